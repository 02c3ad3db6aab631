"""``autosp-hoist-shard``: slice replicated values at their source, not at their use.

``autosp-shard-sequence`` keeps parameter-free work replicated (every rank computes it
over the whole sequence) and slices it with ``autosp.shard`` where it meets sharded
values. For RoPE that means each rank builds the cos/sin tables of all S positions (in
fp32, then in the model's dtype) to keep 1/P of them: 6 GiB per rank at 4M tokens for
Llama-3-8B. This pass moves each ``autosp.shard`` above the ops that compute its operand
when they are proven row-wise along the sharded dimension, so each rank computes its own
rows only.

An op is hoisted over when the shards are its result's only users (all with the same
attributes and length operand) and it is one of (sizes read from the result types):

* element-wise (unary math, casts, arithmetic with broadcasting): each tensor operand
  whose dim aligned with the sharded one is dynamic is sharded along it; an operand that
  lacks that dim or has size 1 there (a broadcast) is used whole. torch.export
  specialises sizes 0 and 1, so a dynamic dim that broadcasts against the sequence is the
  sequence;
* ``unsqueeze`` / ``transpose.int``: the dim is mapped through;
* ``cat`` along another dim: every part is sharded;
* ``matmul``/``bmm`` whose sharded dim is the result's row (column) dim and whose other
  operand has static sizes: only the left (right) operand is sharded (each row of the
  result reads one row of it).

Anything else (views with size lists, reductions, ops reading several rows) stops the
hoist; the values computed stay exact: a shard of a row-wise op's result is the op on the
shards of its operands. Finally, shards of one value with the same attributes are merged
into the first.

Input::

    %c = torch.aten.cos %f : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
    %u = torch.aten.unsqueeze %c, %int1 : ... -> !torch.vtensor<[1,1,?,8],f32>
    %s = "autosp.shard"(%u, %S) {dim = 2 : i64, ...}

Output::

    %f_r = "autosp.shard"(%f, %S) {dim = 1 : i64, ...}
    %c_r = torch.aten.cos %f_r : ...
    %s = torch.aten.unsqueeze %c_r, %int1 : ...
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.passes.dce import eliminate_dead_code
from torch_mlir import ir

from autosp.ir.contract import SHARD
from autosp.ir.core import const_int, funcs, op_name, producer, tensor_dims, users
from autosp.ir.ops import BIND_SHAPE
from autosp.ir.pass_base import ModulePass

ELEMENTWISE = frozenset(f"torch.aten.{n}" for n in (
    "cos", "sin", "tan", "tanh", "exp", "log", "neg", "abs", "sqrt", "rsqrt", "reciprocal", "sigmoid",
    "floor", "ceil", "round", "to.dtype", "to.dtype_layout", "_to_copy", "type_as", "clone", "float",
    "mul.Tensor", "mul.Scalar", "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "div.Tensor",
    "div.Scalar", "pow.Tensor_Scalar", "remainder.Scalar", "fmod.Scalar", "floor_divide.Scalar",
    "eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar", "where.self",
    "where.ScalarSelf", "where.ScalarOther", "where.Scalar"))
MATMULS = ("torch.aten.matmul", "torch.aten.bmm")


def _norm(dim: int | None, rank: int) -> int | None:
    if dim is None:
        return None
    return dim + rank if dim < 0 else dim


def _operand_dims(op, dim: int) -> dict[int, int] | None:
    """{operand index: dim to shard it along} so that ``op`` on the shards is the shard of
    its result along ``dim``; operands not listed are used whole. None: not row-wise."""
    name = op_name(op)
    out = tensor_dims(op.results[0])
    if out is None or len(op.results) != 1 or out[dim] is not None:
        return None
    rank = len(out)
    if name in ELEMENTWISE:
        dims = {}
        for i, operand in enumerate(op.operands):
            shape = tensor_dims(operand)
            if shape is None:
                continue
            aligned = dim - (rank - len(shape))
            if aligned < 0 or shape[aligned] == 1:
                continue  # broadcast along the sequence: the same for every row
            if shape[aligned] is not None:
                return None
            dims[i] = aligned
        return dims
    if name == "torch.aten.unsqueeze":
        at = _norm(const_int(op.operands[1]), rank)
        if at is None or at == dim:
            return None
        return {0: dim if dim < at else dim - 1}
    if name == "torch.aten.transpose.int":
        a, c = (_norm(const_int(v), rank) for v in op.operands[1:3])
        if a is None or c is None:
            return None
        return {0: c if dim == a else a if dim == c else dim}
    if name in MATMULS:
        lhs, rhs = tensor_dims(op.operands[0]), tensor_dims(op.operands[1])
        if lhs is None or rhs is None or len(lhs) != rank or len(rhs) != rank or rank < 2:
            return None
        if dim == rank - 2 and None not in rhs and lhs[dim] is None:
            return {0: dim}
        if dim == rank - 1 and None not in lhs and rhs[dim] is None:
            return {1: dim}
        return None
    return None


def _cat_parts(op, dim: int) -> list[ir.Value] | None:
    """The parts of a ``cat`` along another dim than ``dim``, each dynamic there."""
    if op_name(op) != "torch.aten.cat" or len(op.results) != 1:
        return None
    out = tensor_dims(op.results[0])
    along = _norm(const_int(op.operands[1]), len(out) if out else 0)
    parts_op = producer(op.operands[0])
    if out is None or along is None or along == dim or parts_op is None or \
            op_name(parts_op) != "torch.prim.ListConstruct":
        return None
    parts = list(parts_op.operands)
    if any((s := tensor_dims(p)) is None or len(s) != len(out) or s[dim] is not None for p in parts):
        return None
    return parts


def _attributes(op) -> dict:
    named = op.attributes
    return {named[i].name: named[i].attr for i in range(len(named))}


def _same_shards(value: ir.Value) -> list | None:
    """The shard ops using ``value`` if they are all its users (symbolic-shape bindings
    aside) and all alike."""
    found = users(value)
    if not found or any(op_name(u) != SHARD or u.operands[0] != value for u in found):
        return None

    def key(u):
        return u.operands[1], sorted((k, str(v)) for k, v in _attributes(u).items())
    first = key(found[0])
    return found if all(key(u) == first for u in found[1:]) else None


def _earliest(ops_: list, block) -> ir.Operation:
    for op in block.operations:
        if any(op.operation == o.operation for o in ops_):
            return op
    raise AssertionError("shard ops not in their block")


def _new_shard(template, value: ir.Value, dim: int) -> ir.Value:
    attributes = _attributes(template)
    attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)
    return ir.Operation.create(SHARD, results=[value.type], operands=[value, template.operands[1]],
                               attributes=attributes).result


def _erase_if_dead(op) -> None:
    """Erase ``op`` (and its symbolic-shape bindings) once nothing else uses its result."""
    if op is None or any(op_name(u.owner) != BIND_SHAPE for r in op.results for u in r.uses):
        return
    for r in op.results:
        for bind in [u.owner for u in r.uses]:
            bind.erase()
    op.erase()


def _merge_alike(block) -> int:
    """Replace each shard op by an earlier one of the same value with the same attributes
    and length operand; return how many were merged."""
    seen: list = []
    merged = 0
    for op in list(block.operations):
        if op_name(op) != SHARD:
            continue
        key = (op.operands[0], op.operands[1], sorted((k, str(v)) for k, v in _attributes(op).items()))
        twin = next((o for k, o in seen if k == key), None)
        if twin is None:
            seen.append((key, op))
            continue
        op.results[0].replace_all_uses_with(twin.results[0])
        op.erase()
        merged += 1
    return merged


def _hoist_once(block) -> int:
    """Hoist one shard op's set over its operand's producer; 1 if done, else 0."""
    for shard in [op for op in block.operations if op_name(op) == SHARD]:
        value = shard.operands[0]
        source = producer(value)
        shards = _same_shards(value)
        if source is None or shards is None or not any(s.operation == shard.operation for s in shards):
            continue
        dim = shard.attributes["dim"].value
        parts = _cat_parts(source, dim)
        dims = None if parts is not None else _operand_dims(source, dim)
        if parts is None and dims is None:
            continue
        first = _earliest(shards, block)
        with ir.InsertionPoint(first), source.location:
            if parts is not None:
                sharded = [_new_shard(shard, p, dim) for p in parts]
                parts_op = producer(source.operands[0])
                new_list = ir.Operation.create("torch.prim.ListConstruct", results=[parts_op.results[0].type],
                                               operands=sharded).result
                operands = [new_list, *list(source.operands)[1:]]
            else:
                along = dims or {}
                operands = [_new_shard(shard, v, along[i]) if i in along else v for i, v in enumerate(source.operands)]
            clone = ir.Operation.create(op_name(source), results=[source.results[0].type], operands=operands,
                                        attributes=_attributes(source))
        for s in shards:
            s.results[0].replace_all_uses_with(clone.results[0])
        for s in shards:
            s.erase()
        parts_op = producer(source.operands[0]) if parts is not None else None
        _erase_if_dead(source)
        _erase_if_dead(parts_op)
        return 1  # the block changed under the iteration: start a new sweep
    return 0


@dataclass(frozen=True)
class HoistShard(ModulePass):
    """Move autosp.shard above row-wise, parameter-free ops: each rank computes its own rows.

    Input::

        %c = torch.aten.cos %f : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
        %s = "autosp.shard"(%c, %S) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}

    Output::

        %f_r = "autosp.shard"(%f, %S) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64}
        %s = torch.aten.cos %f_r : !torch.vtensor<[1,?,8],f32> -> !torch.vtensor<[1,?,8],f32>
    """

    name: ClassVar[str] = "autosp-hoist-shard"

    def apply(self, module) -> None:
        for func in funcs(module):
            block = func.regions[0].blocks[0]
            while _hoist_once(block):
                pass
            _merge_alike(block)
        eliminate_dead_code(module)
