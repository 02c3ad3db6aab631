"""``autosp-causal-conv``: a left-padded valid convolution becomes the padded-and-cut form.

A causal 1-d convolution along the sequence of kernel k is written two ways:

- transformers' ``causal_conv1d_fn`` and Mamba's torch path: ``nn.Conv1d(padding=k - 1)``
  then a cut back to the input's length, ``conv(x)[..., :S]``;
- Qwen3.5 and torchtitan: a left pad of k - 1 zeros, then a valid convolution,
  ``F.conv1d(F.pad(x, [k - 1, 0]), w, groups=C)``.

Both compute output t from inputs t - k + 1 .. t. ``autosp-shard-sequence`` proves the
first form causal (``Rules.causal_conv_halo``) and splits it with a halo; the second
changes the sequence's length twice (S -> S + k - 1 -> S), which it refuses. This pass
rewrites the second form into the first, when every condition is proven from the IR:
the pad is ``torch.aten.constant_pad_nd`` (or ``torch.aten.pad`` with mode
``"constant"``) with a constant list of exactly two ints ``[k - 1, 0]`` (only the left
of the last dim) and a constant value 0 (int or float; None for ``aten.pad``), the pad's
input is 3-d, the convolution's weight is 3-d with a static kernel size k (its last dim),
stride ``[1]``, dilation ``[1]``, padding ``[0]``, not transposed. Then padding k - 1
zeros on both sides and keeping the first S outputs is the same computation: output t of
both reads padded positions t .. t + k - 1, i.e. inputs t - k + 1 .. t, zeros before 0.

The cut's end is ``torch.aten.size.int(x, 2)`` (the length is often dynamic). A pad with
other users stays for them; one left unused is erased. Anything else is left as written
(``autosp-shard-sequence`` then reports it).

The input/output example is on :class:`CausalConv`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir import ops
from autosp.ir.core import const_bool, const_float, const_int, funcs, is_none, op_name, producer, tensor_dims
from autosp.ir.pass_base import ModulePass

PAD_OPS = (ops.CONSTANT_PAD_OP, "torch.aten.pad")
SEQ = 2  # the sequence dim of a conv1d's [B, C, S] input


def _const_ints(value: ir.Value) -> list[int] | None:
    """The items of a ``torch.prim.ListConstruct`` of ``torch.constant.int``; else None."""
    owner = producer(value)
    if owner is None or op_name(owner) != ops.LIST_CONSTRUCT:
        return None
    items = [const_int(v) for v in owner.operands]
    return None if any(i is None for i in items) else items  # type: ignore[return-value]


def _const_str(value: ir.Value) -> str | None:
    owner = producer(value)
    if owner is None or op_name(owner) != "torch.constant.str":
        return None
    return ir.StringAttr(owner.attributes["value"]).value


def _zero_left_pad(pad) -> int | None:
    """``p`` when ``pad`` pads only the left of its input's last dim with ``p`` zeros
    (``constant_pad_nd(x, [p, 0], 0)`` or ``pad(x, [p, 0], "constant", 0 or None)``)."""
    if op_name(pad) not in PAD_OPS:
        return None
    if op_name(pad) == ops.CONSTANT_PAD_OP:
        if len(pad.operands) != 3 or const_float(pad.operands[2]) != 0.0:
            return None
    elif len(pad.operands) != 4 or _const_str(pad.operands[2]) != "constant" or \
            not (is_none(pad.operands[3]) or const_float(pad.operands[3]) == 0.0):
        return None
    widths = _const_ints(pad.operands[1])
    if widths is None or len(widths) != 2 or widths[1] != 0 or widths[0] < 0:
        return None
    return widths[0]


def left_padded_conv(conv) -> tuple[ir.Value, int] | None:
    """``(x, k)`` when ``conv`` (a ``torch.aten.convolution``) is a valid 1-d convolution
    of kernel k (stride 1, dilation 1, padding 0, not transposed) of ``x`` [B, C, S]
    padded on the left of dim 2 with exactly k - 1 zeros; else None."""
    if op_name(conv) != ops.CONVOLUTION_OP or len(conv.operands) != 9:
        return None
    pad = producer(conv.operands[0])
    if pad is None:
        return None
    left = _zero_left_pad(pad)
    if left is None:
        return None
    x = pad.operands[0]
    weight, out = tensor_dims(conv.operands[1]), tensor_dims(conv.results[0])
    x_dims = tensor_dims(x)
    if x_dims is None or len(x_dims) != 3 or weight is None or len(weight) != 3 or \
            out is None or len(out) != 3:
        return None
    k = weight[-1]
    if k is None or left != k - 1:
        return None
    stride, padding, dilation = (_const_ints(conv.operands[i]) for i in (3, 4, 5))
    if stride != [1] or padding != [0] or dilation != [1] or const_bool(conv.operands[6]) is not False:
        return None
    return x, k


def _bindings(value: ir.Value) -> list:
    return [u.owner.operation for u in value.uses if op_name(u.owner) == ops.BIND_SHAPE]


def _rebind_longer(conv, new: ir.Value, extra: int) -> None:
    """Give ``new`` (the padded convolution's result) the bindings of ``conv``'s result
    with dim 2 longer by ``extra``, placed where those bindings are."""
    for bind in _bindings(conv.results[0]):
        shape = ir.AffineMapAttr(bind.attributes["shape_expressions"]).value
        exprs = list(shape.results)
        if len(exprs) != 3:
            continue
        with ir.InsertionPoint(bind), bind.location:
            exprs[SEQ] = exprs[SEQ] + ir.AffineConstantExpr.get(extra)
            affine = ir.AffineMap.get(shape.n_dims, shape.n_symbols, exprs)
            ir.Operation.create(ops.BIND_SHAPE, operands=[new, *bind.operands[1:]],
                                attributes={"shape_expressions": ir.AffineMapAttr.get(affine)})


def canonicalise_causal_convs(module) -> int:
    """Rewrite every left-padded valid convolution (:func:`left_padded_conv`) into a
    convolution with padding k - 1 cut back to the input's length; return how many."""
    count = 0
    for func in funcs(module):
        for conv in list(func.regions[0].blocks[0].operations):
            found = left_padded_conv(conv)
            if found is None:
                continue
            x, k = found
            pad = producer(conv.operands[0])
            shape = b.vtensor_shape(conv.results[0].type)
            assert shape is not None  # left_padded_conv read it as a 3-d vtensor
            out_dims, dtype = shape
            length_out = out_dims[SEQ]
            long_dims = [*out_dims[:SEQ], None if length_out is None else length_out + k - 1]
            with ir.InsertionPoint(conv), conv.location:
                padding = ir.Operation.create(ops.LIST_CONSTRUCT, results=[ir.Type.parse("!torch.list<int>")],
                                              operands=[b.constant_int(k - 1)]).result
                operands = list(conv.operands)
                operands[0], operands[4] = x, padding
                long = b.torch_op(ops.CONVOLUTION_OP, operands, b.vtensor_type(long_dims, dtype))
                seq = b.constant_int(SEQ)
                length = b.torch_op(ops.SIZE_OP, [x, seq], b.int_type())
                cut = b.torch_op(ops.SLICE_OP, [long, seq, b.constant_int(0), length, b.constant_int(1)],
                                 conv.results[0].type)
            _rebind_longer(conv, long, k - 1)
            conv.results[0].replace_all_uses_with(cut)
            conv.operation.erase()
            if all(op_name(u.owner) == ops.BIND_SHAPE for u in pad.results[0].uses):
                for bind in _bindings(pad.results[0]):
                    bind.operation.erase()
                pad.operation.erase()
            count += 1
    return count


@dataclass(frozen=True)
class CausalConv(ModulePass):
    """A valid conv1d of an input left-padded with k - 1 zeros becomes conv1d(padding=k-1)[..., :S].

    The padded convolution cut back to the input's length is the form autosp proves
    causal: ``F.conv1d(F.pad(x, [k - 1, 0]), w)`` (Qwen3.5, torchtitan) becomes
    ``F.conv1d(x, w, padding=k - 1)[..., :S]`` (transformers' ``causal_conv1d_fn``), which
    ``autosp-shard-sequence`` splits over ranks with a halo of k - 1 positions. Rewritten
    only when proven from the IR: a constant pad list of exactly ``[k - 1, 0]``, pad value
    0, a 3-d input, a static kernel size k, stride 1, dilation 1, padding 0, not
    transposed. Anything else is left as written. A pad with other users stays.

    Input::

        %pad = torch.prim.ListConstruct %int3, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
        %xp = torch.aten.constant_pad_nd %x, %pad, %float0 : !torch.vtensor<[2,8,?],f32>, ... -> !torch.vtensor<[2,8,?],f32>
        %y = torch.aten.convolution %xp, %w, %b, %one, %zero, %one, %false, %zero, %int8
               : ..., !torch.vtensor<[8,1,4],f32>, ... -> !torch.vtensor<[2,8,?],f32>

    Output::

        %p = torch.prim.ListConstruct %int3_0 : (!torch.int) -> !torch.list<int>
        %long = torch.aten.convolution %x, %w, %b, %one, %p, %one, %false, %zero, %int8 ... -> !torch.vtensor<[2,8,?],f32>
        %s = torch.aten.size.int %x, %int2 : !torch.vtensor<[2,8,?],f32>, !torch.int -> !torch.int
        %y = torch.aten.slice.Tensor %long, %int2, %int0, %s, %int1 ... -> !torch.vtensor<[2,8,?],f32>
    """

    name: ClassVar[str] = "autosp-causal-conv"

    def apply(self, module) -> None:
        canonicalise_causal_convs(module)
