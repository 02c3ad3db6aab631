"""``autosp-fuse-attention``: hand-written softmax attention becomes one SDPA op.

Eager attention (transformers' ``eager`` implementations, GPT-2, Llama with
``attn_implementation="eager"``, hand-written models) computes::

    scores = (q @ k.transpose(-1, -2)) * scale   (or / c, or no scale)
    scores = scores + mask                       (optional additive mask)
    probs  = softmax(scores, dim=-1)             (cast back to its dtype, dropout p = 0)
    out    = probs @ v

and autograd keeps ``scores`` and ``probs`` for backward: O(S^2) bytes per layer, whatever
sequence parallelism does. This pass proves that a chain is exactly that (each matmul a
``torch.aten.matmul`` of rank-4 tensors, or its decomposition ``view(bmm(view(expand(a)),
view(expand(b))))`` that merges and splits only the two leading dims; the key transposed
over its last two dims; the scale a constant; softmax over the last dim in the scores' own
dtype; every intermediate used by the chain alone) and replaces it with
``scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale)``: the same function (up
to float rounding), run by the fused kernel that keeps only its output and log-sum-exp.
``autosp-causal-mask`` then examines the mask like any SDPA mask.

The form ``scores.masked_fill(cond, c)`` (c at most -1e30, or -inf: nanoGPT's tril buffer)
fuses too, with the boolean mask ``not cond``; a row masked everywhere keeps eager's answer
(``autosp.empty_rows = "mean"``, see :mod:`autosp.ir.ops`).

**Attention sinks** (gpt-oss): ``softmax(cat([scores, sinks.reshape(1, -1, 1, 1).expand(B, -1,
S, -1)], -1) - row max)[..., :-1] @ v``, where the concatenated column is proven one value
per head (a ``[H]`` vector viewed as ``[1, H, 1, 1]`` and broadcast) and exactly that column
is dropped after the softmax, becomes ``torch.operator "torch.autosp.sink_attention"``
with SDPA's eight operands and the ``[H]`` sinks: ``exp(sinks[h])`` joins each row's
denominator. Every SDPA rule holds for it (:func:`autosp.ir.ops.is_sdpa`); the runtime
folds the sinks into the kernel's log-sum-exp (:mod:`autosp.runtime.ring`). The row maximum
subtracted before a softmax is dropped wherever it appears: softmax is invariant to it.

Not fused, left as written (correct, with the O(S^2) cost, and ``autosp.unfused_attention``
on the softmax, so the compile warns): probabilities used elsewhere
(``output_attentions``), dropout with p > 0 (SDPA would draw other numbers), a softmax in
another dtype, a multiplicative or per-element-modified score (soft-capping, ALiBi added
per head is still an additive mask and fuses), anything not matching exactly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, cast

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.contract import EMPTY_ROWS_ATTR, UNFUSED_ATTR, EmptyRows
from autosp.ir.core import body_ops, const_bool, const_float, const_int, main_func, op_name, producer, users
from autosp.ir.mask_algebra import Lin, NotProven
from autosp.ir.ops import SDPA_OP, SINK_ATTENTION, SOFTMAX_OPS
from autosp.ir.pass_base import ModulePass
from autosp.ir.sizes import dim_sizes

_log = logging.getLogger(__name__)

_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")
_EXPANDS = ("torch.aten.broadcast_to", "torch.aten.expand")
_MATMUL = "torch.aten.matmul"
_BMM = "torch.aten.bmm"


class _NoMatch(Exception):
    """The chain is not exactly softmax attention: the reason, for the log."""


def _only_use(value: ir.Value, what: str):
    found = users(value)
    if len(found) != 1:
        raise _NoMatch(f"{what} has {len(found)} users")
    return found[0]


def _op(value: ir.Value, *names: str):
    op = producer(value)
    if op is None or op_name(op) not in names:
        made = "an input" if op is None else op_name(op)
        raise _NoMatch(f"{value.get_name()} comes from {made}, where {' or '.join(names)} was expected")
    return op


def _sizes(value: ir.Value) -> tuple:
    try:
        return dim_sizes(value)
    except NotProven as e:
        raise _NoMatch(str(e)) from None


def _rank4(value: ir.Value) -> tuple:
    sizes = _sizes(value)
    if len(sizes) != 4:
        raise _NoMatch(f"{value.get_name()} is not rank 4")
    return sizes


def _unmerge(value: ir.Value) -> ir.Value:
    """``x`` where ``value = view(expand?(x))`` only merges the two leading dims of a rank-4 ``x``."""
    view = _op(value, *_VIEWS)
    x = view.operands[0]
    inner = producer(x)
    if inner is not None and op_name(inner) in _EXPANDS and _sizes(inner.operands[0]) == _sizes(x):
        x = inner.operands[0]  # an expand to the same sizes is the identity
    a, h, m, n = _rank4(x)
    merged = _sizes(value)
    if len(merged) != 3 or merged[1:] != (m, n) or not (a.is_const() and h.is_const()) \
            or merged[0] != Lin((), a.const * h.const):
        raise _NoMatch(f"{value.get_name()} is not the leading dims of {x.get_name()} merged")
    return x


def _matmul(value: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(a, b) when ``value`` is exactly ``a @ b`` of rank-4 tensors with the same leading dims."""
    op = producer(value)
    if op is not None and op_name(op) == _MATMUL:
        a, c = op.operands[0], op.operands[1]
    else:
        view = _op(value, *_VIEWS)
        bmm = _op(view.operands[0], _BMM)
        a, c = _unmerge(bmm.operands[0]), _unmerge(bmm.operands[1])
        out, flat = _sizes(value), _sizes(bmm.results[0])
        if len(out) != 4 or out[2:] != flat[1:]:
            raise _NoMatch(f"{value.get_name()} is not the bmm's leading dim split")
    sa, sc, so = _rank4(a), _rank4(c), _rank4(value)  # (the inner dims match, or the matmul fails)
    if sa[:2] != sc[:2] or so[:2] != sa[:2]:
        raise _NoMatch(f"{value.get_name()}: operands of a batched matmul with other leading dims")
    return a, c


