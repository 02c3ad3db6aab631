"""Selections and non-sum reductions over a sequence-sharded dim: what ``autosp.local_positions``,
``autosp.softmax``, ``autosp.logsumexp`` and ``autosp.amax`` become in the emitted graph.

A rank holds its pieces of the sequence (:func:`collectives.spans`); these functions work
on them so that the group computes what one device computes on the whole sequence:

* :func:`local_positions`: positions of a window (global, negative from its end, as
  ``index``/``gather``/``select`` take them) -> this rank's local row, or its local length
  (one past its rows) where another rank holds the position. The pass pads the sharded
  value with one zero row there, so a rank's ``index``/``gather`` gives its rows and zeros
  for the others', and a sum all-reduce gives every rank the selected rows (the backward of
  the local index reaches the owner's rows only).
* :func:`softmax`: softmax / log-softmax along the sharded dim, in two passes (a max
  all-reduce, then a sum of exponentials), with the exact backward: the one reduction it
  needs (``sum(dy * y)``, or ``sum(dy)`` for the log) is all-reduced too.
* :func:`logsumexp`, :func:`amax`: the replicated reduction (keepdim), backward local
  (each rank's positions get their share from the replicated gradient); ``amax`` splits a
  tie's gradient over the tied positions of every rank, as one device does.

Every function is the identity of one device on a group of one rank, and communicates
nothing under :class:`collectives.simulate`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autosp.runtime import collectives


def _all_reduce(t: torch.Tensor, op: str, group: str, backward: bool = False) -> torch.Tensor:
    """``t`` reduced over the group (in place on a contiguous copy; no autograd)."""
    t = t.contiguous()
    collectives.record("all_reduce", group, t, backward=backward)
    if collectives.simulating() or collectives.group_size(group) == 1:
        return t
    reduce = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    t = t.clone()
    dist.all_reduce(t, op=reduce, group=collectives.process_group(group))
    return t


# ----------------------------------------------------------------------------- selection
def local_positions(positions: torch.Tensor, seq_len: int, *, lo: int, trim: int, group: str) -> torch.Tensor:
    """This rank's local row of each position of the window ``[lo, seq_len - trim)`` (index
    j is frame position ``lo + j``; a negative j counts from the window's end), or its local
    length where another rank holds it. A position outside the window raises, as the
    indexing op would on one device (a rank would otherwise silently select zeros)."""
    window = seq_len - lo - trim
    if positions.numel() and bool(((positions < -window) | (positions >= window)).any()):
        bad = positions[(positions < -window) | (positions >= window)].flatten()[0].item()
        raise IndexError(f"autosp: index {bad} is out of bounds for the sequence dimension of size {window}")
    frame = torch.where(positions < 0, positions + window, positions) + lo
    pieces = collectives.spans(seq_len, lo, trim, collectives.layout(group), collectives.group_rank(group))
    total = sum(b - a for a, b in pieces)
    local = torch.full_like(frame, total)
    offset = 0
    for a, b in pieces:
        local = torch.where((frame >= a) & (frame < b), frame - a + offset, local)
        offset = offset + (b - a)
    return local


# ----------------------------------------------------------------------------- softmax
_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log, group):
        with torch.no_grad():
            m = _all_reduce(x.amax(dim, keepdim=True), "max", group)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf: exp gives 0, log -inf
            s = _all_reduce(torch.exp(x - m).sum(dim, keepdim=True), "sum", group)
            lse = m + torch.log(s)
            y = x - lse if log else torch.exp(x - lse)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.group = dim, log, group
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        if ctx.log:
            total = _all_reduce(dy.sum(ctx.dim, keepdim=True), "sum", ctx.group, backward=True)
            return dy - torch.exp(y) * total, None, None, None
        total = _all_reduce((dy * y).sum(ctx.dim, keepdim=True), "sum", ctx.group, backward=True)
        return y * (dy - total), None, None, None


def softmax(x: torch.Tensor, *, dim: int, log: int, group: str, dtype: str = "") -> torch.Tensor:
    """``softmax`` (``log=0``) or ``log_softmax`` (``log=1``) of a sharded ``x`` along its
    sharded ``dim``, over the whole sequence of the group; ``dtype`` (an MLIR element type,
    e.g. ``"f32"``): the op's dtype argument (``x`` cast first), "" for none."""
    if dtype:
        x = x.to(_DTYPES[dtype])
    if collectives.group_size(group) == 1:
        return torch.log_softmax(x, dim) if log else torch.softmax(x, dim)
    return _Softmax.apply(x, dim % x.dim(), bool(log), group)


