"""``autosp-tile-loss``: the LM head and the cross-entropy run in chunks of rows.

A causal LM's loss reads the label's log-probability of every position::

    logits = h @ W^T                      (torch.aten.mm: [N, H] x [H, V])
    ...    = views, sequence slices / rewindows, casts, soft-capping (tanh(x / c) * c)
    lp     = log_softmax(logits, dim=-1)  ([N, V])
    picked = gather(lp, 1, labels)        ([N, 1])

and autograd keeps the [N, V] logits and log-probabilities for backward: with a 128K
vocabulary that is most of a long-context step's peak. This pass proves, op by op, that a
``gather`` reads exactly such a chain (the log-softmax over the last dim used by the gather
alone; every op between the matmul and the log-softmax one that maps rows to rows: a view
whose size list keeps the vocabulary last, a slice or ``autosp.rewindow`` / ``autosp.shard``
along another dim, a dtype cast, a multiplication or division by a constant, ``tanh``) and
replaces the gather with one ``autosp.vocab_logprob`` op over the hidden rows: the same
row ops replayed on ``h`` (with the hidden size last), the weight, and the labels. The
runtime (:func:`autosp.runtime.tiling.vocab_logprob`) computes it in chunks of rows and
recomputes each chunk's logits in backward, so no [N, V] tensor lives whole.

Everything after the gather (ignore_index masking, sums, the all-reduce, the division by
the token count or ``num_items_in_batch``) is untouched: it is O(N). The logits chain
stays where the logits are also returned; with ``drop-logits`` a returned value computed
from the chain is removed from the results (``autosp.dropped_results`` on the function:
the compiled call returns ``None`` there), so the logits never exist. A loss computed
outside the model from returned logits has no gather here: nothing is tiled, and the
logits exist whole.

Input::

    %l = torch.aten.mm %h, %wt : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32> -> !torch.vtensor<[?,512],f32>
    %lp = torch.aten.log_softmax.int %l, %int1, %none : ... -> !torch.vtensor<[?,512],f32>
    %p = torch.aten.gather %lp, %int1, %idx, %false : ... -> !torch.vtensor<[?,1],f32>

Output::

    %p = "autosp.vocab_logprob"(%h, %wt, %idx) {chunk = 0 : i64, softmax_dtype = "", steps = ""}
           : (!torch.vtensor<[?,64],f32>, !torch.vtensor<[64,512],f32>, !torch.vtensor<[?,1],si64>) -> !torch.vtensor<[?,1],f32>
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.contract import DROPPED_ATTR, REWINDOW, SHARD, VOCAB_LOGPROB
from autosp.ir.core import body_ops, const_float, const_int, is_none, main_func, op_name, producer, users
from autosp.ir.ops import LIST_CONSTRUCT
from autosp.ir.pass_base import ModulePass

_log = logging.getLogger(__name__)

_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")
_ROW_MOVES = ("torch.aten.slice.Tensor", REWINDOW, SHARD)
_LOG_SOFTMAX = ("torch.aten.log_softmax.int", "torch.aten._log_softmax")
# torch's ScalarType numbers -> MLIR element types (the dtypes a logits cast can name).
_DTYPES = {5: "f16", 6: "f32", 7: "f64", 15: "bf16"}


class _NoMatch(Exception):
    """Not exactly the LM head's log-probabilities: the reason, for the log."""


@dataclass(frozen=True)
class TileLoss(ModulePass):
    """Fuse the LM head, log-softmax and label pick into ``autosp.vocab_logprob``.

    Proves that a ``torch.aten.gather`` picks from ``log_softmax(h @ W^T)`` over the last
    dim through row-preserving ops only (views keeping the vocabulary last, sequence
    slices and rewindows, casts, scaling by constants, tanh soft-capping), and replaces it
    with one op the runtime computes in row chunks (``chunk`` rows; 0: chosen at run time
    from the vocabulary size), recomputing each chunk in backward. ``drop-logits`` also
    removes returned logits computed by the chain (the compiled call returns None there).

    Input::

        %l = torch.aten.mm %h, %wt : ... -> !torch.vtensor<[?,512],f32>
        %lp = torch.aten.log_softmax.int %l, %int1, %none : ...
        %p = torch.aten.gather %lp, %int1, %idx, %false : ... -> !torch.vtensor<[?,1],f32>

    Output::

        %p = "autosp.vocab_logprob"(%h, %wt, %idx) {chunk = 0 : i64, softmax_dtype = "", steps = ""} : ...
    """

    name: ClassVar[str] = "autosp-tile-loss"
    chunk: int = 0
    drop_logits: bool = False

    def apply(self, module) -> None:
        tile_loss(module, self.chunk, self.drop_logits)


