"""Model state sharded by FSDP2 (``fully_shard``), composed with sequence parallelism.

World 2: SP 2 with FSDP over both ranks; world 4: SP 2 x 2 data-parallel replicas with
FSDP over all four (gradients: the replicas' mean), with SAC checkpointing; both at S = 15
and 16 (not divisible and divisible by P). The user's recipe
unchanged: ``fully_shard`` per block and on the root, ``autosp.compile``, AdamW on the
DTensor parameters (eps 1e-5, Llama's: ``ADAM_EPS``). Three steps match single-device
training within 1e-5 (loss each step, every gradient as ``grad.full_tensor()`` (world 4:
each step; world 2: the first), and the parameters after the last);
each fully_shard-ed module's parameters are all-gathered once in forward (the next
module's gather issued before the current one's layer runs) and once in backward, and
reduce-scattered once, and no more than two groups are ever unsharded at once;
the model still runs as plain FSDP2 afterwards (a plain forward leaves FSDP2's root
unsharded: the compiled call then says to call ``model.reshard()``). Negative control: a gather whose backward
skips the reduce-scatter (each rank keeps its own share) must fail the gradient check; a
call without the prefetch must fail the order check (it is what the check sees); at world 4
the sum over all ranks without the 1/dp scale must fail.
"""
import copy

import torch

from autosp.testing.distributed import run_ranks
from autosp.testing.parity import ADAM_EPS

TOL = 1e-5


def _sharded_llama(seed):
    """(model sharded with the FSDP2 recipe, an unsharded single-device copy)."""
    from torch.distributed.fsdp import fully_shard

    from autosp.models import LlamaConfig, LlamaLike
    torch.manual_seed(seed)
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=3, heads=4, kv_heads=2))
    reference = copy.deepcopy(model)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, reference


def _body(rank, world, queue, seed):
    from torch.distributed.tensor import DTensor

    import autosp
    from autosp.runtime import fsdp
    from autosp.testing.parity import relative_error
    model, reference = _sharded_llama(seed)
    sp = autosp.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=ADAM_EPS)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
    gen = torch.Generator().manual_seed(seed + 1)
    result = {"dtensor": all(isinstance(p, DTensor) for p in model.parameters()), "loss": [], "grad": None}
    names = [n for n, _ in reference.named_parameters()]
    for step in range(3):
        ids = torch.randint(0, 64, (2, 15 + step % 2), generator=gen)
        labels = torch.randint(0, 64, (2, 15 + step % 2), generator=gen)
        loss = sp(ids, labels=labels)["loss"]
        loss.backward()
        ref_loss = reference(ids, labels=labels)["loss"]
        ref_loss.backward()
        result["loss"].append(relative_error(loss, ref_loss))
        if step == 0:
            result["grad"] = max(relative_error(p.grad.full_tensor(), q.grad)
                                 for p, q in zip(model.parameters(), reference.parameters()))
            result["grad_is_dtensor"] = all(isinstance(p.grad, DTensor) for p in model.parameters())
            program = sp.programs[0]
            result["log"], result["order"] = program.last_unsharder.log, program.unshard_order
            result["max_unsharded"] = program.last_unsharder.max_unsharded
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    result["params"] = max(relative_error(p.full_tensor(), q.detach())
                           for p, q in zip(model.parameters(), reference.parameters()))
    result["names"] = [n for n, _ in model.named_parameters()] == names
    ids = torch.randint(0, 64, (2, 15), generator=gen)

    original = fsdp.Unsharder.reduce_scatter

    def no_reduce_scatter(self, k, grads):  # each rank keeps its own share of the gradient
        rank = torch.distributed.get_rank(self.group)
        return [g[rank * per:rank * per + t.shape[0]].contiguous()
                for g, t, per in zip(grads, self.locals[k], self.layouts[k].per)]

    fsdp.Unsharder.reduce_scatter = no_reduce_scatter
    try:  # restored below: pooled ranks run the next test in this process
        sp(ids, labels=ids)["loss"].backward()
        reference(ids, labels=ids)["loss"].backward()
        result["control"] = max(relative_error(p.grad.full_tensor(), q.grad)
                                for p, q in zip(model.parameters(), reference.parameters()))
    finally:
        fsdp.Unsharder.reduce_scatter = original
    program.prefetch = False
    try:
        sp(ids, labels=ids)
        result["log_without_prefetch"] = program.last_unsharder.log
    finally:
        program.prefetch = True
    # The model still runs as plain FSDP2; its root stays unsharded after a forward, which
    # the compiled call refuses until model.reshard().
    with torch.no_grad():
        result["plain_fsdp"] = relative_error(model(ids, labels=ids)["loss"], reference(ids, labels=ids)["loss"])
        try:
            sp(ids, labels=ids)
            result["unsharded"] = "no error"
        except RuntimeError as e:
            result["unsharded"] = str(e)
        model.reshard()
        result["after_reshard"] = relative_error(sp(ids, labels=ids)["loss"], reference(ids, labels=ids)["loss"])
    queue.put((rank, result))


