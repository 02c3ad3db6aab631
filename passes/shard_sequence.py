"""``autosp-shard-sequence``: give every value a layout and make each rank compute its shard.

Three parts, as Shardy separates sharding rules, propagation and export:

* the **layouts** (:class:`Replicated`, :class:`SequenceSharded`, :class:`HeadSharded`);
* the **op rules** (:func:`op_class` and :class:`Rules`): what an op class does to the
  layouts of its operands, decided from the layouts and the sequence analysis alone;
* the **propagation** (:class:`_Propagation`) walks the function in program order, asks
  the rules for each op and hands the decision to the **rewriter** (:class:`_Rewriter`),
  the only part that edits the IR.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, Union

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.builders import vtensor_shape
from autosp.ir import ops
from autosp.ir.contract import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, ATTENTION_ATTR, LOCAL_LEN, PARAMETER_ATTR,
                                REWINDOW, RING_ATTENTION, SEQ_ATTR, SHARD)
from autosp.ir.core import body_ops, const_int, is_none, main_func, op_name, producer
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.pass_base import ModulePass
from autosp.ir.sequence import Linear, SequenceInfo, analyze_sequence, sequence_length_value


@dataclass(frozen=True)
class ShardSequence(ModulePass):
    """Propagate replicated / sequence-sharded / head-sharded layouts and materialise them.

    Every tensor value gets one layout:

    * **Replicated**: every rank computes all of it (inputs, positions, masks, anything
      that depends on no parameter);
    * **SequenceSharded(dim, window)**: rank r holds its chunk of the sequence
      (``runtime.collectives.chunk``) intersected with the value's *window*
      ``[lo, S - trim)``, which a slice along the sequence narrows (``logits[:, :-1]`` is
      the window ``(0, 1)``);
    * **HeadSharded**: heads split over the full sequence, between the all-to-alls that
      ``autosp-partition-attention`` put around attention (run it first).

    Rules, applied in program order:

    1. An op with a sequence-sharded operand and a sequence dimension in its result is
       sequence-sharded. Replicated operands that have a sequence dimension are sliced
       to the rank's part of the same window (``autosp.shard``: positions, RoPE tables
       and labels become correct on every rank without communication). Sizes computed
       from S that shape the result become the local length (``autosp.local_len``).
    2. An op whose result has a sequence dimension and that reads a parameter (directly
       or through other ops) is where sharding starts: its replicated operands are sliced.
       Parameter-free work stays replicated and is sliced where it meets sharded values.
    3. A sum over the sequence of a sharded value (its dims, read from the IR, name the
       sequence dim) becomes a local sum and an ``autosp.all_reduce``; the result is
       replicated (a global loss on every rank). A mean arrives as a sum divided by a size
       (torch.export decomposes it), so it splits too.
    4. A slice along the sequence of a sharded value whose bounds trim a constant number
       of positions from either end (``x[:, 1:]``, ``x[:, :-1]``, ``x[:, :x.size(1) - 1]``)
       narrows its window (``autosp.rewindow``). Bounds are read exactly: a constant
       ``c >= 0`` counts from the start, a negative constant or ``S + c`` from the end.
       A slice to a fixed length (``h[:, :850]``) is diagnosed.
    5. A size read from a sharded value along its sequence dim (``q.shape[1]``) is
       rewritten to the global length it stands for, computed from S; uses that shape
       sequence-sharded values get the local length by rule 1, uses that build
       replicated values (``arange`` positions) keep the global one. An index along
       the sequence that is the whole range ``arange(S)`` (how ``x[..., [k], :]``
       exports) keeps every position where it is: each rank indexes its shard with
       its local range.
    6. Any other op that would need the whole sequence is diagnosed, naming the op: a
       matmul contracting it, a selected position, a gather over positions, a reduction
       over it other than a sum (``amax``, ``logsumexp``...), and any op whose schema's
       dim arguments (``dim``, ``dims``...: read at their own operand positions, as an
       int, a list or None, negative or not) name the sequence (``flip``, ``roll``,
       ``cumsum``, ``softmax``, ``sort``, ``cat`` along it). A dim that is not a constant
       is diagnosed too (it cannot be proven not to be the sequence). Ops that mix
       positions with no dim argument (convolution, pooling, batch/group norm:
       ``ops.MIXING_WITHOUT_DIM``) and ops that change the sequence's length (a pad
       along it) are diagnosed as well; only layout ops (``ops.LAYOUT_DIM_OPS``:
       permute, transpose, unsqueeze...) take the sequence dim as an argument freely.

    Returned sequence-sharded values stay local, or are gathered (``gather-outputs``).
    Shards may differ in length by one when P does not divide S: no padding, no
    dropped tokens. Removes the symbolic-shape bindings: after sharding, the sizes they
    state are no longer the local ones.

    Input::

        %e = torch.aten.embedding %w, %ids, ... -> !torch.vtensor<[2,?,32],f32>
        %n = torch.aten.mul.int %int2, %S : !torch.int, !torch.int -> !torch.int
        %l = torch.prim.ListConstruct %n, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
        %v = torch.aten.view %e, %l : ... -> !torch.vtensor<[?,32],f32>

    Output::

        %ids_r = "autosp.shard"(%ids, %S) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} ...
        %e = torch.aten.embedding %w, %ids_r, ... -> !torch.vtensor<[2,?,32],f32>
        %L = "autosp.local_len"(%S) {group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.int) -> !torch.int
        %n2 = torch.aten.mul.int %L, %int2_0 : !torch.int, !torch.int -> !torch.int
        %l2 = torch.prim.ListConstruct %n2, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
        %v = torch.aten.view %e, %l2 : ... -> !torch.vtensor<[?,32],f32>
    """

    name: ClassVar[str] = "autosp-shard-sequence"
    group: str = "sp"
    gather_outputs: bool = False

    def apply(self, module) -> None:
        info = analyze_sequence(module, require_attention=False)
        shard_sequence(module, info, sequence_length_value(module, info), self.group, self.gather_outputs)


# ============================================================================ layouts
@dataclass(frozen=True)
class Window:
    """The part ``[lo, S - trim)`` of the sequence a value covers."""

    lo: int = 0
    trim: int = 0

    @property
    def length(self) -> Linear:
        """The window's length as ``S - (lo + trim)``."""
        return Linear(1, -(self.lo + self.trim))


