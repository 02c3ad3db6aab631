"""AdamW with its state in host memory (as ZeRO-Offload does).

Mixed-precision AdamW keeps, per parameter element, an fp32 master weight and two fp32
moments: 12 bytes, next to the 2-byte bf16 weight and its 2-byte gradient. For an 8B model
that is 90 GiB, more than an 80 GB GPU holds. :class:`HostAdamW` keeps all 12 bytes on the
host, so the device holds only the 16-bit parameters and their gradients.

Per parameter it keeps, on the CPU, an fp32 master copy (pinned when the parameter is on
CUDA), and runs :class:`torch.optim.AdamW` over the masters. :meth:`HostAdamW.step`:

1. copies each parameter's ``.grad`` to its master's ``.grad`` (device to host; on CUDA,
   non-blocking into pinned buffers in the gradient's own dtype, then one synchronize per
   device; the cast to fp32 happens on the host). Parameters without a ``.grad`` are
   skipped, exactly as AdamW skips them (their moments and step count stay as they are);
2. runs the inner AdamW step on the host;
3. copies each updated master back into its parameter, in place and cast to its dtype (on
   CUDA: cast on the host into the pinned buffer, non-blocking copy to the device on the
   current stream, so the next forward on that stream sees the values; an event is recorded
   and waited for before the host buffers are written again).

The masters are the weights: rounding to bf16 happens only on the way to the device, so
updates smaller than bf16's resolution accumulate instead of being lost.

FSDP2 parameters (DTensors) are handled through their local shards: the master mirrors
``p.to_local()``, the gradient taken is ``p.grad.to_local()``; nothing is gathered.

The inner AdamW defaults to its fused CPU kernel (far faster on the host than the foreach
or for-loop implementations); pass ``foreach=`` or ``fused=False`` to choose another.
``param_groups`` are the inner optimizer's (their ``"params"`` are the masters), so
``for g in opt.param_groups: g["lr"] = ...`` works; an LR scheduler, which insists on a
``torch.optim.Optimizer``, is given ``opt.inner``.

Example::

    >>> model = build().to("cuda", torch.bfloat16)
    >>> opt = HostAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)   # masters pinned
    >>> sched = torch.optim.lr_scheduler.LambdaLR(opt.inner, warmup)
    >>> loss = model(x).sum(); loss.backward()
    >>> opt.step(); opt.zero_grad(); sched.step()
    >>> opt.host_bytes          # 12 bytes per element once every parameter has a step
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch without DTensor: no parameter is sharded
    DTensor = ()  # type: ignore[assignment,misc]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s data here: an FSDP2 DTensor's local shard (a view of
    it, so writing it writes the parameter), else ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


class _Slot:
    """One parameter and its host buffers."""

    __slots__ = ("param", "master", "pin", "grad", "stage")

    def __init__(self, param: torch.Tensor, pin: bool | None):
        local = _local(param).detach()
        if not local.is_floating_point():
            raise ValueError(f"HostAdamW optimizes floating-point parameters only, got {local.dtype}")
        self.param = param
        self.pin = local.device.type == "cuda" if pin is None else pin
        self.master = torch.empty(local.shape, dtype=torch.float32, pin_memory=self.pin)
        self.master.copy_(local)
        self.grad: torch.Tensor | None = None   # fp32 host gradient, allocated at the first step
        self.stage: torch.Tensor | None = None  # pinned buffer in the parameter's dtype (non-fp32 on CUDA)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fp32 gradient buffer and the staging buffer, allocated on first use."""
        if self.grad is None:
            staged = self.pin and self.master.dtype != _local(self.param).dtype
            self.grad = torch.empty(self.master.shape, dtype=torch.float32, pin_memory=self.pin and not staged)
            if staged:
                self.stage = torch.empty(self.master.shape, dtype=_local(self.param).dtype, pin_memory=True)
        return self.grad, self.stage


