"""Recognise causal attention masks built from sizes only, and use ``is_causal`` instead.

Hugging Face models build their attention mask differently when traced: eagerly, SDPA
gets ``is_causal=True`` and no mask; under ``torch.export`` the mask is materialised as a
``[1, 1, S, S]`` boolean tensor (causal, AND-ed with a packed-sequence check computed from
the positions). SDPA then converts it to an additive float mask and keeps it for
backward: O(S^2) bytes per layer, and the slower masked kernel.

:func:`fold_causal_masks` finds SDPA ops whose mask depends on no input data, only on the
sequence length (every use of a function argument in the mask's backward slice is a
``torch.aten.size.int``, and the slice has no random op), evaluates that slice with
PyTorch for several lengths, and when the result is the causal mask at every length,
drops the mask and sets ``is_causal``. Masks computed from inputs (padding masks,
position ids) are kept.

Example::

    >>> fold_causal_masks(module)        # SDPA(q, k, v, %mask, 0.0, false) -> SDPA(q, k, v, none, 0.0, true)
    1
"""
from __future__ import annotations

import torch
from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import body_ops, main_func, op_name
from autosp.ir.sequence import SDPA_OP

PROBE_LENGTHS = (1, 2, 3, 7, 16, 33)
_RANDOM = ("rand", "dropout", "bernoulli", "normal", "multinomial")


def _slice(value: ir.Value):
    """The ops that compute ``value`` (in block order), and the block arguments they read."""
    ops, args, todo, seen = [], set(), [value], set()
    while todo:
        v = todo.pop()
        owner = v.owner
        if isinstance(owner, ir.Block):
            args.add(v)
            continue
        op = owner.operation
        key = ir.Value(op.results[0]) if len(op.results) else None
        if key is None or key in seen:
            continue
        seen.add(key)
        ops.append(op)
        todo.extend(op.operands)
    return ops, args


def _size_only(ops, args) -> bool:
    for op in ops:
        name = op_name(op)
        if any(r in name for r in _RANDOM):
            return False
        for i, v in enumerate(op.operands):
            if v in args and not (name == "torch.aten.size.int" and i == 0):
                return False
    return bool(ops)


def _evaluate(func, ops, target: ir.Value, seq_len: int):
    """Run the slice with PyTorch, every argument it reads being zeros of length ``seq_len``
    in its dynamic dimensions."""
    from autosp.backend.fx_emitter import _Emitter  # compile-time evaluation reuses the emitter
    emitter = _Emitter(func)
    block = func.regions[0].blocks[0]
    inputs = []
    for i, arg in enumerate(block.arguments):
        emitter.values[arg] = emitter.graph.placeholder(f"arg{i}")
        shape = b.vtensor_shape(arg.type)
        inputs.append(torch.zeros([seq_len if d is None else d for d in shape[0]]) if shape else None)
    members = {ir.Value(op.results[0]) for op in ops}
    for op in body_ops(func):  # in block order
        if len(op.results) and ir.Value(op.results[0]) in members:
            emitter.emit_op(op)
    emitter.graph.output(emitter.get(target, None))
    gm = torch.fx.GraphModule(emitter.root, emitter.graph)
    return gm(*inputs)


def _is_causal(mask, seq_len: int) -> bool:
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or tuple(mask.shape[-2:]) != (seq_len, seq_len):
        return False
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    if mask.dtype == torch.bool:
        keep = mask
    elif mask.is_floating_point():
        low = torch.finfo(mask.dtype).min / 2
        if not bool(((mask == 0) | (mask <= low)).all()):
            return False
        keep = mask == 0
    else:
        return False
    return bool((keep == allowed).all())


def fold_causal_masks(module) -> int:
    """Replace size-only causal masks of SDPA ops by ``is_causal``; return how many."""
    func = main_func(module)
    folded = 0
    for op in [o for o in body_ops(func) if op_name(o) == SDPA_OP]:
        mask = op.operands[3]
        if not isinstance(mask.owner, ir.Block) and op_name(mask.owner) == "torch.constant.none":
            continue
        ops, args = _slice(mask)
        if not _size_only(ops, args):
            continue
        try:
            causal = all(_is_causal(_evaluate(func, ops, mask, n), n) for n in PROBE_LENGTHS)
        except Exception:  # a slice PyTorch cannot run at some length: leave the mask alone
            causal = False
        if not causal:
            continue
        with ir.InsertionPoint(op), op.location:
            none = b.constant_none()
            true = ir.Operation.create("torch.constant.bool", results=[ir.Type.parse("!torch.bool")],
                                       attributes={"value": ir.BoolAttr.get(True)}).result
        op.operands[3] = none
        op.operands[5] = true
        folded += 1
    return folded
