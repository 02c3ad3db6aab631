"""Parameters the user's loss uses outside the compiled call get the sequence-parallel sum.

torchtitan's ``ChunkedLossWrapper`` (and any loss written like it) takes hidden states from
the model and applies ``lm_head`` itself, on this rank's positions: before, that weight's
gradient was this rank's share only (0.71 off in torchtitan's llama3), with the loss
exact and no warning. Each case is checked against one device's eager model on the full
sequence, with a control that removes the sum and must fail.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB = 64


class _Hidden(torch.nn.Module):
    """A Llama-like model that returns its final hidden states (``_skip_lm_head``): the loss
    applies ``lm_head`` outside. ``tied``: ``lm_head`` is the embedding, used inside too."""

    def __init__(self, tied: bool = False):
        super().__init__()
        from autosp.models import LlamaConfig, LlamaLike
        self.inner = LlamaLike(LlamaConfig(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2,
                                           tie_embeddings=tied))
        self.lm_head = self.inner.lm_head

    def forward(self, ids):
        m = self.inner
        b, s = ids.shape
        cos, sin = m.rope(torch.arange(s).unsqueeze(0).expand(b, s))
        x = m.embed(ids)
        for blk in m.blocks:
            x = blk(x, cos, sin, None)
        return m.norm(x)


def _targets(ids):
    return torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], dim=1)


def _chunked_loss(head, h, targets, count, chunks=2):
    """torchtitan's way: the head applied chunk by chunk, summed, over the global count."""
    total = 0.0
    for hc, tc in zip(h.chunk(chunks, dim=1), targets.chunk(chunks, dim=1)):
        total = total + F.cross_entropy(head(hc).flatten(0, 1), tc.flatten(), ignore_index=-100, reduction="sum")
    return total / count


def _body(rank, world, queue, seed, tied, seq):
    import torch.distributed as dist

    import autosp
    from autosp.runtime.outside_grads import OutsideGradientError
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = _Hidden(tied)
    reference = copy.deepcopy(model)
    sp = autosp.compile(model)
    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(seed + 1))
    targets = _targets(ids)
    count = (targets != -100).sum()
    expected = _chunked_loss(reference.lm_head, reference(ids), targets, count)
    expected.backward()

    def errors():
        out = {n: relative_error(p.grad, q.grad) for (n, p), q in zip(model.named_parameters(),
                                                                     reference.parameters())}
        return max(out.values()), out["inner.lm_head.weight" if not tied else "inner.embed.weight"]

    result = {}
    # 1. the shard path: this rank's positions, lm_head outside
    model.zero_grad(set_to_none=True)
    loss = _chunked_loss(sp.lm_head if hasattr(sp, "lm_head") else model.lm_head, sp(ids),
                         sp.shard_sequence(targets), count)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    result["loss"] = relative_error(total, expected.detach())
    result["grads"], result["head"] = errors()
    result["summed"] = sp.grad_sync.outside.summed_last_backward
    # 2. the control: without the outside sum the head's gradient is this rank's share
    outside, sp.grad_sync.outside = sp.grad_sync.outside, None
    model.zero_grad(set_to_none=True)
    _chunked_loss(model.lm_head, sp(ids), sp.shard_sequence(targets), count).backward()
    result["control"] = errors()[1]
    sp.grad_sync.outside = outside
    # 3. the whole loss on gathered outputs: nothing outside is a share, nothing is summed
    model.zero_grad(set_to_none=True)
    _chunked_loss(model.lm_head, sp.gather_sequence(sp(ids)), targets, count).backward()
    result["gathered"] = errors()[0]
    # 4. the plain model called while a call's sharded outputs wait: its backward is one
    #    device's (nothing summed), and the waiting call's share can no longer be summed
    model.zero_grad(set_to_none=True)
    pending = _chunked_loss(model.lm_head, sp(ids), sp.shard_sequence(targets), count)
    _chunked_loss(model.lm_head, model(ids), targets, count).backward()
    result["plain"] = errors()[0]
    try:
        pending.backward()
        result["pending"] = "no error"
    except OutsideGradientError as e:
        result["pending"] = str(e)
    # 5. torchtitan's chunked loss: lm_head + loss back-propagated per chunk from detached
    #    hidden states, then the hidden states from the chunks' gradients
    model.zero_grad(set_to_none=True)
    h = sp(ids)
    local = sp.shard_sequence(targets)
    chunks = h.detach().chunk(2, dim=1)
    grads = []
    for hc, tc in zip(chunks, local.chunk(2, dim=1)):
        hc.requires_grad_(True)
        (F.cross_entropy(model.lm_head(hc).flatten(0, 1), tc.flatten(), ignore_index=-100,
                         reduction="sum") / count).backward()
        grads.append(hc.grad)
    h.backward(torch.cat(grads, dim=1))
    result["detached"] = errors()[0]
    queue.put((rank, result))


