"""autosp.testing.distributed.run_ranks: pooled rank processes, and never a hang."""
import os
import time

import pytest
import torch

from autosp.testing.distributed import run_ranks


@pytest.fixture(autouse=True)
def _pooled(monkeypatch):
    """These tests are about the pool: on even where the suite runs with AUTOSP_RANK_POOL=0."""
    monkeypatch.setenv("AUTOSP_RANK_POOL", "1")


def _pid(rank, world, queue):
    import torch.distributed as dist
    # A collective on a group made by this body, as compiled modules do with their meshes.
    group = dist.new_group(list(range(world)))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=group)
    queue.put((rank, (os.getpid(), float(total))))


def _patch_collectives(rank, world, queue):
    from autosp.passes import PASSES

    from autosp.runtime import collectives
    collectives.all_reduce = None  # what a negative control's sabotage does
    PASSES["autosp-leak"] = object  # a module-level registry filled by a body
    queue.put((rank, collectives.all_reduce is None))


def _collectives_intact(rank, world, queue):
    from autosp.passes import PASSES

    from autosp.runtime import collectives
    queue.put((rank, callable(collectives.all_reduce) and "autosp-leak" not in PASSES))


def _big(rank, world, queue, n):
    queue.put((rank, torch.full((n,), float(rank))))


def _sleep(rank, world, queue, seconds):
    time.sleep(seconds)


def _die_on_rank_one(rank, world, queue):
    import torch.distributed as dist
    if rank == 1:
        os._exit(3)
    dist.barrier()  # would wait for rank 1 until the collective timeout


def test_ranks_are_reused_and_bodies_do_not_leak_patches():
    first = run_ranks(_pid, 2)
    second = run_ranks(_pid, 2)
    assert {r: p for r, (p, _) in first.items()} == {r: p for r, (p, _) in second.items()}, \
        "the pool was not reused"
    assert all(total == 1.0 for _, total in second.values())
    assert all(run_ranks(_patch_collectives, 2).values())
    assert all(run_ranks(_collectives_intact, 2).values()), "a body's patch leaked into the next body"
    # Negative control: fresh=True spawns new ranks.
    fresh = run_ranks(_pid, 2, fresh=True)
    assert not {p for p, _ in fresh.values()} & {p for p, _ in first.values()}


def test_large_results_do_not_block_the_ranks():
    n = 8 * 2**20  # 32 MiB per rank, far above a pipe's buffer
    results = run_ranks(_big, 2, args=(n,), timeout=120)
    for rank, t in results.items():
        assert t.shape == (n,) and bool((t == rank).all())


def test_a_timeout_or_a_dead_rank_tears_the_pool_down():
    before = {p for p, _ in run_ranks(_pid, 2).values()}
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within the timeout"):
        run_ranks(_sleep, 2, args=(60,), timeout=3)
    assert time.monotonic() - start < 15, "the timeout was not enforced"
    after = {p for p, _ in run_ranks(_pid, 2, timeout=120).values()}
    assert not before & after, "ranks that timed out must not be reused"
    with pytest.raises(RuntimeError, match=r"rank 1 (died|exited)"):
        run_ranks(_die_on_rank_one, 2, timeout=120)
