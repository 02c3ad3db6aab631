"""Data for sequence-parallel training: shard by data-parallel replica, keep SP groups together.

Every rank of a sequence-parallel (SP) group must feed the compiled model the **same** full
batch (docs/DESIGN.md §2); only the data-parallel (DP) replicas see different data. A
``torch.utils.data.DistributedSampler`` built the usual way shards over every rank of the
world, so the ranks of one SP group would get different samples: autosp's input check then
stops the job (or, with the check off, the answer is wrong). The helpers here shard over
the replicas instead. The world is laid out as autosp lays it out (``autosp.compile`` with a
world larger than ``sp_size``): consecutive ranks form one SP group, so rank ``r`` belongs to
replica ``r // sp_size``.

Example::

    sp = autosp.compile(model, sp_size=2)                      # under torchrun, 4 ranks: DP 2 x SP 2
    sampler = autosp.data.DistributedSampler(dataset, sp_size=2, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:                                   # the same batch on ranks 0, 1; another on 2, 3
            sp(**batch)["loss"].backward()
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data

from autosp.ir.diagnostics import AutospError

__all__ = ["DistributedSampler", "data_parallel_rank", "loader_for", "sampler_for"]


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def data_parallel_rank(sp_size: int | None = None) -> tuple[int, int]:
    """``(replica, replicas)``: this rank's data-parallel replica and how many there are, for
    SP groups of ``sp_size`` consecutive ranks (default: the whole world is one group). One
    process without torch.distributed is replica 0 of 1.

    Example::

        >>> autosp.data.data_parallel_rank(sp_size=2)   # on rank 3 of 4
        (1, 2)
    """
    world, rank = _world()
    sp_size = world if sp_size is None else sp_size
    if not isinstance(sp_size, int) or sp_size < 1:
        raise AutospError(f"sp_size must be a positive int, got {sp_size!r}")
    if world % sp_size:
        raise AutospError(f"sp_size={sp_size} does not divide the number of ranks ({world}): every rank must belong "
                          "to one sequence-parallel group")
    return rank // sp_size, world // sp_size


class DistributedSampler(torch.utils.data.DistributedSampler):
    """``torch.utils.data.DistributedSampler`` over data-parallel replicas, not ranks: every rank
    of one SP group gets the same indices, in the same order; replicas get disjoint shards.

    ``sp_size``: the ranks per SP group (default: the world, i.e. one group: every rank gets
    every index of the epoch). The other arguments are ``DistributedSampler``'s; ``num_replicas``
    and ``rank`` are worked out from ``sp_size`` (pass them only to override it). Call
    ``set_epoch(epoch)`` at each epoch when shuffling, as with PyTorch's sampler.

    Example::

        >>> sampler = autosp.data.DistributedSampler(dataset, sp_size=2, shuffle=True, seed=0)
        >>> loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    """

    def __init__(self, dataset, sp_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_replicas: int | None = None, rank: int | None = None):
        replica, replicas = data_parallel_rank(sp_size)
        self.sp_size = _world()[0] // replicas
        super().__init__(dataset, num_replicas=replicas if num_replicas is None else num_replicas,
                         rank=replica if rank is None else rank, shuffle=shuffle, seed=seed, drop_last=drop_last)


def _sp_size_of(sp_module: Any) -> int:
    size = getattr(sp_module, "sp_size", None)
    if not isinstance(size, int):
        raise AutospError(f"sampler_for/loader_for expects the module autosp.compile returned, got "
                          f"{type(sp_module).__name__}")
    if getattr(sp_module, "group", None) is not None:
        raise AutospError("sampler_for: this module was compiled on an explicit process group; build the sampler "
                          "with autosp.data.DistributedSampler(dataset, num_replicas=..., rank=...) for that layout")
    return size


def sampler_for(sp_module: Any, dataset, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False) -> DistributedSampler:
    """The :class:`DistributedSampler` that matches a compiled module's SP groups.

    Example::

        >>> sp = autosp.compile(model, sp_size=2)
        >>> sampler = autosp.data.sampler_for(sp, dataset, seed=0)
    """
    return DistributedSampler(dataset, sp_size=_sp_size_of(sp_module), shuffle=shuffle, seed=seed,
                              drop_last=drop_last)


def loader_for(sp_module: Any, dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
               drop_last: bool = False, **loader_kwargs) -> torch.utils.data.DataLoader:
    """A ``DataLoader`` of ``batch_size`` samples per replica, sampled by :func:`sampler_for`
    (the global batch is ``batch_size`` times the number of replicas). ``loader_kwargs`` go to
    ``DataLoader`` (``collate_fn``, ``num_workers``, ...). Call ``loader.sampler.set_epoch(e)``
    at each epoch when shuffling.

    Example::

        >>> loader = autosp.data.loader_for(sp, dataset, batch_size=4, collate_fn=collate)
        >>> for epoch in range(2):
        ...     loader.sampler.set_epoch(epoch)
        ...     for batch in loader:
        ...         sp(**batch)["loss"].backward()
    """
    if "sampler" in loader_kwargs or "batch_sampler" in loader_kwargs:
        raise AutospError("loader_for chooses the sampler; build the DataLoader yourself to pass another one")
    sampler = sampler_for(sp_module, dataset, shuffle=shuffle, seed=seed, drop_last=drop_last)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                                       **loader_kwargs)
