"""Hugging Face GPT-NeoX (partial rotary, parallel residual, LayerNorm), held out from the
models the compiler was built around, made sequence-parallel unmodified.

Besides parity, the memory claim: a rank keeps at most 0.58x the single-device
activation bytes at P = 2. The gap this closes was torch-mlir's decomposition of
``layer_norm`` (variance in f64; ``x - mean``, its square and the f64 copy saved per
norm); autosp now keeps layer norm whole, as it keeps SDPA, softmax and activations, and
shards all of its results (output, mean, rstd) as one token-wise op. The negative controls
are a wrong shard (parity must fail) and the old, decomposed layer norm (memory must fail).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128
RATIO = 0.58  # issue 9: a rank keeps <= 0.58x the single-device activation bytes at P = 2


def _neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, rotary_pct=0.25, use_parallel_residual=True,
                        max_position_embeddings=1024, attn_implementation="sdpa", use_cache=False,
                        hidden_dropout=0.0, attention_dropout=0.0)
    return GPTNeoXForCausalLM(cfg)


def _wrong_shard(x, seq_len, dim, lo, trim, group):
    """Negative control: every rank takes the next rank's part of a replicated value."""
    from autosp.runtime import collectives
    p, r = collectives.group_size(group), collectives.group_rank(group)
    a, b = collectives.span(seq_len, lo, trim, p, (r + 1) % p)
    a2, b2 = collectives.span(seq_len, lo, trim, p, r)
    n = min(b - a, b2 - a2)
    return x.narrow(dim % x.dim(), a - lo, n)


def _parity_body(rank, world, queue, seq, seed, control):
    import autosp
    from autosp.backend import fx_emitter
    from autosp.testing.parity import parity
    original = fx_emitter._AUTOSP_OPS["autosp.shard"]
    if control:  # restored below: pooled ranks run the next test in this process
        fx_emitter._AUTOSP_OPS["autosp.shard"] = (_wrong_shard, ("x", "seq_len"))
    try:
        torch.manual_seed(seed)
        model = _neox()
        reference = copy.deepcopy(model)
        compiled = autosp.compile(model, gather_outputs=True)
        ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seed))
        report = parity(reference, compiled, input_ids=ids, labels=ids.clone(), use_cache=False)
    finally:
        fx_emitter._AUTOSP_OPS["autosp.shard"] = original
    queue.put((rank, {"outputs": report.max_output_error, "grads": report.max_grad_error}))


@pytest.mark.parametrize("case", families.params("gpt_neox"))
def test_neox_matches_single_device(case, _fresh_seed):
    world, seq = case.world, case.seq
    results = run_ranks(_parity_body, world, args=(seq, _fresh_seed % 10000, False), timeout=300)
    for rank, r in results.items():
        assert r["outputs"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"


def test_negative_control_wrong_shard_fails(_fresh_seed):
    """A rank that slices another rank's positions (labels, RoPE tables) must not pass:
    either the numbers are off or the shapes no longer fit (shards differ by one token)."""
    try:
        results = run_ranks(_parity_body, 2, args=(32, _fresh_seed % 10000, True), timeout=300)
    except RuntimeError as e:
        assert "shape" in str(e) or "size" in str(e), e
        return
    assert max(max(r["outputs"], r["grads"]) for r in results.values()) > 1e-3, results


def _saved_bytes(fn, params) -> int:
    from autosp.planning.memory import SavedTensors
    with SavedTensors(params) as saved:
        fn()
    return saved.bytes


def _memory_body(rank, world, queue, seq, seed):
    import autosp
    from autosp.frontend import importer
    torch.manual_seed(seed)
    model = _neox()
    ids = torch.randint(0, VOCAB, (1, seq), generator=torch.Generator().manual_seed(seed))
    params = list(model.parameters())
    single = _saved_bytes(lambda: model(input_ids=ids, labels=ids, use_cache=False), params)
    ratios = {}
    original = importer._KEEP_WHOLE
    decomposed = tuple(k for k in original if k != "layer_norm")
    try:  # restored below: pooled ranks run the next test in this process
        for label, keep in (("layer_norm whole", original), ("layer_norm decomposed", decomposed)):
            importer._KEEP_WHOLE = keep
            compiled = autosp.compile(model)
            compiled(input_ids=ids, labels=ids, use_cache=False)  # compile outside the counter
            step = lambda c=compiled: c(input_ids=ids, labels=ids, use_cache=False)  # noqa: E731
            ratios[label] = _saved_bytes(step, params) / single
    finally:
        importer._KEEP_WHOLE = original
    queue.put((rank, ratios))


def test_neox_rank_keeps_at_most_058_of_single_device_activations(_fresh_seed):
    """Measured on two gloo ranks at S = 512 (hidden 64): each rank's saved-for-backward
    bytes against single-device eager. The decomposed layer norm (the old behaviour) is the
    negative control: it must not pass the same bound."""
    results = run_ranks(_memory_body, 2, args=(512, _fresh_seed % 10000), timeout=300)
    print(f"GPT-NeoX saved bytes per rank / single device at P=2: {results}")
    for rank, r in results.items():
        assert r["layer_norm whole"] <= RATIO, f"rank {rank}: {r}"
        assert r["layer_norm decomposed"] > RATIO, f"rank {rank}: the control passes too: {r}"