def _float_const(value: ir.Value) -> float:
    _op(value, "torch.constant.float", "torch.constant.int")  # else a _NoMatch naming the producer
    return cast(float, const_float(value))


def _dtype(value: ir.Value) -> str:
    shape = b.vtensor_shape(value.type)
    if shape is None:
        raise _NoMatch(f"{value.get_name()} is not a tensor")
    return shape[1]


@dataclass
class Match:
    q: ir.Value
    k: ir.Value
    v: ir.Value
    mask: ir.Value | None
    scale: float
    out: ir.Value  # the p @ v result the SDPA replaces
    fill: ir.Value | None = None  # masked_fill's condition: the mask is its negation (True: attend)
    fill_finite: bool = False  # ... with a finite fill value (a row masked everywhere is uniform)
    sinks: ir.Value | None = None  # [H] sink logits in the softmax denominator (gpt-oss)


def match(softmax) -> Match:
    """The attention around ``softmax``, or :class:`_NoMatch` with the reason."""
    name = op_name(softmax)
    scores = softmax.operands[0]
    if const_int(softmax.operands[1]) not in (-1, 3):
        raise _NoMatch("softmax over another dim than the last")
    if name == "torch.aten._softmax" and const_bool(softmax.operands[2]) is not False:
        raise _NoMatch("_softmax with half_to_float")
    if _dtype(softmax.results[0]) != _dtype(scores):
        raise _NoMatch("softmax in another dtype than the scores")
    scores, sinks = _strip_sinks(scores)
    _only_use(scores, "the scores")
    # scores = [(q @ k^T) * scale] + mask
    mask = fill = None
    fill_finite = False
    x = scores
    producer_op = producer(x)
    if producer_op is not None and op_name(producer_op) == "torch.aten.masked_fill.Scalar":
        # scores.masked_fill(cond, c) with c at most half the dtype's lowest (or -inf): after
        # softmax exactly a boolean mask `not cond`, except in rows where cond is true
        # everywhere (eager: uniform over all keys, no gradient to q and k).
        c = _float_const(producer_op.operands[2])
        if not c <= -1e30:
            raise _NoMatch(f"masked_fill with {c}, not a masking constant")
        x, fill, fill_finite = producer_op.operands[0], producer_op.operands[1], c != float("-inf")
        _only_use(x, "the scaled scores")
        if _dtype(fill) != "i1" or (len(_sizes(fill)) == 4 and _sizes(fill)[1] != Lin((), 1)):
            raise _NoMatch("masked_fill with a per-head or non-boolean condition")
    elif producer_op is not None and op_name(producer_op) == "torch.aten.add.Tensor":
        if abs(_float_const(producer_op.operands[2]) - 1.0) > 0:
            raise _NoMatch("add with alpha != 1")
        first, second = producer_op.operands[0], producer_op.operands[1]
        # The scores are the operand of the full [B, H, S, S] shape that comes from a scale or a matmul.
        for s, m in ((first, second), (second, first)):
            p = producer(s)
            if p is not None and op_name(p) in ("torch.aten.mul.Scalar", "torch.aten.div.Scalar", *_VIEWS, _MATMUL):
                x, mask = s, m
                break
        else:
            raise _NoMatch("an add whose operands are not scores and a mask")
        _only_use(x, "the scaled scores")
        if _dtype(mask) != _dtype(x) or not _dtype(mask).startswith(("f", "bf")):
            raise _NoMatch("a mask of another dtype than the scores")
        mask_rank = len(_sizes(mask))
        if mask_rank == 4 and _sizes(mask)[1] != Lin((), 1):
            raise _NoMatch("a per-head additive mask")
    scale = 1.0
    producer_op = producer(x)
    if producer_op is not None and op_name(producer_op) in ("torch.aten.mul.Scalar", "torch.aten.div.Scalar"):
        c = _float_const(producer_op.operands[1])
        if c == 0.0:
            raise _NoMatch("a scale of 0")
        scale = c if op_name(producer_op) == "torch.aten.mul.Scalar" else 1.0 / c
        x = producer_op.operands[0]
        _only_use(x, "the scores")
    q, kt = _matmul(x)
    t = _op(kt, "torch.aten.transpose.int", "torch.aten.permute")
    if op_name(t) == "torch.aten.permute":
        order = _op(t.operands[1], "torch.prim.ListConstruct")
        swapped = [(const_int(d) or 0) % 4 for d in order.operands] == [0, 1, 3, 2]
    else:
        swapped = sorted((const_int(d) or 0) % 4 for d in t.operands[1:3]) == [2, 3]
    if not swapped:
        raise _NoMatch("the key is not transposed over its last two dims")
    k = t.operands[0]
    # probs -> (the sink column dropped) -> (identity casts, dropout p = 0) -> @ v
    p = softmax.results[0]
    if sinks is not None:
        p = _drop_sink_column(p, _sizes(scores)[3])
    while True:
        user = _only_use(p, "the probabilities")
        uname = op_name(user)
        if uname in ("torch.aten.to.dtype", "torch.aten.type_as", "torch.aten._to_copy") \
                and _dtype(user.results[0]) == _dtype(p):
            p = user.results[0]
        elif uname == "torch.aten.dropout":
            if _float_const(user.operands[1]) != 0.0 and const_bool(user.operands[2]) is not False:
                raise _NoMatch("attention dropout with p > 0")
            p = user.results[0]
        else:
            break
    out = _pv_result(p)
    a, v = _matmul(out)
    if a != p:
        raise _NoMatch("the probabilities are not the left operand of the value matmul")
    for t_ in (q, k, v, out):
        if _dtype(t_) != _dtype(scores):
            raise _NoMatch("q, k, v and the output are not all in the scores' dtype")
    return Match(q, k, v, mask, scale, out, fill, fill_finite, sinks)


