"""Parameters sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``), used by a
compiled program.

FSDP2 keeps each parameter as a DTensor sharded on dim 0 over its mesh, and unshards it in
forward hooks on the modules. A compiled program never calls the user's modules, so it
gathers the shards itself: :class:`GatherShard` all-gathers a parameter's local shard
(padded to equal rows, as FSDP2 does) and its backward reduce-scatters the gradient. The
reduce-scatter sums over every rank of the FSDP mesh, which includes the sequence-parallel
ranks, so it also performs the SP gradient sum (these parameters get no separate
all-reduce); with data-parallel replicas in the mesh the sum is scaled to their mean.
Autograd hands the gradient of ``p.to_local()`` back as a DTensor with ``p``'s
placements, so ``p.grad``, the optimizer and ``torch.distributed.checkpoint`` see what
they see under plain FSDP2.

Scope today: a 1-D FSDP mesh spanning the whole world, ``Shard(0)`` placements; every
sharded parameter is gathered when the call starts (not yet one layer at a time).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # a torch without DTensor: nothing is ever sharded
    DTensor = ()  # type: ignore[assignment,misc]
    Shard = None  # type: ignore[assignment,misc]


def is_sharded(t: object) -> bool:
    """Whether ``t`` is a DTensor (an FSDP2 parameter)."""
    return isinstance(t, DTensor)


def check_supported(name: str, p) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``p`` is sharded as this module supports."""
    mesh = p.device_mesh
    if mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise ValueError(f"parameter '{name}' is a DTensor with placements {tuple(p.placements)} on a "
                         f"{mesh.ndim}-D mesh; autosp supports FSDP2's Shard(0) on a 1-D mesh")
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"parameter '{name}' is sharded over {mesh.size()} of {dist.get_world_size()} ranks; "
                         "autosp supports FSDP over the whole world (the default of fully_shard)")


def stand_in(t: torch.Tensor) -> torch.Tensor:
    """What export traces in place of a sharded parameter: an uninitialised tensor of its
    global shape (the program only needs shapes and dtypes; the values are never read)."""
    if is_sharded(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.to_local().device)
    return t


@contextlib.contextmanager
def hooks_detached(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2's forward hooks taken off ``model``'s modules while it is traced (they would
    all-gather real shards inside torch.export), and put back as they were."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:
        yield
        return
    saved = []
    for module in model.modules():
        state = _get_module_fsdp_state(module)
        if state is None:
            continue
        for hooks in (module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs, module._forward_hooks):
            saved.append((hooks, dict(hooks)))
        for handle in (state._pre_forward_hook_handle, state._post_forward_hook_handle):
            module._forward_pre_hooks.pop(handle.id, None)
            module._forward_pre_hooks_with_kwargs.pop(handle.id, None)
            module._forward_hooks.pop(handle.id, None)
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


class GatherShard(torch.autograd.Function):
    """``local`` (this rank's rows of a dim-0-sharded tensor of ``rows`` rows) -> the whole
    tensor, by one all-gather over ``group``; backward: one reduce-scatter (sum) of the
    gradient, times ``scale``, and this rank's rows of it."""

    @staticmethod
    def forward(ctx, local, rows: int, group, scale: float):
        n = dist.get_world_size(group)
        per = -(-rows // n)  # rows per rank, padded (torch.chunk's split, as FSDP2's)
        ctx.group, ctx.rows, ctx.per, ctx.local_rows, ctx.scale = group, rows, per, local.shape[0], scale
        padded = local.new_zeros((per, *local.shape[1:]))
        padded[: local.shape[0]] = local
        full = local.new_empty((per * n, *local.shape[1:]))
        dist.all_gather_into_tensor(full, padded, group=group)
        return full[:rows]

    @staticmethod
    def backward(ctx, grad):
        n = dist.get_world_size(ctx.group)
        padded = grad.new_zeros((ctx.per * n, *grad.shape[1:]))
        padded[: ctx.rows] = grad
        mine = grad.new_empty((ctx.per, *grad.shape[1:]))
        dist.reduce_scatter_tensor(mine, padded, group=ctx.group)
        if ctx.scale != 1.0:
            mine = mine * ctx.scale
        return mine[: ctx.local_rows], None, None, None


def gather(p, scale: float) -> torch.Tensor:
    """The whole of sharded parameter ``p`` as a plain tensor whose gradient flows back to
    ``p`` (a DTensor gradient with ``p``'s placements) through a reduce-scatter."""
    return GatherShard.apply(p.to_local(), p.shape[0], p.device_mesh.get_group(), scale)
