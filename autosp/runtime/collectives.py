"""Runtime collectives: what the autosp dialect's ops become in the emitted FX graph.

Each function takes a group *name* resolved through :func:`register_group`, so emitted
graphs hold no process-group objects. Every compiled module uses a name of its own
(``autosp0``, ``autosp1``, ...) bound to its own process group, so two modules on
different groups never resolve each other's; a name nobody registered (``"sp"`` in a
hand-written test) means the default group. On a group of one rank every function is an
identity, which keeps ``sp_size=1`` an exact round trip.

**Sequence chunks.** A sequence of length S is split over P ranks evenly: rank r holds
positions ``[r*S // P, (r+1)*S // P)``; lengths differ by at most one, so no length needs
to be divisible by P and no token is dropped or padded (and the formula has no branch, so
``torch.compile`` keeps S symbolic). A value may live on a *window* ``[lo, S - trim)`` of that frame (the
labels of a causal-LM loss are shifted by one); each rank then holds the part of its
chunk inside the window.

**Gradients (SPMD).** Every rank runs the same program and differentiates its own copy.
A collective whose result is replicated (``all_reduce``, ``all_gather``) therefore has a
*local* backward (identity / this rank's slice): each rank back-propagates its own share,
and summing the parameter gradients over the group gives the single-device gradient.
``all_to_all`` is a permutation, and its backward is the inverse exchange.

This module is the bottom of the dependency graph: it imports nothing else of autosp.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_GROUPS: dict[str, object] = {}
_SIMULATED: list = []  # [(size, rank)] while simulate() is active


class simulate:
    """Context manager: every group has ``size`` ranks and this process is ``rank``; the
    collectives return tensors of the right shape without communicating (their contents
    are undefined). For the memory model, which runs programs on meta tensors.

    Example::

        with collectives.simulate(8, rank=0):
            loss = program(model, leaves)      # as rank 0 of 8, no process group needed
    """

    def __init__(self, size: int, rank: int = 0):
        self.size, self.rank = size, rank

    def __enter__(self):
        _SIMULATED.append((self.size, self.rank))
        return self

    def __exit__(self, *exc):
        _SIMULATED.pop()


class _SimulatedExchange(torch.autograd.Function):
    """Shape-only stand-in for a collective: ``numel`` elements out, ``x``'s shape back."""

    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = x.shape
        return x.new_empty(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty(ctx.shape), None


def register_group(name: str, group) -> None:
    """Bind a group name used in the IR (``group = "autosp0"``) to a process group (None:
    the default group). ``AutospModule`` registers one unique name per module."""
    _GROUPS[name] = group


def group_size(name: str) -> int:
    """Ranks in group ``name`` (1 when torch.distributed is not initialised)."""
    if _SIMULATED:
        return _SIMULATED[-1][0]
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(_GROUPS.get(name))


def group_rank(name: str) -> int:
    """This rank's index in group ``name`` (0 when torch.distributed is not initialised)."""
    if _SIMULATED:
        return _SIMULATED[-1][1]
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(_GROUPS.get(name))


def _group(name: str):
    g = _GROUPS.get(name)
    return g if g is not None else dist.group.WORLD


# ----------------------------------------------------------------------------- chunks
def chunk(seq_len: int, ranks: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of ``rank``'s chunk of a length-``seq_len`` sequence."""
    return rank * seq_len // ranks, (rank + 1) * seq_len // ranks


def span(seq_len: int, lo: int, trim: int, ranks: int, rank: int) -> tuple[int, int]:
    """This rank's part ``[a, b)`` (frame positions) of the window ``[lo, seq_len - trim)``."""
    start, end = chunk(seq_len, ranks, rank)
    a = torch.sym_max(start, lo)
    b = torch.sym_max(a, torch.sym_min(end, seq_len - trim))
    return a, b


def local_len(seq_len: int, lo: int, trim: int, group: str) -> int:
    """How many positions of the window ``[lo, seq_len - trim)`` this rank holds."""
    a, b = span(seq_len, lo, trim, group_size(group), group_rank(group))
    return b - a


def shard(x: torch.Tensor, seq_len: int, dim: int, lo: int, trim: int, group: str) -> torch.Tensor:
    """Replicated -> sharded, no communication: ``x`` holds the window ``[lo, seq_len - trim)``
    (index j is frame position lo + j); keep this rank's part of it.

    ``dim`` may also be a flattened (outer x window) dimension, the window innermost, as
    ``labels[:, 1:].reshape(-1)``: then each of its ``outer`` rows is sliced alike.
    """
    p = group_size(group)
    if p == 1:
        return x
    a, b = span(seq_len, lo, trim, p, group_rank(group))
    dim %= x.dim()
    window = seq_len - lo - trim
    size = x.shape[dim]
    if size == window:
        return x.narrow(dim, a - lo, b - a)
    if window <= 0 or size % window:
        raise RuntimeError(f"autosp.shard: dim {dim} of size {size} is not the sequence window ({window}) "
                           "or a multiple of it")
    outer = size // window
    rows = x.unflatten(dim, (outer, window)).narrow(dim + 1, a - lo, b - a)
    return rows.flatten(dim, dim + 1)


def rewindow(x: torch.Tensor, seq_len: int, dim: int, lo: int, trim: int, new_lo: int, new_trim: int,
             group: str) -> torch.Tensor:
    """A sharded value on window (lo, trim) narrowed to the window (new_lo, new_trim) inside it."""
    p = group_size(group)
    if p == 1:
        return x.narrow(dim, new_lo - lo, seq_len - new_trim - new_lo)
    r = group_rank(group)
    a, _ = span(seq_len, lo, trim, p, r)
    na, nb = span(seq_len, new_lo, new_trim, p, r)
    return x.narrow(dim, torch.sym_min(na - a, x.shape[dim]), nb - na)


# ----------------------------------------------------------------------------- all_to_all
class _AllToAllSingle(torch.autograd.Function):
    """A flat all-to-all with per-rank split sizes; the backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, send, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        received = send.new_empty(sum(out_splits))
        dist.all_to_all_single(received, send.contiguous(), out_splits, in_splits, group=group)
        return received

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        sent_back = grad.new_empty(sum(in_splits))
        dist.all_to_all_single(sent_back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return sent_back, None, None, None


def all_to_all(x: torch.Tensor, split_dim: int, concat_dim: int, seq_dim: int, group: str,
               seq_len: int | None = None) -> torch.Tensor:
    """Split ``split_dim`` into P parts, send part i to rank i, concatenate what arrives along
    ``concat_dim`` (in rank order).

    ``seq_dim`` names which of the two is the sequence (or -1 for neither): that side is
    split or assembled in the uneven chunks of ``seq_len`` (the full length; needed when the
    sequence is the concatenated side); the other side must divide by P.
    """
    p = group_size(group)
    if p == 1:
        return x
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    nd = x.dim()
    split_dim, concat_dim = split_dim % nd, concat_dim % nd
    seq_dim = seq_dim % nd if seq_dim >= 0 else -1
    rank = group_rank(group)

    # Parts to send: along split_dim, even or in sequence chunks.
    size = x.shape[split_dim]
    if seq_dim == split_dim:
        bounds = [chunk(size, p, i) for i in range(p)]
    else:
        if size % p:
            raise RuntimeError(f"autosp.all_to_all: dim {split_dim} of size {size} does not divide "
                               f"over {p} ranks")
        bounds = [(i * size // p, (i + 1) * size // p) for i in range(p)]
    parts = [x.narrow(split_dim, a, b - a) for a, b in bounds]
    send = torch.cat([t.reshape(-1) for t in parts])
    in_splits = [t.numel() for t in parts]

    # Shapes that arrive: this rank's part of split_dim, and rank i's extent of concat_dim.
    my_part = list(parts[rank].shape)
    if seq_dim == concat_dim:
        if seq_len is None:
            raise RuntimeError("autosp.all_to_all: gathering the sequence needs its full length")
        extents = [b - a for a, b in (chunk(seq_len, p, i) for i in range(p))]
    else:
        extents = [x.shape[concat_dim]] * p
    shapes = []
    for e in extents:
        s = list(my_part)
        s[concat_dim] = e
        shapes.append(s)
    out_splits = [int(torch.Size(s).numel()) for s in shapes]
    if _SIMULATED:
        received = _SimulatedExchange.apply(send, (sum(out_splits),))
    elif torch.compiler.is_compiling():  # functional collectives: traceable by torch.compile
        received = all_to_all_single_autograd(send, out_splits, in_splits, _group(group))
    else:  # eager: the process group's own call, without the functional wrapper's overhead
        received = _AllToAllSingle.apply(send, out_splits, in_splits, _group(group))
    pieces = torch.split(received, out_splits)
    return torch.cat([piece.view(s) for piece, s in zip(pieces, shapes)], dim=concat_dim)


# ----------------------------------------------------------------------------- reductions
class _AllReduceLocalBackward(torch.autograd.Function):
    """Forward: reduce over the group. Backward: identity (each rank's own share, see module doc)."""

    @staticmethod
    def forward(ctx, x, reduce_op, group):
        from torch.distributed._functional_collectives import all_reduce as _all_reduce, wait_tensor
        if _SIMULATED:
            return x.clone()
        return wait_tensor(_all_reduce(x.contiguous(), reduce_op, _group(group)))

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def all_reduce(x: torch.Tensor, reduce_op: str, group: str) -> torch.Tensor:
    """Reduce ``x`` over the group (``sum``/``max``/``min``); every rank gets the result.

    Used where every rank then computes the same replicated value (a global loss): the
    backward is local (identity), see the module docstring.
    """
    if group_size(group) == 1:
        return x
    return _AllReduceLocalBackward.apply(x, reduce_op, group)


class _AllGatherLocalBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, seq_len, lo, trim):
        p, r = group_size(group), group_rank(group)
        spans = [span(seq_len, lo, trim, p, i) for i in range(p)]
        longest = max(b - a for a, b in spans)
        padded = x
        if x.shape[dim] < longest:
            pad_shape = list(x.shape)
            pad_shape[dim] = longest - x.shape[dim]
            padded = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        gathered = [torch.empty_like(padded) for _ in range(p)]
        if not _SIMULATED:
            dist.all_gather(gathered, padded.contiguous(), group=_group(group))
        ctx.dim, ctx.offset, ctx.length = dim, spans[r][0] - spans[0][0], spans[r][1] - spans[r][0]
        return torch.cat([g.narrow(dim, 0, b - a) for g, (a, b) in zip(gathered, spans)], dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.dim, ctx.offset, ctx.length), None, None, None, None, None


def all_gather(x: torch.Tensor, dim: int, group: str, seq_len: int | None = None, lo: int = 0,
               trim: int = 0) -> torch.Tensor:
    """Concatenate every rank's part along ``dim``. With ``seq_len``, the parts are the uneven
    pieces of the window ``[lo, seq_len - trim)``; without, all parts have ``x``'s size.
    The backward is local: this rank's slice of the gradient."""
    p = group_size(group)
    if p == 1:
        return x
    dim %= x.dim()
    if seq_len is None:
        n = x.shape[dim] * p
        seq_len, lo, trim = n, 0, 0
    return _AllGatherLocalBackward.apply(x, dim, group, seq_len, lo, trim)


def reduce_scatter(x: torch.Tensor, dim: int, reduce_op: str, group: str) -> torch.Tensor:
    """Reduce over the group, keep this rank's equal chunk of ``dim``."""
    if group_size(group) == 1:
        return x
    from torch.distributed._functional_collectives import reduce_scatter_tensor_autograd
    if _SIMULATED:
        shape = list(x.shape)
        shape[dim % x.dim()] //= group_size(group)
        return _SimulatedExchange.apply(x, tuple(shape))
    return reduce_scatter_tensor_autograd(x.contiguous(), reduce_op, dim % x.dim(), _group(group))