@pytest.mark.parametrize("world,tied,seq", [(2, False, 16), (2, True, 15), (4, False, 15)])
def test_a_head_applied_outside_gets_the_sequence_parallel_sum(world, tied, seq, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, tied, seq), timeout=300)
    for rank, r in results.items():
        assert r["loss"] <= TOL, (rank, r)
        assert r["grads"] <= TOL, f"rank {rank}: gradients off by {r['grads']:.2e} ({r})"
        assert r["summed"], r
        assert r["control"] > 1e-2, f"rank {rank}: the control (no outside sum) should be wrong: {r}"
        assert r["gathered"] <= TOL, f"rank {rank}: the gathered whole loss: {r['gathered']:.2e}"
        assert r["plain"] <= TOL, f"rank {rank}: the plain model's gradient: {r['plain']:.2e}"
        assert "was disarmed before" in r["pending"], r["pending"]
        assert r["detached"] <= TOL, f"rank {rank}: torchtitan's chunked loss: {r['detached']:.2e}"


def test_a_module_registered_twice_keeps_its_real_weights_after_export():
    """Before: the export's fake weight stayed in ``model.lm_head`` (registered as
    ``inner.lm_head`` too) on the exporting rank, and its backward silently did nothing."""
    from torch._subclasses.fake_tensor import FakeTensor

    import autosp
    model = _Hidden()
    before = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    autosp.import_model(model, torch.randint(0, VOCAB, (2, 8)))
    after = dict(model.named_parameters(remove_duplicate=False))
    assert set(after) == set(before) and "lm_head.weight" in after
    for n, p in after.items():
        assert not isinstance(p, FakeTensor) and p is before[n], n


def _fsdp_body(rank, world, queue, seed):
    from torch.distributed.fsdp import fully_shard

    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = _Hidden()
    reference = copy.deepcopy(model)
    # torchtitan's apply_fsdp_to_decoder: the embedding, each block, [norm, lm_head] as one
    # group (a _MultiHandle), then the root
    fully_shard(model.inner.embed)
    for blk in model.inner.blocks:
        fully_shard(blk)
    fully_shard([model.inner.norm, model.inner.lm_head])
    fully_shard(model)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed + 1))
    targets = _targets(ids)
    count = (targets != -100).sum()
    _chunked_loss(reference.lm_head, reference(ids), targets, count).backward()
    sp = autosp.compile(model)

    def step():
        model.zero_grad(set_to_none=True)
        _chunked_loss(model.lm_head, sp(ids), sp.shard_sequence(targets), count).backward()
        return {n: relative_error(p.grad.full_tensor(), q.grad)
                for (n, p), q in zip(model.named_parameters(), reference.parameters())}

    out = step()
    result = {"grads": max(out.values())}
    # the plain FSDP2 model after compile (the same batch on every rank): FSDP2's own mean
    model.zero_grad(set_to_none=True)
    _chunked_loss(model.lm_head, model(ids), targets, count).backward()
    result["plain"] = max(relative_error(p.grad.full_tensor(), q.grad)
                          for p, q in zip(model.parameters(), reference.parameters()))
    sp._fsdp_outside.factor = float(world)  # the control: FSDP2's default mean over the world
    result["control"] = step()["inner.lm_head.weight"]
    queue.put((rank, result))


def test_fsdp_groups_of_several_modules_and_a_head_outside(_fresh_seed):
    """torchtitan's FSDP2 grouping (``fully_shard([norm, lm_head])``) with its head applied
    outside the call: before, the outside call found no single root, and FSDP2's own mean
    over the world halved the head's gradient at P = 2."""
    results = run_ranks(_fsdp_body, 2, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        assert r["grads"] <= TOL, f"rank {rank}: {r}"
        assert r["plain"] <= TOL, f"rank {rank}: the plain FSDP2 model after compile: {r}"
        assert r["control"] > 0.1, f"rank {rank}: the control (FSDP2's mean) should be wrong: {r}"
