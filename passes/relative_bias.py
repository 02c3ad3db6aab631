"""``autosp-relative-bias``: a per-head bias of the distance ``k - q`` in an SDPA mask runs in O(S).

T5 adds a learned bias to its scores: ``table[bucket(k - q), h]``, built as ``[1, H, S, S]``
(``embedding(table, bucket(arange(S)[None, :] - arange(S)[:, None]))``, permuted and
unsqueezed) and, with the padding mask, passed as SDPA's ``attn_mask``
(``where(keep, bias, c)``): O(S²) bytes per layer, kept for backward. This pass proves from
the IR that the mask is such a bias and rewrites the SDPA op as
``torch.operator "torch.autosp.relative_bias_attention"`` with SDPA's eight operands (the
mask: key padding ``[B, 1, 1, S]`` or none), the ``table`` and the buckets of every
distance (``[2 S - 1]`` integers), and the masking constant ``c``. The runtime
(:mod:`autosp.runtime.relative_bias`) rebuilds the bias block by block: O(S) bytes.

**The proof.** The bucket tensor ``I`` (``[S, S]`` integers) is a function of ``k - q``
alone: its chain starts at ``sub(kpos, qpos)`` where ``kpos`` is ``arange(0, S, 1)`` (plus
a constant) along the key dim (``[1, S]``) and ``qpos`` the same range, with the same
constant, along the query dim (``[S, 1]``), and continues only through element-wise ops
whose other operands are scalars or zero-dimensional tensors (or broadcasts of one). By
induction every value of the chain is ``f(k - q)``. The chain is then computed once on
the distances ``d = arange(1 - S, S)``: ``buckets[d + S - 1] = I[q, k]`` for ``k - q = d``.
The bias must be ``unsqueeze(permute(embedding(table, I), [2, 0, 1]), 0)``: ``[1, H, S,
S]``, head, query, key. ``keep`` (where there is one) must be proven all true or key
padding by the mask interpreter of ``autosp-causal-mask``, and ``c`` a zero-dimensional
constant. SDPA without dropout, q, k and v with the same heads.

Anything else is left as it was (correct, with its S × S mask).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.passes.causal_mask import key_mask, split_key_padding
from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import (
    body_ops,
    const_bool,
    const_float,
    const_int,
    const_ints,
    is_none,
    main_func,
    op_name,
    producer,
)
from autosp.ir.mask_algebra import And, BoolTensor, Const, NotProven
from autosp.ir.mask_interp import MaskInterpreter
from autosp.ir.ops import RELATIVE_BIAS_ATTENTION, SDPA_OP
from autosp.ir.pass_base import ModulePass
from autosp.ir.sizes import dim_sizes

# Element-wise ops whose operand 0 carries the distance and whose other operands are scalars.
_UNARY = {"torch.aten.abs", "torch.aten.neg", "torch.aten.log", "torch.aten.exp", "torch.aten.to.dtype",
          "torch.aten._to_copy", "torch.prims.convert_element_type", "torch.aten.gt.Scalar", "torch.aten.lt.Scalar",
          "torch.aten.ge.Scalar", "torch.aten.le.Scalar", "torch.aten.eq.Scalar", "torch.aten.ne.Scalar",
          "torch.aten.mul.Scalar", "torch.aten.div.Scalar", "torch.aten.add.Scalar", "torch.aten.sub.Scalar",
          "torch.aten.floor", "torch.aten.ceil", "torch.aten.round", "torch.aten.clamp", "torch.aten.sign",
          "torch.aten.logical_not", "torch.aten.bitwise_not", "torch.aten.pow.Tensor_Scalar",
          "torch.aten.floor_divide.Scalar", "torch.aten.remainder.Scalar", "torch.aten.div.Tensor_mode"}
# Element-wise ops of several tensors: each carries the distance or is a constant.
_NARY = {"torch.aten.add.Tensor", "torch.aten.sub.Tensor", "torch.aten.mul.Tensor", "torch.aten.div.Tensor",
         "torch.aten.minimum", "torch.aten.maximum", "torch.aten.where.self", "torch.aten.eq.Tensor",
         "torch.aten.lt.Tensor", "torch.aten.gt.Tensor", "torch.aten.le.Tensor", "torch.aten.ge.Tensor",
         "torch.aten.logical_and", "torch.aten.logical_or", "torch.aten.bitwise_and", "torch.aten.bitwise_or"}


@dataclass(frozen=True)
class RelativeBias(ModulePass):
    """Rewrite SDPA whose mask is a per-head bias of ``k - q`` (T5's buckets) as
    ``torch.autosp.relative_bias_attention`` (see the module docstring).

    Input::

        %I = <bucket chain of> torch.aten.sub.Tensor %kpos, %qpos  ->  !torch.vtensor<[?,?],si64>
        %E = torch.aten.embedding %table, %I, ...  ->  !torch.vtensor<[?,?,4],f32>
        %T = torch.aten.unsqueeze (torch.aten.permute %E, [2, 0, 1]), 0  ->  !torch.vtensor<[1,4,?,?],f32>
        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %T, %f0, %false, %f1, %false

    Output::

        %d = torch.aten.arange.start_step (1 - S), S, 1  ->  !torch.vtensor<[?],si64>
        %buckets = <the bucket chain on %d>  ->  !torch.vtensor<[?],si64>
        %o = torch.operator "torch.autosp.relative_bias_attention"(%q, %k, %v, %none, %f0, %false, %f1,
                 %false, %table, %buckets, %none)
    """

    name: ClassVar[str] = "autosp-relative-bias"

    def apply(self, module) -> None:
        fuse_relative_biases(module)


def fuse_relative_biases(module) -> int:
    """Rewrite every SDPA op of ``@main`` whose mask is proven a relative bias; return how many.
    Layers that share one bias (T5 computes it in its first layer) share its buckets."""
    count = 0
    shared: dict = {}
    for op in [o for o in body_ops(main_func(module)) if op_name(o) == SDPA_OP]:
        found = _match(op)
        if found is not None:
            table, chain, keep, fill = found
            _rewrite(op, table, chain, keep, fill, shared)
            count += 1
    return count


def _match(sdpa) -> tuple | None:
    """``(table, (chain, (base, arange)), keep, fill)`` where the rewrite applies, else None."""
    q, k, v, mask = sdpa.operands[:4]
    shapes = [b.vtensor_shape(x.type) for x in (q, k, v)]
    if any(s is None or len(s[0]) != 4 for s in shapes) or is_none(mask):
        return None
    heads = shapes[0][0][1]  # type: ignore[index]
    if heads is None or shapes[1][0][1] != heads or shapes[2][0][1] != heads:  # type: ignore[index]
        return None
    dropout = sdpa.operands[4]
    if not (is_none(dropout) or const_float(dropout) == 0.0) or const_bool(sdpa.operands[5]) is None:
        return None
    keep, fill, bias = None, None, mask
    owner = producer(mask)
    if owner is not None and op_name(owner) == "torch.aten.where.self":
        keep, bias = _keep(owner.operands[0], k), owner.operands[1]
        if keep is None:
            return None
        if keep != "all":  # (kept everywhere: the masking constant is never read)
            fill = _zero_dim_float(owner.operands[2])
            if fill is None:
                return None
    table, indices = _embedded_bias(bias, heads)
    if table is None:
        return None
    chain = _distance_chain(indices)
    if chain is None:
        return None
    return table, chain, keep, fill


def _zero_dim_float(value) -> float | None:
    """The value of a zero-dimensional float literal (a splat), else None. A cast of one
    (``to.device``, ``to.dtype``: a constant lifted on meta weights) is read through: the
    runtime rounds the value to the bias's dtype as the cast does."""
    op = producer(value)
    while op is not None and op_name(op) in ("torch.aten.to.device", "torch.aten.to.dtype", "torch.aten._to_copy"):
        value = op.operands[0]
        op = producer(value)
    shape = b.vtensor_shape(value.type)
    if op is None or op_name(op) != "torch.vtensor.literal" or shape is None or shape[0] or \
            not shape[1].startswith(("f", "bf")):
        return None
    attr = ir.DenseElementsAttr(op.attributes["value"])
    if not attr.is_splat:
        return None
    return float(ir.FloatAttr(attr.get_splat_value()).value)


def _keep(cond, key):
    """``"all"`` where the boolean ``cond`` is proven true everywhere, ``(padding, nonzero)``
    where it is key padding alone (spanning the keys), else None."""
    interpreter = MaskInterpreter()
    try:
        value = interpreter.value(cond)
        if not isinstance(value, BoolTensor) or value.rank != 4:
            return None
        if interpreter.shape(cond)[-1] != dim_sizes(key)[-2]:
            return None
    except (NotProven, RecursionError):
        return None
    if value.formula == Const(True):
        return "all"
    rest, padding = split_key_padding(And((value.formula,)), 3, cond, interpreter)
    if padding is None or rest not in (Const(True), And(())):
        return None
    return padding


def _embedded_bias(bias, heads: int):
    """``(table, I)`` where ``bias`` is ``unsqueeze(permute(embedding(table, I), [2, 0, 1]), 0)``
    with ``table`` ``[buckets, heads]``; else ``(None, None)``."""
    un = producer(bias)
    if un is None or op_name(un) != "torch.aten.unsqueeze" or const_int(un.operands[1]) != 0:
        return None, None
    perm = producer(un.operands[0])
    if perm is None or op_name(perm) != "torch.aten.permute" or const_ints(perm.operands[1]) != [2, 0, 1]:
        return None, None
    emb = producer(perm.operands[0])
    if emb is None or op_name(emb) != "torch.aten.embedding":
        return None, None
    table, indices = emb.operands[0], emb.operands[1]
    tshape, ishape = b.vtensor_shape(table.type), b.vtensor_shape(indices.type)
    if tshape is None or ishape is None or len(tshape[0]) != 2 or tshape[0][1] != heads or len(ishape[0]) != 2:
        return None, None
    return table, indices


def _position(value):
    """``(dim, end, offset, arange)`` where ``value`` is ``arange(0, end, 1) + offset``
    unsqueezed to rank 2 along ``dim`` (size 1 on the other dim); else None."""
    offset, dim = 0, None
    shape = b.vtensor_shape(value.type)
    if shape is None or len(shape[0]) != 2:
        return None
    while True:
        op = producer(value)
        if op is None:
            return None
        name = op_name(op)
        if name == "torch.aten.unsqueeze":
            at = const_int(op.operands[1])
            if at is None or dim is not None:
                return None
            dim = 1 - at  # the arange's dim in the rank-2 result: the one not inserted
            value = op.operands[0]
        elif name == "torch.aten.add.Scalar" and const_int(op.operands[1]) is not None and \
                const_int(op.operands[2]) == 1:
            offset += const_int(op.operands[1])  # type: ignore[operator]
            value = op.operands[0]
        elif name == "torch.aten.arange.start_step" and dim is not None:
            if const_int(op.operands[0]) != 0 or const_int(op.operands[2]) != 1:
                return None
            return dim, op.operands[1], offset, op
        else:
            return None


def _distance_chain(indices):
    """The ops from ``sub(kpos, qpos)`` (first) to ``indices``, where every value of it is a
    function of ``k - q`` (see the module docstring); None where not proven."""
    chain: list = []
    seen: set = set()
    base: list = []

    def visit(value) -> bool:
        op = producer(value)
        if op is None:
            return False
        if op in seen:
            return True
        name = op_name(op)
        if name == "torch.aten.sub.Tensor" and not base:
            kpos, qpos = _position(op.operands[0]), _position(op.operands[1])
            if kpos is not None and qpos is not None and kpos[0] == 1 and qpos[0] == 0 and \
                    kpos[1] == qpos[1] and kpos[2] == qpos[2] and const_int(op.operands[2]) == 1:
                base.append((op, kpos[3]))
                seen.add(op)
                chain.append(op)
                return True
            return False
        if name in _UNARY:
            if any("vtensor" in str(x.type) for x in op.operands[1:]) or not visit(op.operands[0]):
                return False
        elif name in _NARY:
            for x in op.operands:
                if "vtensor" not in str(x.type) or _constant(x) is not None:
                    continue
                if not visit(x):
                    return False
        else:
            return False
        seen.add(op)
        chain.append(op)
        return True

    if not visit(indices) or not base:
        return None
    return chain, base[0]


def _constant(value):
    """The zero-dimensional tensor ``value`` is (or broadcasts), else None."""
    shape = b.vtensor_shape(value.type)
    if shape is not None and not shape[0]:
        return value
    op = producer(value)
    if op is not None and op_name(op) in ("torch.aten.broadcast_to", "torch.aten.expand"):
        return _constant(op.operands[0])
    return None


def _rewrite(sdpa, table, found, keep, fill, shared: dict) -> None:
    (chain, (base, arange)) = found
    with ir.InsertionPoint(sdpa), sdpa.location:
        buckets = shared.get(chain[-1].results[0]) or _buckets(chain, base, arange)
        shared[chain[-1].results[0]] = buckets
        mask = b.constant_none()
        if keep is not None and keep != "all":
            mask = key_mask(sdpa, keep[0], keep[1])
        fill_value = b.constant_none() if keep is None or keep == "all" else ir.Operation.create(
            "torch.constant.float", results=[ir.Type.parse("!torch.float")],
            attributes={"value": ir.FloatAttr.get(ir.F64Type.get(), fill)}).result
        operands = [*sdpa.operands[:3], mask, *sdpa.operands[4:8], table, buckets, fill_value]
        new = ir.Operation.create("torch.operator", results=[sdpa.results[0].type], operands=operands,
                                  attributes={"name": ir.StringAttr.get(RELATIVE_BIAS_ATTENTION)})
    sdpa.results[0].replace_all_uses_with(new.result)
    sdpa.erase()


def _buckets(chain: list, base, arange) -> ir.Value:
    """The chain computed on the distances ``arange(1 - S, S)`` (in place of ``base``), at
    the current insertion point: ``[2 S - 1]``."""
    end = arange.operands[1]  # S
    start = b.torch_op("torch.aten.sub.int", [b.constant_int(1), end], b.int_type())
    base_dtype = b.vtensor_shape(base.results[0].type)[1]  # type: ignore[index]
    distances = ir.Operation.create(
        "torch.aten.arange.start_step", results=[b.vtensor_type([None], base_dtype)],
        operands=[start, end, b.constant_int(1), *arange.operands[3:]]).result
    built = {base.results[0]: distances}
    for op in chain[1:]:
        operands = []
        for x in op.operands:
            if x in built:
                operands.append(built[x])
            elif "vtensor" in str(x.type):
                operands.append(_constant(x) or x)
            else:
                operands.append(x)
        dtype = b.vtensor_shape(op.results[0].type)[1]  # type: ignore[index]
        with op.location:
            built[op.results[0]] = ir.Operation.create(op_name(op), results=[b.vtensor_type([None], dtype)],
                                                       operands=operands).result
    return built[chain[-1].results[0]]
