"""Ops that work along the sequence: refused by name, or partitioned exactly (issue 22).

Each entry of :data:`CASES` is one op applied to the hidden state ``h`` [B, S, D] of a
tiny model (embedding -> linear -> causal SDPA -> **the op** -> linear -> cross-entropy).
Along the sequence (dim 1, written 1, -2, a list or a tuple) an op either

* is refused when autosp compiles it for two ranks: an :class:`AutospError` whose message
  names the op autosp saw in the IR (``refused_by``; torch.export decomposes some ops
  first: ``roll`` becomes slices and a ``cat``, ``logsumexp`` a ``max.dim``...), or
* is partitioned exactly (``refused_by=None``: sums over the sequence, and the means and
  variances torch.export writes as sums, pooled into the loss; logsumexp and amax pooled
  into the loss; softmax and log_softmax along it, issue 39): loss and every gradient
  within 1e-5 of single-device eager PyTorch on the full sequence, at sp_size=2 and at
  sp_size=1. A sum fed back onto the tokens is refused: its all-reduce's backward is
  local, right only while the sum stays replicated up to the loss.

Every op also runs along the feature dim (-1) as a control that the check is not
over-eager: all of them in one model (``every_op``), which must compile and match. A negative control switches the check off: the
flip of issue 22 then compiles and its gradients are wrong, so the parity check sees it.

The refusals are checked without ranks (``autosp.driver.transform`` runs the passes alone);
the parity entries run in one ``run_ranks`` call, one entry after another.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from autosp.testing.distributed import run_ranks

TOL = 1e-5
SEQ = 15  # not divisible by 2: uneven shards


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable  # (h, dim) -> a tensor shaped like h; dim is the dim it works along
    refused_by: str | None  # the op the diagnostic names along the sequence; None: exact
    seq_dims: tuple = (1, -2)  # how the sequence dim is written for this entry
    pooled: bool = False  # the op's result enters the loss (an auxiliary term), not the tokens


def _keep(reduced, h):
    return reduced + h  # a [B, 1, D] (or [B, S, 1]) reduction broadcast back onto h


CASES = [
    # ops.MIXING_ALONG_DIM of old (dim at operand 1, or a list), and flip / roll
    Case("flip", lambda h, d: torch.flip(h, [d]), "torch.aten.flip"),
    Case("flip_tuple", lambda h, d: torch.flip(h, (d,)), "torch.aten.flip", seq_dims=(1,)),
    Case("roll_int", lambda h, d: torch.roll(h, 1, d), "torch.aten.slice.Tensor", seq_dims=(-2,)),
    Case("roll_tuple", lambda h, d: torch.roll(h, (2,), (d,)), "torch.aten.slice.Tensor", seq_dims=(1,)),
    Case("cumsum", lambda h, d: h.cumsum(d), "torch.aten.cumsum"),
    Case("cumprod", lambda h, d: h.cumprod(d), "torch.aten.cumprod", seq_dims=(1,)),
    Case("logcumsumexp", lambda h, d: h.logcumsumexp(d), "torch.aten.cumsum", seq_dims=(1,)),  # exp, cumsum, log
    Case("sort", lambda h, d: h.sort(d).values, "torch.aten.sort", seq_dims=(-2,)),
    Case("argsort", lambda h, d: h.argsort(d).float() + h, "torch.aten.sort", seq_dims=(1,)),
    Case("topk", lambda h, d: _keep(h.topk(2, d).values.sum(d, keepdim=True), h), "torch.aten.sort", seq_dims=(1,)),
    # reductions along the sequence other than sum
    # (amax and logsumexp split over the sequence, replicated: fed back onto the tokens they are
    # refused as a sum is, below; pooled into the loss they are exact)
    Case("amax", lambda h, d: _keep(h.amax(d, keepdim=True), h), "torch.aten.add.Tensor", seq_dims=(-2,)),
    Case("amin", lambda h, d: _keep(h.amin(d, keepdim=True), h), "torch.aten.min.dim", seq_dims=(1,)),
    # argmax over the sequence: autosp.argmax (its positions replicated, no gradient)
    Case("argmax", lambda h, d: _keep(h.argmax(d, keepdim=True).float(), h), None, seq_dims=(1,)),
    Case("prod", lambda h, d: _keep(h.prod(d, keepdim=True), h), "torch.aten.prod.dim_int", seq_dims=(1,)),
    Case("logsumexp", lambda h, d: _keep(h.logsumexp(d, keepdim=True), h), "torch.aten.add.Tensor", seq_dims=(1,)),
    Case("norm", lambda h, d: _keep(h.norm(dim=d, keepdim=True), h), "torch.aten.linalg_vector_norm", seq_dims=(1,)),
    Case("any", lambda h, d: _keep((h > 0).any(d, keepdim=True).float(), h), "torch.aten.any.dim", seq_dims=(1,)),
    Case("kthvalue", lambda h, d: _keep(h.kthvalue(2, d, keepdim=True).values, h), "torch.aten.kthvalue",
         seq_dims=(1,)),
    # ops that pick or move positions along a dim
    Case("gather", lambda h, d: h.gather(d, torch.zeros_like(h, dtype=torch.long)), "torch.aten.gather", seq_dims=(1,)),
    Case("index_select", lambda h, d: h.index_select(d, torch.zeros(h.shape[d], dtype=torch.long)),
         "torch.aten.index_select", seq_dims=(1,)),
    Case("diff", lambda h, d: torch.diff(h, dim=d, prepend=h.narrow(d, 0, 1)), "torch.aten.cat",
         seq_dims=(1,)),
    Case("cat", lambda h, d: torch.cat([h, h * 2], d).narrow(d, 0, h.shape[d]), "torch.aten.cat", seq_dims=(1,)),
    # exact along the sequence: a sum splits into local sums and an all-reduce; mean and
    # var arrive as sums divided by the (global) length. Pooled into the loss, replicated:
    Case("sum", lambda h, d: h.sum(d, keepdim=True), None, pooled=True),
    Case("mean", lambda h, d: h.mean(d, keepdim=True), None, seq_dims=(-2,), pooled=True),
    Case("mean_dropped", lambda h, d: h.mean(d), None, seq_dims=(1,), pooled=True),
    # softmax and log_softmax along the sequence: autosp.softmax (a max and a sum all-reduce,
    # the backward's sum all-reduced), the result sharded like its input
    Case("softmax", lambda h, d: h.softmax(d), None, seq_dims=(1,)),
    Case("_softmax", lambda h, d: torch._softmax(h, d, False), None, seq_dims=(1,)),
    Case("log_softmax", lambda h, d: h.log_softmax(d), None, seq_dims=(1,)),
    Case("_log_softmax", lambda h, d: torch._log_softmax(h, d, False), None, seq_dims=(-2,)),
    # logsumexp and amax over the sequence: autosp.logsumexp / autosp.amax, replicated
    Case("logsumexp_pooled", lambda h, d: h.logsumexp(d, keepdim=True), None, seq_dims=(1,), pooled=True),
    Case("amax_pooled", lambda h, d: h.amax(d), None, seq_dims=(-2,), pooled=True),
    # var over the sequence: x - mean(x) feeds the mean back onto the tokens (below)
    Case("var", lambda h, d: h.var(d, keepdim=True), "torch.aten.sub.Tensor", seq_dims=(1,), pooled=True),
    # ... but fed back onto the tokens, each rank's gradient of the sum would be its own
    # positions' share only (the all-reduce's backward is local): refused
    Case("sum_onto_tokens", lambda h, d: _keep(h.sum(d, keepdim=True), h), "torch.aten.add.Tensor", seq_dims=(1,)),
    Case("mean_onto_tokens", lambda h, d: h.mean(d).unsqueeze(d) * h, "torch.aten.mul.Tensor", seq_dims=(-2,)),
]
# torch.cummax, cummin and median(dim) along any dim fail torch-mlir's import (ops it does
# not lower), before autosp sees them: not entries here.


def _every_op(h, d):
    """Every entry's op along ``d`` in one program (bounded by tanh, added onto the tokens):
    along the features, one compilation shows that none of them is refused there."""
    total = h
    for case in CASES:
        r = case.fn(h, d)
        total = total + 0.01 * torch.tanh(r if r.dim() == h.dim() else r.unsqueeze(d))
    return total


ALL_ALONG_FEATURES = Case("every_op", _every_op, None, seq_dims=())

# Along the sequence: each written form of the sequence dim; along the features: -1.
SEQ_ENTRIES = [(c, d) for c in CASES for d in c.seq_dims]
BY_NAME = {c.name: c for c in (*CASES, ALL_ALONG_FEATURES)}


class _Model(torch.nn.Module):
    """embedding -> linear -> causal SDPA (autosp partitions a model with attention) ->
    ``fn(h, dim)`` -> linear -> cross-entropy."""

    def __init__(self, fn, dim, pooled=False, vocab=64, hidden=16, heads=2):
        super().__init__()
        self.fn, self.dim, self.pooled, self.heads = fn, dim, pooled, heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids, labels):
        h = self.proj(self.embed(ids))
        b, s, d = h.shape
        q = h.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        h = h + F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(b, s, d)
        aux = self.fn(h, self.dim).square().sum() * 1e-3 if self.pooled else 0.0
        if not self.pooled:
            h = self.fn(h, self.dim)
        logits = self.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)) + aux


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64, (2, SEQ), generator=gen), torch.randint(0, 64, (2, SEQ), generator=gen)


def _model(name, dim, seed):
    torch.manual_seed(seed)
    return _Model(BY_NAME[name].fn, dim, BY_NAME[name].pooled)


# ---------------------------------------------------------------- refusals (no ranks)
REFUSED = [(c, d) for c, d in SEQ_ENTRIES if c.refused_by is not None]


@pytest.mark.parametrize("case, dim", REFUSED, ids=[f"{c.name}-dim{d}" for c, d in REFUSED])
def test_along_the_sequence_is_refused_by_name(case, dim):
    from autosp.driver import transform
    from autosp.ir.diagnostics import AutospError
    ids, labels = _inputs(0)
    model = _model(case.name, dim, 0)
    with pytest.raises(AutospError) as err:
        transform(model, (ids,), {"labels": labels}, sp_size=2)
    message = str(err.value)
    assert f"'{case.refused_by}' op" in message, message
    assert "error:" in message and ".py:" in message, f"no source location in: {message}"


# ---------------------------------------------------------------- parity (two ranks)
# Along the features, every op at once in one model (one compilation instead of one per op),
# and flip alone (issue 22's op).
EXACT = [(c.name, d) for c, d in SEQ_ENTRIES if c.refused_by is None] + [("every_op", -1), ("flip", -1)]
# sp_size=1 (an exact round trip, no sharding) for the pooled entries along the sequence, one
# that stays on the tokens (softmax) and one control: enough to see it behave as world 2 does,
# at a fraction of the time.
SP1 = {e for e in EXACT if e[1] != -1 and BY_NAME[e[0]].pooled} | {("softmax", 1), ("every_op", -1)}


def _parity_body(rank, world, queue, entries, seed):
    """Every entry on these two ranks: compiled at sp_size=2 and at sp_size=1, each against
    eager on the full sequence; then the negative control. Reports per entry, never raises
    (a failure of one entry must not hide the others)."""
    from autosp.passes.shard_sequence import Rules

    import autosp
    from autosp.ir.diagnostics import AutospError
    from autosp.testing.parity import parity

    ids, labels = _inputs(seed)
    results = {}
    for name, dim in entries:
        row = {}
        for sp_size in (2, 1) if (name, dim) in SP1 else (2,):
            model = _model(name, dim, seed)
            reference = copy.deepcopy(model)
            try:
                compiled = autosp.compile(model, sp_size=sp_size)
                report = parity(reference, compiled, ids, labels=labels)
                row[sp_size] = (report.max_output_error, report.max_grad_error,
                                float(compiled(ids, labels=labels).detach()))
            except AutospError as e:
                row[sp_size] = str(e).splitlines()[0]
        results[(name, dim)] = row
    # Negative control: without the token-wise check, issue 22's flip along the sequence
    # compiles (each rank flips its own shard).
    original = Rules.check_token_wise
    Rules.check_token_wise = lambda self, op, kind, tensor_operands: None
    try:
        model = _model("flip", 1, seed)
        reference = copy.deepcopy(model)
        report = parity(reference, autosp.compile(model, sp_size=2), ids, labels=labels)
        results["unchecked_flip"] = (report.max_output_error, report.max_grad_error)
    except AutospError as e:
        results["unchecked_flip"] = str(e).splitlines()[0]
    finally:
        Rules.check_token_wise = original
    queue.put((rank, results))


@pytest.fixture(scope="module")
def parity_results():
    return run_ranks(_parity_body, 2, args=(EXACT, 1234), timeout=600)


@pytest.mark.parametrize("name, dim", EXACT, ids=[f"{n}-dim{d}" for n, d in EXACT])
def test_compiles_and_matches_single_device(parity_results, name, dim):
    for rank, results in parity_results.items():
        row = results[(name, dim)]
        for sp_size in row:
            assert not isinstance(row[sp_size], str), f"rank {rank} sp_size={sp_size} refused: {row[sp_size]}"
            out_err, grad_err, _ = row[sp_size]
            assert out_err <= TOL and grad_err <= TOL, \
                f"rank {rank} sp_size={sp_size}: loss {out_err:.2e}, grads {grad_err:.2e}"
        if 1 in row:
            loss2, loss1 = row[2][2], row[1][2]
            assert abs(loss2 - loss1) <= TOL * max(1.0, abs(loss1)), f"sp_size=2 {loss2} vs sp_size=1 {loss1}"


def test_negative_control_unchecked_flip_is_wrong(parity_results):
    for rank, results in parity_results.items():
        assert not isinstance(results["unchecked_flip"], str), results["unchecked_flip"]
        out_err, grad_err = results["unchecked_flip"]
        assert max(out_err, grad_err) > 1e-3, \
            f"rank {rank}: with the check off, flip along the sequence went unnoticed ({out_err:.1e}, {grad_err:.1e})"
