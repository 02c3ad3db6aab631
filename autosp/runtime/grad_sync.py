"""Gradient synchronisation across the sequence-parallel group, bucketed.

Each rank back-propagates its own share of the loss (see ``collectives``), so a
parameter's full gradient is the sum of the ranks' gradients. After the backward pass
(DDP's trick: a callback queued on the autograd engine from the first gradient hook),
gradients are flattened into buckets of ``bucket_bytes`` and summed with one all-reduce
per bucket, not one per parameter.

Example::

    sync = GradientSync(model.parameters(), group="sp")   # hooks stay until sync.remove()
    loss.backward()                                       # .grad is the global gradient here
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autosp.runtime.collectives import _group, group_size


class GradientSync:
    def __init__(self, params, group: str = "sp", bucket_bytes: int = 25 << 20, scale: float = 1.0):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.scale = scale  # e.g. 1/dp: sum over sequence ranks, average over data-parallel replicas
        self.bucket_bytes = bucket_bytes
        self._queued = False
        self.enabled = True
        self.collectives_last_step = 0
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def _on_grad(self, _param) -> None:
        if self.enabled and not self._queued and group_size(self.group) > 1:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._defer)

    def _defer(self) -> None:
        # Queue again, so the sum runs after every callback queued in this backward, e.g.
        # DDP's, which writes its data-parallel average into .grad when it finishes. The
        # two reductions are linear, so only their writes' order matters.
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _finish(self) -> None:
        self._queued = False
        self.synchronize()

    def synchronize(self) -> None:
        """Sum every parameter's gradient over the group (missing gradients count as zero)."""
        count = 0
        bucket: list[torch.Tensor] = []
        size = 0
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= self.bucket_bytes:
                self._reduce(bucket)
                count += 1
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)
            count += 1
        self.collectives_last_step = count

    def _reduce(self, params) -> None:
        by_dtype: dict = {}
        for p in params:
            by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group_params in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group_params])
            dist.all_reduce(flat, group=_group(self.group))
            if self.scale != 1.0:
                flat.mul_(self.scale)
            offset = 0
            for p in group_params:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
