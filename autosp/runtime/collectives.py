"""Runtime collectives: what the autosp dialect's ops become in the emitted FX graph.

Each function takes a group *name* resolved through :func:`register_group`, so emitted
graphs hold no process-group objects. Every compiled module uses a name of its own
(``autosp0``, ``autosp1``, ...) bound to its own process group, so two modules on
different groups never resolve each other's; a name nobody registered (``"sp"`` in a
hand-written test) means the default group. On a group of one rank every function is an
identity, which keeps ``sp_size=1`` an exact round trip.

**Who owns a name.** A compiled module's names are bound by its
:class:`autosp.runtime.context.RuntimeContext`, which removes them when the module is
garbage-collected. A name registered here directly (tests, benchmarks) stays until
:func:`unregister_group`.

Example::

    collectives.register_group("sp", pg)            # pg: a ProcessGroup (None: the default group)
    y = collectives.all_to_all(x, 2, 1, 1, "sp", seq_len=S)
    collectives.unregister_group("sp")

**Sequence chunks.** A sequence of length S is split over P ranks evenly: rank r holds
positions ``[r*S // P, (r+1)*S // P)``; lengths differ by at most one, so no length needs
to be divisible by P and no token is dropped or padded (and the formula has no branch, so
``torch.compile`` keeps S symbolic). A value may live on a *window* ``[lo, S - trim)`` of that frame (the
labels of a causal-LM loss are shifted by one); each rank then holds the part of its
chunk inside the window.

**Layouts** (:class:`SeqLayout`). With ring attention the group is a mesh of ``ring``
groups of ``ulysses`` ranks (rank ``g = i * ulysses + j``: ring index i, Ulysses index j).
The sequence is cut into ``ring`` chunks, or ``2 * ring`` with ``zigzag`` (ring group i
then holds chunks i and ``2*ring - 1 - i``, so causal attention costs every ring rank the
same); ring group i's chunks, concatenated, are split evenly over its ``ulysses`` ranks.
A rank thus holds one or two *pieces* (absolute ranges) of the sequence, in that order:
:meth:`SeqLayout.pieces`. With one ring group (Ulysses) that is the even split above.
Sub-groups are named after the group: ``"<name>:ulysses"`` (the ranks of one ring index)
and ``"<name>:ring"`` (the ranks of one Ulysses index).

**Gradients (SPMD).** Every rank runs the same program and differentiates its own copy.
A collective whose result is replicated (``all_reduce``, ``all_gather``) therefore has a
*local* backward (identity / this rank's slice): each rank back-propagates its own share,
and summing the parameter gradients over the group gives the single-device gradient.
``all_to_all`` is a permutation, and its backward is the inverse exchange.

This module is the bottom of the dependency graph: it imports nothing else of autosp but
:class:`~autosp.ir.layout.SeqLayout` (plain data).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autosp.ir.layout import SeqLayout, chunk
from autosp.runtime import opaque

# The name tables. Plain dicts, read on every collective: torch.compile traces reads of a
# dict (not of a WeakValueDictionary). Their entries are owned: see "Who owns a name".
_GROUPS: dict[str, object] = {}        # group name -> process group (None: the default group)
_LAYOUTS: dict[str, SeqLayout] = {}    # base group name -> its sequence layout (default: even split)
_SIMULATED: list = []  # [(size, rank, layout)] while simulate() is active; see simulating()


def _base(name: str) -> tuple[str, str]:
    """``"autosp0:ring"`` -> ``("autosp0", "ring")``; a plain name -> ``(name, "")``."""
    base, _, axis = name.partition(":")
    return base, axis


def layout(name: str) -> SeqLayout:
    """The layout of group ``name``'s sequence-parallel group (its base name's)."""
    base, _ = _base(name)
    found = _LAYOUTS.get(base)
    if found is not None:
        return found
    if _SIMULATED and _SIMULATED[-1][2] is not None:
        return _SIMULATED[-1][2]
    return SeqLayout(ulysses=group_size(base))


class simulate:
    """Context manager: every group has ``size`` ranks and this process is ``rank``; the
    collectives return tensors of the right shape without communicating (their contents
    are undefined). For the memory model, which runs programs on meta tensors.

    Example::

        with collectives.simulate(8, rank=0):
            loss = program(model, leaves)      # as rank 0 of 8, no process group needed
    """

    def __init__(self, size: int, rank: int = 0, layout: SeqLayout | None = None):
        self.size, self.rank, self.layout = size, rank, layout

    def __enter__(self):
        _SIMULATED.append((self.size, self.rank, self.layout))
        return self

    def __exit__(self, *exc):
        _SIMULATED.pop()


def simulating() -> bool:
    """Whether a :class:`simulate` block is active (collectives then communicate nothing).

    Example::

        >>> with collectives.simulate(8):
        ...     collectives.simulating()
        True
    """
    return bool(_SIMULATED)


# The observers' record lists, innermost last (a plain list, like _SIMULATED: torch.compile
# traces reads of it, where it cannot trace a ContextVar).
_OBSERVERS: list = []


@dataclass
class WireRecord:
    """One tensor handed to a collective (or a ring send): what a process group sees."""
    kind: str               # "all_to_all", "all_reduce", "all_gather", "reduce_scatter", "send", ...
    group: str
    shape: tuple
    dtype: torch.dtype
    contiguous: bool
    bytes: int
    backward: bool = False  # issued by the backward pass


class observe:
    """Context manager: every collective issued inside it (real or simulated) is appended
    to ``records`` as a :class:`WireRecord` (the fake-CUDA harness checks them: contiguous
    inputs, dtypes NCCL takes, bytes per step)."""

    def __init__(self):
        self.records: list[WireRecord] = []

    def __enter__(self) -> observe:
        _OBSERVERS.append(self.records)
        return self

    def __exit__(self, *exc):
        i = next(i for i in range(len(_OBSERVERS) - 1, -1, -1) if _OBSERVERS[i] is self.records)
        del _OBSERVERS[i]


def record(kind: str, group: str, t: torch.Tensor, backward: bool = False) -> None:
    """Note ``t`` as handed to a collective of ``kind`` over ``group`` (see :class:`observe`)."""
    if _OBSERVERS:
        _OBSERVERS[-1].append(WireRecord(kind, str(group), tuple(t.shape), t.dtype, t.is_contiguous(),
                                  t.numel() * t.element_size(), backward))


class _SimulatedExchange(torch.autograd.Function):
    """Shape-only stand-in for a collective: ``numel`` elements out, ``x``'s shape back."""

    @staticmethod
    def forward(ctx, x, shape, kind="exchange", group=""):
        ctx.shape, ctx.kind, ctx.group = x.shape, kind, group
        record(kind, group, x)
        return x.new_empty(shape)

    @staticmethod
    def backward(ctx, grad):
        record(ctx.kind, ctx.group, grad.contiguous(), backward=True)
        return grad.new_empty(ctx.shape), None, None, None


