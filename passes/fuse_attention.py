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

**A key bias** (ALiBi as MPT and BLOOM write it): an additive term proven to be the same for
every query of a row, by its shape alone (size 1 on the query dim; a slice's size through
the size symbols' ranges, :func:`autosp.ir.sizes.static_size`), added per head or not,
becomes ``torch.operator "torch.autosp.key_bias_attention"`` with SDPA's eight operands
and the bias as ``[B|1, H|1, 1, S|1]``; scores with the heads folded into the batch
(BLOOM's ``baddbmm(alibi, q, kᵀ)`` on ``[B * H, S, D]``, viewed up to ``[B, H, S, S]``)
match too. The runtime (:func:`autosp.runtime.attention.key_bias_attention`) broadcasts
the bias over the queries inside a fused kernel: O(S) bytes. A term that varies with the
query per head (T5's buckets written out) is no match.

**Half precision.** Eager attention over bf16/f16 inputs upcasts: ``softmax(x, dtype=
float32)``, ``scores.float()``, an fp32 bias promoting the sum (MPT), torch's ``baddbmm``
computing in fp32 and rounding back; the probabilities are cast back before ``@ v``. These
casts are matched and dropped: the fused kernels compute the scores and the softmax in
fp32 (more precise than eager's rounded scores, not bit-equal). An fp32 mask promoting the
scores fuses only with a key bias, whose runtime casts it.

Not fused, left as written (correct, with the O(S^2) cost, and ``autosp.unfused_attention``
on the softmax, so the compile warns): probabilities used elsewhere
(``output_attentions``), dropout with p > 0 (SDPA would draw other numbers), a
multiplicative or per-element-modified score (soft-capping), a per-head term that varies
with the query, anything not matching exactly.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import ClassVar, cast

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.contract import EMPTY_ROWS_ATTR, UNFUSED_ATTR, EmptyRows
from autosp.ir.core import body_ops, const_bool, const_float, const_int, main_func, op_name, producer, users
from autosp.ir.mask_algebra import Lin, NotProven
from autosp.ir.ops import KEY_BIAS_ATTENTION, SDPA_OP, SINK_ATTENTION, SOFTMAX_OPS
from autosp.ir.pass_base import ModulePass
from autosp.ir.sizes import dim_sizes, static_size

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
    bias: KeyBias | None = None  # a per-head bias of the key alone (ALiBi), added to the scores


@dataclass
class KeyBias:
    """An additive score bias proven independent of the query: ``value`` has size 1 on the
    query dim, so broadcasting gives every query of a row the same bias per key. ``folded``:
    ``(B, H)`` where it is ``[B * H | 1, 1, S]`` added to scores with the heads folded into
    the batch (BLOOM's ``baddbmm``); else it is aligned from the right with ``[B, H, S, S]``."""

    value: ir.Value
    folded: tuple[int, int] | None = None


def match(softmax) -> Match:
    """The attention around ``softmax``, or :class:`_NoMatch` with the reason."""
    name = op_name(softmax)
    scores = softmax.operands[0]
    if const_int(softmax.operands[1]) not in (-1, 3):
        raise _NoMatch("softmax over another dim than the last")
    if name == "torch.aten._softmax" and const_bool(softmax.operands[2]) is not False:
        raise _NoMatch("_softmax with half_to_float")
    if _dtype(softmax.results[0]) != _dtype(scores) and (_dtype(softmax.results[0]), _dtype(scores)) not in _WIDER:
        raise _NoMatch("softmax in another dtype than the scores")
    scores, sinks = _strip_sinks(scores)
    _only_use(scores, "the scores")
    x, fill, fill_finite, mask, bias, scale = _peel_scores(scores)
    if bias is not None and sinks is not None:
        raise _NoMatch("a key bias and attention sinks together")
    q, k = _query_and_key(x)
    # probs -> (the sink column dropped) -> (identity casts, dropout p = 0) -> @ v
    p = softmax.results[0]
    if sinks is not None:
        p = _drop_sink_column(p, _sizes(scores)[3])
    low = _dtype(q)
    while True:
        user = _only_use(p, "the probabilities")
        uname = op_name(user)
        if uname in ("torch.aten.to.dtype", "torch.aten.type_as", "torch.aten._to_copy") \
                and _dtype(user.results[0]) in (_dtype(p), low):  # (an fp32 softmax cast back: eager's upcast)
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
    # q, k, v, the probabilities @ v and the output share a dtype; the scores and softmax may
    # be fp32 over bf16/f16 inputs (eager's upcast: softmax(..., dtype=float32), or an fp32
    # bias promoting the sum), which the fused kernels compute in fp32 anyway.
    for t_ in (k, v, p, out):
        if _dtype(t_) != low:
            raise _NoMatch("q, k, v, the probabilities @ v and the output are not all in one dtype")
    if _dtype(scores) != low and (_dtype(scores), low) not in _WIDER:
        raise _NoMatch("scores in another dtype than q, k and v")
    return Match(q, k, v, mask, scale, out, fill, fill_finite, sinks, bias)


_FILLS = ("torch.aten.masked_fill.Scalar", "torch.aten.where.self")
# (wider, narrower) float dtypes: an fp32 softmax or sum over half-precision attention inputs.
_WIDER = (("f32", "bf16"), ("f32", "f16"))
_CASTS = ("torch.aten.to.dtype", "torch.aten._to_copy")
_FLOAT_MAX = {"f32": 3.4028234663852886e38, "bf16": 3.3895313892515355e38, "f16": 65504.0}
_SCALES = ("torch.aten.mul.Scalar", "torch.aten.div.Scalar")


def _fill_value(op) -> tuple[ir.Value, ir.Value, float] | None:
    """``(scores, cond, c)`` where ``op`` is ``scores.masked_fill(cond, c)``, written as
    such or as ``where(cond, c, scores)`` with ``c`` a scalar literal tensor; else None."""
    if op_name(op) == "torch.aten.masked_fill.Scalar":
        return op.operands[0], op.operands[1], _float_const(op.operands[2])
    value = op.operands[1]
    if _sizes(value) != ():
        return None
    literal = producer(value)
    while literal is not None and op_name(literal) in (*_CASTS, "torch.aten.to.device"):  # (moved to a device)
        literal = producer(literal.operands[0])
    if literal is None or op_name(literal) != "torch.vtensor.literal":
        return None
    attr = literal.attributes["value"]
    if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
        return None
    try:
        c = ir.FloatAttr(attr.get_splat_value()).value
    except (TypeError, ValueError):
        return None
    if _dtype(value) in _FLOAT_MAX and abs(c) > _FLOAT_MAX[_dtype(value)]:  # (cast to a narrower float)
        c = math.copysign(math.inf, c)
    return op.operands[2], op.operands[0], c


def _peel_scores(scores: ir.Value):
    """``(qk, fill, fill_finite, mask, bias, scale)`` where ``scores`` is exactly
    ``masked_fill?(((qk * scale) + bias?) [viewed from the folded form] + mask?, fill)``.

    ``qk`` is the raw ``q @ kᵀ`` (``[B, H, S, S]``, or ``[B * H, S, S]`` when the scores are
    viewed up from the heads folded into the batch). Each additive term is classified by
    its shape alone: one with a single head that varies with the query is the mask (what
    ``autosp-causal-mask`` examines), one of size 1 on the query dim is a key bias (every
    query of a row adds the same value per key: ALiBi as MPT and BLOOM write it). A
    per-head term that varies with the query (T5's buckets written out) is no match."""
    x = scores
    fill = mask = None
    bias: KeyBias | None = None
    fill_finite = False
    four = _rank4(scores)
    producer_op = producer(x)
    found = _fill_value(producer_op) if producer_op is not None and op_name(producer_op) in _FILLS else None
    if found is not None:
        # scores.masked_fill(cond, c) with c at most half the dtype's lowest (or -inf): after
        # softmax exactly a boolean mask `not cond`, except in rows where cond is true
        # everywhere (eager: uniform over all keys, no gradient to q and k).
        x, fill, c = found
        if not c <= -1e30:
            raise _NoMatch(f"masked_fill with {c}, not a masking constant")
        fill_finite = c != float("-inf")
        _only_use(x, "the scaled scores")
        if _dtype(fill) != "i1" or (len(_sizes(fill)) == 4 and _sizes(fill)[1] != Lin((), 1)):
            raise _NoMatch("masked_fill with a per-head or non-boolean condition")
    folded: tuple[int, int] | None = None
    promoting_mask = False  # an fp32 mask over half-precision scores (BLOOM under autocast)
    while True:
        producer_op = producer(x)
        name = op_name(producer_op) if producer_op is not None else None
        if name == "torch.aten.add.Tensor":
            if abs(_float_const(producer_op.operands[2]) - 1.0) > 0:
                raise _NoMatch("add with alpha != 1")
            first, second = producer_op.operands[0], producer_op.operands[1]
            # The scores are the operand that comes from a scale, a view, a matmul or another
            # add (where both do, the one of the result's whole shape).
            sides = [(s, t) for s, t in ((first, second), (second, first))
                     if producer(s) is not None and op_name(producer(s)) in
                     (*_SCALES, *_VIEWS, _MATMUL, _BMM, "torch.aten.add.Tensor")]
            if len(sides) == 2:
                sides = [st for st in sides if _sizes(st[0]) == _sizes(x)] or sides
            if not sides:
                raise _NoMatch("an add whose operands are not scores and a mask")
            s, t = sides[0]
            if _dtype(t) != _dtype(x) or not _dtype(t).startswith(("f", "bf")):
                raise _NoMatch("a mask of another dtype than the scores")
            kind = _term_kind(t, len(_sizes(x)), mask is None and fill is None and folded is None)
            promotes = _dtype(s) != _dtype(x)
            if promotes and (_dtype(x), _dtype(s)) not in _WIDER:
                raise _NoMatch("a term that promotes the scores to another dtype")
            if kind == "mask" and mask is not None and bias is None and fill is None and _key_only(mask):
                # a one-head key-only term outside the mask (scores + mask + bias): the bias after all
                bias, mask, promoting_mask = KeyBias(mask), None, False
            if kind == "mask" and (mask is not None or fill is not None or folded is not None):
                raise _NoMatch("two masks added to the scores")
            if kind == "bias" and bias is not None:
                raise _NoMatch("two key biases added to the scores")
            if kind == "mask":
                mask, promoting_mask = t, promotes
            else:
                bias = KeyBias(t, (int(four[0].const), int(four[1].const)) if folded is not None else None)
                if folded is not None and not (four[0].is_const() and four[1].is_const()):
                    raise _NoMatch("a key bias on folded heads with a dynamic batch or head count")
            x = s
            _only_use(x, "the scaled scores")
        elif name in _CASTS and ((_dtype(x), _dtype(producer_op.operands[0])) in _WIDER or
                                 (_dtype(producer_op.operands[0]), _dtype(x)) in _WIDER):
            # scores.float(), or fp32 scores rounded to bf16 (torch's baddbmm on bf16 computes
            # in fp32 and casts back): the fused kernel keeps them in fp32
            x = producer_op.operands[0]
            _only_use(x, "the scores before their cast")
        elif name in _VIEWS and folded is None and len(_sizes(x)) == 4 and len(_sizes(producer_op.operands[0])) == 3:
            inner = producer_op.operands[0]
            b_, h, m, n = _sizes(x)
            if not (b_.is_const() and h.is_const()) or _sizes(inner) != (Lin((), b_.const * h.const), m, n):
                raise _NoMatch(f"{x.get_name()} is not the folded scores' leading dim split")
            folded = (b_.const, h.const)
            x = inner
            _only_use(x, "the folded scores")
        else:
            break
    scale = 1.0
    producer_op = producer(x)
    if producer_op is not None and op_name(producer_op) in _SCALES:
        c = _float_const(producer_op.operands[1])
        if c == 0.0:
            raise _NoMatch("a scale of 0")
        scale = c if op_name(producer_op) == "torch.aten.mul.Scalar" else 1.0 / c
        x = producer_op.operands[0]
        _only_use(x, "the scores")
    if folded is not None and len(_sizes(x)) != 3:
        raise _NoMatch("scores viewed from a folded form that is no batched matmul")
    if promoting_mask and bias is None:  # (SDPA takes a float mask in q's dtype; key-bias attention casts it)
        raise _NoMatch("a mask that promotes the scores to another dtype")
    return x, fill, fill_finite, mask, bias, scale


def _key_only(t: ir.Value) -> bool:
    """Is ``t`` the same for every query when added to scores: no query dim (``[S]``), or
    size 1 there (:func:`autosp.ir.sizes.static_size`)?"""
    query_dim = len(_sizes(t)) - 2
    return query_dim < 0 or static_size(t, query_dim) == 1


def _term_kind(t: ir.Value, rank: int, mask_free: bool) -> str:
    """``"mask"`` or ``"bias"`` for a term added to scores of ``rank`` (4: ``[B, H, S, S]``;
    3: the heads folded into the batch). A key bias has size 1 on the query dim (proven by
    :func:`autosp.ir.sizes.static_size`: through slices whose start is pinned by the size
    symbols' ranges, e.g. MPT's ``alibi[:, max(1 - S, 0):]``), or no query dim at all (a
    ``[S]`` term). A term with one head is the mask (what autosp-causal-mask proves: a
    ``[B, 1, 1, S]`` padding mask stays one), unless ``mask_free`` is False (a mask or a
    fill is already there) and it is the same for every query: then it is a head-shared
    key bias (and :func:`_peel_scores` turns a key-only mask it met first into the bias when
    a second mask comes). A per-head term that varies with the query is no match."""
    sizes = _sizes(t)
    if len(sizes) > rank:
        raise _NoMatch(f"a term of rank {len(sizes)} added to rank-{rank} scores")
    heads = len(sizes) - 3
    key_only = _key_only(t)
    one_head = rank == 4 and (heads < 0 or static_size(t, heads) == 1)
    if one_head and (mask_free or not key_only):
        return "mask"
    if key_only:
        return "bias"
    raise _NoMatch("a per-head additive mask that varies with the query")


def _transposed(kt: ir.Value, rank: int) -> ir.Value:
    """``k`` where ``kt`` is ``k`` transposed over its last two dims (rank 4 or 3)."""
    t = _op(kt, "torch.aten.transpose.int", "torch.aten.permute")
    if op_name(t) == "torch.aten.permute":
        order = _op(t.operands[1], "torch.prim.ListConstruct")
        swapped = [(const_int(d) or 0) % rank for d in order.operands] == [*range(rank - 2), rank - 1, rank - 2]
    else:
        swapped = sorted((const_int(d) or 0) % rank for d in t.operands[1:3]) == [rank - 2, rank - 1]
    if not swapped:
        raise _NoMatch("the key is not transposed over its last two dims")
    return t.operands[0]


def _uncast(x: ir.Value) -> ir.Value:
    """``x`` before an upcast from bf16/f16 to fp32 (torch's baddbmm on bf16 multiplies in
    fp32), else ``x``."""
    op = producer(x)
    if op is not None and op_name(op) in _CASTS and (_dtype(x), _dtype(op.operands[0])) in _WIDER:
        _only_use(x, "the upcast operand")
        return op.operands[0]
    return x


def _query_and_key(qk: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The rank-4 ``(q, k)`` of the raw scores ``qk``: ``q @ kᵀ`` as :func:`_matmul` reads
    it, or (rank 3, the heads folded into the batch) ``bmm(view(q), view(k)ᵀ)`` with the
    key transposed before or after its two leading dims are merged."""
    if len(_sizes(qk)) == 4:
        q, kt = _matmul(qk)
        return q, _transposed(kt, 4)
    bmm = _op(qk, _BMM)
    q, right = _unmerge(_uncast(bmm.operands[0])), _uncast(bmm.operands[1])
    t = producer(right)
    if t is not None and op_name(t) in ("torch.aten.transpose.int", "torch.aten.permute") \
            and len(_sizes(t.operands[0])) == 3:
        k = _unmerge(_transposed(right, 3))  # (merged, then transposed: BLOOM)
    else:
        k = _transposed(_unmerge(right), 4)
    if _rank4(q)[:2] != _rank4(k)[:2]:
        raise _NoMatch(f"{qk.get_name()}: operands of a batched matmul with other leading dims")
    return q, k


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


def _bias_as_rank4(bias: KeyBias) -> ir.Value:
    """The key bias as ``[B|1, H|1, 1, S|1]`` (at the insertion point): a folded
    ``[B * H, 1, S]`` unflattened to ``[B, H, 1, S]``, a lower rank unsqueezed in front."""
    dims, dtype = b.vtensor_shape(bias.value.type)  # type: ignore[misc]
    x = bias.value
    if bias.folded is not None and len(dims) == 3 and dims[0] != 1:  # (its rows are the B * H ones)
        batch, heads = bias.folded
        sizes = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<int>")],
                                    operands=[b.constant_int(batch), b.constant_int(heads)]).result
        dims = [batch, heads, *dims[1:]]
        return b.torch_op("torch.aten.unflatten.int", [x, b.constant_int(0), sizes], b.vtensor_type(dims, dtype))
    while len(dims) < 4:
        dims = [1, *dims]
        if len(dims) == 4:
            dims[2] = 1  # (the query dim, proven 1 by the match: its type may not say so)
        x = b.torch_op("torch.aten.unsqueeze", [x, b.constant_int(0)], b.vtensor_type(dims, dtype))
    return x


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
            if m.sinks is not None:
                sdpa = ir.Operation.create("torch.operator", results=[m.out.type], operands=operands + [m.sinks],
                                           attributes={"name": ir.StringAttr.get(SINK_ATTENTION)}).result
            elif m.bias is not None:
                sdpa = ir.Operation.create("torch.operator", results=[m.out.type],
                                           operands=operands + [_bias_as_rank4(m.bias)],
                                           attributes={"name": ir.StringAttr.get(KEY_BIAS_ATTENTION)}).result
            else:
                sdpa = b.torch_op(SDPA_OP, operands, m.out.type)
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
    scores and dropped after the softmax (gpt-oss) it becomes ``torch.autosp.sink_attention``;
    with a bias proven independent of the query (ALiBi) ``torch.autosp.key_bias_attention``.
    The dead chain is left to ``autosp-dce``.

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
