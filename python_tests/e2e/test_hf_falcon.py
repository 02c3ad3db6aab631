"""Hugging Face Falcon (new decoder architecture, one KV head), unmodified, sequence-parallel.

Falcon splits its fused QKV projection with ``x[..., [k], :]``, which exports as advanced
indexing whose sequence index is ``arange(query_layer.shape[1])``: a size read from a
sequence-sharded value. The compiler knows that size is S wherever it was read; an
index that is the whole range 0..S-1 on the sequence dim keeps every position where it
is, so each rank indexes its shard with its local range. One KV head is repeated to P
before the all-to-all. Every rank checks the loss, the gathered logits and every
gradient against single-device eager on the full sequence.
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128


def _falcon():
    from transformers import FalconConfig, FalconForCausalLM
    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_kv_heads=1, new_decoder_architecture=True, attn_implementation="sdpa",
                       hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=256, use_cache=False)
    return FalconForCausalLM(cfg)


def _global_index(self, op, dim, window, layouts):
    """Negative control: index the rank's shard with the sharded global range (this
    rank's global positions) instead of its local range, as a rewrite that only
    slices replicated operands would."""
    self.shard_operands(op, window, layouts)


def _body(rank, world, queue, seq, seed, control):
    from autosp.passes import shard_sequence
    original = shard_sequence._Rewriter.localise_index
    if control:  # restored below: pooled ranks run the next test in this process
        shard_sequence._Rewriter.localise_index = _global_index
    try:
        _check(rank, queue, seq, seed)
    finally:
        shard_sequence._Rewriter.localise_index = original


def _check(rank, queue, seq, seed):
    import autosp
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    model = _falcon()
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seed))
    report = parity(reference, compiled, input_ids=ids, labels=ids.clone(), use_cache=False)
    mlir = compiled.programs[0].mlir["transformed"]
    queue.put((rank, {"outputs": report.max_output_error, "grads": report.max_grad_error,
                      "a2a": mlir.count('"autosp.all_to_all"')}))


# S not divisible by P at P = 2, divisible at P = 4 (suite time: each case compiles per rank).
@pytest.mark.parametrize("case", families.params("falcon"))
def test_falcon_one_kv_head_matches_single_device(case, _fresh_seed):
    world, seq = case.world, case.seq
    results = run_ranks(_body, world, args=(seq, _fresh_seed % 10000, False), timeout=300)
    print(f"falcon P={world} S={seq}: {results}")
    for rank, r in results.items():
        assert r["outputs"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"
        assert r["a2a"] == 8, "4 all-to-alls per layer, 2 layers"


def test_negative_control_global_positions_as_local_index(_fresh_seed):
    """Falcon splits its fused QKV with ``x[..., [k], :]``, which exports as advanced
    indexing with the full range 0..S-1 on the sequence dim. Indexing a rank's shard
    with its global positions (not its local range) must not pass: the shape check finds
    it before the first run (rank 0's index runs past its shard)."""
    with pytest.raises(RuntimeError, match=r"shapes do not agree: torch\.aten\.\w+.* at \S*falcon/modeling_falcon\.py"):
        run_ranks(_body, 2, args=(16, _fresh_seed % 10000, True), timeout=300)
