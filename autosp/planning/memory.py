"""Memory accounting for one training step: saved activations and peak live bytes.

Two exact counters that work on any device, meta included (so the memory model in
:mod:`autosp.planning.estimate` runs the same counters on tensors without data):

* :class:`SavedTensors`: bytes of tensors autograd saves for backward during a forward,
  via ``torch.autograd.graph.saved_tensors_hooks``, counted once per storage, with the
  storages of ``exclude`` (parameters, buffers, inputs) left out.
* :class:`PeakTracker`: a ``TorchDispatchMode`` that sees every op (forward and backward)
  and keeps the set of storages created under it that are still alive; ``peak_bytes`` is
  the largest total. Storages that existed before (parameters, inputs, optimizer state)
  are not counted; gradients and every temporary are.

Example::

    >>> report = measure_step(lambda: model(ids, labels=ids)["loss"], exclude=model.parameters())
    >>> report.saved_bytes, report.peak_bytes, report.retained_bytes

``retained_bytes`` (live bytes at the end of the forward, outputs excluded) is a second
view of what the forward keeps: it also sees tensors held outside autograd's saved-tensor
mechanism (e.g. by ``torch.utils.checkpoint`` with ``use_reentrant=False``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

MiB = 1 << 20
_RESIZE_STORAGE = torch.ops.inductor.resize_storage_bytes_.default


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class SavedTensors:
    """Context manager: ``bytes`` saved for backward inside it, once per storage.

    Tensors whose storage is one of ``exclude``'s (e.g. the parameters) are not counted.
    """

    def __init__(self, exclude=()):
        self.exclude = {_storage_key(t) for t in exclude}
        self.seen: set[int] = set()
        self.bytes = 0
        self.count = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self.seen and key not in self.exclude:
            self.seen.add(key)
            self.bytes += t.untyped_storage().nbytes()
            self.count += 1
        return t

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class PeakTracker(TorchDispatchMode):
    """Dispatch mode: live and peak bytes of the storages created while it is active."""

    def __init__(self, contents: bool = False):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        # contents=True: what made each live storage (op and shape), and the largest ones
        # live at the peak of the bytes not set aside (a diagnostic: it costs a sort per new peak).
        self.origin: dict[int, str] | None = {} if contents else None
        self.peak_contents: list[tuple[int, str]] = []
        self.peak_op = ""  # (contents=True) the op that set the peak
        self._ops = 0
        # Storages that existed before (inputs, parameters), by key, while they live: a key
        # whose storage was freed may be reused by a storage created here, which counts.
        self.external: dict[int, StorageWeakRef] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        self.set_aside: set[int] = set()  # live storages left out of peak_other_bytes
        self.set_aside_bytes = 0
        self.peak_other_bytes = 0  # peak of live bytes not set aside (e.g. without gradients)
        self._sweep_at = 1024  # sweep when this many storages are tracked (freed ones included)

    def set_aside_tensor(self, t: torch.Tensor) -> None:
        """Leave ``t``'s storage out of ``peak_other_bytes`` from now on (e.g. a gradient)."""
        key = _storage_key(t)
        if self._known(key) and key not in self.set_aside:
            self.set_aside.add(key)
            self.set_aside_bytes += self.live[key][1]

    def _drop(self, key: int) -> None:
        n = self.live.pop(key)[1]
        self.live_bytes -= n
        if key in self.set_aside:
            self.set_aside.discard(key)
            self.set_aside_bytes -= n

    def _sweep(self) -> None:
        for k in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self._drop(k)
        self._sweep_at = 2 * len(self.live) + 1024

    def _known(self, key: int) -> bool:
        """Is ``key`` a live storage created here? An entry whose storage was freed since
        the last sweep is dropped first (its address may now hold another storage)."""
        found = self.live.get(key)
        if found is not None and found[0].expired():
            self._drop(key)
            return False
        return found is not None

    def _is_external(self, key: int) -> bool:
        """Is ``key`` a live storage that existed before (not created here)? A freed one's
        entry is dropped: its address may now hold a storage created here."""
        found = self.external.get(key)
        if found is not None and found.expired():
            del self.external[key]
            return False
        return found is not None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._ops += 1
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if not self._known(key) and not self._is_external(key):
                    self.external[key] = StorageWeakRef(t.untyped_storage())
        if func is _RESIZE_STORAGE:  # a storage freed (or grown) in place, e.g. a released recomputed output
            key = _storage_key(args[0])
            out = func(*args, **kwargs)
            if self._known(key):
                ref, n = self.live[key]
                now = args[0].untyped_storage().nbytes()
                self.live[key] = (ref, now)
                self.live_bytes += now - n
                if key in self.set_aside:
                    self.set_aside_bytes += now - n
            return out
        out = func(*args, **kwargs)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if not self._known(key) and not self._is_external(key):
                    storage = t.untyped_storage()
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.live_bytes += storage.nbytes()
                    if self.origin is not None:
                        self.origin[key] = (f"#{self._ops} {func.__name__} {list(t.shape)} {t.dtype}"
                                            .replace("torch.", ""))
        # live_bytes counts freed storages until a sweep, so it bounds the live bytes from
        # above (and live - set aside bounds the rest): sweep only where that bound could
        # be a new peak (exact peaks; one sweep per op made long steps quadratic).
        if (self.live_bytes > self.peak_bytes or self.live_bytes - self.set_aside_bytes > self.peak_other_bytes
                or len(self.live) > self._sweep_at):
            self._sweep()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            if self.live_bytes - self.set_aside_bytes > self.peak_other_bytes:
                self.peak_other_bytes = self.live_bytes - self.set_aside_bytes
                if self.origin is not None:
                    self.peak_op = f"#{self._ops} {func.__name__}"
                    self.peak_contents = sorted(((n, self.origin.get(k, "?")) for k, (_, n) in self.live.items()
                                                 if k not in self.set_aside), reverse=True)
        return out

    def current(self) -> int:
        """Live bytes now (after dropping storages freed since the last op)."""
        self._sweep()
        return self.live_bytes


