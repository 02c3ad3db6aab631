"""Runtime collectives: what the autosp dialect's ops become in the emitted FX graph.

Each function takes a group *name* (``"sp"``) resolved through :func:`register_group`,
so emitted graphs hold no process-group objects. All functions are autograd-aware
(backed by ``torch.distributed._functional_collectives``) and are identities on a
group of one rank, which keeps ``sp_size=1`` an exact round trip.

This module is the bottom of the dependency graph: it imports nothing else of autosp.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_GROUPS: dict[str, object] = {}


def register_group(name: str, group) -> None:
    """Bind a group name used in the IR (``group = "sp"``) to a process group (or None: world)."""
    _GROUPS[name] = group


def group_size(name: str) -> int:
    """Ranks in group ``name`` (1 when torch.distributed is not initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(_GROUPS.get(name))


def group_rank(name: str) -> int:
    """This rank's index in group ``name`` (0 when torch.distributed is not initialised)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(_GROUPS.get(name))


def _group(name: str):
    g = _GROUPS.get(name)
    return g if g is not None else dist.group.WORLD


def all_to_all(x: torch.Tensor, split_dim: int, concat_dim: int, group: str) -> torch.Tensor:
    """Split ``x`` along ``split_dim`` into P chunks, exchange, concatenate along ``concat_dim``."""
    p = group_size(group)
    if p == 1:
        return x
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    split_dim %= x.dim()
    concat_dim %= x.dim()
    # Put the split dim first so the exchange is on contiguous chunks of dim 0.
    chunks = x.movedim(split_dim, 0).contiguous()
    if chunks.shape[0] % p:
        raise RuntimeError(f"autosp.all_to_all: dim {split_dim} of size {chunks.shape[0]} "
                           f"is not divisible by the group size {p}")
    out = all_to_all_single_autograd(chunks, None, None, _group(group))
    out = out.view(p, chunks.shape[0] // p, *chunks.shape[1:]).movedim(1, split_dim + 1)
    # out: [P, ...] with the received rank index first; fold it into concat_dim.
    out = out.movedim(0, concat_dim)
    shape = list(out.shape)
    shape[concat_dim:concat_dim + 2] = [shape[concat_dim] * shape[concat_dim + 1]]
    return out.reshape(shape)


def all_gather(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (ranks in group order)."""
    p = group_size(group)
    if p == 1:
        return x
    from torch.distributed._functional_collectives import all_gather_tensor_autograd
    return all_gather_tensor_autograd(x.contiguous(), dim % x.dim(), _group(group))


def all_reduce(x: torch.Tensor, reduce_op: str, group: str) -> torch.Tensor:
    """Reduce ``x`` over the group (``sum``/``max``/``min``); every rank gets the result."""
    if group_size(group) == 1:
        return x
    from torch.distributed._functional_collectives import all_reduce as _all_reduce
    if reduce_op != "sum" or not x.requires_grad:
        return _all_reduce(x, reduce_op, _group(group))
    return _AllReduceSum.apply(x, group)


class _AllReduceSum(torch.autograd.Function):
    """Sum over the group; the gradient of a sum is the sum of the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        from torch.distributed._functional_collectives import all_reduce as _all_reduce
        ctx.group = group
        return _all_reduce(x, "sum", _group(group))

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed._functional_collectives import all_reduce as _all_reduce
        return _all_reduce(grad.contiguous(), "sum", _group(ctx.group)), None


def reduce_scatter(x: torch.Tensor, dim: int, reduce_op: str, group: str) -> torch.Tensor:
    """Reduce over the group, keep this rank's chunk of ``dim``."""
    if group_size(group) == 1:
        return x
    from torch.distributed._functional_collectives import reduce_scatter_tensor_autograd
    return reduce_scatter_tensor_autograd(x.contiguous(), reduce_op, dim % x.dim(), _group(group))


def shard(x: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """This rank's contiguous chunk of ``x`` along ``dim`` (no communication)."""
    p = group_size(group)
    if p == 1:
        return x
    size = x.shape[dim]
    if size % p:
        raise RuntimeError(f"autosp.shard: dim {dim} of size {size} is not divisible by the group size {p}")
    return x.narrow(dim, group_rank(group) * (size // p), size // p)