def prefetch_violations(log, order):
    """Groups whose successor's forward all-gather was not issued before the group was
    handed to its layer (without prefetch: every group but the last)."""
    def at(event):
        return log.index(event)
    return [k for k, nxt in zip(order, order[1:])
            if at(("all_gather", "forward", nxt)) > at(("use", "forward", k))]


def collectives_per_group(log, groups):
    """{group: (forward all-gathers, backward all-gathers, reduce-scatters)}."""
    return {k: (log.count(("all_gather", "forward", k)), log.count(("all_gather", "backward", k)),
                log.count(("reduce_scatter", "backward", k))) for k in groups}


def _dp_body(rank, world, queue, seed):
    """World 4: SP 2 x 2 data-parallel replicas (each its own batch), FSDP over all 4
    ranks, SAC checkpointing. The reduce-scatter sums over all 4; scaled by 1/2 it is the
    replicas' mean. Three AdamW steps at S = 15, 16, 15."""
    import autosp
    from autosp.testing.parity import relative_error
    model, reference = _sharded_llama(seed)
    sp = autosp.compile(model, sp_size=2, checkpointing="sac")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=ADAM_EPS)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
    found = []
    for step in range(3):
        seq = 15 + step % 2
        batches = []
        for r in range(2):
            gen = torch.Generator().manual_seed(seed + 100 * r + step)
            batches.append((torch.randint(0, 64, (2, seq), generator=gen), torch.randint(0, 64, (2, seq), generator=gen)))
        ids, labels = batches[rank // 2]
        loss = sp(ids, labels=labels)["loss"]
        loss.backward()
        for batch_ids, batch_labels in batches:
            (reference(batch_ids, labels=batch_labels)["loss"] / 2).backward()
        grad = max(relative_error(p.grad.full_tensor(), q.grad)
                   for p, q in zip(model.parameters(), reference.parameters()))
        with torch.no_grad():
            ref_loss = reference(ids, labels=labels)["loss"]
        found.append((seq, relative_error(loss, ref_loss), grad))
        opt.step(), ref_opt.step()
        opt.zero_grad(), ref_opt.zero_grad()
    params = max(relative_error(p.full_tensor(), q.detach()) for p, q in zip(model.parameters(), reference.parameters()))
    program = sp.programs[0]
    counts = collectives_per_group(program.last_unsharder.log, program.unshard_order)
    # Negative control: the reduce-scatter's sum over all 4 ranks, not scaled to the replicas' mean.
    program.shard_scale = 1.0
    sp(ids, labels=labels)["loss"].backward()
    for batch_ids, batch_labels in batches:
        (reference(batch_ids, labels=batch_labels)["loss"] / 2).backward()
    control = max(relative_error(p.grad.full_tensor(), q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    queue.put((rank, (found, params, tuple(sp.mesh.shape), counts, program.last_unsharder.max_unsharded, control)))


def test_fsdp2_over_data_parallel_replicas_of_sequence_parallel_groups(_fresh_seed):
    results = run_ranks(_dp_body, 4, args=(_fresh_seed % 10000,), timeout=300)
    for rank, (found, params, mesh, counts, unsharded, control) in results.items():
        assert control > 0.5, f"rank {rank}: gradients matched without the 1/dp scale ({control:.2e})"
        assert mesh == (2, 2)
        for seq, loss, grad in found:  # every step (AdamW's eps is Llama's: see ADAM_EPS)
            assert loss <= TOL and grad <= TOL, f"rank {rank}, S={seq}: loss {loss:.2e} grads {grad:.2e}"
        assert params <= TOL, f"rank {rank}: parameters after 3 AdamW steps differ by {params:.2e}"
        assert len(counts) == 4 and set(counts.values()) == {(1, 1, 1)}, counts  # root + 3 blocks, checkpointed
        assert unsharded <= 2, unsharded


def test_fsdp2_sharded_model_trains_like_one_device(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        assert r["dtensor"] and r["grad_is_dtensor"] and r["names"], r
        assert max(r["loss"]) <= TOL and r["grad"] <= TOL, f"rank {rank}: {r}"
        assert r["params"] <= TOL, f"rank {rank}: parameters after 3 AdamW steps differ by {r['params']:.2e}"
        assert r["plain_fsdp"] <= TOL and r["after_reshard"] <= TOL, f"rank {rank}: {r}"
        assert "is no longer sharded" in r["unsharded"] and "model.reshard()" in r["unsharded"], r
        assert r["control"] > 1e-3, f"rank {rank}: gradients matched without the reduce-scatter: {r}"
        # One all-gather per fully_shard-ed module in forward, one in backward, one reduce-scatter.
        assert len(r["order"]) == 4 and set(collectives_per_group(r["log"], r["order"]).values()) == {(1, 1, 1)}, r
        assert r["max_unsharded"] <= 2, r["max_unsharded"]  # the root's group and one block's at most
        assert prefetch_violations(r["log"], r["order"]) == [], r["log"]
        assert prefetch_violations(r["log_without_prefetch"], r["order"]) == r["order"][:-1], r["log_without_prefetch"]