def _shape(value: ir.Value) -> tuple[list, str]:
    shape = b.vtensor_shape(value.type)
    if shape is None:
        raise _NoMatch(f"{value.get_name()} is not a tensor of known rank")
    return shape


def _step(op) -> tuple | None:
    """The element-wise step an op applies to the logits, None if it only moves rows."""
    name = op_name(op)
    if name == "torch.aten.to.dtype":
        dtype = const_int(op.operands[1])
        if dtype not in _DTYPES or not all(is_none(v) or op_name(producer(v)) == "torch.constant.bool"
                                            for v in list(op.operands)[2:] if producer(v) is not None):
            raise _NoMatch("a cast with a dtype or options other than a float type")
        return ("cast", _DTYPES[dtype])
    if name in ("torch.aten.div.Scalar", "torch.aten.mul.Scalar"):
        c = const_float(op.operands[1])
        if c is None:
            raise _NoMatch(f"{name} by a value that is not a constant")
        return ("div" if "div" in name else "mul", c)
    if name == "torch.aten.tanh":
        return ("tanh",)
    return None


def _walk(logits_in: ir.Value):
    """From the log-softmax's input back to the head's mm: ``(mm op, row ops, steps)``,
    row ops and steps in execution order."""
    rows: list = []
    steps: list[tuple] = []
    value = logits_in
    vocab = _shape(value)[0][-1]
    while True:
        op = producer(value)
        if op is None:
            raise _NoMatch("the log-softmax's input does not come from a matmul")
        name = op_name(op)
        dims, _ = _shape(value)
        if dims[-1] != vocab:
            raise _NoMatch(f"{name} changes the last dim")
        if name == "torch.aten.mm":
            if None in _shape(op.operands[1])[0]:
                raise _NoMatch("the head's weight depends on the sequence")
            return op, rows[::-1], steps[::-1]
        if name in _VIEWS:
            sizes = producer(op.operands[1])
            if sizes is None or op_name(sizes) != LIST_CONSTRUCT or const_int(list(sizes.operands)[-1]) != vocab \
                    or _shape(op.operands[0])[0][-1] != vocab:
                raise _NoMatch("a view that does not keep the vocabulary last")
            rows.append(op)
        elif name in _ROW_MOVES:
            rank = len(dims)
            dim = const_int(op.operands[1]) if name == "torch.aten.slice.Tensor" else op.attributes["dim"].value
            if dim is None or dim % rank == rank - 1:
                raise _NoMatch(f"{name} along the vocabulary")
            rows.append(op)
        else:
            step = _step(op)
            if step is None:
                raise _NoMatch(f"{name} between the head and the log-softmax")
            steps.append(step)
        value = op.operands[0]


def _match(gather):
    """``(mm, row ops, steps, log_softmax)`` for a gather that picks log-probabilities."""
    lp = gather.operands[0]
    softmax = producer(lp)
    if softmax is None or op_name(softmax) not in _LOG_SOFTMAX:
        raise _NoMatch("the gather does not read a log-softmax")
    rank = len(_shape(lp)[0])
    if rank != 2 or const_int(gather.operands[1]) not in (1, -1) or const_int(softmax.operands[1]) not in (1, -1):
        raise _NoMatch("not a [N, V] log-softmax and gather over the last dim")
    if op_name(softmax) == "torch.aten._log_softmax" and (
            op_name(producer(softmax.operands[2])) != "torch.constant.bool"
            or ir.BoolAttr(producer(softmax.operands[2]).attributes["value"]).value):
        raise _NoMatch("a half-to-float log-softmax")
    if users(lp) != [gather]:
        raise _NoMatch("the log-probabilities have other users")
    if op_name(producer(gather.operands[3])) != "torch.constant.bool" or \
            ir.BoolAttr(producer(gather.operands[3]).attributes["value"]).value:
        raise _NoMatch("a sparse gather")
    mm, rows, steps = _walk(softmax.operands[0])
    return mm, rows, steps, softmax