def _strip_sinks(x: ir.Value) -> tuple[ir.Value, ir.Value | None]:
    """``(scores, sinks)`` under a softmax input ``x``: gpt-oss's form
    ``cat([scores, sinks.reshape(1, -1, 1, 1).expand(B, -1, S, -1)], -1)``, less its row
    maximum, gives the ``[H]`` sinks (None where there is no sink column). Subtracting
    the row maximum is dropped on its own too: softmax is invariant to a per-row shift (in
    value and gradient)."""
    sub, shifted = producer(x), False
    if sub is not None and op_name(sub) == "torch.aten.sub.Tensor":
        top = producer(sub.operands[1])
        if top is not None and op_name(top) == "torch.aten.max.dim" and top.operands[0] == sub.operands[0] \
                and sub.operands[1] == top.results[0] and const_int(top.operands[1]) in (-1, 3) \
                and const_bool(top.operands[2]) is True and _float_const(sub.operands[2]) == 1.0:
            if len(users(sub.operands[0])) != 2 or len(users(top.results[0])) != 1 or users(top.results[1]):
                raise _NoMatch("the row maximum subtracted before the softmax has other users")
            x, shifted = sub.operands[0], True
    cat = producer(x)
    if cat is None or op_name(cat) != "torch.aten.cat":
        return x, None
    if const_int(cat.operands[1]) not in (-1, 3):
        raise _NoMatch("scores concatenated along another dim than the keys")
    parts = _op(cat.operands[0], "torch.prim.ListConstruct").operands
    if len(parts) != 2:
        raise _NoMatch(f"scores concatenated from {len(parts)} tensors, not scores and one sink column")
    _only_use(cat.operands[0], "the concatenated list")
    if not shifted:  # (shifted: its users are the maximum and the subtraction, checked above)
        _only_use(x, "the scores with their sink column")
    scores, column = parts[0], parts[1]
    b_, h, m, _ = _rank4(scores)
    if _rank4(column) != (b_, h, m, Lin((), 1)):
        raise _NoMatch(f"the column concatenated to the scores is not [B, H, S, 1]: {_sizes(column)}")
    # column = expand(view(sinks [H] -> [1, H, 1, 1])): every row of head h reads sinks[h]
    wide = _op(column, *_EXPANDS)
    per_head = wide.operands[0]
    if _sizes(per_head) != (Lin((), 1), h, Lin((), 1), Lin((), 1)):
        raise _NoMatch("the sink column is not one value per head broadcast over batch and queries")
    view = _op(per_head, *_VIEWS)
    sinks = view.operands[0]
    if _sizes(sinks) != (h,):
        raise _NoMatch(f"the sinks are not one [H] vector: {_sizes(sinks)}")
    if _dtype(sinks) != _dtype(scores):
        raise _NoMatch("sinks of another dtype than the scores")
    return scores, sinks


