"""``autosp-shard-sequence``: give every value a layout and make each rank compute its shard.

Three parts, as Shardy separates sharding rules, propagation and export:

* the **layouts** (:class:`Replicated`, :class:`SequenceSharded`, :class:`HeadSharded`)
  and the **op rules** (:func:`op_class` and :class:`Rules`): what an op class does to the
  layouts of its operands, decided from the layouts and the sequence analysis alone
  (both in :mod:`autosp.passes.shard_rules`);
* the **propagation** (:class:`_Propagation`) walks the function in program order, asks
  the rules for each op and hands the decision to the **rewriter** (:class:`_Rewriter`),
  the only part that edits the IR.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from autosp.passes.shard_rules import (
    HEAD_SHARDED,
    REPLICATED,
    Action,
    Decision,
    Layout,
    OpClass,
    Rules,
    SequenceSharded,
    Window,
    is_tensor,
    list_items,
    op_class,
    uniform_fill,
)
from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir import ops
from autosp.ir.contract import (
    ALL_GATHER,
    ALL_REDUCE,
    ATTENTION_ATTR,
    BUFFER_WRITES_ATTR,
    GRAD_SHARE,
    HALO,
    LOCAL_LEN,
    LOCAL_POSITIONS,
    MASKED_SCATTER,
    PARAMETER_ATTR,
    REWINDOW,
    SCAN_GROUP_ATTR,
    SEQ_ARGMAX,
    SEQ_ATTR,
    SEQ_SOFTMAX,
    SHARD,
    SHARDED_RESULTS_ATTR,
    SP_LAYOUT_ATTR,
)
from autosp.ir.core import as_operation, body_ops, const_bool, const_int, main_func, op_name, producer, tensor_dims
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.layout import SeqLayout
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
    7. A selection of positions into a result without a sequence dim (``x[:, 0]``,
       ``x[:, -1]``, ``x[:, a:b]``, ``x[:, -k:]``, an ``index``/``gather``/``index_select``
       by a replicated integer index: a reward model's last non-pad token, a QA label's
       position) is split as the owning rank's rows: the sharded operand gets one zero row
       (``constant_pad_nd``), the positions become ``autosp.local_positions`` (this rank's
       row, or that zero row where another rank holds the position), and the result is
       summed over the group (``autosp.all_reduce``), replicated, as a sum's is (rule 3).
       ``softmax``/``log_softmax`` along the sequence become ``autosp.softmax`` (sharded
       like their input); ``logsumexp``/``amax``/``argmax`` over the sequence dim alone
       become ``autosp.logsumexp``/``autosp.amax``/``autosp.argmax`` (replicated; a
       ``max.dim`` both). ``topk``, ``sort`` and reductions over the sequence together
       with other dims stay diagnosed (rule 6).

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


class _Rewriter:
    """The IR edits that make a rank compute its shard (the only part that edits the IR)."""

    def __init__(self, info: SequenceInfo, group: str, seq_len: ir.Value):
        self.info, self.group, self.seq_len = info, group, seq_len
        self.local_lens: dict = {}  # Window -> the one autosp.local_len of that window

    def shard(self, op, value, dim: int, window: Window, layouts: dict | None = None) -> ir.Value:
        """Slice a replicated operand to this rank's part of ``window``. Its sequence dim has
        the window's length, or a multiple a of it: rows folding the sequence with other
        dims, read from the views that merged them (``[B, None]``: batch x sequence,
        ``[B, None, k]``: each token's k rows). The fold must be the one the op's sharded
        operands have (``layouts``), or the rank's slice would hold other rows than theirs;
        a value proven uniform (:func:`uniform_fill`: ``full_like(logits, -inf)``) needs none,
        its rows being all alike."""
        length = self.info.length(value, dim)
        if not isinstance(length, Linear) or length.a < 1 or length != window.length.times(length.a):
            raise DiagnosticError.at(op, f"needs operand {value.type} sliced along its sequence dim {dim} "
                                         f"(size {length if length is not None else '?'}), which does not match "
                                         f"the window {window.length} of the sharded operands")
        merged = None
        if length.a > 1 and uniform_fill(value) is None:  # rows folding the sequence with other dims: read how, from the views
            merged = _folded_rows(value, dim, self.info.length)
            if merged is None or math.prod(d for d in merged if d is not None) != length.a:
                raise DiagnosticError.at(op, f"needs operand {value.type} sliced along dim {dim}, whose rows fold the "
                                             "sequence with other dims in an order autosp cannot read from the IR; "
                                             "each rank's slice would take other rows than its own: compute it "
                                             "from the sharded values instead")
            theirs = self.sharded_folds(op, layouts or {}, length)
            if not theirs or any(f is None or _dims_over_one(f) != _dims_over_one(merged) for f in theirs):
                seen = ", ".join(str(f) for f in theirs) if theirs else "a fold autosp cannot read from the IR"
                raise DiagnosticError.at(op, f"needs operand {value.type} sliced along dim {dim}, whose rows fold the "
                                             f"sequence with other dims as {merged} (None: the sequence), but its "
                                             f"sequence-sharded operands' rows fold as {seen}; each rank's slice "
                                             "would take other rows than its own: compute it from the sharded "
                                             "values instead")
        with ir.InsertionPoint(op), op.location:
            if merged is None or merged[-1] is None:  # the sequence innermost: autosp.shard slices each row
                return b.autosp_op(SHARD, [value, self.seq_len], value.type, dim=dim, lo=window.lo,
                                   trim=window.trim, group=self.group)
            # Other dims inside the sequence ([B * S * k]: a repeat_interleave of a flattened
            # mask): unfold, slice the sequence dim, fold back (the sharded rows' order).
            opened = _view(value, _unfolded(value, dim, merged))
            sliced = b.autosp_op(SHARD, [opened, self.seq_len], opened.type, dim=dim + merged.index(None),
                                 lo=window.lo, trim=window.trim, group=self.group)
            return _view(sliced, tensor_dims(value), value.type)

    def masked_scatter(self, op, lay: SequenceSharded) -> ir.Value:
        """``masked_scatter`` as ``autosp.masked_scatter`` (see ``Rules.decide_masked_scatter``)."""
        x, mask, source = op.operands[0], op.operands[1], op.operands[2]
        with ir.InsertionPoint(op), op.location:
            merged = b.autosp_op(MASKED_SCATTER, [x, mask, source, self.seq_len], op.results[0].type, dim=lay.dim,
                                 lo=lay.window.lo, trim=lay.window.trim, group=self.group)
        op.results[0].replace_all_uses_with(merged)
        self.info.dims[merged] = self.info.dims.get(op.results[0])
        op.erase()
        return merged

    def grad_share(self, op, v) -> ir.Value:
        """``autosp.grad_share`` of ``v``, just before ``op``."""
        with ir.InsertionPoint(op), op.location:
            return b.autosp_op(GRAD_SHARE, [v], v.type, group=self.group)

    def halo(self, op, lay: SequenceSharded, width: int) -> None:
        """A causal convolution (``Rules.causal_conv_halo``) on this rank's part: its input
        gets the ``width`` positions before the part (``autosp.halo``), its padding 0."""
        x = op.operands[0]
        with ir.InsertionPoint(op), op.location:
            op.operands[0] = b.autosp_op(HALO, [x, self.seq_len], x.type, dim=lay.dim, width=width,
                                         lo=lay.window.lo, trim=lay.window.trim, group=self.group)
            zero = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                                       operands=[b.constant_int(0)]).result
            op.operands[4] = zero

    def sharded_folds(self, op, layouts: dict, length) -> list:
        """The folds (:func:`_folded_rows`) of ``op``'s sequence-sharded tensor operands whose
        sharded dim has ``length``; None where one cannot be read."""
        folds = []
        for v in op.operands:
            for u in list_items(v) or [v]:
                lay = layouts.get(u) if is_tensor(u) else None
                if isinstance(lay, SequenceSharded) and self.info.length(u, lay.dim) == length:
                    folds.append(_folded_rows(u, lay.dim, self.info.length))
        return folds

    def sharded_operand(self, op, v, window: Window, layouts: dict):
        """``v`` itself if it is sharded or has no sequence dim, else its shard on ``window``."""
        if not is_tensor(v) or isinstance(layouts.get(v), SequenceSharded):
            return v
        dims = self.info.seq_dims(v)
        if not dims:
            return v
        if len(dims) > 1:
            raise DiagnosticError.at(op, "has a replicated operand with two sequence dims")
        return self.shard(op, v, dims[0], window, layouts)

    def shard_operands(self, op, window: Window, layouts: dict) -> None:
        for i, v in enumerate(list(op.operands)):
            items = list_items(v)
            if items:  # a list of tensors (torch.aten.cat): shard its replicated items
                new_items = [self.sharded_operand(op, item, window, layouts) for item in items]
                if any(x != y for x, y in zip(new_items, items)):
                    with ir.InsertionPoint(op), op.location:
                        op.operands[i] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[v.type],
                                                             operands=new_items).result
            elif is_tensor(v):
                op.operands[i] = self.sharded_operand(op, v, window, layouts)
        if op_name(op) in ops.SIZE_LIST_OPS:
            self.localise_size_list(op, window)
        else:
            self.check_no_global_sizes(op)

    def localise_index(self, op, dim: int, window: Window, layouts: dict) -> None:
        """Replace the identity range indexing sequence dim ``dim`` by this rank's local
        range (the same ``arange``, then unsqueezes, to the local length), then shard the
        other operands as usual."""
        items = list_items(op.operands[1])
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
        for i, item in enumerate(list_items(lst)):
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
        for scalar in list(op.operands) + [i for v in op.operands for i in list_items(v)]:
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

    def select_positions(self, op, lay: SequenceSharded, positions: tuple[int, ...] | None) -> ir.Value:
        """A selection of positions along ``lay.dim`` (``Rules.decide_selection``) on this
        rank's part: the sharded operand gets one zero row appended there, and the positions
        (the op's index tensor, or for a select / fixed slice a literal of them) become
        ``autosp.local_positions``: this rank's rows, or that zero row where another rank
        holds one. Returns the local result (the caller all-reduces it)."""
        x, name, dim = op.operands[0], op_name(op), lay.dim
        with ir.InsertionPoint(op), op.location:
            shape = b.vtensor_shape(x.type)
            assert shape is not None  # a sharded tensor
            rank = len(shape[0])
            pad = [b.constant_int(0)] * (2 * (rank - 1 - dim)) + [b.constant_int(0), b.constant_int(1)]
            pad_list = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                                           operands=pad).result
            padded_shape = list(shape[0])
            padded_shape[dim] = None
            padded = b.torch_op(ops.CONSTANT_PAD_OP, [x, pad_list, b.constant_int(0)],
                                b.vtensor_type(padded_shape, shape[1]))
            if positions is None:  # an index tensor: index / gather / index_select keep their own form
                op.operands[0] = padded
                if name in ops.INDEX_OPS:
                    items = list_items(op.operands[1])
                    items[dim] = self.local_positions(items[dim], lay.window)
                    op.operands[1] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[op.operands[1].type],
                                                         operands=items).result
                else:
                    op.operands[2] = self.local_positions(op.operands[2], lay.window)
                return op.results[0]
            literal = b.literal_ints(list(positions))
            out_shape, out_dtype = b.vtensor_shape(op.results[0].type) or ([], shape[1])
            picked_shape = list(out_shape)
            if op_name(op) == ops.SELECT_OP:
                picked_shape.insert(dim, 1)
            picked = b.torch_op(ops.INDEX_SELECT_OP, [padded, b.constant_int(dim),
                                                      self.local_positions(literal, lay.window)],
                                b.vtensor_type(picked_shape, out_dtype))
            if op_name(op) == ops.SELECT_OP:
                picked = b.torch_op(ops.SQUEEZE_DIM_OP, [picked, b.constant_int(dim)], op.results[0].type)
        op.results[0].replace_all_uses_with(picked)
        op.erase()
        return picked

    def local_positions(self, positions, window: Window) -> ir.Value:
        """``autosp.local_positions`` of ``positions`` (a replicated integer tensor) on ``window``."""
        return b.autosp_op(LOCAL_POSITIONS, [positions, self.seq_len], positions.type, lo=window.lo,
                           trim=window.trim, group=self.group)

    def seq_softmax(self, op, lay: SequenceSharded) -> ir.Value:
        """softmax / log_softmax along the sequence as ``autosp.softmax`` (its dtype argument,
        or a half-to-float ``_softmax``, as the result's element type)."""
        x, result = op.operands[0], op.results[0]
        in_type, out_type = b.vtensor_shape(x.type), b.vtensor_shape(result.type)
        dtype = out_type[1] if in_type and out_type and in_type[1] != out_type[1] else ""
        with ir.InsertionPoint(op), op.location:
            new = b.autosp_op(SEQ_SOFTMAX, [x], result.type, dim=lay.dim,
                              log=int(ops.SEQUENCE_SOFTMAX[ops.operator_name(op)]), dtype=dtype, group=self.group)
        return self._replace(op, new)

    def seq_reduce(self, op, lay: SequenceSharded) -> list:
        """logsumexp / amax / argmax over the sequence dim as ``autosp.logsumexp`` /
        ``autosp.amax`` / ``autosp.argmax`` (keepdim; squeezed after where the op does not
        keep it); ``max.dim``'s values as ``autosp.amax``, its indices as ``autosp.argmax``.
        Returns the new results (none for a result nobody uses)."""
        x, name, dim = op.operands[0], ops.operator_name(op), lay.dim
        keep = const_bool(op.operands[2]) if len(op.operands) > 2 else False
        shape = b.vtensor_shape(x.type)
        assert shape is not None  # a tensor
        kept = list(shape[0])
        kept[dim] = 1
        if name == "torch.aten.max.dim":
            kinds = [ops.SEQUENCE_REDUCTIONS["torch.aten.amax"], SEQ_ARGMAX]
        else:
            kinds = [SEQ_ARGMAX if name in ops.ARGMAX_OPS else ops.SEQUENCE_REDUCTIONS[name]]
        news = []
        with ir.InsertionPoint(op), op.location:
            for kind, result in zip(kinds, op.results):
                if not any(op_name(use.owner) != ops.BIND_SHAPE for use in result.uses):
                    continue  # (max.dim's values when only its indices are used: no collective for them)
                out = b.vtensor_shape(result.type)
                assert out is not None  # a tensor
                type_ = result.type if keep else b.vtensor_type(kept, out[1])
                if kind == SEQ_ARGMAX:
                    new = b.autosp_op(kind, [x, self.seq_len], type_, dim=dim, lo=lay.window.lo,
                                      trim=lay.window.trim, group=self.group)
                else:
                    new = b.autosp_op(kind, [x], type_, dim=dim, group=self.group)
                if not keep:
                    new = b.torch_op(ops.SQUEEZE_DIM_OP, [new, b.constant_int(dim)], result.type)
                result.replace_all_uses_with(new)
                news.append(new)
        for result in op.results:  # what is left: shape bindings of a result nobody uses
            for use in list(result.uses):
                use.owner.erase()
        op.erase()
        return news

    def _replace(self, op, new) -> ir.Value:
        op.results[0].replace_all_uses_with(new)
        if op.results[0] in self.info.dims:
            self.info.dims[new] = self.info.dims[op.results[0]]
        op.erase()
        return new

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
            if not any(is_tensor(r) for r in op.results):
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
        tensor_operands = [v for v in operands if is_tensor(v)]
        tensor_operands += [item for v in operands for item in list_items(v) if is_tensor(item)]
        layouts = [self.layout(v) for v in tensor_operands]
        derived = any(v in self.param_derived for v in operands + tensor_operands)
        if derived:
            self.param_derived.update(op.results)
        kind = op_class(op)
        decision = self.rules.decide(op, kind, tensor_operands, layouts, derived)
        self.check_sequence_sums(op, tensor_operands, decision)
        result = op.results[0]
        if kind is OpClass.RECURRENCE and isinstance(decision.layout, SequenceSharded):  # chained over the group
            op.attributes[SCAN_GROUP_ATTR] = ir.StringAttr.get(self.rewriter.group)
        if decision.action is Action.SHARD_OPERANDS:
            self.rewriter.shard_operands(op, decision.sharded().window, self.layouts)
        elif decision.action is Action.LOCAL_INDEX:
            assert decision.index_dim is not None, decision  # Rules sets it with LOCAL_INDEX
            self.rewriter.localise_index(op, decision.index_dim, decision.sharded().window, self.layouts)
        elif decision.action is Action.ALL_REDUCE:
            windows = {lay.window for lay in (self.layout(v) for v in op.operands) if isinstance(lay, SequenceSharded)}
            if op_name(op) in ops.SCATTER_SUM_OPS and windows:  # a replicated src: this rank's tokens of it
                self.rewriter.shard_operands(op, windows.pop(), self.layouts)
            self.from_sequence_sums[self.rewriter.all_reduce(op)] = op
        elif decision.action is Action.SELECT_POSITIONS:
            source = self.layout(op.operands[0])
            assert isinstance(source, SequenceSharded), source  # Rules select from a sharded operand 0
            picked = self.rewriter.select_positions(op, source, decision.positions)
            reduced = self.rewriter.all_reduce(picked.owner)
            self.from_sequence_sums[reduced] = reduced.owner
            self.param_derived.update([picked, reduced] if derived else [])
            return
        elif decision.action is Action.SEQ_SOFTMAX:
            new = self.rewriter.seq_softmax(op, decision.sharded())
            self.layouts[new] = decision.layout
            self.param_derived.update([new] if derived else [])
            return
        elif decision.action is Action.SEQ_REDUCE:
            source = self.layout(op.operands[0])
            assert isinstance(source, SequenceSharded), source  # Rules reduce a sharded operand 0
            for new in self.rewriter.seq_reduce(op, source):
                if (b.vtensor_shape(new.type) or ((), ""))[1].startswith(("f", "bf")):  # (positions: no gradient)
                    self.from_sequence_sums[new] = new.owner
                self.param_derived.update([new] if derived else [])
            return
        elif decision.action is Action.HALO:
            self.rewriter.halo(op, decision.sharded(), decision.halo)
        elif decision.action is Action.MASKED_SCATTER:
            self.rewriter.shard_operands(op, decision.sharded().window, self.layouts)  # x and mask, if replicated
            merged = self.rewriter.masked_scatter(op, decision.sharded())
            self.layouts[merged] = decision.layout
            if derived:
                self.param_derived.add(merged)
            return
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
        share, while its all-reduce's local backward needs the full one. A value every rank
        computes whole from the parameters that joins it (``loss * scale``) gets its
        gradient's share (:meth:`redundant`, ``autosp.grad_share``)."""
        sums = [self.from_sequence_sums[v] for v in tensor_operands if v in self.from_sequence_sums]
        if not sums:
            return
        if decision.layout != REPLICATED:
            raise DiagnosticError.at(op, f"uses a sum over the sequence ('{op_name(sums[0])}') "
                                         "together with sequence-sharded values; each rank's gradient of that sum "
                                         "would miss the other ranks' positions, so autosp cannot shard this op")
        for i, v in enumerate(list(op.operands)):  # a whole value of the parameters joins the sum: its share
            if self.redundant(v):
                op.operands[i] = self.rewriter.grad_share(op, v)
        for r in op.results:
            self.from_sequence_sums[r] = sums[0]

    def redundant(self, v) -> bool:
        """Is ``v`` a float tensor every rank computes whole from the parameters (replicated,
        parameter-derived, not from a sum over the ranks)? Where it meets the objective its
        gradient would count once per rank."""
        shape = b.vtensor_shape(v.type) if is_tensor(v) else None
        return shape is not None and shape[1].startswith(("f", "bf")) and self.layout(v) == REPLICATED and \
            v in self.param_derived and v not in self.from_sequence_sums

    def check_local_scalars(self, op) -> None:
        """A local length may only shape sequence-sharded results."""
        if isinstance(self.layout(op.results[0]), SequenceSharded):
            return
        scalars = list(op.operands) + [i for v in op.operands for i in list_items(v)]
        if any(v in self.local_scalars for v in scalars):
            raise DiagnosticError.at(op, "uses the local length of a sharded tensor to build a replicated one; "
                                         "compute it from the input's size instead")


_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")


def _folded_rows(value, dim: int, length=None):
    """How the rows of ``value``'s sharded dim ``dim`` fold the sequence with other dims:
    the sizes of the dims a view merged into it, in order (None for the sequence), or None
    when that dim is the sequence alone. Followed back through ops that keep operand 0's
    dims up to ``dim`` (row-wise work such as a router's linear) to the view that merged
    them; diagnosed when no such view is found. With ``length`` (the analysis' length of a
    value's dim), a merged dim that itself folds the sequence is read the same way, so
    ``mask.reshape(-1).repeat_interleave(k)`` gives ``[B, None, k]``."""
    shape = tensor_dims(value)
    if shape is None or shape.count(None) != 1 or shape[dim] is not None:
        return None
    op = producer(value)
    while op is not None:
        src = op.operands[0] if op.operands else None
        src_dims = tensor_dims(src) if src is not None else None
        if src_dims is None:
            return None
        if op_name(op) in _VIEWS:
            out_dims = tensor_dims(op.results[0]) or []
            if src_dims != out_dims:  # the view that shaped this dim: which dims it merged
                rest = out_dims[dim + 1:]
                if src_dims[:dim] != out_dims[:dim] or src_dims[len(src_dims) - len(rest):] != rest:
                    return None
                merged = src_dims[dim:len(src_dims) - len(rest)]
                if len(merged) < 2 or merged.count(None) != 1:
                    return None
                at = merged.index(None)
                inner = length(src, dim + at) if length is not None else None
                if isinstance(inner, Linear) and inner.a > 1:  # that dim folds the sequence too
                    sub = _folded_rows(src, dim + at, length)
                    if sub is None:
                        return None
                    merged = merged[:at] + sub + merged[at + 1:]
                return merged
        elif src_dims[:dim + 1] != shape[:dim + 1]:
            return None  # no view merged dims into it here: the sequence alone, as it came
        op = producer(src)
    return None


def _dims_over_one(fold) -> list:
    """A fold without its size-1 dims (they do not change the rows' order)."""
    return [d for d in fold if d != 1]


def _unfolded(value, dim: int, merged) -> list:
    """``value``'s dims with dim ``dim`` opened into ``merged`` (None: the sequence)."""
    shape = tensor_dims(value)
    assert shape is not None  # a tensor: _folded_rows read its dims
    return shape[:dim] + list(merged) + shape[dim + 1:]


def _view(value, dims, type_=None) -> ir.Value:
    """``torch.aten.view`` of ``value`` to ``dims`` (None: the one dynamic size, -1)."""
    found = b.vtensor_shape(value.type)
    assert found is not None
    sizes = [b.constant_int(-1 if d is None else d) for d in dims]
    listed = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                                 operands=sizes).result
    return b.torch_op("torch.aten.view", [value, listed], type_ or b.vtensor_type(list(dims), found[1]))


def _gather_output(ret, value, lay, seq_len, group: str):
    """``value`` gathered along its sharded dim. Where that dim folds the sequence with
    other dims (``[B * S_local, E]``: a router's logits), it is unfolded first, gathered
    along the sequence, and folded back: concatenating the ranks' folded rows would put
    rank 1's rows of batch entry 0 after rank 0's of entry 1."""
    merged = _folded_rows(value, lay.dim)
    if merged is None:
        return b.autosp_op(ALL_GATHER, [value, seq_len], value.type, dim=lay.dim, lo=lay.window.lo,
                           trim=lay.window.trim, group=group)
    opened = _view(value, _unfolded(value, lay.dim, merged))
    gathered = b.autosp_op(ALL_GATHER, [opened, seq_len], opened.type, dim=lay.dim + merged.index(None),
                           lo=lay.window.lo, trim=lay.window.trim, group=group)
    return _view(gathered, tensor_dims(value), value.type)


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
    attrs = as_operation(module).attributes
    zigzag = SP_LAYOUT_ATTR in attrs and SeqLayout.parse(ir.StringAttr(attrs[SP_LAYOUT_ATTR]).value).zigzag
    walk = _Propagation(info, Rules(info, params, zigzag), _Rewriter(info, group, seq_len), set(params))
    walk.run(func)
    ret = walk.returned
    if ret is None:
        raise DiagnosticError.at(func, "@main has no func.return")
    layouts = []
    writes = len(func.attributes[BUFFER_WRITES_ATTR]) if BUFFER_WRITES_ATTR in func.attributes else 0
    for i, v in enumerate(list(ret.operands)):
        lay = walk.layout(v)
        if lay == HEAD_SHARDED:
            raise DiagnosticError.at(ret, f"returns head-sharded attention internals (result {i})")
        if i < writes and lay != REPLICATED:
            raise DiagnosticError.at(ret, f"writes a buffer (result {i}) with a value that is {lay} on each rank, "
                                          "not the same on every rank: a buffer the forward writes must be a "
                                          "function of the whole sequence (a count or a sum over it)")
        if walk.redundant(v):  # returned whole from the parameters: each rank's share of its gradient
            ret.operands[i] = walk.rewriter.grad_share(ret, v)
        if isinstance(lay, SequenceSharded) and gather_outputs:
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[i] = _gather_output(ret, v, lay, seq_len, group)
            lay = REPLICATED
        layouts.append(None if lay == REPLICATED else lay)
    with func.context:
        func.attributes[SHARDED_RESULTS_ATTR] = ir.ArrayAttr.get(
            [ir.IntegerAttr.get(ir.IntegerType.get_signless(64), i) for i, lay in enumerate(layouts) if lay is not None])
    for op in list(body_ops(func)):
        if op_name(op) == ops.BIND_SHAPE:
            op.erase()
        else:  # the analysis' notes describe global sizes; the IR is now per rank
            for attr in (SEQ_ATTR, ATTENTION_ATTR):
                if attr in op.attributes:
                    del op.attributes[attr]
    return {"returned": layouts}