class HostAdamW:
    """AdamW over fp32 host copies of the parameters (see the module docstring). Accepts
    what ``torch.optim.AdamW`` accepts as ``params``: tensors, or dicts with ``"params"``
    and per-group options. ``pin_memory``: pin the host masters and buffers; None pins
    those of CUDA parameters. ``**adamw_kwargs`` go to the inner ``torch.optim.AdamW``
    (``amsgrad``, ``maximize``, ``foreach``, ``fused``; ``fused`` defaults to True unless
    ``foreach`` is given).

    Example::

        >>> opt = HostAdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
        >>> loss.backward(); opt.step(); opt.zero_grad()
        >>> torch.save(opt.state_dict(), "opt.pt")       # masters + moments, all on the host
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, pin_memory: bool | None = None,
                 **adamw_kwargs: Any):
        if isinstance(params, torch.Tensor):
            raise TypeError("HostAdamW: params should be an iterable of Tensors or dicts, got a Tensor")
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._slots: list[_Slot] = []
        seen: set[int] = set()
        inner_groups = []
        for group in groups:
            ps = group["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            slots = []
            for p in ps:
                if id(p) in seen:
                    raise ValueError("HostAdamW: a parameter appears more than once")
                seen.add(id(p))
                slots.append(_Slot(p, pin_memory))
            self._slots += slots
            inner_groups.append({**group, "params": [s.master for s in slots]})
        if "foreach" not in adamw_kwargs:
            adamw_kwargs.setdefault("fused", True)
        self.inner = torch.optim.AdamW(inner_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                       **adamw_kwargs)
        self._pending: list[Any] = []  # CUDA events: copies from host buffers still in flight

    # ------------------------------------------------------------------ public API
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner AdamW's param groups (``"params"``: the host masters); edit ``"lr"`` etc. here."""
        return self.inner.param_groups

    @property
    def host_bytes(self) -> int:
        """Bytes of optimizer state on the host: the fp32 masters and AdamW's moments (not
        the scalar step counts, nor the gradient buffers: see :attr:`buffer_bytes`)."""
        total = sum(s.master.numel() * s.master.element_size() for s in self._slots)
        for state in self.inner.state.values():
            total += sum(v.numel() * v.element_size() for k, v in state.items()
                         if k != "step" and isinstance(v, torch.Tensor))
        return total

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host gradient buffers (fp32, plus the pinned staging buffers of
        non-fp32 CUDA parameters), allocated at a parameter's first step with a gradient."""
        return sum(b.numel() * b.element_size() for s in self._slots for b in (s.grad, s.stage) if b is not None)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One AdamW step of every parameter that has a ``.grad``; returns ``closure()``'s
        loss (run, with grad enabled, before the gradients are taken), or None."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._wait()  # host buffers may still feed the last copy-back
        live, devices = [], set()
        for s in self._slots:
            g = s.param.grad
            if g is None:
                s.master.grad = None
                continue
            g = _local(g)
            grad, stage = s.buffers()
            dst = stage if stage is not None and stage.dtype == g.dtype else grad
            dst.copy_(g, non_blocking=s.pin)
            if s.pin and g.device.type == "cuda":
                devices.add(g.device)
            live.append((s, dst))
        for d in devices:  # one synchronize per device, for all the copies to host
            torch.cuda.current_stream(d).synchronize()
        for s, dst in live:
            if dst is not s.grad:
                s.grad.copy_(dst)  # type: ignore[union-attr]  # cast to fp32 on the host
            s.master.grad = s.grad
        self.inner.step()
        self._copy_back([s for s, _ in live])
        for s, _ in live:
            s.master.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients (as ``torch.optim.Optimizer.zero_grad``)."""
        for s in self._slots:
            p = s.param
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """``{"optimizer": the inner AdamW's state_dict, "masters": the fp32 masters}``
        (references, as torch optimizers give them; the masters are the weights to resume
        from, the 16-bit parameters are only their rounding)."""
        return {"optimizer": self.inner.state_dict(), "masters": [s.master for s in self._slots]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`: the inner AdamW's state and the masters, which are
        then copied into the parameters (so they match the masters whatever they held)."""
        masters = state_dict["masters"]
        if len(masters) != len(self._slots):
            raise ValueError(f"HostAdamW.load_state_dict: {len(masters)} masters for {len(self._slots)} parameters")
        self._wait()
        self.inner.load_state_dict(state_dict["optimizer"])
        with torch.no_grad():
            for s, m in zip(self._slots, masters):
                s.master.copy_(m)
        self._copy_back(self._slots)

    # ------------------------------------------------------------------ internals
    @torch.no_grad()
    def _copy_back(self, slots: list[_Slot]) -> None:
        """Write the masters of ``slots`` into their parameters (cast, in place)."""
        devices = set()
        for s in slots:
            local = _local(s.param)
            if isinstance(local, torch.nn.Parameter):
                local = local.data
            src = s.master
            if s.stage is not None:
                s.stage.copy_(s.master)  # cast on the host: half the bytes to move
                src = s.stage
            local.copy_(src, non_blocking=s.pin)
            if s.pin and local.device.type == "cuda":
                devices.add(local.device)
        for d in devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(d))
            self._pending.append(event)

    def _wait(self) -> None:
        """Wait for the copies from host buffers still in flight (before writing them)."""
        for event in self._pending:
            event.synchronize()
        self._pending.clear()