@dataclass(frozen=True)
class Replicated:
    """Every rank computes the whole value."""

    def __str__(self) -> str:
        return "replicated"


@dataclass(frozen=True)
class SequenceSharded:
    """Each rank holds its chunk of ``window`` along dimension ``dim``."""

    dim: int
    window: Window = Window()

    def __str__(self) -> str:
        return f"sequence-sharded(dim {self.dim}, window [{self.window.lo}, S - {self.window.trim}))"


@dataclass(frozen=True)
class HeadSharded:
    """Heads split across ranks, each over the full sequence (inside Ulysses attention)."""

    def __str__(self) -> str:
        return "head-sharded"


Layout = Union[Replicated, SequenceSharded, HeadSharded]
REPLICATED, HEAD_SHARDED = Replicated(), HeadSharded()


# ============================================================================ op rules
class OpClass(enum.Enum):
    """What an op does to the sequence, as far as layouts are concerned."""

    TO_HEADS = "all_to_all to heads"
    TO_SEQUENCE = "all_to_all to sequence"
    RING = "ring attention"  # q, k, v sharded alike -> output sharded alike
    SUM = "sum"  # over the sequence: local sum + all-reduce
    SLICE = "slice"  # along the sequence: narrows the window
    SELECT = "select"  # one position: needs the whole sequence
    INDEX = "index"  # advanced indexing: the identity range along the sequence is local
    CONTRACTION = "matmul"  # mixes positions when it contracts the sequence dim
    POINTWISE = "token-wise"  # everything else, once Rules.check_token_wise proved it keeps
    # each position's data at its position (no dim argument on the sequence, no convolution
    # or pooling over it, the sequence length kept)


def op_class(op) -> OpClass:
    """The :class:`OpClass` of ``op``, by its name (tables in :mod:`autosp.ir.ops`)."""
    name = op_name(op)
    if name == ALL_TO_ALL:
        to_heads = op.attributes["concat_dim"].value == op.attributes["seq_dim"].value
        return OpClass.TO_HEADS if to_heads else OpClass.TO_SEQUENCE
    if name == RING_ATTENTION:
        return OpClass.RING
    if name in ops.SUM_OPS:
        return OpClass.SUM
    if name == ops.SLICE_OP:
        return OpClass.SLICE
    if name == ops.SELECT_OP:
        return OpClass.SELECT
    if name in ops.INDEX_OPS:
        return OpClass.INDEX
    if name in ops.CONTRACTIONS:
        return OpClass.CONTRACTION
    return OpClass.POINTWISE


class Action(enum.Enum):
    """What the rewriter does for an op once the rules chose its result's layout."""

    NONE = "keep the op as it is"
    SHARD_OPERANDS = "slice replicated operands to the result's window, localise sizes"
    ALL_REDUCE = "all-reduce the (partial) result"
    REWINDOW = "replace the slice by a window change"
    LOCAL_INDEX = "index the sequence dim with the local range, shard the other operands"


@dataclass(frozen=True)
class Decision:
    layout: Layout
    action: Action = Action.NONE
    window: Window | None = None  # for REWINDOW: the new window
    index_dim: int | None = None  # for LOCAL_INDEX: the sequence dim the identity range indexes

    def sharded(self) -> SequenceSharded:
        """The layout of a SHARD_OPERANDS, LOCAL_INDEX or REWINDOW decision, which :class:`Rules`
        always makes sequence-sharded."""
        assert isinstance(self.layout, SequenceSharded), self
        return self.layout


@dataclass(frozen=True)
class Bound:
    """A slice bound: ``offset`` positions from the ``start`` (>= 0) or the ``end`` (<= 0)."""

    from_end: bool
    offset: int


END_OF_SEQUENCE = 1 << 62  # a constant end this large (INT64_MAX in exported graphs) means "no end"


