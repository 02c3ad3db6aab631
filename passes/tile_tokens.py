"""``autosp-tile-tokens``: token-wise blocks run in sequence chunks (tiled MLP).

Inside a checkpointed layer, the MLP's [S/P, ffn] intermediates (3.5 x hidden in Llama 3,
and several of them while its backward runs) dominate the recomputation's peak. Every
position of such a block is computed independently of the others, so it can run in
``tiles`` sequence chunks, in forward and in backward (recomputed chunk by chunk), and
[S/P, ffn] never lives whole (ALST's TiledMLP, found and proven by the compiler instead of
patched in by hand).

A **token-wise run** is a maximal run of consecutive ops of one checkpoint segment
(``autosp.segment``, from ``autosp-checkpoint``) that are each proven row-wise from their
types (the sequence is the one dynamic dim ``?``; the dims before it are the batch; a
*row* is one position of one batch entry, its features the dims after ``?``):

* element-wise ops (``add``, ``mul``, ``silu``, ``rsqrt``, casts...) whose operands with
  ``?`` have the result's shape up to and including ``?`` (weights broadcast freely);
* ``mm`` / ``addmm`` / ``matmul`` / ``linear`` of rows by a weight without ``?``;
* reductions, softmax and layer norm over feature dims only (after ``?``);
* views that regroup rows and keep each row's features whole (the product of the dims
  after ``?`` is unchanged): their one size that depends on the sequence is rewritten to
  ``-1``, so the block computes its sizes from each chunk;
* ops on weights alone (no ``?``: permutes, casts) whose other operands are constants.

A run is tiled when it contains a matmul and its inputs and outputs with ``?`` all have
the same batch dims and the same **sequence extent** (so one set of sequence chunks cuts
them all). ``?`` is a rank's shard in some values and the whole sequence in others (a key
padding mask, the position ids): :func:`sequence_extents` tells them apart from where each
value comes from (an ``autosp.shard`` or an all-to-all that scatters the sequence gives a
shard; a function argument or a gather gives the whole sequence; ops that keep each
position's place pass it on, and a row-wise op proves its operands' extents equal;
anything else gets an extent of its own).
Ops of two extents interleaved in one segment form two runs; runs whose ops interleave
are not both tiled (their chunks could not be split apart). Its ops get
``autosp.tile = <run id>`` and ``autosp.tiles = N``; the backend runs the run as
:func:`autosp.runtime.tiling.tiled_call`. Nothing random (dropout) and nothing that mixes
positions (attention, cumsum, arange, sequence slices) is ever part of a run.

Input::

    %u = torch.aten.mm %x, %w1 {autosp.segment = 1 : i64} : !torch.vtensor<[?,64],f32>, ... -> !torch.vtensor<[?,256],f32>
    %a = torch.aten.silu %u {autosp.segment = 1 : i64} : ...
    %d = torch.aten.mm %a, %w2 {autosp.segment = 1 : i64} : ... -> !torch.vtensor<[?,64],f32>

Output::

    %u = torch.aten.mm %x, %w1 {autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 4 : i64} ...
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from math import prod
from typing import ClassVar

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.contract import (
    ALL_GATHER,
    ALL_TO_ALL,
    LOCAL_LEN,
    OFFLOAD_ATTR,
    REGION_ATTR,
    RING_ATTENTION,
    SEGMENT_ATTR,
    SHARD,
    TILE_ATTR,
    TILES_ATTR,
)
from autosp.ir.core import body_ops, const_int, main_func, op_name, producer, tensor_dims
from autosp.ir.ops import LIST_CONSTRUCT, is_sdpa
from autosp.ir.pass_base import ModulePass, PassOptionError

_log = logging.getLogger(__name__)


_ELEMENTWISE = {f"torch.aten.{n}" for n in (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "add.Scalar", "sub.Scalar", "mul.Scalar", "div.Scalar",
    "rsub.Scalar", "pow.Tensor_Scalar", "rsqrt", "sqrt", "silu", "gelu", "tanh", "sigmoid", "neg", "exp", "relu",
    "reciprocal", "to.dtype", "_to_copy", "clone", "contiguous", "detach", "where.self", "maximum", "minimum",
    "erf", "square", "abs", "log")}
_REDUCTIONS = ("torch.aten.sum.dim_IntList", "torch.aten.mean.dim", "torch.aten.amax", "torch.aten.var.correction")
_SOFTMAX = ("torch.aten.softmax.int", "torch.aten._softmax", "torch.aten.log_softmax.int", "torch.aten._log_softmax")
_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")
_WEIGHT_ONLY = {f"torch.aten.{n}" for n in ("permute", "transpose.int", "t", "numpy_T", "unsqueeze")} | _ELEMENTWISE \
    | set(_VIEWS)
_MATMULS = ("torch.aten.mm", "torch.aten.addmm", "torch.aten.matmul", "torch.aten.linear")
# Ops that produce no tensor (sizes, constants, lists): they neither join nor break a run.
_TRANSPARENT = ("torch.constant.", LIST_CONSTRUCT, "torch.bind_symbolic_shape", "torch.aten.size.int",
                "torch.aten.add.int", "torch.aten.sub.int", "torch.aten.mul.int", "torch.aten.floordiv.int",
                LOCAL_LEN, "torch.symbolic_int")


def _seq(dims) -> int | None:
    """Index of the one dynamic dim; -1 when there are several (not a token layout)."""
    dyn = [i for i, d in enumerate(dims) if d is None]
    return None if not dyn else (dyn[0] if len(dyn) == 1 else -1)


def _prefix(value: ir.Value):
    dims = tensor_dims(value)
    if dims is None:
        return None
    i = _seq(dims)
    return None if i is None else tuple(dims[: i + 1])


def _tensors(values) -> list:
    return [v for v in values if tensor_dims(v) is not None]


def _constant(value: ir.Value) -> bool:
    """A constant, or a list of constants."""
    op = producer(value)
    if op is None:
        return False
    if op_name(op) == LIST_CONSTRUCT:
        return all(_constant(v) for v in op.operands)
    return op_name(op).startswith("torch.constant.")


def _feature_dims(dims_value: ir.Value, rank: int, seq: int) -> bool:
    """A constant dim (list) naming feature dims only (after ``seq``)."""
    op = producer(dims_value)
    items = list(op.operands) if op is not None and op_name(op) == LIST_CONSTRUCT else [dims_value]
    ints = [const_int(v) for v in items]
    return bool(ints) and all(i is not None and i % rank > seq for i in ints)


def row_wise(op) -> str | None:
    """Why ``op`` is not row-wise (None if it is); see the module docstring."""
    name = op_name(op)
    tensors_in = _tensors(op.operands)
    results = _tensors(op.results)
    with_seq = [v for v in tensors_in + results if _seq(tensor_dims(v)) is not None]
    if any(_seq(tensor_dims(v)) == -1 for v in with_seq):
        return "a value with several dynamic dims"
    others = [v for v in op.operands if v not in tensors_in]
    if not with_seq:  # on weights alone
        return None if name in _WEIGHT_ONLY and all(_constant(v) for v in others) else f"{name} on weights"
    if not results or any(_prefix(r) is None for r in results):
        return f"{name} has a result without the sequence"
    out = _prefix(results[0])
    if name in _VIEWS:
        x, y = op.operands[0], op.results[0]
        dx, dy = tensor_dims(x), tensor_dims(y)
        if _seq(dx) is None or prod(dx[_seq(dx) + 1:]) != prod(dy[_seq(dy) + 1:]):  # type: ignore[operator, index]
            return "a view that does not keep each row's features"
        sizes = producer(op.operands[1])
        if sizes is None or op_name(sizes) != LIST_CONSTRUCT:
            return "a view without a size list"
        free = [v for v in sizes.operands if not _constant(v)]
        inferred = any(const_int(v) == -1 for v in sizes.operands)
        if len(free) > 1 or free and inferred and _prefix(x) != _prefix(y):
            return "a view with more than one size from the sequence"
        return None
    if any(not _constant(v) for v in others):
        return f"{name} with a size or scalar that is not a constant"
    if name in _MATMULS:
        x = op.operands[1] if name == "torch.aten.addmm" else op.operands[0]
        rest = [v for v in tensors_in if v != x]
        if _prefix(x) is None or any(_prefix(v) is not None for v in rest) or _seq(tensor_dims(x)) == len(tensor_dims(x)) - 1:  # type: ignore[arg-type]
            return f"{name} not of rows by a weight"
        return None if _prefix(x) == out else f"{name} regroups rows"
    aligned = all(_prefix(v) == out for v in with_seq)
    if name in _ELEMENTWISE:
        return None if aligned else f"{name} broadcasts over the sequence"
    rank, seq = len(tensor_dims(op.operands[0])), _seq(tensor_dims(op.operands[0]))  # type: ignore[arg-type]
    if name in _REDUCTIONS or name in _SOFTMAX:
        ok = aligned and seq is not None and _feature_dims(op.operands[1], rank, seq)
        return None if ok else f"{name} over a row dim"
    if name == "torch.aten.native_layer_norm":
        return None if aligned else f"{name} broadcasts over the sequence"
    return f"{name} is not known to be row-wise"


@dataclass(frozen=True)
class TileTokens(ModulePass):
    """Run the token-wise blocks of checkpoint segments (the MLP) in sequence chunks.

    Marks each proven token-wise run of a segment that contains a matmul with
    ``autosp.tile`` (its id) and ``autosp.tiles = tiles``, and rewrites the sequence-derived
    size of its views to -1 (see the module docstring). ``tiles=1`` does nothing.

    Input::

        %u = torch.aten.mm %x, %w1 {autosp.segment = 1 : i64} : ...

    Output::

        %u = torch.aten.mm %x, %w1 {autosp.segment = 1 : i64, autosp.tile = 0 : i64, autosp.tiles = 4 : i64} : ...
    """

    name: ClassVar[str] = "autosp-tile-tokens"
    tiles: int = 4

    def __post_init__(self):
        if self.tiles < 1:
            raise PassOptionError(f"option 'tiles' of pass '{self.name}' must be >= 1, got {self.tiles}")

    def apply(self, module) -> None:
        tile_tokens(module, self.tiles)


FULL = "whole sequence"
# Ops whose results keep the length of their operands' sequence dim (besides row_wise ones).
_KEEP_LENGTH = ("torch.aten.permute", "torch.aten.transpose.int", "torch.aten.unsqueeze", "torch.aten.squeeze.dim",
                "torch.aten.embedding", "torch.aten.contiguous", "torch.aten.clone", RING_ATTENTION)


def sequence_extents(func) -> dict:
    """For each value of ``func`` with a dynamic (sequence) dim, what that dim spans: a
    rank's shard (``("shard", lo, trim)``: the window of ``autosp.shard``), :data:`FULL`,
    or an extent of its own (an ``object()``) where the IR does not prove it.

    Extents are joined (union-find) by what an op proves: a row-wise op's operands with
    the sequence dim have the result's length there (they could not broadcast otherwise),
    an op of :data:`_KEEP_LENGTH` keeps its operand's, and attention's output has its
    query's. So the rotary tables computed from ``arange`` become the whole sequence where
    they multiply a whole-sequence query (one device, ``sp_size=1``), and a shard where
    they multiply a shard. Two proven extents that differ (a shard and the whole sequence)
    are never joined: such an op's result gets an extent of its own. See the module
    docstring."""
    parent: dict = {}

    def find(x):
        while parent.get(x, x) is not x:
            x = parent[x]
        return x

    def join(nodes) -> object:
        roots = list(dict.fromkeys(find(n) for n in nodes))
        proven = {r for r in roots if not _fresh(r)}
        if len(proven) > 1:
            return object()
        root = proven.pop() if proven else roots[0]
        for r in roots:
            if r is not root:
                parent[r] = root
        return root

    node: dict = {}
    for arg in func.arguments:
        if _prefix(arg) is not None:
            node[arg] = FULL
    for op in body_ops(func):
        name = op_name(op)
        seq_results = [r for r in op.results if _prefix(r) is not None]
        if not seq_results:
            continue
        attrs = op.attributes
        seq_operands = [node[v] for v in op.operands if _prefix(v) is not None and v in node]
        found: object
        if name == SHARD:
            found = ("shard", attrs["lo"].value, attrs["trim"].value)
        elif name == ALL_TO_ALL:
            seq, split, concat = (attrs[a].value for a in ("seq_dim", "split_dim", "concat_dim"))
            found = ("shard", 0, 0) if seq == split else FULL if seq == concat else object()
        elif name == ALL_GATHER:
            found = FULL
        elif is_sdpa(op) and op.operands[0] in node:
            found = node[op.operands[0]]  # the query's positions
        elif seq_operands and (name in _KEEP_LENGTH or row_wise(op) is None):
            found = join(seq_operands + [object()])
        else:
            found = object()
        for r in seq_results:
            node[r] = found
    return {v: find(n) for v, n in node.items()}


def _fresh(extent) -> bool:
    """An extent the IR has not proven (an ``object()`` of its own)."""
    return not isinstance(extent, (str, tuple))


def _runs(func, extents: dict | None = None) -> list[list]:
    """Maximal runs of row-wise ops of one segment (transparent ops skipped), one per
    sequence extent: ops on the whole sequence (a mask's cast) interleaved with ops on a
    shard form two runs, not one. An op without the sequence (on weights) joins the run
    the op before it joined.

    An op of the run's segment that is not row-wise does not end the run: it is
    *deferred* (it runs after the tiled run, which the backend's split puts it after), and
    so is every op that reads its results. A row-wise op that reads a deferred result
    ends the run (it would depend on an op that now runs after it). So the q, k and v
    projections of one normalised input, each followed by a transpose to heads, form one
    run: the normalised input never lives whole (it is neither an output of the run nor
    kept for its backward)."""
    runs: list[list] = []
    open_runs: dict = {}  # extent -> the run being built (None: not yet known)
    last = None
    key = None
    deferred: set = set()  # results of ops deferred past the open runs
    extents = sequence_extents(func) if extents is None else extents
    for op in body_ops(func):
        name = op_name(op)
        if name.startswith(_TRANSPARENT):
            if any(v in deferred for v in op.operands):
                deferred.update(op.results)
            continue
        segment = op.attributes[SEGMENT_ATTR].value if SEGMENT_ATTR in op.attributes else None
        if key is not None and segment != key and _on_weights(op):
            continue  # a weight op the checkpoint plan put in another segment: an input of the run
        reason = row_wise(op) if segment is not None else "not in a checkpoint segment"
        seq = [extents.get(r) for r in _tensors(op.results) if _prefix(r) is not None]
        extent = seq[0] if seq else last
        reads_deferred = any(v in deferred for v in op.operands)
        if reason is None and segment == key and not reads_deferred:
            if extent not in open_runs and None in open_runs:
                open_runs[extent] = open_runs.pop(None)
            open_runs.setdefault(extent, []).append(op)
            last = extent
            continue
        if reason is not None and key is not None and segment == key and any(open_runs.values()):
            deferred.update(op.results)  # runs after the open runs (see the docstring)
            _log.debug("autosp-tile-tokens: %s is deferred past a run: %s", name, reason)
            continue
        runs.extend(r for r in open_runs.values() if r)
        deferred = set()
        open_runs, last, key = ({extent: [op]}, extent, segment) if reason is None else ({}, None, None)
        if reason is not None:
            _log.debug("autosp-tile-tokens: %s ends a run: %s", name, reason)
    runs.extend(r for r in open_runs.values() if r)
    return runs


def _on_weights(op) -> bool:
    """A row-wise op without the sequence anywhere (a permute or cast of a weight)."""
    values = _tensors(op.operands) + _tensors(op.results)
    return bool(values) and all(_seq(tensor_dims(v)) is None for v in values) and row_wise(op) is None


def _boundary(run) -> tuple[list, list]:
    """The tensor values a run reads from outside, and those it defines that are used outside."""
    inside = {op.operation for op in run}
    defined = {r for op in run for r in op.results}
    reads = [v for op in run for v in op.operands if v not in defined and tensor_dims(v) is not None]
    outs = [r for op in run for r in op.results
            if any(u.owner.operation not in inside and op_name(u.owner) != "torch.bind_symbolic_shape" for u in r.uses)]
    return reads, outs


def _one_layout(run, extents: dict) -> bool:
    """The run's inputs and outputs with the sequence share one batch prefix and one
    sequence extent."""
    reads, outs = _boundary(run)
    layouts = {(_prefix(v), extents.get(v)) for v in reads + outs if _prefix(v) is not None}
    return len(layouts) == 1 and any(_prefix(v) is not None for v in outs)


def tile_tokens(module, tiles: int) -> int:
    """Mark the token-wise runs (see the module docstring); returns how many."""
    if tiles <= 1:
        return 0
    func = main_func(module)
    extents = sequence_extents(func)
    position = {op.operation: i for i, op in enumerate(body_ops(func))}
    spans: list[tuple[int, int]] = []  # the tiled runs' first and last op
    count = 0
    for whole in _runs(func, extents):
        # The longest leading part of the run whose inputs and outputs share one token
        # layout (a run that ends in the head returns merged [B*S, H] rows too).
        run = next((whole[:n] for n in range(len(whole), 0, -1) if _one_layout(whole[:n], extents)), None)
        if run is None or not any(op_name(op) in _MATMULS for op in run):
            if any(op_name(op) in _MATMULS for op in whole):
                _log.info("autosp-tile-tokens: a run at %s is not tiled: its inputs and outputs do not share one "
                          "token layout", whole[0].location)
            continue
        span = (position[run[0].operation], position[run[-1].operation])
        if any(lo <= span[1] and span[0] <= hi for lo, hi in spans):
            _log.info("autosp-tile-tokens: a run at %s is not tiled: its ops interleave with a tiled run's",
                      run[0].location)
            continue
        spans.append(span)
        with func.context:
            for op in run:
                op.attributes[TILE_ATTR] = b.i64(count)
                op.attributes[TILES_ATTR] = b.i64(tiles)
                if op_name(op) in _VIEWS:
                    _free_size(op)
        count += 1
    return count


def _free_size(view) -> None:
    """Rewrite a view's one non-constant size to -1, or, when the list already infers a
    size, to the input's sequence size (equal: same batch dims, same features per row);
    in a fresh list, as others may share the old one."""
    sizes = producer(view.operands[1])
    items = list(sizes.operands)
    if all(_constant(v) for v in items):
        return
    with ir.InsertionPoint(view), view.location:
        if any(const_int(v) == -1 for v in items):
            x = view.operands[0]
            size = ir.Operation.create("torch.aten.size.int", results=[b.int_type()],
                                       operands=[x, b.constant_int(_seq(tensor_dims(x)))])  # type: ignore[arg-type]
            for name in (REGION_ATTR, SEGMENT_ATTR, OFFLOAD_ATTR, TILE_ATTR, TILES_ATTR):
                if name in view.attributes:  # computed inside the view's segment and tile run
                    size.attributes[name] = view.attributes[name]
            size = size.result
        else:
            size = b.constant_int(-1)
        items = [v if _constant(v) else size for v in items]
        fresh = ir.Operation.create(LIST_CONSTRUCT, results=[view.operands[1].type], operands=items).result
    view.operands[1] = fresh
