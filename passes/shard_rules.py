"""The layouts of ``autosp-shard-sequence`` and its op rules: what each op class does to them.

The first two of the pass's three parts (:mod:`autosp.passes.shard_sequence` has the
propagation and the rewriter):

* the **layouts**: :class:`Replicated`, :class:`SequenceSharded` (a rank's chunk of a
  :class:`Window` along one dim), :class:`HeadSharded`;
* the **op rules**: :func:`op_class` names what an op does to the sequence, and
  :class:`Rules` decides from the operands' layouts and the sequence analysis alone the
  result's layout and what the rewriter must do (a :class:`Decision`). They read the IR,
  never edit it; an op they cannot prove local is diagnosed, naming it.

Example::

    >>> op_class(op)                          # %y = torch.aten.add.Tensor %x, %pos, %int1
    <OpClass.POINTWISE: 'token-wise'>
    >>> Rules(info, params).decide(op, op_class(op), [x, pos], [SequenceSharded(1), REPLICATED], True).action
    <Action.SHARD_OPERANDS: "slice replicated operands to the result's window, localise sizes">
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from torch_mlir import ir

from autosp.ir import ops
from autosp.ir.builders import vtensor_shape
from autosp.ir.contract import ALL_TO_ALL, LOCAL_HEADS, RING_ATTENTION
from autosp.ir.core import const_bool, const_float, const_int, is_none, list_items, op_name, producer
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.sequence import Linear, SequenceInfo


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


Layout = Replicated | SequenceSharded | HeadSharded
REPLICATED, HEAD_SHARDED = Replicated(), HeadSharded()


# ============================================================================ op rules
class OpClass(enum.Enum):
    """What an op does to the sequence, as far as layouts are concerned."""

    TO_HEADS = "all_to_all to heads"
    TO_SEQUENCE = "all_to_all to sequence"
    LOCAL_HEADS = "local heads"  # a replicated per-head tensor -> this rank's heads (inside Ulysses)
    RING = "ring attention"  # q, k, v sharded alike -> output sharded alike
    SUM = "sum"  # over the sequence: local sum + all-reduce
    SLICE = "slice"  # along the sequence: narrows the window
    SELECT = "select"  # one position: needs the whole sequence
    INDEX = "index"  # advanced indexing: the identity range along the sequence is local
    CONTRACTION = "matmul"  # mixes positions when it contracts the sequence dim
    RECURRENCE = "recurrence"  # stated: a linear recurrence along dim 1, run as a chain over the ranks
    OPAQUE = "opaque"  # a torch.operator torch-mlir kept whole whose semantics autosp does not state
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
    if name == LOCAL_HEADS:
        return OpClass.LOCAL_HEADS
    if name == "torch.operator":
        inner = _schema_name(op)
        if inner in ops.COUNTING_OPS:
            return OpClass.SUM
        if inner in ops.RECURRENCE_OPERATORS:
            return OpClass.RECURRENCE
        return OpClass.POINTWISE if inner in ops.TOKEN_WISE_OPERATORS else OpClass.OPAQUE
    if name in ops.SUM_OPS or name in ops.SCATTER_SUM_OPS:
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
    HALO = "prepend the positions before this rank's part (autosp.halo), convolve without padding"
    MASKED_SCATTER = "fill this rank's true positions with their source elements (autosp.masked_scatter)"
    SELECT_POSITIONS = "pick this rank's selected rows (zeros for the others': autosp.local_positions), all-reduce"
    SEQ_SOFTMAX = "softmax along the sequence over the group (autosp.softmax)"
    SEQ_REDUCE = "a reduction along the sequence over the group (autosp.logsumexp, autosp.amax): replicated"


@dataclass(frozen=True)
class Decision:
    """What :class:`Rules` decided for an op: its result's layout and the rewriter's action."""

    layout: Layout
    action: Action = Action.NONE
    window: Window | None = None  # for REWINDOW: the new window
    index_dim: int | None = None  # for LOCAL_INDEX: the sequence dim the identity range indexes
    halo: int = 0  # for HALO: how many positions before this rank's part the convolution reads
    # for SELECT_POSITIONS of a select or a fixed-length slice: the positions it keeps
    # (index j of the operand's window; negative: from its end); None: an index tensor
    positions: tuple[int, ...] | None = None

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

    def __init__(self, info: SequenceInfo, params: set, zigzag: bool = False):
        self.info = info
        self.params = params
        self.zigzag = zigzag  # the module's layout gives a rank two pieces (a ring's zigzag)

    def decide(self, op, kind: OpClass, tensor_operands: list, layouts: list, param_derived: bool) -> Decision:
        res_dims = self.result_seq_dims(op)
        if kind is OpClass.TO_HEADS:
            seq_dim = op.attributes["seq_dim"].value
            if layouts[0] != SequenceSharded(seq_dim):
                raise DiagnosticError.at(op, "attention inputs must be sequence-sharded on the whole sequence "
                                             f"along dim {seq_dim}, got {layouts[0]}")
            return Decision(HEAD_SHARDED)
        if kind is OpClass.LOCAL_HEADS:
            if layouts[0] != REPLICATED:
                raise DiagnosticError.at(op, f"takes this rank's heads of a replicated tensor, got {layouts[0]}")
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
                        self.check_sizes_known(op, kind, tensor_operands, layouts, res_dims[0])
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
        if _schema_name(op) in ops.RANDOM_OPS:
            raise DiagnosticError.at(op, "draws random numbers shaped like a sequence-sharded value; each rank "
                                         "would draw its own numbers, not its part of what one device draws, so "
                                         "training would silently differ from one device (draw from a size list, as "
                                         "dropout does, or turn the noise off: e.g. router jitter in eval or = 0)")
        if op_name(op) == ops.CONVOLUTION_OP and isinstance(layouts[0], SequenceSharded) and \
                not any(isinstance(lay, SequenceSharded) for lay in layouts[1:]):
            return Decision(layouts[0], Action.HALO, halo=self.causal_conv_halo(op, layouts[0]))
        if kind is OpClass.RECURRENCE:
            return self.decide_recurrence(op, tensor_operands, layouts, res_dims, window)
        if op_name(op) == ops.MASKED_SCATTER_OP:
            return self.decide_masked_scatter(op, layouts, res_dims, window)
        picked = self.decide_selection(op, kind, tensor_operands, layouts, res_dims)
        if picked is not None:
            return picked
        reduced = self.decide_reduction(op, layouts, res_dims)
        if reduced is not None:
            return reduced
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
            items = list_items(op.operands[1])
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
            unknown = [r for r in op.results if is_tensor(r) and r not in self.info.dims
                       and None in (vtensor_shape(r.type) or ((),))[0]]
            if unknown:
                raise DiagnosticError.at(op, f"has a result {unknown[0].type} with a dynamic size and no shape "
                                             "binding: autosp cannot tell whether it is the sequence")
            self.check_contraction(op, kind)
            self.check_opaque(op, kind)
            if kind is OpClass.SUM and _schema_name(op) in ops.COUNTING_OPS:
                self.check_fixed_bins(op)
                return Decision(REPLICATED, Action.ALL_REDUCE)  # counts over a partition add up
            if kind is OpClass.SUM and op_name(op) in ops.SCATTER_SUM_OPS:
                self.check_scatter_of_tokens(op, layouts)
                return Decision(REPLICATED, Action.ALL_REDUCE)  # the tokens' scatters into zeros add up
            along = self.sequence_dims_along(op)
            if kind is OpClass.SUM and (along or not ops.dim_operands(op_name(op))):
                # proven: the sum's dims name the sequence (torch.aten.sum sums every dim)
                return Decision(REPLICATED, Action.ALL_REDUCE)
            where = f" dimension ({along[0]})" if along else ""
            raise DiagnosticError.at(op, f"reduces over the sequence{where} with '{_schema_name(op)}', which autosp "
                                         "cannot split; along the sequence it splits sums (a mean exports as one), "
                                         "logsumexp, "
                                         "amax, softmax and log_softmax (each over the sequence dim alone), and "
                                         "selections of positions (x[:, 0], x[:, -1], index/gather by positions)")
        if len(res_dims) > 1:
            raise DiagnosticError.at(op, "produces a [.., S, S] tensor outside recognised attention; autosp "
                                         "cannot shard it")
        self.check_opaque(op, kind)
        self.check_token_wise(op, kind, tensor_operands)
        self.check_sizes_known(op, kind, tensor_operands, layouts, res_dims[0])
        return Decision(SequenceSharded(res_dims[0], window), Action.SHARD_OPERANDS)

    # ---------------------------------------------------------------- selections and reductions
    def decide_selection(self, op, kind: OpClass, tensor_operands, layouts, res_dims) -> Decision | None:
        """An op that keeps a fixed or data-dependent set of positions of a sequence-sharded
        operand 0 along its sequence dim, into a result without a sequence dim (a pooled
        row: ``h[:, 0]``, ``h[:, -1]``, ``h[:, i:i+k]``, the last non-pad token by an index
        tensor, a gather of the label's position): :data:`Action.SELECT_POSITIONS`, each rank
        picks its rows (zeros for the others') and a sum all-reduce gives every rank the
        selected rows, replicated. The positions must be replicated integers (an index
        tensor every rank computes whole) or constants; None when ``op`` is no selection."""
        if not layouts or not isinstance(layouts[0], SequenceSharded) or res_dims:
            return None
        lay, name, source = layouts[0], op_name(op), op.operands[0]
        rank = len(self.info.dims.get(source) or ())
        def on_sequence(v) -> bool:
            d = const_int(v)
            return bool(rank) and d is not None and d % rank == lay.dim
        if kind is OpClass.SELECT and on_sequence(op.operands[1]):
            at = self.bound(op, op.operands[2], lay.window, is_start=True)
            if at.from_end and at.offset >= 0:
                raise DiagnosticError.at(op, "selects a position at or past the end of the sequence")
            return Decision(REPLICATED, Action.SELECT_POSITIONS, index_dim=lay.dim, positions=(at.offset,))
        if kind is OpClass.SLICE and on_sequence(op.operands[1]):
            return Decision(REPLICATED, Action.SELECT_POSITIONS, index_dim=lay.dim,
                            positions=self.fixed_positions(op, lay.window))
        if kind is OpClass.INDEX:
            items = list_items(op.operands[1])
            if lay.dim >= len(items) or is_none(items[lay.dim]):
                return None
            index = items[lay.dim]
            if self.is_identity_range(index, source, lay.dim):
                return None
            others = [v for i, v in enumerate(items) if i != lay.dim and not is_none(v)]
            self.check_positions(op, index, others)
            return Decision(REPLICATED, Action.SELECT_POSITIONS, index_dim=lay.dim)
        if name in (ops.GATHER_OP, ops.INDEX_SELECT_OP) and on_sequence(op.operands[1]):
            self.check_positions(op, op.operands[2], [])
            return Decision(REPLICATED, Action.SELECT_POSITIONS, index_dim=lay.dim)
        return None

    def check_positions(self, op, index, others: list) -> None:
        """The positions of a selection (and the other index tensors beside them) must be
        replicated integer tensors without a sequence dim of their own."""
        shape = vtensor_shape(index.type)
        bad = None
        if shape is None or not shape[1].startswith(("si", "ui")):
            bad = f"positions {index.type} that are not an integer tensor (a boolean mask selects a number of " \
                  "positions that depends on the data; index with torch.nonzero's result or a position instead)"
        elif any(self.info.seq_dims(v) for v in [index] + others):
            bad = "an index tensor as long as the sequence (a permutation or a gather of every position)"
        if bad:
            raise DiagnosticError.at(op, f"selects positions of the sequence by {bad}; each rank holds only part of "
                                         "it, so autosp cannot shard this op")

    def fixed_positions(self, op, window: Window) -> tuple[int, ...]:
        """The positions a slice along the sequence to a fixed length keeps (index j of the
        operand's window; negative: from its end): ``x[:, a:b]`` and ``x[:, -k:]``."""
        step = op.operands[4]
        if not is_none(step) and const_int(step) != 1:
            raise DiagnosticError.at(op, "slices the sequence with a step; autosp supports step 1")
        start = self.bound(op, op.operands[2], window, is_start=True)
        end = self.bound(op, op.operands[3], window, is_start=False)
        if start.from_end == end.from_end and end.offset > start.offset:
            return tuple(range(start.offset, end.offset))
        where = lambda b: f"{b.offset} from the {'end' if b.from_end else 'start'}"  # noqa: E731
        raise DiagnosticError.at(op, f"slices the sequence from {where(start)} to {where(end)}, positions that "
                                     "depend on its length; autosp supports slices that trim a constant number of positions "
                                     "(x[:, 1:], x[:, :-1]) and fixed positions (x[:, a:b], x[:, -k:])")

    def decide_reduction(self, op, layouts, res_dims) -> Decision | None:
        """softmax / log_softmax along the sequence dim of a sharded operand 0 (result
        sharded alike, :data:`Action.SEQ_SOFTMAX`), and logsumexp / amax / argmax / max.dim
        over the sequence dim alone (results replicated, :data:`Action.SEQ_REDUCE`); None for
        other ops, or along other dims. Over the sequence and other dims together (or every
        dim: ``argmax(x)``), diagnosed."""
        name = _schema_name(op)
        if not layouts or not isinstance(layouts[0], SequenceSharded) or \
                (name not in ops.SEQUENCE_SOFTMAX and name not in ops.SEQUENCE_REDUCTIONS and name not in ops.ARGMAX_OPS):
            return None
        lay, rank = layouts[0], len(self.info.dims.get(op.operands[0]) or ())
        dims = _read_dims(op.operands[1])
        if dims is None or not rank:
            self._reduction_error(op, name, "a dim that is not a constant")
        if dims == "all":
            self._reduction_error(op, name, "every dim (the flattened tensor)")
        along = sorted({d % rank for d in dims})
        if lay.dim not in along:
            return None
        if along != [lay.dim]:
            self._reduction_error(op, name, f"dims {along}, the sequence dim ({lay.dim}) among others")
        if name in ops.SEQUENCE_SOFTMAX:
            return Decision(lay, Action.SEQ_SOFTMAX, index_dim=lay.dim)
        return Decision(REPLICATED, Action.SEQ_REDUCE, index_dim=lay.dim)

    @staticmethod
    def _reduction_error(op, name: str, what: str):
        raise DiagnosticError.at(op, f"is '{name}' over {what}; autosp splits it over the sequence dim alone "
                                     "(reduce the other dims in a separate op)")

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

    def check_sizes_known(self, op, kind: OpClass, tensor_operands: list, layouts: list, res_dim: int) -> None:
        """Diagnose a token-wise op about to be sharded along its result's dim ``res_dim``
        that broadcasts against it an operand dim of dynamic size the sequence analysis
        cannot relate to S (a ``max``/``min`` of sizes, ``prim.max.int``, has no affine
        binding): the rewriter would leave that operand whole and each rank would pair its
        part of the sequence with all of it (a size mismatch at run time, or a silent wrong
        pairing where it happens to broadcast)."""
        if kind is not OpClass.POINTWISE or not op.results:
            return
        result = vtensor_shape(op.results[0].type)
        if result is None:
            return
        for v, lay in zip(tensor_operands, layouts):
            shape = vtensor_shape(v.type)
            if shape is None or isinstance(lay, SequenceSharded):
                continue
            j = res_dim - (len(result[0]) - len(shape[0]))  # broadcasting aligns the trailing dims
            if 0 <= j < len(shape[0]) and shape[0][j] is None and self.info.length(v, j) is None:
                raise DiagnosticError.at(op, f"pairs the sequence (dim {res_dim} of its result) with dim {j} of an "
                                             f"operand {v.type} whose dynamic size autosp cannot relate to the "
                                             "sequence length (a max, min or condition of sizes, e.g. max(S, n)); "
                                             "each rank would pair its part of the sequence with all of it. Compute "
                                             "that size with +, -, *, // or % of the sequence length")

    def decide_masked_scatter(self, op, layouts, res_dims, window) -> Decision:
        """``masked_scatter(x, mask, source)`` reads the source in the order of the whole
        mask's true elements: it is not token-wise. With ``x`` or ``mask`` sharded and the
        source replicated (image features merged at image tokens), each rank takes its
        elements' places from the gathered mask (:data:`Action.MASKED_SCATTER`); a sharded
        source is refused."""
        source_layout = layouts[2] if len(layouts) > 2 else REPLICATED
        if isinstance(source_layout, SequenceSharded) or self.info.seq_dims(op.operands[2]) or len(res_dims) != 1:
            raise DiagnosticError.at(op, "scatters a source that is itself sequence-sharded (or into a result "
                                         "without one sequence dim); masked_scatter reads the source in the whole "
                                         "mask's order, so autosp cannot shard it")
        return Decision(SequenceSharded(res_dims[0], window), Action.MASKED_SCATTER)

    def decide_recurrence(self, op, tensor_operands, layouts, res_dims, window) -> Decision:
        """A recurrence with stated semantics (``ops.RECURRENCE_OPERATORS``): along dim 1 of
        every input and of the result. Sharded there, each rank runs its part from the
        previous rank's state (the emitter chains them over the group); any other layout
        of the sequence is refused."""
        name = _schema_name(op)
        bad = [f"{v.type} {lay}" for v, lay in zip(tensor_operands, layouts)
               if isinstance(lay, SequenceSharded) and lay.dim != 1 or self.info.seq_dims(v) not in ([1], [])]
        if bad or res_dims != [1]:
            raise DiagnosticError.at(op, f"is '{name}', a recurrence along dim 1, but its operands hold the sequence "
                                         f"elsewhere ({'; '.join(bad) or 'its result'}); autosp cannot chain it")
        if self.zigzag:
            raise DiagnosticError.at(op, f"is '{name}', a recurrence along the sequence: each rank runs its part "
                                         "from the previous one's state, which needs each rank's positions in one "
                                         "piece; the ring's zigzag layout gives it two (compile with "
                                         "sp_strategy='ulysses')")
        return Decision(SequenceSharded(1, window), Action.SHARD_OPERANDS)

    def causal_conv_halo(self, op, lay: SequenceSharded) -> int:
        """``k - 1`` for a causal 1-d convolution along the sequence (the last dim of its
        [B, C, S] input): kernel k (static), stride 1, dilation 1, padding k - 1, not
        transposed, and every use a slice of the output back to the input's length
        (``conv(x)[..., :S]``, as transformers' ``causal_conv1d_fn`` and Mamba's torch
        path write it). Output t then reads inputs t - k + 1 .. t only: each rank needs
        the k - 1 positions before its part (a halo) and convolves without padding."""
        x = op.operands[0]
        entries = self.info.dims.get(x) or []
        shape = vtensor_shape(op.operands[1].type)
        k = shape[0][-1] if shape is not None and len(shape[0]) == 3 else None
        stride, padding, dilation = (_read_dims(op.operands[i]) for i in (3, 4, 5))
        why = []
        if len(entries) != 3 or lay.dim != 2:
            why.append("it is not a 1-d convolution over the last dim")
        if k is None:
            why.append("its kernel size is not static")
        if stride != [1] or dilation != [1] or const_bool(op.operands[6]) is not False:
            why.append(f"stride {stride}, dilation {dilation} (1 and 1, not transposed, needed)")
        if k is not None and padding != [k - 1]:
            why.append(f"padding {padding} is not kernel - 1 = {k - 1 if k else '?'} (a causal convolution)")
        if self.zigzag:
            why.append("the ring's zigzag layout gives each rank two pieces of the sequence, and the halo needs one "
                       "(compile with sp_strategy='ulysses')")
        length = self.info.length(x, 2) if len(entries) == 3 else None
        for use in op.results[0].uses:
            user = use.owner
            if op_name(user) == ops.BIND_SHAPE:
                continue
            ends = op_name(user) == ops.SLICE_OP and user.operands[0] == op.results[0] and \
                const_int(user.operands[1]) in (2, -1) and (is_none(user.operands[2]) or const_int(user.operands[2]) == 0) \
                and (is_none(user.operands[4]) or const_int(user.operands[4]) == 1) and \
                self.info.scalars.get(user.operands[3]) == length
            if not ends:
                why.append(f"its output is used by '{op_name(user)}', not only cut back to the input's length "
                           "(conv(x)[..., :S])")
                break
        if why:
            raise DiagnosticError.at(op, "convolves along the sequence dimension (2) but is not a causal convolution "
                                         f"autosp can split with a halo: {'; '.join(why)}; each rank holds only part "
                                         "of the sequence, so autosp cannot shard this op")
        assert k is not None  # why would name it
        return k - 1

    def check_opaque(self, op, kind: OpClass) -> None:
        """An op torch-mlir kept opaque, with no semantics stated to autosp, on sharded values."""
        if kind is OpClass.OPAQUE:
            raise DiagnosticError.at(op, f"is '{_schema_name(op)}', an op torch-mlir keeps opaque; autosp does not "
                                         "know what it does along the sequence, so it cannot shard it (ops with "
                                         f"stated semantics: {', '.join(ops.TOKEN_WISE_OPERATORS + ops.COUNTING_OPS)})")

    def check_scatter_of_tokens(self, op, layouts) -> None:
        """``scatter_add(target, dim, index, src)`` splits over the tokens as local scatters
        plus an all-reduce only when the target is proven zero (else each rank adds it
        once more), replicated, and the sharded index scatters along its sequence dim."""
        target, dim_value, index = op.operands[0], op.operands[1], op.operands[2]
        if not _is_zeros(target) or isinstance(layouts[0], SequenceSharded):
            raise DiagnosticError.at(op, "scatter-adds sequence-sharded values into a target autosp cannot prove "
                                         "zero; each rank would add the target once more: scatter into zeros and "
                                         "add the target after")
        dim = const_int(dim_value)
        seq = self.info.seq_dims(index)
        if dim is None or len(seq) != 1 or dim % max(1, len(self.info.dims.get(index) or ())) != seq[0]:
            raise DiagnosticError.at(op, "scatter-adds along a dimension that is not the sequence of its index; "
                                         "autosp cannot split it over the tokens")

    def check_fixed_bins(self, op) -> None:
        """``histc(x, bins, min, max)`` adds up over any split of ``x`` only with a fixed range
        (``min < max``, constants); ``min == max`` takes the range from the data."""
        lo, hi = (const_float(v) for v in op.operands[2:4])
        if lo is None or hi is None or not lo < hi:
            raise DiagnosticError.at(op, "counts sequence-sharded values (histc) over a range that is not fixed "
                                         "(min and max constants, min < max); each rank would take the range from "
                                         "its own part, so autosp cannot split it")

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


# ============================================================================ reading the IR
def is_tensor(value) -> bool:
    """Is ``value`` a tensor (or a list of tensors)?"""
    return "vtensor" in str(value.type)


def _is_zeros(value) -> bool:
    """Is ``value`` proven all zeros from its producer (see :func:`uniform_fill`)?"""
    return uniform_fill(value) == 0.0


_FILLED = {"torch.aten.zeros": 0.0, "torch.aten.new_zeros": 0.0, "torch.aten.zeros_like": 0.0,
           "torch.aten.ones": 1.0, "torch.aten.new_ones": 1.0, "torch.aten.ones_like": 1.0}
_FILLED_WITH = ("torch.aten.full", "torch.aten.new_full", "torch.aten.full_like", "torch.aten.fill.Scalar")
_SAME_VALUES = ("torch.aten.broadcast_to", "torch.aten.expand", "torch.aten.clone", "torch.aten._to_copy",
                "torch.aten.to.dtype", "torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")


def uniform_fill(value) -> float | None:
    """The one value every element of ``value`` holds, proven from its producer (zeros,
    ones, full or fill with a constant, a splat literal, and copies, broadcasts and views
    of those), else None. Any rows of such a tensor are the same, so a rank needs no fold
    to take its part of it."""
    owner = producer(value)
    if owner is None:
        return None
    name = op_name(owner)
    if name in _FILLED:
        return _FILLED[name]
    if name in _FILLED_WITH:
        return const_float(owner.operands[1])
    if name in _SAME_VALUES:
        return uniform_fill(owner.operands[0])
    if name == "torch.vtensor.literal":
        attr = owner.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
            item = attr.get_splat_value()
            if isinstance(item, ir.BoolAttr):
                return float(item.value)
            if isinstance(item, (ir.FloatAttr, ir.IntegerAttr)):
                return float(item.value)
    return None


def _schema_name(op) -> str:
    """The aten name of ``op``, also for a ``torch.operator "torch.aten.X"`` torch-mlir kept opaque."""
    return ops.operator_name(op)


def _dim_sources(op) -> list:
    """The tensors an op's dim arguments index: its operand 0, or the items of a tensor list
    there (``torch.aten.cat``)."""
    if not op.operands:
        return []
    items = list_items(op.operands[0])
    return [v for v in items if is_tensor(v)] if items else [op.operands[0]]


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