class Rules:
    """The layout rules (see :class:`ShardSequence`): they read the IR, never edit it."""

    def __init__(self, info: SequenceInfo, params: set):
        self.info = info
        self.params = params

    def decide(self, op, kind: OpClass, tensor_operands: list, layouts: list, param_derived: bool) -> Decision:
        res_dims = self.result_seq_dims(op)
        if kind is OpClass.TO_HEADS:
            seq_dim = op.attributes["seq_dim"].value
            if layouts[0] != SequenceSharded(seq_dim):
                raise DiagnosticError.at(op, "attention inputs must be sequence-sharded on the whole sequence "
                                             f"along dim {seq_dim}, got {layouts[0]}")
            return Decision(HEAD_SHARDED)
        if kind is OpClass.TO_SEQUENCE:
            if layouts[0] != HEAD_SHARDED:
                raise DiagnosticError.at(op, "expects a head-sharded operand")
            return Decision(SequenceSharded(op.attributes["seq_dim"].value))
        if kind is OpClass.RING:
            # q, k, v: sequence-sharded on the whole sequence (ring alone) or head-sharded
            # frames (inside Ulysses); the document ids stay replicated (read by position).
            if layouts[0] != SequenceSharded(2) and layouts[0] != HEAD_SHARDED or \
                    any(lay != layouts[0] for lay in layouts[1:3]):
                raise DiagnosticError.at(op, "ring attention needs q, k and v sequence-sharded on the whole "
                                             f"sequence along dim 2, or head-sharded; got {', '.join(map(str, layouts[:3]))}")
            return Decision(layouts[0])
        if HEAD_SHARDED in layouts:
            # Inside attention: queries and keys are whole, so replicated masks stay whole.
            if any(isinstance(x, SequenceSharded) for x in layouts):
                raise DiagnosticError.at(op, "mixes head-sharded attention values with sequence-sharded ones")
            return Decision(HEAD_SHARDED)

        sharded = [lay for lay in layouts if isinstance(lay, SequenceSharded)]
        if sharded:
            return self.decide_sharded(op, kind, tensor_operands, layouts, res_dims)
        if res_dims and param_derived and len(res_dims) == 1:
            # Rule 2: sharding starts here, on the window of the replicated operand.
            for v in tensor_operands:
                dims = self.info.seq_dims(v)
                if len(dims) == 1 and v not in self.params:
                    window = self.window_of_replicated(v, dims[0])
                    if window is not None:
                        self.check_token_wise(op, kind, tensor_operands)
                        return Decision(SequenceSharded(res_dims[0], window), Action.SHARD_OPERANDS)
                    break
            raise DiagnosticError.at(op, "starts sequence-sharded work from an operand whose sequence size "
                                         "autosp cannot split")
        return Decision(REPLICATED)

    def decide_sharded(self, op, kind, tensor_operands, layouts, res_dims) -> Decision:
        sharded = [lay for lay in layouts if isinstance(lay, SequenceSharded)]
        windows = {lay.window for lay in sharded}
        if len(windows) > 1:
            ranges = sorted((w.lo, w.trim) for w in windows)
            raise DiagnosticError.at(op, f"combines sequence-sharded values on different windows {ranges} "
                                         "(e.g. tokens shifted against each other); autosp cannot align them "
                                         "without communication")
        window = windows.pop()
        source = tensor_operands[0]
        if kind in (OpClass.SLICE, OpClass.SELECT) and isinstance(layouts[0], SequenceSharded):
            dim = const_int(op.operands[1])
            if dim is None:
                raise DiagnosticError.at(op, "slices along a dimension that is not a constant")
            entries = self.info.dims.get(source) or []
            lay = layouts[0]
            if entries and dim % len(entries) == lay.dim:
                if kind is OpClass.SELECT:
                    raise DiagnosticError.at(op, "selects one position of the sequence; each rank holds only "
                                                 "part of it, so autosp cannot shard this op")
                new = self.slice_window(op, lay.window)
                return Decision(SequenceSharded(lay.dim, new), Action.REWINDOW, new)
        if kind is OpClass.INDEX and isinstance(layouts[0], SequenceSharded):
            items = _list_items(op.operands[1])
            d = layouts[0].dim
            if d < len(items) and not is_none(items[d]):
                if not self.is_identity_range(items[d], source, d):
                    raise DiagnosticError.at(op, f"indexes the sequence dimension ({d}) with a tensor that is not "
                                                 "the range 0..S-1; a gather over positions needs the whole "
                                                 "sequence, so autosp cannot shard this op")
                if len(res_dims) != 1:
                    raise DiagnosticError.at(op, "indexes the sequence into a result autosp cannot describe")
                return Decision(SequenceSharded(res_dims[0], window), Action.LOCAL_INDEX, index_dim=d)
        if not res_dims:
            unknown = [r for r in op.results if _is_tensor(r) and r not in self.info.dims
                       and None in (vtensor_shape(r.type) or ((),))[0]]
            if unknown:
                raise DiagnosticError.at(op, f"has a result {unknown[0].type} with a dynamic size and no shape "
                                             "binding: autosp cannot tell whether it is the sequence")
            self.check_contraction(op, kind)
            along = self.sequence_dims_along(op)
            if kind is OpClass.SUM and (along or not ops.dim_operands(op_name(op))):
                # proven: the sum's dims name the sequence (torch.aten.sum sums every dim)
                return Decision(REPLICATED, Action.ALL_REDUCE)
            where = f" dimension ({along[0]})" if along else ""
            raise DiagnosticError.at(op, f"reduces over the sequence{where}, which autosp can only split for sums "
                                         "(local sums + an all-reduce)")
        if len(res_dims) > 1:
            raise DiagnosticError.at(op, "produces a [.., S, S] tensor outside recognised attention; autosp "
                                         "cannot shard it")
        self.check_token_wise(op, kind, tensor_operands)
        return Decision(SequenceSharded(res_dims[0], window), Action.SHARD_OPERANDS)

    # ---------------------------------------------------------------- rule helpers
    def result_seq_dims(self, op) -> list[int]:
        """The sequence dims of ``op``'s result. An op with several results (a layer norm's
        output, mean and rstd) is token-wise when every result that has a sequence dim has
        it at the same index: that index; results that disagree give ``[]``."""
        dims = [self.info.seq_dims(r) for r in op.results]
        found = [d for d in dims if d]
        if len(dims) == 1 or not found:
            return dims[0]
        return found[0] if all(d == found[0] for d in found) else []

    def window_of_replicated(self, value, dim: int) -> Window | None:
        """The window a replicated value of length ``S - c`` (c >= 0) spans when sharding starts."""
        length = self.info.length(value, dim)
        if not isinstance(length, Linear) or length.a != 1 or length.b > 0:
            return None
        return Window(0, -length.b)

    def check_token_wise(self, op, kind: OpClass, tensor_operands: list) -> None:
        """Diagnose an op about to be sharded that would combine positions of the sequence
        (rule 6): a matmul contracting it, a dim argument on it, a convolution or pooling
        over it, or a result whose sequence is longer or shorter than its operands'."""
        self.check_contraction(op, kind)
        along = self.sequence_dims_along(op)
        if along:
            raise DiagnosticError.at(op, f"works along the sequence dimension ({along[0]}); each rank holds only "
                                         "part of it, so autosp cannot shard this op")
        kept = ops.MIXING_WITHOUT_DIM.get(_schema_name(op))
        mixed = [d for v in _dim_sources(op) for d in self.info.seq_dims(v) if kept is not None and d not in kept]
        if mixed:
            raise DiagnosticError.at(op, f"combines neighbouring positions along the sequence dimension ({mixed[0]}) "
                                         "(a convolution, pooling or normalisation over positions); each rank holds "
                                         "only part of it, so autosp cannot shard this op")
        self.check_keeps_length(op, tensor_operands)

    def check_contraction(self, op, kind: OpClass) -> None:
        if kind is OpClass.CONTRACTION:
            ra = self.info.dims.get(op.operands[0])
            rb = self.info.dims.get(op.operands[1])
            if (ra and ra[-1] is not None) or (rb and rb[-2 if len(rb) > 1 else 0] is not None):
                raise DiagnosticError.at(op, "contracts the sequence dimension (a matmul over positions) outside "
                                             "recognised attention; autosp cannot shard it")

    def sequence_dims_along(self, op) -> list[int]:
        """The sequence dims (as the IR writes them: ``-2`` stays ``-2``) that ``op`` works
        along, from its schema's dim arguments (``ops.dim_operands``, at their own operand
        positions) read against its first operand (or the tensors of a ``cat``). None or an
        empty list (every dim, for reductions and ``roll``) counts as the sequence; a dim
        that is not a constant is diagnosed where the operand has a sequence dim: autosp
        cannot prove it is not the sequence."""
        name = _schema_name(op)
        sources = [v for v in _dim_sources(op) if self.info.seq_dims(v)]
        if not sources or name in ops.LAYOUT_DIM_OPS:
            return []
        seq, rank = self.info.seq_dims(sources[0]), len(self.info.dims[sources[0]])
        found: list[int] = []
        for index, arg in ops.dim_operands(name):
            if index >= len(op.operands):
                continue
            dims = _read_dims(op.operands[index], every_dim_if_empty=name not in ops.EMPTY_DIMS_MEAN_NONE)
            if dims is None:
                raise DiagnosticError.at(op, f"works along a dimension ('{arg}', operand {index}) that is not a "
                                             "constant; autosp cannot prove it is not the sequence dimension, so "
                                             "it cannot shard this op")
            found += seq if dims == "all" else [d for d in dims if -rank <= d < rank and d % rank in seq]
        return found

    def check_keeps_length(self, op, tensor_operands: list) -> None:
        """A token-wise op keeps the sequence's length: a result whose sequence is longer or
        shorter than an operand's (a ``cat`` or ``pad`` along it, a ``repeat``) moved
        positions. Views and broadcasts are the exception: rule 1 localises their sizes."""
        if op_name(op) in ops.SIZE_LIST_OPS:
            return
        result = next(r for r in op.results if self.info.seq_dims(r))
        out = self.info.length(result, self.info.seq_dims(result)[0])
        for v in tensor_operands:
            for d in self.info.seq_dims(v):
                length = self.info.length(v, d)
                if length != out:
                    raise DiagnosticError.at(op, f"changes the length of the sequence ({length} -> {out}); "
                                                 "each rank holds only part of it, so autosp cannot shard this op")

    def is_identity_range(self, index, source, dim: int) -> bool:
        """Is ``index`` the range ``0, 1, ..., n-1`` over the length ``n`` of ``source``'s
        sequence dim ``dim`` (an ``arange``, then unsqueezes: the decomposition of
        ``x[:, :, [k]]`` indexes every other dim with its full range)? Indexing with it
        keeps every position where it is, so each rank indexes with its local range."""
        op = producer(index)
        while op is not None and op_name(op) == ops.UNSQUEEZE_OP:
            op = producer(op.operands[0])
        if op is None or op_name(op) not in ops.ARANGE_OPS:
            return False
        name = op_name(op)
        start = const_int(op.operands[0]) if name != "torch.aten.arange" else 0
        end = op.operands[0] if name == "torch.aten.arange" else op.operands[1]
        step = const_int(op.operands[2]) if name == "torch.aten.arange.start_step" else 1
        length = self.info.length(source, dim)
        return start == 0 and step == 1 and length is not None and self.info.scalars.get(end) == length

    def bound(self, op, value, window: Window, is_start: bool) -> Bound:
        """Classify a slice bound exactly (rule 4): from the start, or from the end."""
        if is_none(value):
            return Bound(from_end=not is_start, offset=0)
        c = const_int(value)
        if c is not None:
            if c >= END_OF_SEQUENCE:  # torch writes "to the end" as INT64_MAX
                return Bound(True, 0)
            return Bound(True, c) if c < 0 else Bound(False, c)
        expr = self.info.scalars.get(value)
        if isinstance(expr, Linear) and expr.a == 1:
            # S + b on a value of length S - (lo + trim): (lo + trim + b) from its end.
            offset = expr.b + window.lo + window.trim
            if offset > 0 and not is_start:
                offset = 0  # past the end: a slice stops at the end
            return Bound(True, offset)
        what = f"'{expr}', which is not S plus a constant" if expr is not None else \
            "that is neither a constant nor computed from the sequence length"
        raise DiagnosticError.at(op, f"slices the sequence with a bound {what}; autosp supports constant "
                                     "bounds and bounds of the form S + c")

    def slice_window(self, op, window: Window) -> Window:
        """The window of ``op`` (a slice along the sequence) applied to ``window``."""
        step = op.operands[4]
        if not is_none(step) and const_int(step) != 1:
            raise DiagnosticError.at(op, "slices the sequence with a step; autosp supports step 1")
        start = self.bound(op, op.operands[2], window, is_start=True)
        end = self.bound(op, op.operands[3], window, is_start=False)
        if not start.from_end and end.from_end:
            return Window(window.lo + start.offset, window.trim - end.offset)
        if not start.from_end and not end.from_end:
            length = max(end.offset - start.offset, 0)
            raise DiagnosticError.at(op, f"truncates the sequence to a fixed length {length} (positions "
                                         f"[{start.offset}, {end.offset})); autosp supports slices that trim a "
                                         "constant number of positions from either end (x[:, 1:], x[:, :-1]), "
                                         "not a fixed-length part of a sequence of any length")
        if start.from_end and end.from_end:
            if start.offset > 0:
                raise DiagnosticError.at(op, "slices the sequence from a start past its end")
            raise DiagnosticError.at(op, f"keeps a fixed number ({max(end.offset - start.offset, 0)}) of the "
                                         "last positions of the sequence; autosp supports slices that trim a "
                                         "constant number of positions from either end (x[:, 1:], x[:, :-1])")
        raise DiagnosticError.at(op, f"slices the sequence from {-start.offset} before its end to the fixed "
                                     f"position {end.offset}; autosp supports slices that trim a constant "
                                     "number of positions from either end (x[:, 1:], x[:, :-1])")