def _drop_sink_column(p: ir.Value, keys) -> ir.Value:
    """The probabilities ``p[..., :-1]`` (the sink's column dropped): the only use of ``p``."""
    cut = _only_use(p, "the probabilities with the sink column")
    if op_name(cut) != "torch.aten.slice.Tensor" or const_int(cut.operands[1]) not in (-1, 3) \
            or const_int(cut.operands[2]) != 0 or const_int(cut.operands[4]) != 1 \
            or _sizes(cut.results[0])[3] != keys:
        raise _NoMatch("the probabilities are not sliced back to the keys (the sink column dropped)")
    return cut.results[0]


def _pv_result(p: ir.Value) -> ir.Value:
    """The result of ``p @ v``: the matmul, or the view that ends its bmm decomposition."""
    user = _only_use(p, "the probabilities")
    if op_name(user) == _MATMUL:
        return user.results[0]
    while op_name(user) in _EXPANDS or op_name(user) in _VIEWS:
        user = _only_use(user.results[0], "the reshaped probabilities")
    if op_name(user) != _BMM:
        raise _NoMatch("the probabilities do not reach a matmul")
    return _only_use(user.results[0], "the bmm").results[0]


def _looks_like_scores(softmax) -> bool:
    """A softmax over the last dim of a rank-4 [B, H, S, S] (or rank-3 [B*H, S, S]) tensor
    whose last two dims have the same size: attention probabilities, fused or not."""
    try:
        sizes = _sizes(softmax.results[0])
    except _NoMatch:
        return False
    return len(sizes) in (3, 4) and sizes[-1] == sizes[-2] and const_int(softmax.operands[1]) in (-1, len(sizes) - 1)


