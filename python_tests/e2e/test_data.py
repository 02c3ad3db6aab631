"""autosp.data: samplers that shard by data-parallel replica and keep SP groups together."""
import pytest
import torch

from autosp.testing.distributed import run_ranks


def _indices(rank, world, queue):
    import autosp
    import autosp.data
    data = list(range(22))
    out = {"replica": autosp.data.data_parallel_rank(sp_size=2)}
    sampler = autosp.data.DistributedSampler(data, sp_size=2, shuffle=True, seed=5)
    out["epochs"] = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        out["epochs"].append(list(sampler))
    model = torch.nn.Linear(4, 4)
    sp = autosp.compile(model, sp_size=2)
    loader = autosp.data.loader_for(sp, data, batch_size=3, shuffle=False)
    out["batches"] = [b.tolist() for b in loader]
    out["whole_world_group"] = list(autosp.data.DistributedSampler(data, shuffle=False))
    queue.put((rank, out))


def test_sampler_keeps_sp_groups_together():
    r = run_ranks(_indices, world_size=4)
    assert [r[k]["replica"] for k in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    for epoch in range(2):
        assert r[0]["epochs"][epoch] == r[1]["epochs"][epoch] and r[2]["epochs"][epoch] == r[3]["epochs"][epoch]
        first, second = set(r[0]["epochs"][epoch]), set(r[2]["epochs"][epoch])
        assert first | second == set(range(22)) and not first & second  # replicas: disjoint, all indices
    assert r[0]["epochs"][0] != r[0]["epochs"][1], "set_epoch reshuffles"
    assert r[0]["batches"] == r[1]["batches"] and r[0]["batches"] != r[2]["batches"]
    assert r[0]["batches"][0] == [0, 2, 4]  # replica 0 of 2, batch 3, not shuffled
    assert all(r[k]["whole_world_group"] == list(range(22)) for k in range(4))  # sp_size = world: one replica


def test_sp_size_must_divide_the_world():
    import autosp.data
    from autosp.ir.diagnostics import AutospError
    assert autosp.data.data_parallel_rank() == (0, 1)  # one process
    with pytest.raises(AutospError, match="does not divide"):
        autosp.data.data_parallel_rank(sp_size=2)
    with pytest.raises(AutospError, match="compile"):
        autosp.data.sampler_for(torch.nn.Linear(2, 2), [1, 2])