# ============================================================================ rewriting
def _list_items(value) -> list:
    """The items of a ``torch.prim.ListConstruct`` result (empty for anything else)."""
    owner = producer(value)
    if owner is None or op_name(owner) != ops.LIST_CONSTRUCT:
        return []
    return list(owner.operands)


def _is_tensor(value) -> bool:
    return "vtensor" in str(value.type)


def _schema_name(op) -> str:
    """The aten name of ``op``, also for a ``torch.operator "torch.aten.X"`` torch-mlir kept opaque."""
    name = op_name(op)
    if name == "torch.operator" and "name" in op.attributes:
        inner = ir.StringAttr(op.attributes["name"]).value
        return inner if inner.startswith("torch.") else "torch." + inner
    return name


def _dim_sources(op) -> list:
    """The tensors an op's dim arguments index: its operand 0, or the items of a tensor list
    there (``torch.aten.cat``)."""
    if not op.operands:
        return []
    items = _list_items(op.operands[0])
    return [v for v in items if _is_tensor(v)] if items else [op.operands[0]]


def _read_dims(value, every_dim_if_empty: bool = True):
    """The dims a dim operand names: ``[d]`` for an int, its items for a list of constants
    (a tuple arrives as a list), ``"all"`` for None (and for an empty list where that means
    every dim); None when autosp cannot read it (not a constant)."""
    if is_none(value):
        return "all"
    c = const_int(value)
    if c is not None:
        return [c]
    owner = producer(value)
    if owner is None or op_name(owner) != ops.LIST_CONSTRUCT:
        return None
    items = [const_int(v) for v in owner.operands]
    if any(d is None for d in items):
        return None
    return items if items or not every_dim_if_empty else "all"