def fuse_attention(module) -> int:
    """Replace each proven softmax-attention chain by one SDPA op; return how many."""
    func = main_func(module)
    fused = 0
    for softmax in [o for o in body_ops(func) if op_name(o) in SOFTMAX_OPS]:
        try:
            m = match(softmax)
        except _NoMatch as e:
            _log.info("softmax %s not fused into SDPA: %s", softmax.results[0].get_name(), e)
            if _looks_like_scores(softmax):  # the compile warns: its scores are kept, O(S^2)
                softmax.attributes[UNFUSED_ATTR] = ir.StringAttr.get(str(e))
            continue
        anchor = producer(m.out)
        with ir.InsertionPoint(anchor), anchor.location:
            none = b.constant_none()
            mask = none if m.mask is None else m.mask
            if m.fill is not None:
                mask = b.torch_op("torch.aten.logical_not", [m.fill], m.fill.type)
            zero = ir.Operation.create("torch.constant.float", results=[ir.Type.parse("!torch.float")],
                                       attributes={"value": ir.FloatAttr.get_f64(0.0)}).result
            false = ir.Operation.create("torch.constant.bool", results=[ir.Type.parse("!torch.bool")],
                                        attributes={"value": ir.BoolAttr.get(False)}).result
            scale = ir.Operation.create("torch.constant.float", results=[ir.Type.parse("!torch.float")],
                                        attributes={"value": ir.FloatAttr.get_f64(m.scale)}).result
            operands = [m.q, m.k, m.v, mask, zero, false, scale, false]
            if m.sinks is None:
                sdpa = b.torch_op(SDPA_OP, operands, m.out.type)
            else:
                sdpa = ir.Operation.create("torch.operator", results=[m.out.type], operands=operands + [m.sinks],
                                           attributes={"name": ir.StringAttr.get(SINK_ATTENTION)}).result
        if m.fill_finite:  # rows masked everywhere keep eager's answer (see EMPTY_ROWS_ATTR)
            sdpa.owner.attributes[EMPTY_ROWS_ATTR] = ir.StringAttr.get(EmptyRows.MEAN.value)
        m.out.replace_all_uses_except(sdpa, sdpa.owner.operation)
        fused += 1
    return fused


@dataclass(frozen=True)
class FuseAttention(ModulePass):
    """Replace hand-written softmax attention, proven from the IR, by one SDPA op.

    The chain must be exactly ``softmax(q @ k^T * scale + mask) @ v`` without dropout
    (module docstring: what is matched); with a per-head sink column concatenated to the
    scores and dropped after the softmax (gpt-oss) it becomes ``torch.autosp.sink_attention``. The dead chain is left to ``autosp-dce``.

    Input::

        %kt = torch.aten.transpose.int %k, %int2, %int3 : ... -> !torch.vtensor<[1,2,8,?],f32>
        %s = torch.aten.matmul %q, %kt : ... -> !torch.vtensor<[1,2,?,?],f32>
        %ss = torch.aten.mul.Scalar %s, %float0.35 : ...
        %sm = torch.aten.add.Tensor %ss, %mask, %int1 : ...
        %p = torch.aten.softmax.int %sm, %int-1, %none : ...
        %o = torch.aten.matmul %p, %v : ... -> !torch.vtensor<[1,2,?,8],f32>

    Output::

        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %mask, %float0, %false, %float0.35, %false
    """

    name: ClassVar[str] = "autosp-fuse-attention"

    def apply(self, module) -> None:
        fuse_attention(module)
