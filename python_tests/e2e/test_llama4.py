"""Llama 4 text, unmodified, made sequence-parallel (issue 26: chunked attention, complex rope).

Llama 4 attends within fixed chunks (``attention_chunk_size``): its mask is
``(k - pad[b]) // c == (q - pad[b]) // c and k <= q``. ``autosp-causal-mask`` reads the
floor division as one derived tensor of chunk ids, ``floor(i / c)``, computed in the
model, and proves the mask to be causal attention within documents: O(S), no S x S mask
(``autosp.documents``; the ring takes the ids as its mask operand). Its rotary embedding
is complex (``torch.polar``, ``view_as_complex``): the round trip must keep complex64
(torch-mlir numbers dtypes its own way). Its MoE layer repeats the tokens once per expert
(``hidden_states.repeat(E, 1)``: a [E * T, H] fold of the sequence) and routes with
``full_like(logits, -inf).scatter_(...)``, whose rows are all alike.

A tiny config (4 layers: three chunked with rope, one full-attention NoPE layer with
temperature tuning; MoE every other layer, a shared expert): loss, gathered logits and
every gradient against single-device eager, then 3 AdamW steps, with Ulysses at P = 2
(S = 15) and P = 4 (S = 19), a ring at P = 2 (S = 16) and a 2 x 2 Ulysses x ring mesh at
P = 4 (S = 19). Bytes kept for backward grow at most 2.3x from S to 2S. Negative
control: the chunk ids dropped (plain causal attention) must break parity.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Llama4TextConfig"):  # pragma: no cover
    pytest.skip("transformers without Llama 4", allow_module_level=True)

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128
CHUNK = 4


def _model():
    cfg = transformers.Llama4TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=CHUNK, use_cache=False, max_position_embeddings=256,
        no_rope_layers=[1, 1, 1, 0], attn_temperature_tuning=True, floor_scale=4)
    cfg._attn_implementation = "eager"
    return transformers.Llama4ForCausalLM(cfg).float()


def test_round_trip_is_exact_with_complex_rope():
    """P = 1: one compilation serves S = 8, 16 and 40, exactly; the graph keeps complex64."""
    import autosp
    from autosp.testing.parity import parity
    torch.manual_seed(0)
    model = _model()
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    for s in (8, 16, 40):
        ids = torch.randint(0, VOCAB, (2, s))
        report = parity(reference, compiled, input_ids=ids, labels=ids)
        assert report.max_error <= TOL and report.max_grad_error <= TOL, f"S={s}: {report}"
    assert len(compiled.programs) == 1
    gm = compiled.programs[0].graph_module
    complex_dtypes = {a for n in gm.graph.nodes for a in list(n.args) + list(n.kwargs.values())
                      if isinstance(a, torch.dtype) and a.is_complex}
    assert complex_dtypes <= {torch.complex64}, complex_dtypes  # never complex128 (torch's 10)
    assert any(n.target is torch.ops.aten.view_as_complex.default for n in gm.graph.nodes)


def test_emitter_maps_torch_mlir_dtype_numbers():
    """torch-mlir writes complex64 as 10 (torch's ComplexDouble): the emitter must convert."""
    from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_INT

    from autosp.backend.fx_emitter import _convert
    schema = torch.ops.aten._to_copy.default._schema
    dtype_arg = next(a for a in schema.arguments if a.name == "dtype")
    for dtype in (torch.complex64, torch.float32, torch.bfloat16, torch.int64, torch.bool):
        assert _convert(str(dtype_arg.real_type), TORCH_DTYPE_TO_INT[dtype]) is dtype


def _run_case(strategy, seq, seed, control=None, full=True):
    import autosp
    from autosp.runtime import attention
    from autosp.testing.parity import adamw_steps, parity, saved_growth
    torch.manual_seed(seed)
    model = _model()
    reference = copy.deepcopy(model)
    original = attention.document_attention
    if control == "no_chunks":
        def causal_only(q, k, v, attn_mask=None, *args, **kwargs):
            return original(q, k, v, torch.zeros_like(attn_mask), *args, **kwargs)
        attention.document_attention = causal_only
    try:
        compiled = autosp.compile(model, gather_outputs=True, sp_strategy=strategy)
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = parity(reference, compiled, input_ids=ids, labels=ids)
        result = {"outputs": report.outputs, "grads": report.max_grad_error}
        if control:
            return result
        ir = compiled.programs[0].mlir["transformed"]
        # chunked layers: SDPA within documents (Ulysses), or a ring op with the ids as its mask
        result["chunked"] = ir.count("autosp.documents}") + ir.count("1, 1, 1, 1, 1, 0, 0>")
        result["kept"] = ir.count("autosp.mask_kept") + ir.count("autosp.unfused_attention")
        if not full:  # (one call: parity of outputs and gradients)
            return result
        def loss_of(m, ids):
            return m(input_ids=ids, labels=ids).loss
        result["steps"] = adamw_steps(reference, model, compiled, loss_of,
                                      [torch.randint(0, VOCAB, (2, seq), generator=gen) for _ in range(3)])
        result["saved_growth"] = saved_growth(compiled, model, loss_of, [torch.randint(0, VOCAB, (2, s), generator=gen)
                                                                        for s in (seq * 2, seq * 4)])
        return result
    finally:
        attention.document_attention = original


def _body(rank, world, queue, seed):
    # (variant words: the strategy; full = 3 AdamW steps and the growth S -> 2S -> 4S)
    queue.put((rank, {case.id(): _run_case(case.variant[0], case.seq, seed + i, full=case.has("full"))
                      for i, case in enumerate(families.at("llama4", world))}))


@pytest.mark.parametrize("world", families.worlds("llama4"))
def test_llama4_matches_single_device(world, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000,), timeout=600)
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"rank {rank}, {case}, P={world}: {r}"
            assert max(r["outputs"].values()) <= TOL and r["grads"] <= TOL, where
            assert r["chunked"] == 3, where  # the three chunked layers ran within documents
            assert r["kept"] == 0, where  # no S x S mask kept
            if "steps" in r:
                for grads, params in r["steps"]:
                    assert grads <= TOL and params <= TOL, where
                assert r["saved_growth"] <= 2.3, where


def _control_body(rank, world, queue, seed):
    queue.put((rank, _run_case("ulysses", 15, seed, control="no_chunks")))


def test_dropped_chunk_ids_break_parity(_fresh_seed):
    results = run_ranks(_control_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for rank, r in results.items():
        assert max(r["outputs"].values()) > 1e-3, (rank, r)