class _Rewriter:
    """The IR edits that make a rank compute its shard (the only part that edits the IR)."""

    def __init__(self, info: SequenceInfo, group: str, seq_len: ir.Value):
        self.info, self.group, self.seq_len = info, group, seq_len
        self.local_lens: dict = {}  # Window -> the one autosp.local_len of that window

    def shard(self, op, value, dim: int, window: Window) -> ir.Value:
        """Slice a replicated operand to this rank's part of ``window``. Its sequence dim has
        the window's length, or a multiple a of it (batch x sequence flattened, sequence inner)."""
        length = self.info.length(value, dim)
        if not isinstance(length, Linear) or length.a < 1 or length != window.length.times(length.a):
            raise DiagnosticError.at(op, f"needs operand {value.type} sliced along its sequence dim {dim} "
                                         f"(size {length if length is not None else '?'}), which does not match "
                                         f"the window {window.length} of the sharded operands")
        with ir.InsertionPoint(op), op.location:
            return b.autosp_op(SHARD, [value, self.seq_len], value.type, dim=dim, lo=window.lo,
                               trim=window.trim, group=self.group)

    def sharded_operand(self, op, v, window: Window, layouts: dict):
        """``v`` itself if it is sharded or has no sequence dim, else its shard on ``window``."""
        if not _is_tensor(v) or isinstance(layouts.get(v), SequenceSharded):
            return v
        dims = self.info.seq_dims(v)
        if not dims:
            return v
        if len(dims) > 1:
            raise DiagnosticError.at(op, "has a replicated operand with two sequence dims")
        return self.shard(op, v, dims[0], window)

    def shard_operands(self, op, window: Window, layouts: dict) -> None:
        for i, v in enumerate(list(op.operands)):
            items = _list_items(v)
            if items:  # a list of tensors (torch.aten.cat): shard its replicated items
                new_items = [self.sharded_operand(op, item, window, layouts) for item in items]
                if any(x != y for x, y in zip(new_items, items)):
                    with ir.InsertionPoint(op), op.location:
                        op.operands[i] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[v.type],
                                                             operands=new_items).result
            elif _is_tensor(v):
                op.operands[i] = self.sharded_operand(op, v, window, layouts)
        if op_name(op) in ops.SIZE_LIST_OPS:
            self.localise_size_list(op, window)
        else:
            self.check_no_global_sizes(op)

    def localise_index(self, op, dim: int, window: Window, layouts: dict) -> None:
        """Replace the identity range indexing sequence dim ``dim`` by this rank's local
        range (the same ``arange``, then unsqueezes, to the local length), then shard the
        other operands as usual."""
        items = _list_items(op.operands[1])
        chain, value = [], items[dim]
        while op_name(producer(value)) == ops.UNSQUEEZE_OP:
            chain.append(producer(value))
            value = producer(value).operands[0]
        arange = producer(value)
        end_at = 0 if op_name(arange) == "torch.aten.arange" else 1
        local_end = self.local_size(op, self.info.scalars[arange.operands[end_at]], window)
        with ir.InsertionPoint(op), op.location:
            operands = list(arange.operands)
            operands[end_at] = local_end
            attributes = {n: arange.attributes[n] for n in arange.attributes}
            local = ir.Operation.create(op_name(arange), results=[arange.results[0].type], operands=operands,
                                        attributes=attributes).result
            for unsqueeze in reversed(chain):
                local = ir.Operation.create(ops.UNSQUEEZE_OP, results=[unsqueeze.results[0].type],
                                            operands=[local] + list(unsqueeze.operands[1:])).result
            items[dim] = local
            op.operands[1] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[op.operands[1].type],
                                                 operands=items).result
        self.shard_operands(op, window, layouts)

    def local_size(self, op, expr, window: Window) -> ir.Value:
        """The local version of a size ``expr`` = a * len(window), for a sharded result."""
        if not isinstance(expr, Linear) or expr.a < 1 or expr != window.length.times(expr.a):
            raise DiagnosticError.at(op, f"has a size '{expr}' that is not a multiple of its sequence window "
                                         f"({window.length}): cannot compute the local size")
        if window not in self.local_lens:
            with ir.InsertionPoint.after(self.seq_len.owner), op.location:
                self.local_lens[window] = b.autosp_op(LOCAL_LEN, [self.seq_len], b.int_type(), lo=window.lo,
                                                      trim=window.trim, group=self.group)
        local = self.local_lens[window]
        if expr.a != 1:
            with ir.InsertionPoint(op), op.location:
                local = b.torch_op("torch.aten.mul.int", [local, b.constant_int(expr.a)], b.int_type())
        return local

    def localise_size_list(self, op, window: Window) -> None:
        """Rewrite the S-dependent entries of a view/broadcast size list to local sizes."""
        lst = op.operands[1]
        owner = producer(lst)
        if owner is None or op_name(owner) != ops.LIST_CONSTRUCT:
            raise DiagnosticError.at(op, "has a size list autosp cannot read")
        result_entries = self.info.dims.get(op.results[0])
        new_items, changed = [], False
        for i, item in enumerate(_list_items(lst)):
            expr = self.info.scalars.get(item)
            if expr is not None and result_entries and result_entries[i] is not None:
                new_items.append(self.local_size(op, expr, window))
                changed = True
            elif expr is not None:
                raise DiagnosticError.at(op, f"uses the sequence length ('{expr}') for dimension {i}, which is "
                                             "not a sequence dimension of its result")
            else:
                new_items.append(item)
        if changed:
            with ir.InsertionPoint(op), op.location:
                op.operands[1] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[lst.type],
                                                     operands=new_items).result

    def check_no_global_sizes(self, op) -> None:
        """A sequence-sharded result shaped by a global size autosp does not know how to
        localise would be silently wrong: diagnose it."""
        for scalar in list(op.operands) + [i for v in op.operands for i in _list_items(v)]:
            expr = self.info.scalars.get(scalar)
            if expr is not None:
                raise DiagnosticError.at(op, f"takes the sequence length ('{expr}') as an argument of a "
                                             "sequence-sharded result; autosp only localises sizes of view, "
                                             "reshape, expand and slice")

    def global_size(self, op, expr: Linear) -> ir.Value:
        """``expr`` (a*S + b) computed from the full sequence length, before ``op``."""
        value = self.seq_len
        with ir.InsertionPoint(op), op.location:
            if expr.a != 1:
                value = b.torch_op("torch.aten.mul.int", [value, b.constant_int(expr.a)], b.int_type())
            if expr.b != 0:
                value = b.torch_op("torch.aten.add.int", [value, b.constant_int(expr.b)], b.int_type())
        return value

    def all_reduce(self, op) -> ir.Value:
        result = op.results[0]
        with ir.InsertionPoint.after(op), op.location:
            reduced = b.autosp_op(ALL_REDUCE, [result], result.type, reduce_op="sum", group=self.group)
        for use in list(result.uses):
            if use.owner != reduced.owner:
                use.owner.operands[use.operand_number] = reduced
        self.info.dims.pop(reduced, None)
        return reduced

    def rewindow(self, op, old: SequenceSharded, new: Window) -> ir.Value:
        with ir.InsertionPoint(op), op.location:
            narrowed = b.autosp_op(REWINDOW, [op.operands[0], self.seq_len], op.results[0].type, dim=old.dim,
                                   lo=old.window.lo, trim=old.window.trim, new_lo=new.lo, new_trim=new.trim,
                                   group=self.group)
        op.results[0].replace_all_uses_with(narrowed)
        self.info.dims[narrowed] = self.info.dims.get(op.results[0])
        op.erase()
        return narrowed


