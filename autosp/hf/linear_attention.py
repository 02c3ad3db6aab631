"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5) as transformers ships them: one op with stated semantics.

transformers' torch path of a Gated DeltaNet layer calls a module-level function,
``torch_chunk_gated_delta_rule(q, k, v, g, beta, ...)``: it pads the sequence to a
multiple of its chunk size and loops over the chunks, carrying the recurrent state
``[B, H, dk, dv]`` from one to the next. Exported, the loop is unrolled for the example's
chunk count and the padding is ``S + (64 - S % 64) % 64``: no program of symbolic S.

autosp does not read that loop. It states what the function is: while the model is
exported, the function is replaced by one op, ``autosp::gated_delta_rule(q, k, v, g, beta,
l2norm, chunk, kernel)``, whose semantics are a **linear recurrence along dim 1** of every
input (``[B, S, H, d]`` and ``[B, S, H]``): output t is the kernel's output at t from the
state after positions 0 .. t, and running the kernel on positions a .. b from the state
the positions 0 .. a left gives exactly the positions a .. b of the whole run (the
kernel's own ``initial_state`` / ``output_final_state`` contract). The layout rules shard
it along the sequence (``OpClass.RECURRENCE``), and the emitted program calls
:func:`gated_delta_rule`: on one rank the kernel itself; on P ranks each rank runs its
part from the state the previous rank sends (the ranks in sequence order), and in
backward the state's gradient travels back (:class:`_ChainedKernel`).
``python_tests/test_linear_attention.py`` checks the statement on random inputs: the
kernel run in parts, state passed, equals the kernel run whole.

Cost, said plainly: the ranks run their parts one after another (a chain, P times one
part's time per layer, each way), and pass one state per rank boundary each way
(``B * H * dk * dv`` floats). An associative prefix over the ranks' chunk summaries would
let them run at once; it is not built yet.
"""
from __future__ import annotations

import contextlib
import importlib
import sys

import torch
import torch.distributed as dist

OP_NAME = "torch.autosp.gated_delta_rule"  # as it imports (a torch.operator)
KERNEL_NAME = "torch_chunk_gated_delta_rule"  # transformers' torch path, in each family's modeling module


@torch.library.custom_op("autosp::gated_delta_rule", mutates_args=())
def gated_delta_rule_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, l2norm: bool, chunk: int, kernel: str) -> torch.Tensor:
    """The stated op (export only; the emitted program calls :func:`gated_delta_rule`)."""
    return _kernel(kernel)(query, key, value, g=g, beta=beta, chunk_size=chunk,
                           use_qk_l2norm_in_kernel=l2norm)[0].contiguous()


@gated_delta_rule_op.register_fake
def _(query, key, value, g, beta, l2norm, chunk, kernel):
    return value.new_empty(value.shape)


def _kernel(path: str):
    """The kernel function ``"module:name"`` (transformers' own, unpatched)."""
    module, _, name = path.partition(":")
    return _ORIGINALS.get(path) or getattr(importlib.import_module(module), name)


_ORIGINALS: dict[str, object] = {}


@contextlib.contextmanager
def recurrences_as_ops(model: torch.nn.Module):
    """While exporting: every transformers modeling module ``model``'s layers come from
    that defines :data:`KERNEL_NAME` calls :func:`gated_delta_rule_op` instead, for the
    calls it can state (no initial state, no final state wanted; the torch path ignores
    the rest, ``cu_seqlens`` too)."""
    modules = {type(m).__module__ for m in model.modules()}
    patched = []
    for name in sorted(modules):
        mod = sys.modules.get(name)
        original = getattr(mod, KERNEL_NAME, None) if mod is not None else None
        if original is None:
            continue
        path = f"{name}:{KERNEL_NAME}"
        _ORIGINALS[path] = original

        def stated(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, _original=original, _path=path, **kwargs):
            # (the torch path ignores its other keywords, cu_seqlens included: so does the op)
            if initial_state is not None or output_final_state:
                return _original(query, key, value, g, beta, chunk_size=chunk_size, initial_state=initial_state,
                                 output_final_state=output_final_state,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
            out = torch.ops.autosp.gated_delta_rule(query, key, value, g, beta, bool(use_qk_l2norm_in_kernel),
                                                    int(chunk_size), _path)
            return out, None
        setattr(mod, KERNEL_NAME, stated)
        patched.append((mod, original))
    try:
        yield len(patched)
    finally:
        for mod, original in patched:
            setattr(mod, KERNEL_NAME, original)


def _run(kernel, inputs, l2norm, chunk, state):
    q, k, v, g, beta = inputs
    if q.shape[1] == 0:  # this rank holds no position: the state passes through
        return v.new_zeros(v.shape), state
    out, final = kernel(q, k, v, g=g, beta=beta, chunk_size=chunk, initial_state=state, output_final_state=True,
                        use_qk_l2norm_in_kernel=l2norm)
    return out, final


class _ChainedKernel(torch.autograd.Function):
    """This rank's part of the recurrence: the state from the previous rank in, the state
    to the next out. Backward: the final state's gradient from the next rank, the kernel
    recomputed and differentiated, the initial state's gradient to the previous rank."""

    @staticmethod
    def forward(ctx, kernel, l2norm, chunk, group, ranks, rank, q, k, v, g, beta):
        from autosp.runtime import collectives
        b, h, dk, dv = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
        dtype = torch.promote_types(q.dtype, torch.float32)  # transformers' kernels keep the state in fp32
        state = torch.zeros(b, h, dk, dv, dtype=dtype, device=q.device)
        pg = collectives.process_group(group)
        if rank > 0:
            collectives.record("state", group, state)
            dist.recv(state, src=dist.get_global_rank(pg, ranks[rank - 1]), group=pg)
        with torch.no_grad():
            out, final = _run(kernel, (q, k, v, g, beta), l2norm, chunk, state)
        if rank < len(ranks) - 1:
            collectives.record("state", group, final)
            dist.send(final.to(dtype).contiguous(), dst=dist.get_global_rank(pg, ranks[rank + 1]), group=pg)
        ctx.save_for_backward(q, k, v, g, beta, state)
        ctx.args = (kernel, l2norm, chunk, group, ranks, rank)
        ctx.final_shape = final.shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from autosp.runtime import collectives
        kernel, l2norm, chunk, group, ranks, rank = ctx.args
        q, k, v, g, beta, state = ctx.saved_tensors
        pg = collectives.process_group(group)
        grad_final = torch.zeros(ctx.final_shape, dtype=state.dtype, device=state.device)
        if rank < len(ranks) - 1:
            collectives.record("state", group, grad_final, backward=True)
            dist.recv(grad_final, src=dist.get_global_rank(pg, ranks[rank + 1]), group=pg)
        inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in (q, k, v, g, beta)]
        start = state.detach().requires_grad_(rank > 0)
        with torch.enable_grad():
            out, final = _run(kernel, inputs, l2norm, chunk, start)
            wrt = [t for t in inputs + [start] if t.requires_grad]
            grads = torch.autograd.grad((out, final), wrt, (grad_out, grad_final.to(final.dtype)), allow_unused=True)
        found = dict(zip([id(t) for t in wrt], grads))
        grads_in = [found.get(id(t)) for t in inputs]
        if rank > 0:
            grad_start = found.get(id(start))
            grad_start = torch.zeros_like(state) if grad_start is None else grad_start
            collectives.record("state", group, grad_start, backward=True)
            dist.send(grad_start.to(state.dtype).contiguous(), dst=dist.get_global_rank(pg, ranks[rank - 1]), group=pg)
        return (None, None, None, None, None, None, *grads_in)


def gated_delta_rule(query, key, value, g, beta, l2norm: bool, chunk: int, kernel: str, *,
                     group: str | None = None, seq_len: int | None = None):
    """``autosp::gated_delta_rule`` in the emitted program: the kernel itself without a
    group (one rank), else this rank's part of the chain over ``group``'s ranks in
    sequence order (see the module docstring). Each rank must hold one piece of the
    sequence (not a zigzag ring's two)."""
    from autosp.runtime import collectives
    fn = _kernel(kernel)
    if group is None or collectives.group_size(group) == 1 or collectives.simulating():
        return fn(query, key, value, g=g, beta=beta, chunk_size=chunk, use_qk_l2norm_in_kernel=l2norm)[0]
    p = collectives.group_size(group)
    lay = collectives.layout(group)
    n = seq_len if seq_len is not None else query.shape[1] * p
    pieces = [collectives.spans(n, 0, 0, lay, r) for r in range(p)]
    if any(len(ps) != 1 for ps in pieces):
        raise RuntimeError(f"autosp: a Gated DeltaNet recurrence needs each rank's positions in one piece; the layout "
                           f"{lay.describe()} gives a rank two (zigzag): compile with sp_strategy='ulysses'")
    order = sorted(range(p), key=lambda r: pieces[r][0][0])  # the ranks in sequence order
    me = order.index(collectives.group_rank(group))
    return _ChainedKernel.apply(fn, l2norm, chunk, group, order, me, query, key, value, g, beta)
