"""Attention masks through the compiler: folded into ``is_causal`` only when proven causal,
into a sliding window only when proven one.

``autosp-causal-mask`` used to evaluate a size-only mask at lengths 1-33 and fold it when it
looked causal there; a sliding window wider than 33 looks causal at all those lengths, and
Mistral then trained silently wrong. These tests run Hugging Face models on gloo ranks
against single-device eager (loss, gathered logits, every gradient): Mistral's sliding
window (wider than every length the sampler tried, narrower than S) becomes
``is_causal`` + ``autosp.window`` and runs the windowed kernel without an S x S mask (the
bytes kept for backward grow linearly: at 2S at most 2.3x those at S), Llama's mask must
still fold (its memory benefit), and forcing a plain causal fold on the window model must
break parity.
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128
WINDOW = 36  # wider than the longest length the old sampler tried (33), shorter than SEQ
SEQ = 47     # not divisible by 2 or 4: uneven shards


def _model(family: str, window: int | None):
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  use_cache=False, attn_implementation="sdpa")
    if family == "Mistral":
        kwargs["sliding_window"] = window
    return getattr(transformers, family + "ForCausalLM")(getattr(transformers, family + "Config")(**kwargs))


def _sdpa_masks(mlir: str) -> dict:
    """How many SDPA ops of the transformed program have a mask, and how many is_causal."""
    from autosp.ir.core import body_ops, main_func, make_context, op_name, parse_module
    from autosp.ir.ops import SDPA_OP
    module = parse_module(mlir, "transformed.mlir", make_context())
    counts = {"masked": 0, "is_causal": 0, "window": []}
    for op in body_ops(main_func(module)):
        if op_name(op) == SDPA_OP:
            mask, causal = op.operands[3].owner, op.operands[5].owner
            counts["masked"] += op_name(mask) != "torch.constant.none"
            counts["is_causal"] += op_name(causal) == "torch.constant.bool" and "true" in str(causal)
            if "autosp.window" in op.attributes:
                counts["window"].append(op.attributes["autosp.window"].value)
    return counts


def _body(rank, world, queue, family, window, seq, seed, force_fold, memory=False):
    from autosp.passes import causal_mask

    import autosp
    from autosp.testing.parity import parity
    if force_fold:  # negative control: the old sampled verdict (causal) for every mask
        causal_mask.prove_causal = lambda sdpa: causal_mask.MaskProof(True, "forced by the test")
    torch.manual_seed(seed)
    model = _model(family, window)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seed))
    report = parity(reference, compiled, input_ids=ids, labels=ids.clone(), use_cache=False)
    result = {"outputs": report.outputs, "grads": report.max_grad_error}
    if rank == 0:
        result.update(_sdpa_masks(compiled.programs[0].mlir["transformed"]))
    if memory:  # bytes kept for backward at S and 2S (the compiled program serves any S)
        from autosp.planning.memory import SavedTensors
        saved = []
        for n in (8 * window, 16 * window):
            long_ids = torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))
            with SavedTensors(list(model.parameters())) as counter:
                compiled(input_ids=long_ids, labels=long_ids, use_cache=False)
            saved.append(counter.bytes)
        result["saved"] = saved
    queue.put((rank, result))


def _check_parity(results):
    for rank, r in results.items():
        worst = max(max(r["outputs"].values()), r["grads"])
        assert worst <= TOL, f"rank {rank}: outputs {r['outputs']}, grads {r['grads']:.2e}"


@pytest.mark.parametrize("world", [2, 4])
def test_sliding_window_becomes_a_window_and_matches_single_device(world, _fresh_seed):
    results = run_ranks(_body, world, args=("Mistral", WINDOW, SEQ, _fresh_seed % 10000, False, world == 2),
                        timeout=300)
    _check_parity(results)
    r = results[0]
    assert r["masked"] == 0 and r["is_causal"] == 2 and r["window"] == [WINDOW, WINDOW], r
    if world == 2:
        for rank, res in results.items():
            small, large = res["saved"]
            assert large <= 2.3 * small, f"rank {rank}: saved {small} B at S={8 * WINDOW}, {large} B at twice that"


def test_llama_causal_mask_is_still_folded(_fresh_seed):
    results = run_ranks(_body, 2, args=("Llama", None, SEQ, _fresh_seed % 10000, False), timeout=300)
    _check_parity(results)
    assert results[0]["masked"] == 0 and results[0]["is_causal"] == 2, results[0]


def test_forced_fold_of_a_sliding_window_breaks_parity(_fresh_seed):
    """Negative control: what the sampled fold did to this model is caught by the tolerance."""
    results = run_ranks(_body, 2, args=("Mistral", WINDOW, SEQ, _fresh_seed % 10000, True), timeout=300)
    assert results[0]["is_causal"] == 2
    for rank, r in results.items():
        assert r["outputs"]["['logits']"] > 100 * TOL and r["grads"] > 100 * TOL, f"rank {rank}: {r}"


def test_the_pass_does_not_import_the_backend():
    """An IR pass proves from the IR; it never runs the program through the backend."""
    import subprocess
    import sys
    code = ("import sys, autosp.passes.causal_mask; "
            "sys.exit(any(m == 'autosp.backend' or m.startswith('autosp.backend.') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