def _replay(op, value: ir.Value, hidden: int) -> ir.Value:
    """``op`` applied to ``value`` (hidden size last) instead of its logits operand."""
    dims, dtype = _shape(op.results[0])
    result_type = b.vtensor_type([*dims[:-1], hidden], _shape(value)[1])
    operands = [value, *list(op.operands)[1:]]
    if op_name(op) in _VIEWS:
        items = list(producer(op.operands[1]).operands)
        items[-1] = b.constant_int(hidden)
        operands[1] = ir.Operation.create(LIST_CONSTRUCT, results=[op.operands[1].type], operands=items).result
    attributes = {a.name: a.attr for a in (op.attributes[i] for i in range(len(op.attributes)))}
    return ir.Operation.create(op_name(op), results=[result_type], operands=operands, attributes=attributes,
                               loc=op.location).result


def _logits_values(mm, rows) -> set:
    return {mm.results[0], *[r.results[0] for r in rows]}


def tile_loss(module, chunk: int = 0, drop_logits: bool = False) -> int:
    """Rewrite every proven LM-head log-probability pick (see the module docstring);
    returns how many were rewritten."""
    func = main_func(module)
    rewritten = 0
    dropped: list[int] = []
    for gather in [op for op in body_ops(func) if op_name(op) == "torch.aten.gather"]:
        try:
            mm, rows, steps, softmax = _match(gather)
        except _NoMatch as e:
            _log.info("autosp-tile-loss: %s not rewritten: %s", gather.location, e)
            continue
        h, wt = mm.operands[0], mm.operands[1]
        hidden = _shape(h)[0][-1]
        softmax_dtype = const_int(softmax.operands[2]) if not is_none(softmax.operands[2]) else None
        with ir.InsertionPoint(gather), gather.location:
            value = h
            for op in rows:
                value = _replay(op, value, hidden)
            text = " ".join(s[0] if len(s) == 1 else f"{s[0]}({s[1]})" for s in steps)
            fused = ir.Operation.create(
                VOCAB_LOGPROB, results=[gather.results[0].type], operands=[value, wt, gather.operands[2]],
                attributes={"chunk": b.i64(chunk), "steps": ir.StringAttr.get(text),
                            "softmax_dtype": ir.StringAttr.get(_DTYPES.get(softmax_dtype, "")
                                                               if softmax_dtype is not None else "")})
        gather.results[0].replace_all_uses_with(fused.results[0])
        gather.erase()
        if not users(softmax.results[0]):
            for use in list(softmax.results[0].uses):  # torch.bind_symbolic_shape annotations
                use.owner.erase()
            softmax.erase()
        rewritten += 1
        if drop_logits:
            ret = list(body_ops(func))[-1]
            logits = _logits_values(mm, rows)
            dropped += [i for i, v in enumerate(ret.operands) if v in logits]
    if dropped:
        _drop_results(func, sorted(set(dropped)))
    return rewritten


def _drop_results(func, indices: list[int]) -> None:
    """Remove results ``indices`` from ``func``'s return and type; record them."""
    ret = list(body_ops(func))[-1]
    keep = [v for i, v in enumerate(ret.operands) if i not in indices]
    with ir.InsertionPoint(ret), ret.location:
        ir.Operation.create("func.return", operands=keep)
    ret.erase()
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    with func.context:
        results = [t for i, t in enumerate(ftype.results) if i not in indices]
        func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(ftype.inputs, results))
        previous = [ir.IntegerAttr(a).value for a in func.attributes[DROPPED_ATTR]] \
            if DROPPED_ATTR in func.attributes else []
        # ``indices`` count the current results; earlier drops count the original ones.
        original = [i for i in range(len(ftype.results) + len(previous)) if i not in previous]
        dropped = sorted({*previous, *(original[i] for i in indices)})
        func.attributes[DROPPED_ATTR] = ir.ArrayAttr.get([b.i64(i) for i in dropped])
