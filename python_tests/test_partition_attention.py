"""Ulysses attention partitioning, run on spawned gloo ranks.

The SDPA block is token-wise outside attention, so feeding each rank its own sequence
shard through the partitioned graph must give that rank's shard of the single-device
output, and the per-rank parameter gradients must sum to the single-device gradients.
(The compiler's own sharding of inputs is the layout passes' job; here the test shards.)
"""
import copy

import pytest
import torch

from autosp.testing.distributed import run_ranks


def _run(rank, world, queue, seed, heads, swap_shards, partition, kv_heads=None):
    import autosp
    from autosp.backend.fx_emitter import emit_graph_module
    from autosp.testing.models import AttentionBlock
    from autosp.testing.parity import relative_error

    torch.manual_seed(seed)
    model = AttentionBlock(hidden=8 * heads, heads=heads, causal=True, kv_heads=kv_heads)
    reference = copy.deepcopy(model)
    seq = 4 * world
    x = torch.randn(2, seq, 8 * heads)
    imported = autosp.import_model(model, x)
    if partition:
        autosp.run_pipeline(imported.module, f"builtin.module(autosp-partition-attention{{sp-size={world}}})")
    gm = emit_graph_module(imported.module)
    shard = (world - 1 - rank) if swap_shards else rank
    local = x.chunk(world, dim=1)[shard]
    out = gm(*[dict(model.named_parameters())[n] for n in imported.state_names], local)[0]
    weight = torch.randn(2, seq, 8 * heads, generator=torch.Generator().manual_seed(seed))
    (out * weight.chunk(world, dim=1)[rank]).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        torch.distributed.all_reduce(g)
    ref_out = reference(x)
    (ref_out * weight).sum().backward()
    queue.put((rank, dict(
        out=relative_error(out, ref_out.chunk(world, dim=1)[rank]),
        grads=max(relative_error(g, p.grad) for g, p in zip(grads, reference.parameters())),
        a2a=str(imported.module).count('"autosp.all_to_all"'),
    )))


@pytest.mark.parametrize("world, heads, kv_heads", [(2, 4, None), (4, 4, None), (4, 8, None),
                                                    (4, 8, 1), (4, 8, 2), (2, 4, 2)])
def test_partitioned_sdpa_block_matches_eager(world, heads, kv_heads, _fresh_seed):
    """MHA, and GQA with 1 and 2 KV heads at P=4 (KV heads repeated to P) and 2 at P=2."""
    results = run_ranks(_run, world, args=(_fresh_seed, heads, False, True, kv_heads))
    for rank, r in results.items():
        assert r["a2a"] == 4, "Ulysses minimum: 4 all-to-alls per attention layer"
        assert r["out"] <= 1e-5 and r["grads"] <= 1e-5, f"rank {rank}: {r}"


@pytest.mark.parametrize("swap, partition", [(True, True), (False, False)])
def test_negative_controls_fail(swap, partition, _fresh_seed):
    """Swapped shards, or no all-to-all at all (attention sees only its own shard): wrong."""
    results = run_ranks(_run, 2, args=(_fresh_seed, 4, swap, partition))
    assert max(r["out"] for r in results.values()) > 1e-3