# ----------------------------------------------------------------------------- reductions
class _LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        with torch.no_grad():
            m = _all_reduce(x.amax(dim, keepdim=True), "max", group)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            y = m + torch.log(_all_reduce(torch.exp(x - m).sum(dim, keepdim=True), "sum", group))
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        return dy * torch.exp(x - y), None, None


def logsumexp(x: torch.Tensor, *, dim: int, group: str) -> torch.Tensor:
    """``logsumexp(x, dim, keepdim=True)`` over the group's whole sequence (replicated)."""
    if collectives.group_size(group) == 1:
        return torch.logsumexp(x, dim, keepdim=True)
    return _LogSumExp.apply(x, dim % x.dim(), group)


class _Amax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        with torch.no_grad():
            y = _all_reduce(x.amax(dim, keepdim=True), "max", group)
        ctx.save_for_backward(x, y)
        ctx.dim, ctx.group = dim, group
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        tied = (x == y).to(dy.dtype)
        count = _all_reduce(tied.sum(ctx.dim, keepdim=True), "sum", ctx.group, backward=True)
        return dy * tied / count, None, None


def amax(x: torch.Tensor, *, dim: int, group: str) -> torch.Tensor:
    """``amax(x, dim, keepdim=True)`` over the group's whole sequence (replicated); the
    gradient is split evenly over the tied positions of all ranks."""
    if collectives.group_size(group) == 1:
        return torch.amax(x, dim, keepdim=True)
    return _Amax.apply(x, dim % x.dim(), group)


def argmax(x: torch.Tensor, seq_len: int, *, dim: int, lo: int, trim: int, group: str) -> torch.Tensor:
    """``argmax(x, dim, keepdim=True)`` over the group's whole window ``[lo, seq_len - trim)``
    of a sharded ``x`` (replicated, int64, index j = frame position ``lo + j``): the first
    position of the largest value, as one device gives it. Each rank's first local maximum
    is its smallest position among its ties (a rank holds its pieces in sequence order);
    the ranks' (value, position) pairs are gathered and the smallest position of the largest
    value wins. Not differentiable (an index)."""
    dim %= x.dim()
    p = collectives.group_size(group)
    if p == 1:
        return x.argmax(dim, keepdim=True)
    pieces = collectives.spans(seq_len, lo, trim, collectives.layout(group), collectives.group_rank(group))
    with torch.no_grad():
        if x.shape[dim] == 0:
            shape = list(x.shape)
            shape[dim] = 1
            values = x.new_full(shape, -torch.inf)
            index = torch.zeros(shape, dtype=torch.int64, device=x.device)
        else:
            values, index = x.max(dim, keepdim=True)
        position = torch.full_like(index, seq_len)  # past every position: a rank without rows never wins
        offset = 0
        for a, b in pieces:
            held = (index >= offset) & (index < offset + (b - a))
            position = torch.where(held, index - offset + a - lo, position)
            offset = offset + (b - a)
        if collectives.simulating():
            return position
        collectives.record("all_gather", group, values.contiguous())
        all_values = [torch.empty_like(values) for _ in range(p)]
        all_positions = [torch.empty_like(position) for _ in range(p)]
        dist.all_gather(all_values, values.contiguous(), group=collectives.process_group(group))
        dist.all_gather(all_positions, position.contiguous(), group=collectives.process_group(group))
        stacked_values, stacked_positions = torch.stack(all_values), torch.stack(all_positions)
        best = stacked_values.amax(0, keepdim=True)
        tied = torch.where(stacked_values == best, stacked_positions, torch.full_like(stacked_positions, seq_len))
        return tied.amin(0)
