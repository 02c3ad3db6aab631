"""The cheapest tensor across ranks: Ulysses' cut moved back to a smaller source.

Ulysses hands each rank its heads of q, k and v over the whole sequence with all-to-alls:
per token of the sequence a rank receives ``(P - 1) / P`` of ``H x D / P`` values of each.
Where an operand is computed *token by token* from values without heads that are smaller
than that (MLA's compressed latent, 512 + 64 values against DeepSeek-V3's 40,960 of K and
V), it is cheaper to all-gather those values and compute this rank's heads of the operand
from them over the whole sequence. :class:`HeadSlicer` proves, rule by rule, that a
value's heads can be computed that way, finds the values to gather (the *sources*), and
builds the computation; :func:`autosp.cost.strategy.choose_cut` prices it against the
all-to-alls (``autosp-partition-attention`` asks both).

**What "this rank's heads" means.** A value ``V`` has a *head axis* ``(dim, H, E)``: dim
``dim`` of size ``H x E`` holds head ``h`` at indices ``[h E, (h + 1) E)`` (E = 1 for a
plain head dim). ``heads(V)`` is ``V`` narrowed along ``dim`` to heads
``[r H / P, (r + 1) H / P)``: the block the all-to-all to heads gives rank r. The rules,
each an identity on the op that produces ``V``:

* a parameter: ``heads(W)`` is ``autosp.local_heads`` of it (viewed ``[.., H, E, ..]``
  when ``E > 1``): no communication; its gradient is this rank's rows, summed over the
  ranks with every parameter gradient;
* ``permute`` / ``transpose`` / ``t``: the axis moves with its dim;
* ``view`` / ``reshape``: the axis maps to the input dim whose extent (with everything
  inside it) equals the axis' extent (with everything inside it); heads stay outermost;
* ``mm(A, B)`` along B's columns: ``mm(whole(A), heads(B))`` (``addmm``: the bias' heads too);
* ``slice`` / ``slice_scatter`` / ``cat`` along another dim, casts and copies, and
  element-wise ops: the same op on the operands' heads; an operand that broadcasts over
  the heads is taken whole;
* ``broadcast_to`` / ``expand`` of a value with one head (the shared rope key):
  the same broadcast to ``H / P`` heads of the whole value;
* ``empty`` / ``zeros`` / ``ones`` / ``full``: the same op with ``H / P`` heads.

Any other op ends the proof: the operand is all-to-all'd as before.

**Taking a value whole** (``whole(X)``, for values without the head axis): a value with no
sequence dim, or one no parameter reaches (positions, RoPE tables: replicated, whole on
every rank), is used as it is. A parameter-derived value with the sequence as one of its
dims is sequence-sharded: it is a *source*, gathered as
``squeeze(all_to_all(expand(unsqueeze(X, 0), P), split 0, concat seq))``: every rank sends
its part to every rank, which is an all-gather whose backward (the inverse all-to-all,
then the expand's sum) adds up what every rank's heads contributed to each position, the
reduce-scatter the gather needs here (each rank uses the gathered value for its own heads
only). A view that folds the sequence into rows (``[B * S, C]``) is taken as the view of
its whole source, and a product of such rows by a matrix without the sequence (a LoRA
adapter's ``A``) as the product of the whole rows, recomputed over the whole sequence.

The built computation runs on ``H / P`` heads over the whole sequence: the layouts pass
sees it as head-sharded, like an all-to-all's result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir import ops
from autosp.ir.contract import ALL_TO_ALL, LOCAL_HEADS, PARAMETER_ATTR
from autosp.ir.core import const_int, const_ints, list_items, main_func, op_name, producer
from autosp.ir.sequence import Linear, SequenceInfo

_PERMUTES = ("torch.aten.permute", "torch.aten.transpose.int", "torch.aten.t")
_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")
_BROADCASTS = ("torch.aten.broadcast_to", "torch.aten.expand")
_CREATES = ("torch.aten.empty.memory_format", "torch.aten.zeros", "torch.aten.ones", "torch.aten.full")
_UNARY = ("torch.aten.clone", "torch.aten.contiguous", "torch.aten._to_copy", "torch.aten.to.dtype",
          "torch.prims.convert_element_type", "torch.aten.detach", "torch.aten.alias", "torch.aten.neg",
          "torch.aten.mul.Scalar", "torch.aten.div.Scalar")  # (their other operands: no tensor)
_BINARY = ("torch.aten.mul.Tensor", "torch.aten.add.Tensor", "torch.aten.sub.Tensor", "torch.aten.div.Tensor")
_DTYPE_BYTES = {"f64": 8, "si64": 8, "f32": 4, "si32": 4, "bf16": 2, "f16": 2, "si16": 2, "si8": 1, "ui8": 1, "i1": 1}


@dataclass(frozen=True)
class Axis:
    """A head axis: dim ``dim`` holds ``heads`` heads of ``inner`` consecutive entries each."""

    dim: int
    heads: int
    inner: int = 1


def bytes_per_token(value, info: SequenceInfo) -> int | None:
    """Bytes of ``value`` per token of the sequence (its static dims' product times the
    multiple of S its sequence dim holds, times the element size); None if not a tensor
    with one sequence dim and otherwise static sizes."""
    shape = b.vtensor_shape(value.type)
    seq = info.seq_dims(value)
    if shape is None or len(seq) != 1:
        return None
    length = info.length(value, seq[0])
    if not isinstance(length, Linear) or length.a < 1 or length.b != 0:
        return None
    dims, dtype = shape
    rest = [d for i, d in enumerate(dims) if i != seq[0]]
    if None in rest or dtype not in _DTYPE_BYTES:
        return None
    return math.prod(rest) * length.a * _DTYPE_BYTES[dtype]  # type: ignore[arg-type]


class HeadSlicer:
    """Proves and builds ``heads(value)`` (see the module docstring) for one module.

    :meth:`sources` answers, without editing the IR, whether ``heads(value)`` can be
    computed from whole values and which of them must be gathered; :meth:`build` edits.
    Both memoise, so k and v built from one latent share its gather and its projection."""

    def __init__(self, module, info: SequenceInfo, sp_size: int, group: str, seq_len: ir.Value):
        self.info, self.p, self.group, self.seq_len = info, sp_size, group, seq_len
        func = main_func(module)
        args = func.regions[0].blocks[0].arguments
        self.params = set()
        if "arg_attrs" in func.attributes:
            for i, attr in enumerate(func.attributes["arg_attrs"]):
                if PARAMETER_ATTR in attr:
                    self.params.add(args[i])
        self._derived = set(self.params)  # every value a parameter reaches, in one walk
        for op in func.regions[0].blocks[0].operations:
            if any(x in self._derived for x in op.operands):
                self._derived.update(op.results)
        self._planned: dict = {}
        self._built: dict = {}
        self._whole: dict = {}

    # ------------------------------------------------------------------ analysis
    def derived(self, value) -> bool:
        """Does a parameter reach ``value`` (so that the layouts pass shards it)?"""
        return value in self._derived

    def sources(self, value, axis: Axis) -> frozenset | None:
        """The values ``heads(value)`` needs gathered (empty: none), or None where no rule
        proves it."""
        key = (value, axis)
        if key not in self._planned:
            self._planned[key] = None  # (a cycle would end the proof)
            self._planned[key] = self._plan(value, axis)
        return self._planned[key]

    def _plan(self, value, axis: Axis) -> frozenset | None:
        shape = b.vtensor_shape(value.type)
        if shape is None or axis.dim >= len(shape[0]) or shape[0][axis.dim] != axis.heads * axis.inner \
                or axis.heads % self.p:
            return None
        op = producer(value)
        if op is None:
            return frozenset() if value in self.params else None
        rule = self._rule(op, value, axis)
        if rule is None:
            return None
        found: set = set()
        for operand, sub in rule:
            got = self.sources(operand, sub) if isinstance(sub, Axis) else self.whole_sources(operand)
            if got is None:
                return None
            found |= got
        return frozenset(found)

    def whole_sources(self, value) -> frozenset | None:
        """What taking ``value`` whole (no head axis) needs gathered, or None if it cannot."""
        if value in self._whole:
            return self._whole[value]
        seq = self.info.seq_dims(value)
        got: frozenset | None
        if not seq or not self.derived(value):
            got = frozenset()  # replicated: whole on every rank already
        elif len(seq) == 1 and self.info.length(value, seq[0]) == Linear(1) \
                and bytes_per_token(value, self.info) is not None:
            got = frozenset([value])
        else:
            op = producer(value)
            got = self.whole_sources(op.operands[0]) if op is not None and _recomputed(op, self.info) else None
        self._whole[value] = got
        return got

    def _rule(self, op, value, axis: Axis) -> list | None:
        """``[(operand, Axis or None)]``: the operands ``heads(value)`` is computed from,
        with their head axis (None: taken whole); None where no rule applies."""
        name, d = op_name(op), axis.dim
        rank = len(b.vtensor_shape(value.type)[0])  # type: ignore[index]
        if name in _PERMUTES:
            src = self._permuted_dim(op, d, rank)
            return None if src is None else [(op.operands[0], Axis(src, axis.heads, axis.inner))]
        if name in _VIEWS:
            mapped = self._view_axis(op, axis)
            return None if mapped is None else [(op.operands[0], mapped)]
        if name == "torch.aten.mm" and d == 1:
            return [(op.operands[0], None), (op.operands[1], axis)]
        if name == "torch.aten.addmm" and d == 1 and _rank(op.operands[0]) == 1:
            return [(op.operands[0], Axis(0, axis.heads, axis.inner)), (op.operands[1], None),
                    (op.operands[2], axis)]
        if name == ops.SLICE_OP or name == "torch.aten.slice_scatter":
            along = const_int(op.operands[1 if name == ops.SLICE_OP else 2])
            if along is None or along % rank == d:
                return None
            tensors = op.operands[:1] if name == ops.SLICE_OP else op.operands[:2]
            return [(t, axis) for t in tensors]
        if name == "torch.aten.cat":
            along = const_int(op.operands[1])
            items = list_items(op.operands[0])
            if along is None or along % rank == d or not items:
                return None
            return [(t, axis) for t in items]
        if name in _BROADCASTS:
            x = op.operands[0]
            at = d - (rank - _rank(x))
            entry = _list_entry(op.operands[1], d)
            size = b.vtensor_shape(x.type)[0][at] if at >= 0 else 1  # type: ignore[index]
            if size == 1:  # one head, broadcast to all: taken whole, broadcast to H / P
                return [(x, None)] if entry == axis.heads * axis.inner else None
            return [(x, Axis(at, axis.heads, axis.inner))] if size == axis.heads * axis.inner else None
        if name in _CREATES:
            return [] if _list_entry(op.operands[0], d) == axis.heads * axis.inner else None
        if name in _UNARY:
            return [(op.operands[0], axis)]
        if name in _BINARY:
            rule: list[tuple[ir.Value, Axis | None]] = []
            for x in op.operands[:2]:
                shape = b.vtensor_shape(x.type)
                if shape is None:
                    continue  # a scalar operand
                at = d - (rank - len(shape[0]))
                size = shape[0][at] if at >= 0 else 1
                if size == 1:
                    rule.append((x, None))
                elif size == axis.heads * axis.inner:
                    rule.append((x, Axis(at, axis.heads, axis.inner)))
                else:
                    return None
            return rule
        return None

    @staticmethod
    def _permuted_dim(op, d: int, rank: int) -> int | None:
        name = op_name(op)
        if name == "torch.aten.t":
            return 1 - d if rank == 2 else d
        if name == "torch.aten.transpose.int":
            a, c = const_int(op.operands[1]), const_int(op.operands[2])
            if a is None or c is None:
                return None
            a, c = a % rank, c % rank
            return c if d == a else a if d == c else d
        perm = const_ints(op.operands[1])
        return None if perm is None else perm[d] % rank

    def _view_axis(self, op, axis: Axis) -> Axis | None:
        """The head axis of a view's input: the input dim whose extent times everything
        inside it equals the axis dim's (heads outermost in both)."""
        out = b.vtensor_shape(op.results[0].type)
        src = b.vtensor_shape(op.operands[0].type)
        if out is None or src is None:
            return None
        out_dims, src_dims = out[0], src[0]
        inside = out_dims[axis.dim + 1:]
        if None in inside:
            return None
        extent = axis.heads * axis.inner * math.prod(inside)  # type: ignore[arg-type]
        for j in range(len(src_dims)):
            rest = src_dims[j + 1:]
            if None in rest or src_dims[j] is None:
                continue
            below = math.prod(rest)  # type: ignore[arg-type]
            if src_dims[j] * below == extent and (axis.inner * math.prod(inside)) % below == 0:  # type: ignore
                return Axis(j, axis.heads, axis.inner * math.prod(inside) // below)  # type: ignore[arg-type]
        return None

    # ------------------------------------------------------------------ rewriting
    def build(self, value, axis: Axis, before) -> ir.Value:
        """``heads(value)``, built before op ``before`` (call :meth:`sources` first)."""
        key = (value, axis)
        if key not in self._built:
            self._built[key] = self._build(value, axis, before)
        return self._built[key]

    def _local_type(self, value, axis: Axis) -> ir.Type:
        dims, dtype = b.vtensor_shape(value.type)  # type: ignore[misc]
        dims = list(dims)
        dims[axis.dim] = axis.heads * axis.inner // self.p  # (the axis' size: proven static)
        return b.vtensor_type(dims, dtype)

    def _build(self, value, axis: Axis, before) -> ir.Value:
        op = producer(value)
        local_type = self._local_type(value, axis)
        if op is None:  # a parameter (sources() admitted only those)
            return self._local_parameter(value, axis, before)
        with ir.InsertionPoint(before), op.location:
            operands = list(op.operands)
            name = op_name(op)
            rule = self._rule(op, value, axis)
            assert rule is not None  # sources() proved it
            done: dict = {}
            for operand, sub in rule:
                done[operand] = self.build(operand, sub, before) if isinstance(sub, Axis) else \
                    self.whole(operand, before)
            if name == "torch.aten.cat":
                items = [done[t] for t in list_items(operands[0])]
                operands[0] = ir.Operation.create(ops.LIST_CONSTRUCT, results=[operands[0].type],
                                                  operands=items).result
            else:
                operands = [done.get(x, x) for x in operands]
            if name in _VIEWS or name in _BROADCASTS:
                operands[1] = self._sized(operands[1], axis)
            elif name in _CREATES:
                operands[0] = self._sized(operands[0], axis)
            attrs = {n: op.attributes[n] for n in op.attributes}
            return ir.Operation.create(name, results=[local_type], operands=operands, attributes=attrs).result

    def _sized(self, lst, axis: Axis) -> ir.Value:
        """A copy of size list ``lst`` with ``H / P`` heads at the axis (a -1 kept: a view
        infers the heads from the smaller input, a broadcast keeps the input's heads)."""
        items = list_items(lst)
        if const_int(items[axis.dim]) == -1:
            return lst
        items[axis.dim] = b.constant_int(axis.heads * axis.inner // self.p)
        return ir.Operation.create(ops.LIST_CONSTRUCT, results=[lst.type], operands=items).result

    def _local_parameter(self, value, axis: Axis, before) -> ir.Value:
        dims, dtype = b.vtensor_shape(value.type)  # type: ignore[misc]
        with ir.InsertionPoint(before), before.location:
            if axis.inner == 1:
                return b.autosp_op(LOCAL_HEADS, [value], self._local_type(value, axis), dim=axis.dim,
                                   heads=axis.heads, group=self.group)
            split = list(dims[:axis.dim]) + [axis.heads, axis.inner] + list(dims[axis.dim + 1:])
            viewed = _view(value, split, dtype)
            local = list(split)
            local[axis.dim] = axis.heads // self.p
            narrowed = b.autosp_op(LOCAL_HEADS, [viewed], b.vtensor_type(local, dtype), dim=axis.dim,
                                   heads=axis.heads, group=self.group)
            merged = list(dims)
            merged[axis.dim] = axis.heads * axis.inner // self.p
            return _view(narrowed, merged, dtype)

    def whole(self, value, before) -> ir.Value:
        """``value`` whole on every rank: itself where replicated, else gathered (the
        module docstring's all-to-all of P copies)."""
        key = ("whole", value)
        if key in self._built:
            return self._built[key]
        got = self.whole_sources(value)
        assert got is not None  # sources() proved it
        if not got:
            result = value
        elif got == frozenset([value]):
            result = self._gather(value, before)
        else:
            op = producer(value)
            source = self.whole(op.operands[0], before)
            with ir.InsertionPoint(before), op.location:
                result = ir.Operation.create(op_name(op), results=[value.type], operands=[source, *op.operands[1:]]
                                             ).result
        self._built[key] = result
        return result

    def _gather(self, value, before) -> ir.Value:
        dims, dtype = b.vtensor_shape(value.type)  # type: ignore[misc]
        seq = self.info.seq_dims(value)[0]
        loc = producer(value).location if producer(value) is not None else before.location
        with ir.InsertionPoint(before), loc:
            one = b.torch_op("torch.aten.unsqueeze", [value, b.constant_int(0)], b.vtensor_type([1, *dims], dtype))
            sizes = [b.constant_int(self.p)] + [b.constant_int(-1) for _ in dims]
            lst = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                                      operands=sizes).result
            copies = b.torch_op("torch.aten.broadcast_to", [one, lst], b.vtensor_type([self.p, *dims], dtype))
            moved = b.autosp_op(ALL_TO_ALL, [copies, self.seq_len], b.vtensor_type([1, *dims], dtype), split_dim=0,
                                concat_dim=seq + 1, seq_dim=seq + 1, group=self.group)
            return b.torch_op("torch.aten.squeeze.dim", [moved, b.constant_int(0)], value.type)


def _recomputed(op, info: SequenceInfo) -> bool:
    """Is ``op``'s result, whole, ``op`` of its first operand whole (the rest unchanged)?
    A view or reshape (rows that fold the sequence), or a product by a matrix without the
    sequence (a LoRA adapter's ``A`` on a gathered latent: recomputed over the whole
    sequence rather than gathered from a view that folds it)."""
    name = op_name(op)
    if name in _VIEWS:
        return True
    return name == "torch.aten.mm" and not info.seq_dims(op.operands[1])


def _rank(value) -> int:
    shape = b.vtensor_shape(value.type)
    return 0 if shape is None else len(shape[0])


def _list_entry(value, i: int) -> int | None:
    """Entry ``i`` of a size list where it is a constant, else None."""
    items = list_items(value)
    return const_int(items[i]) if i < len(items) else None


def _view(value, dims: list, dtype: str) -> ir.Value:
    lst = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                              operands=[b.constant_int(d) for d in dims]).result
    return b.torch_op("torch.aten.view", [value, lst], b.vtensor_type(dims, dtype))