# ============================================================================ propagation
@dataclass
class _Propagation:
    """Walk ``@main`` in program order: layouts from the rules, edits by the rewriter."""

    info: SequenceInfo
    rules: Rules
    rewriter: _Rewriter
    param_derived: set
    layouts: dict = field(default_factory=dict)  # ir.Value -> Layout (absent: Replicated)
    local_scalars: set = field(default_factory=set)  # sizes that are local lengths (not a*S + b)
    # Replicated values computed from an all-reduced sum over the sequence -> that sum's op.
    # Their gradient is the full one on every rank (autosp.all_reduce's backward is local),
    # which holds only while they stay replicated up to the outputs (a global loss).
    from_sequence_sums: dict = field(default_factory=dict)
    returned: ir.Operation | None = None  # @main's func.return, once run() has seen it

    def layout(self, value) -> Layout:
        return self.layouts.get(value, REPLICATED)

    def run(self, func) -> None:
        for op in list(body_ops(func)):
            name = op_name(op)
            if name.startswith(ops.NO_LAYOUT) or not op.results:
                if name == "func.return":
                    self.returned = op
                continue
            if not any(_is_tensor(r) for r in op.results):
                self.visit_scalar(op)
            else:
                self.visit(op)

    def visit_scalar(self, op) -> None:
        if op_name(op) == ops.SIZE_OP:
            lay = self.layout(op.operands[0])
            if lay == HEAD_SHARDED:
                return  # inside attention sizes are the partitioned program's own: full S, H/P
            if isinstance(lay, SequenceSharded):
                d = const_int(op.operands[1])
                entries = self.info.dims.get(op.operands[0]) or []
                if d is not None and entries and d % len(entries) == lay.dim:
                    expr = self.info.scalars.get(op.results[0])
                    if isinstance(expr, Linear):
                        # Rule 5: the size this stands for is global; its uses get local
                        # lengths where they shape sharded values.
                        full = self.rewriter.global_size(op, expr)
                        op.results[0].replace_all_uses_with(full)
                        self.info.scalars[full] = expr
                    else:
                        # Not a*S + b: only the local length is available; fine for sharded
                        # values, wrong for replicated ones (checked where it is used).
                        self.local_scalars.add(op.results[0])
                        self.info.scalars.pop(op.results[0], None)
                return
        if any(v in self.local_scalars for v in op.operands):
            self.local_scalars.update(op.results)
        for v in op.operands:
            if self.layout(v) != REPLICATED:
                raise DiagnosticError.at(op, "reads a sharded tensor into a scalar; autosp cannot tell whether "
                                             "it wants the local or the global value")

    def visit(self, op) -> None:
        operands = list(op.operands)
        tensor_operands = [v for v in operands if _is_tensor(v)]
        tensor_operands += [item for v in operands for item in _list_items(v) if _is_tensor(item)]
        layouts = [self.layout(v) for v in tensor_operands]
        derived = any(v in self.param_derived for v in operands + tensor_operands)
        if derived:
            self.param_derived.update(op.results)
        kind = op_class(op)
        decision = self.rules.decide(op, kind, tensor_operands, layouts, derived)
        self.check_sequence_sums(op, tensor_operands, decision)
        result = op.results[0]
        if decision.action is Action.SHARD_OPERANDS:
            self.rewriter.shard_operands(op, decision.sharded().window, self.layouts)
        elif decision.action is Action.LOCAL_INDEX:
            assert decision.index_dim is not None, decision  # Rules sets it with LOCAL_INDEX
            self.rewriter.localise_index(op, decision.index_dim, decision.sharded().window, self.layouts)
        elif decision.action is Action.ALL_REDUCE:
            self.from_sequence_sums[self.rewriter.all_reduce(op)] = op
        elif decision.action is Action.REWINDOW:
            # Rules rewindows only a slice of a sequence-sharded operand, and gives the new window.
            source = self.layout(op.operands[0])
            assert isinstance(source, SequenceSharded) and decision.window is not None, (source, decision)
            narrowed = self.rewriter.rewindow(op, source, decision.window)
            if derived:
                self.param_derived.add(narrowed)
            self.layouts[narrowed] = decision.layout
            return
        if decision.layout != REPLICATED:
            self.layouts[result] = decision.layout
            for other in op.results[1:]:  # e.g. a layer norm's mean and rstd: same layout
                if decision.layout == HEAD_SHARDED or self.info.seq_dims(other):
                    self.layouts[other] = decision.layout
        self.check_local_scalars(op)

    def check_sequence_sums(self, op, tensor_operands: list, decision: Decision) -> None:
        """A sum over the sequence may feed replicated work (a global loss), not sharded
        values: there each rank's gradient of the sum would hold only its own positions'
        share, while its all-reduce's local backward needs the full one."""
        sums = [self.from_sequence_sums[v] for v in tensor_operands if v in self.from_sequence_sums]
        if not sums:
            return
        if decision.layout != REPLICATED:
            raise DiagnosticError.at(op, f"uses a sum over the sequence ('{op_name(sums[0])}') "
                                         "together with sequence-sharded values; each rank's gradient of that sum "
                                         "would miss the other ranks' positions, so autosp cannot shard this op")
        for r in op.results:
            self.from_sequence_sums[r] = sums[0]

    def check_local_scalars(self, op) -> None:
        """A local length may only shape sequence-sharded results."""
        if isinstance(self.layout(op.results[0]), SequenceSharded):
            return
        scalars = list(op.operands) + [i for v in op.operands for i in _list_items(v)]
        if any(v in self.local_scalars for v in scalars):
            raise DiagnosticError.at(op, "uses the local length of a sharded tensor to build a replicated one; "
                                         "compute it from the input's size instead")


