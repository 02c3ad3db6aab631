"""Runtime collectives on spawned gloo ranks, and autosp ops emitted into FX graphs."""
import pytest
import torch

from autosp.testing.distributed import run_ranks

IR = """
func.func @main(%x: !torch.vtensor<[2,8,4,3],f32>) -> !torch.vtensor<[2,4,8,3],f32> {
  %0 = "autosp.all_to_all"(%x) {split_dim = 1 : i64, concat_dim = 2 : i64, seq_dim = -1 : i64, group = "sp"}
      : (!torch.vtensor<[2,8,4,3],f32>) -> !torch.vtensor<[2,4,8,3],f32>
  return %0 : !torch.vtensor<[2,4,8,3],f32>
}
"""


def _ulysses_round_trip(rank, world, queue, seed):
    """Sequence-sharded -> head-sharded -> back, through the emitted graph and autograd."""
    from autosp.backend.fx_emitter import emit_graph_module
    from autosp.ir.core import parse_module
    from autosp.runtime import collectives as c

    torch.manual_seed(seed)
    full = torch.randn(2, 8, 4 * world, 3)  # [B, H, S, D], identical on every rank
    local = full.chunk(world, dim=2)[rank].clone().requires_grad_()
    # emitted: seq-sharded [B, H, S/P, D] -> head-sharded [B, H/P, S, D]
    text = IR.replace("[2,8,4,3]", f"[2,8,{4},3]").replace("[2,4,8,3]", f"[2,{8 // world},{4 * world},3]")
    gm = emit_graph_module(parse_module(text, "a2a.mlir"))
    heads = gm(local)[0]
    expected = full.chunk(world, dim=1)[rank]
    back = c.all_to_all(heads, split_dim=2, concat_dim=1, seq_dim=-1, group="sp")
    weight = torch.arange(back.numel(), dtype=back.dtype).view_as(back)
    (back * weight).sum().backward()
    queue.put((rank, dict(
        heads_ok=torch.equal(heads, expected),
        back_ok=torch.equal(back, local.detach()),
        grad_ok=torch.equal(local.grad, weight),
        gather_ok=torch.equal(c.all_gather(local.detach(), dim=2, group="sp"), full),
        shard_ok=torch.equal(c.shard(full, seq_len=full.shape[2], dim=2, lo=0, trim=0, group="sp"),
                             local.detach()),
        reduce_ok=torch.equal(c.all_reduce(torch.full((2,), float(rank)), "sum", "sp"),
                              torch.full((2,), float(sum(range(world))))),
    )))


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_emitted_and_inverse(world, _fresh_seed):
    results = run_ranks(_ulysses_round_trip, world, args=(_fresh_seed,))
    assert sorted(results) == list(range(world))
    for rank, checks in results.items():
        assert all(checks.values()), f"rank {rank}: {checks}"


def _wrong_order(rank, world, queue, seed):
    """Negative control: concatenating in the wrong order must not match."""
    from autosp.runtime import collectives as c
    torch.manual_seed(seed)
    full = torch.randn(1, 4, 2 * world, 2)
    local = full.chunk(world, dim=2)[world - 1 - rank]  # shards swapped
    heads = c.all_to_all(local, split_dim=1, concat_dim=2, seq_dim=-1, group="sp")
    queue.put((rank, torch.equal(heads, full.chunk(world, dim=1)[rank])))


def test_swapped_shards_are_detected(_fresh_seed):
    results = run_ranks(_wrong_order, 2, args=(_fresh_seed,))
    assert not any(results.values())


def _fails_on_rank_one(rank, world, queue):
    from autosp.runtime import collectives as c
    if rank == 1:
        raise ValueError("boom on rank 1")
    c.all_reduce(torch.ones(1), "sum", "sp")  # would wait forever for rank 1


def test_a_failing_rank_ends_with_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        run_ranks(_fails_on_rank_one, 2, timeout=120, collective_timeout=10)


def _uneven(rank, world, queue, seed, seq):
    """Sequence lengths not divisible by P: chunks differ by one, nothing is dropped."""
    from autosp.runtime import collectives as c
    torch.manual_seed(seed)
    full = torch.randn(2, 4, seq, 3, requires_grad=True)  # [B, H, S, D]
    local = c.shard(full, seq_len=seq, dim=2, lo=0, trim=0, group="sp")
    heads = c.all_to_all(local, split_dim=1, concat_dim=2, seq_dim=2, group="sp", seq_len=seq)
    back = c.all_to_all(heads, split_dim=2, concat_dim=1, seq_dim=2, group="sp")
    labels = c.shard(full[:, :, 1:], seq_len=seq, dim=2, lo=0, trim=1, group="sp")   # window [0, S-1)
    logits = c.rewindow(local, seq_len=seq, dim=2, lo=0, trim=0, new_lo=0, new_trim=1, group="sp")
    gathered = c.all_gather(logits - labels, dim=2, group="sp", seq_len=seq, lo=0, trim=1)
    queue.put((rank, dict(
        local=tuple(local.shape), sizes=c.local_len(seq, 0, 1, "sp"),
        heads_ok=torch.equal(heads, full.detach().chunk(world, dim=1)[rank]),
        back_ok=torch.equal(back, local.detach()),
        shift_ok=torch.equal(gathered, (full[:, :, :-1] - full[:, :, 1:]).detach()),
    )))


@pytest.mark.parametrize("world, seq", [(2, 7), (4, 15), (4, 33)])
def test_uneven_sequence_chunks(world, seq, _fresh_seed):
    results = run_ranks(_uneven, world, args=(_fresh_seed, seq))
    lengths = [results[r]["local"][2] for r in range(world)]
    assert sum(lengths) == seq and max(lengths) - min(lengths) == 1
    assert sum(results[r]["sizes"] for r in range(world)) == seq - 1
    for rank, r in results.items():
        assert r["heads_ok"] and r["back_ok"] and r["shift_ok"], f"rank {rank}: {r}"