def register_group(name: str, group, layout: SeqLayout | None = None) -> None:
    """Bind a group name used in the IR (``group = "autosp0"``) to a process group (None:
    the default group), and a plain name to its sequence ``layout`` (None: the even split).
    ``AutospModule`` binds one unique name per module through its
    :class:`~autosp.runtime.context.RuntimeContext`, and for a mesh layout (ring attention)
    its sub-groups ``name:ulysses`` and ``name:ring`` too. A name registered directly stays
    until :func:`unregister_group` (or until the context owning that name releases it)."""
    _GROUPS[name] = group
    if layout is not None:
        _LAYOUTS[name] = layout
    elif ":" not in name:
        _LAYOUTS.pop(name, None)


def unregister_group(name: str) -> None:
    """Forget ``name`` (and a plain name's layout): it means the default group again.
    Nothing happens for a name that is not registered."""
    _GROUPS.pop(name, None)
    if ":" not in name:
        _LAYOUTS.pop(name, None)


def registered_groups() -> dict[str, object]:
    """A copy of the names registered now, each with its process group (None: the default)."""
    return dict(_GROUPS)


def _simulated_index(name: str) -> tuple[int, int]:
    size, rank, _ = _SIMULATED[-1]
    base, axis = _base(name)
    if not axis:
        return size, rank
    lay = layout(base)
    i, j = divmod(rank, lay.ulysses)
    return (lay.ulysses, j) if axis == "ulysses" else (lay.ring, i)