def shard_sequence(module, info: SequenceInfo, seq_len: ir.Value, group: str = "sp",
                   gather_outputs: bool = False) -> dict:
    """Propagate layouts and rewrite ``@main`` so that each rank computes its shard.

    Returns ``{"returned": [layout per result]}`` (None for a replicated result, else a
    :class:`SequenceSharded`).
    """
    func = main_func(module)
    block = func.regions[0].blocks[0]
    params = set()
    if "arg_attrs" in func.attributes:
        for i, attr in enumerate(func.attributes["arg_attrs"]):
            if PARAMETER_ATTR in attr:
                params.add(block.arguments[i])
    walk = _Propagation(info, Rules(info, params), _Rewriter(info, group, seq_len), set(params))
    walk.run(func)
    ret = walk.returned
    if ret is None:
        raise DiagnosticError.at(func, "@main has no func.return")
    layouts = []
    for i, v in enumerate(list(ret.operands)):
        lay = walk.layout(v)
        if lay == HEAD_SHARDED:
            raise DiagnosticError.at(ret, f"returns head-sharded attention internals (result {i})")
        if isinstance(lay, SequenceSharded) and gather_outputs:
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[i] = b.autosp_op(ALL_GATHER, [v, seq_len], v.type, dim=lay.dim, lo=lay.window.lo,
                                              trim=lay.window.trim, group=group)
            lay = REPLICATED
        layouts.append(None if lay == REPLICATED else lay)
    for op in list(body_ops(func)):
        if op_name(op) == ops.BIND_SHAPE:
            op.erase()
        else:  # the analysis' notes describe global sizes; the IR is now per rank
            for attr in (SEQ_ATTR, ATTENTION_ATTR):
                if attr in op.attributes:
                    del op.attributes[attr]
    return {"returned": layouts}