@dataclass
class MemoryReport:
    """One training step's memory, in bytes (see the module docstring)."""
    saved_bytes: int
    peak_bytes: int
    retained_bytes: int
    saved_tensors: int

    def mib(self) -> dict[str, float]:
        return {"saved": self.saved_bytes / MiB, "peak": self.peak_bytes / MiB,
                "retained": self.retained_bytes / MiB}


class AllocatorPeak:
    """Context manager: peak bytes allocated through PyTorch's allocator inside it, above
    what was allocated at its start (the profiler's memory events: sees every kernel,
    Inductor-generated code and collectives included; not for meta tensors)."""

    def __init__(self):
        self.peak_bytes = 0
        self.end_bytes = 0

    def __enter__(self) -> AllocatorPeak:
        from torch.profiler import ProfilerActivity, profile
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        events = [e for e in self._prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        total = peak = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            total += e.nbytes()
            peak = max(peak, total)
        self.peak_bytes, self.end_bytes = peak, total


def measure_step(forward, exclude=(), backward: bool = True) -> MemoryReport:
    """Run ``forward()`` (returning a scalar loss, or a tuple/dict whose first tensor is the
    loss) and then its backward, counting saved, retained and peak bytes.

    Real tensors are measured with :class:`AllocatorPeak` (forward and backward profiled
    separately: peak = max(forward peak, forward balance + backward peak), retained = the
    forward's balance minus its outputs); meta tensors with :class:`PeakTracker`.
    """
    exclude = list(exclude)
    on_meta = bool(exclude) and exclude[0].device.type == "meta"
    meter: PeakTracker | AllocatorPeak = PeakTracker() if on_meta else AllocatorPeak()
    with meter, SavedTensors(exclude) as saved:
        out = forward()
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    loss = leaves[0]
    out_bytes = sum({_storage_key(t): t.untyped_storage().nbytes() for t in leaves}.values())
    if isinstance(meter, PeakTracker):
        tracker = meter
        retained = tracker.current() - out_bytes
        if backward:
            with tracker:
                loss.backward()
        peak = tracker.peak_bytes
    else:
        fwd = meter
        retained = fwd.end_bytes - out_bytes
        peak = fwd.peak_bytes
        if backward:
            with AllocatorPeak() as bwd:
                loss.backward()
            peak = max(peak, fwd.end_bytes + bwd.peak_bytes)
    return MemoryReport(saved.bytes, peak, retained, saved.count)