def group_size(name: str) -> int:
    """Ranks in group ``name`` (1 when torch.distributed is not initialised)."""
    if _SIMULATED:
        return _simulated_index(name)[0]
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group(name))


def group_rank(name: str) -> int:
    """This rank's index in group ``name`` (0 when torch.distributed is not initialised)."""
    if _SIMULATED:
        return _simulated_index(name)[1]
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(process_group(name))


def process_group(name: str):
    """The process group ``name`` resolves to (an unregistered plain name: the default group);
    RuntimeError for an unregistered sub-group (``"autosp0:ring"``)."""
    g = _GROUPS.get(name)
    if g is None and ":" in name and name not in _GROUPS:
        raise RuntimeError(f"autosp: sub-group {name!r} is not registered (the compiled module registers "
                           "its ring and Ulysses groups before running)")
    return g if g is not None else dist.group.WORLD


# ----------------------------------------------------------------------------- chunks
def spans(seq_len: int, lo: int, trim: int, lay: SeqLayout, rank: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s pieces ``[(a, b), ...]`` (frame positions) of the window
    ``[lo, seq_len - trim)``, in the order it holds them (possibly empty)."""
    out = []
    for start, end in lay.pieces(seq_len, rank):
        a = torch.sym_max(start, lo)
        out.append((a, torch.sym_max(a, torch.sym_min(end, seq_len - trim))))
    return out


def span(seq_len: int, lo: int, trim: int, ranks: int, rank: int) -> tuple[int, int]:
    """This rank's part ``[a, b)`` of the window ``[lo, seq_len - trim)`` under the even
    split (one piece)."""
    return spans(seq_len, lo, trim, SeqLayout(ulysses=ranks), rank)[0]


def _length(pieces) -> int:
    return sum(b - a for a, b in pieces)


def local_len(seq_len: int, lo: int, trim: int, group: str) -> int:
    """How many positions of the window ``[lo, seq_len - trim)`` this rank holds."""
    return _length(spans(seq_len, lo, trim, layout(group), group_rank(group)))


def _narrow_pieces(x: torch.Tensor, dim: int, offset: int, pieces) -> torch.Tensor:
    """The pieces ``[(a, b), ...]`` of ``x`` along ``dim``, where index j of ``x`` is frame
    position ``offset + j``, concatenated (no copy for one piece)."""
    parts = [x.narrow(dim, a - offset, b - a) for a, b in pieces]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def shard(x: torch.Tensor, seq_len: int, dim: int, lo: int, trim: int, group: str) -> torch.Tensor:
    """Replicated -> sharded, no communication: ``x`` holds the window ``[lo, seq_len - trim)``
    (index j is frame position lo + j); keep this rank's pieces of it.

    ``dim`` may also be a flattened (outer x window) dimension, the window innermost, as
    ``labels[:, 1:].reshape(-1)``: then each of its ``outer`` rows is sliced alike.
    """
    p = group_size(group)
    if p == 1:
        return x
    pieces = spans(seq_len, lo, trim, layout(group), group_rank(group))
    dim %= x.dim()
    window = seq_len - lo - trim
    size = x.shape[dim]
    if size == window:
        return _narrow_pieces(x, dim, lo, pieces)
    if window <= 0 or size % window:
        raise RuntimeError(f"autosp.shard: dim {dim} of size {size} is not the sequence window ({window}) "
                           "or a multiple of it")
    outer = size // window
    rows = _narrow_pieces(x.unflatten(dim, (outer, window)), dim + 1, lo, pieces)
    return rows.flatten(dim, dim + 1)


def rewindow(x: torch.Tensor, seq_len: int, dim: int, lo: int, trim: int, new_lo: int, new_trim: int,
             group: str) -> torch.Tensor:
    """A sharded value on window (lo, trim) narrowed to the window (new_lo, new_trim) inside it."""
    p = group_size(group)
    if p == 1:
        return x.narrow(dim, new_lo - lo, seq_len - new_trim - new_lo)
    lay, r = layout(group), group_rank(group)
    old, new = spans(seq_len, lo, trim, lay, r), spans(seq_len, new_lo, new_trim, lay, r)
    parts, offset = [], 0
    for (a, b), (na, nb) in zip(old, new):  # the same pieces, each narrowed
        parts.append(x.narrow(dim, torch.sym_min(offset + na - a, x.shape[dim]), nb - na))
        offset = offset + (b - a)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def restore_sequence_order(x: torch.Tensor, dim: int, group: str, seq_len: int | None = None) -> torch.Tensor:
    """All ranks' local shards of a sequence-sharded ``x`` gathered in sequence order
    (the inverse of the layout's permutation; see the module docstring). ``seq_len``: the
    full length (default: the sum of the local lengths)."""
    return all_gather(x, dim, group, seq_len=seq_len if seq_len is not None else _total_len(x, dim, group))


def _total_len(x: torch.Tensor, dim: int, group: str) -> int:
    n = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    if group_size(group) > 1 and not _SIMULATED:
        dist.all_reduce(n, group=process_group(group))
    return int(n) if not _SIMULATED else x.shape[dim] * group_size(group)


# ----------------------------------------------------------------------------- all_to_all
class _AllToAllSingle(torch.autograd.Function):
    """A flat all-to-all with per-rank split sizes; the backward is the inverse exchange."""

    @staticmethod
    def forward(ctx, send, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        received = send.new_empty(sum(out_splits))
        send = send.contiguous()
        record("all_to_all", group, send)
        dist.all_to_all_single(received, send, out_splits, in_splits, group=group)
        return received

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        sent_back = grad.new_empty(sum(in_splits))
        grad = grad.contiguous()
        record("all_to_all", ctx.group, grad, backward=True)
        dist.all_to_all_single(sent_back, grad, in_splits, out_splits, group=ctx.group)
        return sent_back, None, None, None


def _frame_len(group: str, seq_len: int) -> int:
    """The length a Ulysses all-to-all over ``group`` gathers: the whole sequence, or on a
    mesh (``name:ulysses``) the frame of this rank's ring group (its ring attention's rows)."""
    base, axis = _base(group)
    lay = layout(base)
    if axis == "ulysses":
        return _length(lay.ring_pieces(seq_len, group_rank(base) // lay.ulysses))
    if lay.ring != 1:
        raise RuntimeError(f"autosp.all_to_all over {group!r}: the group's layout ({lay.describe()}) has ring "
                           "groups; a Ulysses exchange runs on its ':ulysses' sub-group")
    return seq_len


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
        frame = _frame_len(group, seq_len)
        extents = [b - a for a, b in (chunk(frame, p, i) for i in range(p))]
    else:
        extents = [x.shape[concat_dim]] * p
    shapes = []
    for e in extents:
        s = list(my_part)
        s[concat_dim] = e
        shapes.append(s)
    out_splits = [int(torch.Size(s).numel()) for s in shapes]
    if _SIMULATED:
        received = _SimulatedExchange.apply(send, (sum(out_splits),), "all_to_all", group)
    elif torch.compiler.is_compiling():  # functional collectives: traceable by torch.compile
        received = all_to_all_single_autograd(send, out_splits, in_splits, process_group(group))
    else:  # eager: the process group's own call, without the functional wrapper's overhead
        received = _AllToAllSingle.apply(send, out_splits, in_splits, process_group(group))
    pieces = torch.split(received, out_splits)
    return torch.cat([piece.view(s) for piece, s in zip(pieces, shapes)], dim=concat_dim)


# ----------------------------------------------------------------------------- reductions
class _AllReduceLocalBackward(torch.autograd.Function):
    """Forward: reduce over the group. Backward: identity (each rank's own share, see module doc)."""

    @staticmethod
    def forward(ctx, x, reduce_op, group):
        from torch.distributed._functional_collectives import all_reduce as _all_reduce
        from torch.distributed._functional_collectives import wait_tensor
        record("all_reduce", group, x.contiguous())
        if _SIMULATED:
            return x.clone()
        return wait_tensor(_all_reduce(x.contiguous(), reduce_op, process_group(group)))

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
    """Gather every rank's pieces (``held[g]``: rank g's ``[(a, b), ...]``, frame positions)
    and lay them out in ``order`` (``(rank, piece)`` pairs); index 0 of the result is frame
    position ``lo``. Backward: this rank's pieces of the gradient."""

    @staticmethod
    def forward(ctx, x, dim, group, held, order, lo):
        r = group_rank(group)
        longest = max(_length(pieces) for pieces in held)
        padded = x
        if x.shape[dim] < longest:
            pad_shape = list(x.shape)
            pad_shape[dim] = longest - x.shape[dim]
            padded = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)
        gathered = [torch.empty_like(padded) for _ in held]
        record("all_gather", group, padded.contiguous())
        if not _SIMULATED:
            dist.all_gather(gathered, padded.contiguous(), group=process_group(group))
        offsets = []  # where each rank's pieces start in its own tensor
        for pieces in held:
            o, starts = 0, []
            for a, b in pieces:
                starts.append(o)
                o = o + (b - a)
            offsets.append(starts)
        ctx.dim, ctx.lo, ctx.mine = dim, lo, held[r]
        return torch.cat([gathered[g].narrow(dim, offsets[g][k], held[g][k][1] - held[g][k][0])
                          for g, k in order], dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return _narrow_pieces(grad, ctx.dim, ctx.lo, ctx.mine), None, None, None, None, None


def all_gather(x: torch.Tensor, dim: int, group: str, seq_len: int | None = None, lo: int = 0,
               trim: int = 0) -> torch.Tensor:
    """Concatenate every rank's part along ``dim``. With ``seq_len``, the parts are the
    pieces of the window ``[lo, seq_len - trim)`` in the group's layout, put back in
    sequence order; without, all parts have ``x``'s size (in rank order).
    The backward is local: this rank's slice of the gradient."""
    p = group_size(group)
    if p == 1:
        return x
    dim %= x.dim()
    if seq_len is None:
        n = x.shape[dim]
        held = [[(g * n, (g + 1) * n)] for g in range(p)]
        return _AllGatherLocalBackward.apply(x, dim, group, held, [(g, 0) for g in range(p)], 0)
    lay = layout(group)
    held = [spans(seq_len, lo, trim, lay, g) for g in range(p)]
    return _AllGatherLocalBackward.apply(x, dim, group, held, lay.order(), lo)


def _scatter_places(whole: torch.Tensor, mine: torch.Tensor, dim: int, lo: int, pieces) -> torch.Tensor:
    """The source index of each true element of this rank's mask ``mine`` (its ``pieces``
    of the gathered mask ``whole``): its place among the whole mask's true elements."""
    order = whole.flatten().cumsum(0).view(whole.shape) - 1
    return _narrow_pieces(order, dim, lo, pieces)[mine]


class _GradShare(torch.autograd.Function):
    """Identity forward; backward this rank's share, 1/P of the gradient."""

    @staticmethod
    def forward(ctx, x, size):
        ctx.size = size
        # (traced: a fresh tensor; AOTAutograd replays an output that aliases an input as a view
        # of it outside the graph, and the gradient then bypasses this backward)
        return x.clone() if torch.compiler.is_compiling() else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.size, None


def local_heads(x: torch.Tensor, dim: int, heads: int, group: str) -> torch.Tensor:
    """``autosp.local_heads``: this rank's heads of ``x``, a replicated per-head tensor mixed
    into Ulysses attention (a position bias), no communication. Dim ``dim`` holds the
    ``heads`` heads, or batch x heads folded (BLOOM's ``[B * H, ...]``); rank r takes heads
    ``[r H/P, (r + 1) H/P)``, the block its all-to-all to heads gives it. Its gradient is
    this rank's heads' (the others' are zero here and summed over the ranks with the
    parameters', as for every replicated value)."""
    p = group_size(group)
    if p == 1:
        return x
    n, r = heads // p, group_rank(group)
    if x.shape[dim] == heads:
        return x.narrow(dim, r * n, n)
    return x.unflatten(dim, (-1, heads)).narrow(dim + 1, r * n, n).flatten(dim, dim + 1)


def grad_share(x: torch.Tensor, group: str) -> torch.Tensor:
    """``autosp.grad_share``: ``x`` (computed whole on every rank from the parameters, e.g.
    a vision tower's returned states) with 1/P of its gradient in backward: every rank
    gets the whole gradient of the objective, and the parameter gradients are summed over
    the ranks, so without the share this path would count P times (see the module
    docstring's SPMD gradients)."""
    p = group_size(group)
    return x if p == 1 or not x.is_floating_point() else _GradShare.apply(x, p)


def masked_scatter(x: torch.Tensor, mask: torch.Tensor, source: torch.Tensor, seq_len: int, dim: int, lo: int,
                   trim: int, group: str) -> torch.Tensor:
    """``autosp.masked_scatter``: ``x.masked_scatter(mask, source)`` where ``x`` and ``mask``
    are this rank's part (the window ``[lo, seq_len - trim)`` along ``dim``) and ``source``
    is whole (a vision tower's features, merged at the image tokens). masked_scatter takes
    source elements in the order of the whole mask's true elements, so the rank gathers
    the mask (one byte per element of it), numbers its true elements in that order, and
    fills its own with those source elements. A mask broadcast over trailing dims
    (``[B, S, 1]`` for ``[B, S, H]``) is gathered and numbered as it is, each true element
    standing for a block of H source elements: O(S) bytes, not O(S * H). Too few source
    elements is an error, as on one device. The source's gradient is this rank's rows
    (summed over ranks with the parameters', as for every replicated value)."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call("masked_scatter", x, mask, source, seq_len, dim, lo, trim, group)
    if group_size(group) == 1:
        return x.masked_scatter(mask, source)
    dim %= x.dim()
    flat = source.flatten()
    k = x.dim()  # mask dims k.. are broadcast (size 1): each true element covers a block
    while k > dim + 1 and mask.dim() == x.dim() and mask.shape[k - 1] == 1:
        k -= 1
    block = math.prod(x.shape[k:])
    if mask.dim() != x.dim() or tuple(mask.shape[:k]) != tuple(x.shape[:k]) or flat.numel() % block:
        mask, block = mask.expand_as(x), 1
    whole = all_gather(mask.to(torch.uint8), dim, group, seq_len=seq_len, lo=lo, trim=trim)
    places = _scatter_places(whole, mask.bool(), dim, lo, spans(seq_len, lo, trim, layout(group), group_rank(group)))
    rows = flat.view(-1, block)
    if places.numel() and int(places.max()) >= rows.shape[0]:
        raise RuntimeError(f"autosp.masked_scatter: the mask has more true elements than the source has elements "
                           f"({flat.numel()})")
    return x.masked_scatter(mask.expand_as(x), rows.index_select(0, places).flatten())


def _halo_sources(held: list, start: int, width: int) -> list:
    """For each of the ``width`` positions before ``start``: ``(rank, index)`` in that
    rank's tail block (its last ``width`` positions, left-padded), or None before 0. A
    position before ``start`` lies in a piece that ends at or before ``start``, so it is
    among that piece's last ``width`` positions."""
    out: list[tuple[int, int] | None] = []
    for pos in range(start - width, start):
        if pos < 0:
            out.append(None)
            continue
        g = next(g for g, pieces in enumerate(held) if pieces[0][0] <= pos < pieces[0][1])
        out.append((g, width - (held[g][0][1] - pos)))
    return out


class _Halo(torch.autograd.Function):
    """``x`` (this rank's one piece along ``dim``) with the ``width`` positions before it
    prepended (zeros before the sequence). Forward: an all-gather of every rank's last
    ``width`` positions. Backward: the halo's gradient goes back to the ranks that hold
    those positions (an all-reduce of the [P, width] blocks), added to their tails."""

    @staticmethod
    def forward(ctx, x, dim, width, group, held, rank):
        n = x.shape[dim]
        take = min(width, n)
        tail = x.narrow(dim, n - take, take)
        if take < width:
            pad_shape = list(x.shape)
            pad_shape[dim] = width - take
            tail = torch.cat([x.new_zeros(pad_shape), tail], dim=dim)
        tail = tail.contiguous()
        gathered = [torch.empty_like(tail) for _ in held]
        record("halo", group, tail)
        if _SIMULATED:
            gathered = [tail.clone() for _ in held]
        else:
            dist.all_gather(gathered, tail, group=process_group(group))
        sources = _halo_sources(held, held[rank][0][0], width)
        parts = [torch.zeros_like(tail.narrow(dim, 0, 1)) if src is None else gathered[src[0]].narrow(dim, src[1], 1)
                 for src in sources]
        ctx.dim, ctx.width, ctx.group, ctx.sources, ctx.n, ctx.p, ctx.rank = dim, width, group, sources, n, \
            len(held), rank
        return torch.cat(parts + [x], dim=dim)

    @staticmethod
    def backward(ctx, grad):
        dim, width = ctx.dim, ctx.width
        grad_halo, grad_x = grad.narrow(dim, 0, width), grad.narrow(dim, width, ctx.n)
        shape = list(grad.shape)
        shape[dim] = width
        blocks = grad.new_zeros([ctx.p] + shape)  # what each rank's tail receives
        for j, src in enumerate(ctx.sources):
            if src is not None:
                g, i = src
                blocks[g].narrow(dim, i, 1).add_(grad_halo.narrow(dim, j, 1))
        record("halo", ctx.group, blocks, backward=True)
        if not _SIMULATED:
            dist.all_reduce(blocks, group=process_group(ctx.group))
        mine = blocks[ctx.rank]
        take = min(width, ctx.n)
        grad_x = grad_x.clone()
        grad_x.narrow(dim, ctx.n - take, take).add_(mine.narrow(dim, width - take, take))
        return grad_x, None, None, None, None, None


def halo(x: torch.Tensor, seq_len: int, dim: int, width: int, lo: int, trim: int, group: str) -> torch.Tensor:
    """``autosp.halo``: ``x`` (sharded on the window ``[lo, seq_len - trim)`` along ``dim``)
    with the ``width`` positions before this rank's part prepended, zeros before the
    window's start: what a causal convolution of kernel ``width + 1`` reads (``x`` padded
    on the left at one rank). Each rank must hold one piece (not a zigzag ring's two).

    Example::

        y = torch.nn.functional.conv1d(halo(x, S, 2, 3, 0, 0, "sp"), w, groups=C)  # k = 4
    """
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call("halo", x, seq_len, dim, width, lo, trim, group)
    dim %= x.dim()
    p = group_size(group)
    if p == 1:
        pad_shape = list(x.shape)
        pad_shape[dim] = width
        return torch.cat([x.new_zeros(pad_shape), x], dim=dim)
    lay = layout(group)
    held = [spans(seq_len, lo, trim, lay, g) for g in range(p)]
    if any(len(pieces) != 1 for pieces in held):
        raise RuntimeError(f"autosp.halo: a causal convolution along the sequence needs each rank's positions in "
                           f"one piece; the layout {lay.describe()} gives a rank two (zigzag): compile with "
                           "sp_strategy='ulysses' or a ring without zigzag")
    if any(b <= a for (a, b), in held):
        raise RuntimeError(f"autosp.halo: {seq_len - lo - trim} positions over {p} ranks leave a rank none; a causal "
                           "convolution along the sequence needs at least one position per rank")
    shifted = [[(a - lo, b - lo)] for (a, b), in held]
    return _Halo.apply(x, dim, width, group, shifted, group_rank(group))


def _halo_fake(x, seq_len, dim, width, lo, trim, group):
    shape = list(x.shape)
    shape[dim % x.dim()] += width
    return x.new_empty(shape)


opaque.register("halo", halo, _halo_fake)
opaque.register("masked_scatter", masked_scatter, lambda x, *rest: torch.empty_like(x))


def reduce_scatter(x: torch.Tensor, dim: int, reduce_op: str, group: str) -> torch.Tensor:
    """Reduce over the group, keep this rank's equal chunk of ``dim``."""
    if group_size(group) == 1:
        return x
    from torch.distributed._functional_collectives import reduce_scatter_tensor_autograd
    if _SIMULATED:
        shape = list(x.shape)
        shape[dim % x.dim()] //= group_size(group)
        return _SimulatedExchange.apply(x, tuple(shape), "reduce_scatter", group)
    record("reduce_scatter", group, x.contiguous())
    return reduce_scatter_tensor_autograd(x.contiguous(), reduce_op, dim % x.dim(), process_group(group))
