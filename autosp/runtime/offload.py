"""Offloading of checkpointed tensors to host memory (as ALST does).

With checkpointing (:mod:`autosp.backend.checkpointing`) a segment keeps only its inputs
for backward, through ``ctx.save_for_backward``. An :class:`Offloader` installed around
that save (``saved_tensors_hooks``) moves each kept input to host memory in forward and
brings it back when backward unpacks it, so between forward and backward the device holds
none of them.

Which tensors: floating-point tensors of at least ``min_bytes`` that are neither a
parameter nor a view of one (``t._base``); plain ``torch.Tensor`` only (subclasses such as
DTensor stay as they are). Everything else stays where it is, handed to the hooks that were
active when :meth:`Offloader.hooks` was entered, if any (e.g.
:class:`autosp.planning.memory.SavedTensors`).

How, chosen per tensor by its device (``mode="auto"``) or forced:

* ``"cuda"``: the tensor is copied into a pinned host buffer on a side stream (one per
  device) that first waits for the current stream; ``record_stream`` keeps its device
  memory from being reused before the copy is done, and autograd releases it as usual.
  Backward unpacks in reverse order of packing, so unpacking one tensor starts copying the
  one packed before it back to the device (prefetch, one ahead, on the side stream); the
  current stream waits for a copy's event before it uses the copy. Pinned buffers are
  reused (per device, element count and dtype) once their handle is dropped.
* ``"cpu"``: the data stays (the handle holds the tensor itself), but the bytes are counted
  as if offloaded, so the mechanism runs, and is tested, without an accelerator.
* ``"simulate"`` (meta tensors, for the memory model): the handle keeps only shape, stride
  and dtype; unpacking allocates a fresh meta tensor (``torch.empty_strided``), so
  :class:`autosp.planning.memory.PeakTracker` sees the device memory freed between forward and
  backward and allocated again when backward brings the tensor back.
* ``"off"``: nothing is offloaded (:meth:`Offloader.hooks` installs no hooks).

A tensor comes back with its shape, dtype and, when it covers its memory densely (any
contiguous or permuted layout), its stride; views with gaps or overlaps come back dense,
dimensions in the same order. The same tensor saved twice while alive (same storage,
offset, shape, stride, dtype) is offloaded once and the handle is shared.

Statistics (bytes are ``numel * element_size``): ``offloaded_bytes`` and ``count`` (moved
to host since :meth:`Offloader.reset_stats`), ``host_bytes`` (held on host now, by handles
autograd still keeps) and ``peak_host_bytes``.

Example::

    >>> offloader = Offloader()                      # auto: by each tensor's device
    >>> with offloader.hooks():
    ...     y = _RecomputeFunction.apply(segment, False, x)   # x goes to host
    >>> loss = y.sum(); loss.backward()              # x comes back (prefetched on CUDA)
    >>> offloader.offloaded_bytes, offloader.peak_host_bytes
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

MODES = ("auto", "cuda", "cpu", "simulate", "off")
_BY_DEVICE = {"cuda": "cuda", "cpu": "cpu", "meta": "simulate"}


def _restored_stride(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """The stride ``torch.empty_like`` would give: ``stride`` itself when a tensor of
    ``shape`` with it is non-overlapping and dense, else dense strides with the dimensions
    in the same order (c10's ``infer_dense_strides``). Pure arithmetic: no tensor is made
    (a PeakTracker would count it)."""
    big = sorted((d for d in range(len(shape)) if shape[d] >= 2), key=lambda d: stride[d])
    expected = 1
    for d in big:
        if stride[d] != expected:
            break
        expected *= shape[d]
    else:
        return tuple(stride)
    perm = list(range(len(shape) - 1, -1, -1))  # innermost first; stable insertion sort
    for i in range(1, len(perm)):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            a, b = perm[d0], perm[d1]
            if stride[a] == 0 or stride[b] == 0:
                continue  # a zero stride keeps its place
            if stride[a] < stride[b]:
                break
            if stride[a] > stride[b] or shape[a] > shape[b]:
                perm[d0], perm[d1] = b, a
                d1 = d0
    out = [0] * len(shape)
    step = 1
    for d in perm:
        out[d] = step
        step *= max(shape[d], 1)
    return tuple(out)


class _CudaTransport:
    """Copies between CUDA devices and pinned host memory, on one side stream per device."""

    def __init__(self) -> None:
        self.streams: dict[torch.device, Any] = {}

    def check(self, t: torch.Tensor) -> None:
        if t.device.type != "cuda":
            raise ValueError(f"Offloader(mode='cuda') offloads CUDA tensors only, got one on {t.device}")

    def side(self, device: torch.device) -> Any:
        stream = self.streams.get(device)
        if stream is None:
            stream = self.streams[device] = torch.cuda.Stream(device=device)
        return stream

    def alloc_host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, pin_memory=True)

    def to_host(self, t: torch.Tensor, host: torch.Tensor) -> Any:
        """Start copying ``t`` into ``host`` (1-D, ``t.numel()`` elements); its done-event."""
        side = self.side(t.device)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(t.device))
        side.wait_event(ready)  # the copy starts after whatever produced t
        with torch.cuda.stream(side):
            host.view(t.shape).copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        t.record_stream(side)  # t's memory is not reused before the copy is done
        return done

    def to_device(self, h: _Handle) -> tuple[torch.Tensor, Any]:
        """Start copying ``h``'s host buffer back; the device tensor and its done-event."""
        side = self.side(h.device)
        side.wait_event(h.event)  # in stream order anyway (same side stream); explicit
        assert h.data is not None
        with torch.cuda.stream(side):
            out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
            out.copy_(h.data.view(h.shape), non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        return out, done

    def hand_over(self, out: torch.Tensor, event: Any) -> None:
        """Make the current stream wait for ``out``'s copy, and own its memory from now on."""
        current = torch.cuda.current_stream(out.device)
        current.wait_event(event)
        out.record_stream(current)  # out was allocated on the side stream


class _Handle:
    """What autograd keeps instead of an offloaded tensor."""

    __slots__ = ("owner", "kind", "key", "index", "nbytes", "device", "dtype", "shape", "stride",
                 "data", "event", "prefetched", "prefetch_event", "shares", "served", "cached", "__weakref__")
    owner: Offloader  # set by Offloader.pack once the handle is counted

    def __init__(self, kind: str, t: torch.Tensor, key: tuple, index: int):
        self.kind = kind  # "cuda", "cpu" or "simulate"
        self.key = key
        self.index = index  # order of packing
        self.nbytes = t.numel() * t.element_size()
        self.device, self.dtype = t.device, t.dtype
        self.shape = tuple(t.shape)
        self.stride = _restored_stride(self.shape, tuple(t.stride()))
        self.data: torch.Tensor | None = None  # cuda: pinned buffer; cpu: the tensor; simulate: None
        self.event: Any = None  # cuda: the copy to host is done
        self.prefetched: torch.Tensor | None = None
        self.prefetch_event: Any = None
        self.shares = 1  # packs sharing this handle (the same tensor saved again)
        self.served = 0  # unpacks so far
        self.cached: torch.Tensor | None = None  # unpacked copy, kept while other shares are pending

    def __del__(self) -> None:
        owner = getattr(self, "owner", None)  # set once the handle is counted
        if owner is not None:
            try:
                owner._release(self)
            except Exception:  # interpreter shutdown: nothing left to account for
                pass


class Offloader:
    """Offloads the tensors saved for backward inside :meth:`hooks` (see the module
    docstring). One instance can serve many steps; statistics accumulate until
    :meth:`reset_stats`.

    Example::

        >>> off = Offloader(min_bytes=1 << 20)
        >>> with off.hooks():
        ...     y = Recompute(block)(x)
        >>> y.sum().backward(); off.offloaded_bytes
    """

    def __init__(self, mode: str = "auto", min_bytes: int = 1 << 20):
        if mode not in MODES:
            raise ValueError(f"Offloader mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
        self.mode = mode
        self.min_bytes = min_bytes
        self.offloaded_bytes = 0
        self.host_bytes = 0
        self.peak_host_bytes = 0
        self.count = 0
        self._lock = threading.RLock()  # backward may unpack (and drop handles) on another thread
        self._transport = _CudaTransport()
        self._shared: dict[tuple, tuple[weakref.ref, StorageWeakRef]] = {}  # key -> (handle, storage)
        self._order: list[weakref.ref] = []  # handles in order of packing (cleared when none is alive)
        self._alive = 0
        self._pool: dict[tuple, list[torch.Tensor]] = {}  # (device, numel, dtype) -> pinned buffers
        self._pool_bytes = 0
        self._most_held = 0  # the pool never holds more than this

    # ------------------------------------------------------------------ public API
    def hooks(self, only=None) -> contextlib.AbstractContextManager:
        """Context manager: tensors saved for backward inside it are offloaded (``pack`` /
        ``unpack`` as ``saved_tensors_hooks``). Those not offloaded go to the hooks active
        when it is entered, if any. With ``mode="off"``: no hooks at all. ``only``: the
        tensors that may be offloaded (by storage; e.g. a segment's activations, not the
        unsharded weights it also keeps), None for all."""
        if self.mode == "off":
            return contextlib.nullcontext()
        return self._hooks(None if only is None else {t.untyped_storage()._cdata for t in only})

    @contextlib.contextmanager
    def _hooks(self, only: set | None) -> Iterator[None]:
        previous, self._only = getattr(self, "_only", None), only
        try:
            yield from self._installed()
        finally:
            self._only = previous  # the filter holds inside this context only

    def _installed(self) -> Iterator[None]:
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if outer is None:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
            return
        outer_pack, outer_unpack = outer

        def pack(t: torch.Tensor) -> Any:
            h = self.pack(t)
            return h if isinstance(h, _Handle) else _Outer(outer_pack(t))

        def unpack(x: Any) -> torch.Tensor:
            return outer_unpack(x.value) if isinstance(x, _Outer) else self.unpack(x)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def pack(self, t: torch.Tensor) -> Any:
        """A handle for ``t`` (offloaded), or ``t`` itself when it is not offloaded."""
        kind = self._kind(t)
        if kind is None:
            return t
        storage = t.untyped_storage()
        key = (storage._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        with self._lock:
            entry = self._shared.get(key)
            if entry is not None:
                shared = entry[0]()
                # A dead storage never matches: a new tensor may sit at its address.
                if shared is not None and not entry[1].expired():
                    shared.shares += 1
                    return shared
            if self._alive == 0:
                self._order.clear()
            h = _Handle(kind, t, key, len(self._order))
            if kind == "cuda":
                h.data = self._take_buffer(t.device, t.numel(), t.dtype)
                h.event = self._transport.to_host(t, h.data)
            elif kind == "cpu":
                h.data = t
            self._order.append(weakref.ref(h))
            self._shared[key] = (weakref.ref(h), StorageWeakRef(storage))
            self._alive += 1
            self.count += 1
            self.offloaded_bytes += h.nbytes
            self.host_bytes += h.nbytes
            self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
            self._most_held = max(self._most_held, self.host_bytes)
            h.owner = self  # from now on, dropping h uncounts it
        return h

    def unpack(self, handle: Any) -> torch.Tensor:
        """The tensor ``handle`` stands for (on its device again); a tensor: itself."""
        if not isinstance(handle, _Handle):
            return handle
        h = handle
        with self._lock:
            out = h.cached
            event = None
            if out is None:
                if h.kind == "cpu":
                    assert h.data is not None
                    out = h.data
                elif h.kind == "simulate":
                    out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
                elif h.prefetched is not None:
                    out, event = h.prefetched, h.prefetch_event
                    h.prefetched = h.prefetch_event = None
                else:
                    out, event = self._transport.to_device(h)
            h.served += 1
            h.cached = out if h.served % h.shares else None
            if h.kind == "cuda":
                before = self._previous_pending(h)
                if before is not None:
                    before.prefetched, before.prefetch_event = self._transport.to_device(before)
        if event is not None:
            self._transport.hand_over(out, event)
        return out

    def reset_stats(self) -> None:
        """Start counting a new step (``host_bytes``, what is held now, stays)."""
        with self._lock:
            self.offloaded_bytes = 0
            self.count = 0
            self.peak_host_bytes = self.host_bytes

    def clear_pool(self) -> None:
        """Free the pinned host buffers kept for reuse."""
        with self._lock:
            self._pool.clear()
            self._pool_bytes = 0

    # ------------------------------------------------------------------ internals
    def _kind(self, t: torch.Tensor) -> str | None:
        """How ``t`` is offloaded, or None when it is not."""
        if self.mode == "off" or type(t) is not torch.Tensor or isinstance(t._base, torch.nn.Parameter):
            return None  # nn.Parameter is a subclass, so parameters are left out here too
        only = getattr(self, "_only", None)
        if only is not None and t.untyped_storage()._cdata not in only:
            return None
        if not t.is_floating_point() or t.numel() * t.element_size() < self.min_bytes:
            return None
        if self.mode == "auto":
            return _BY_DEVICE.get(t.device.type)
        if self.mode == "simulate" and t.device.type != "meta":
            raise ValueError(f"Offloader(mode='simulate') offloads meta tensors only, got one on {t.device}")
        if self.mode == "cuda":
            self._transport.check(t)
        return self.mode

    def _previous_pending(self, h: _Handle) -> _Handle | None:
        """The latest handle packed before ``h`` that backward has not unpacked yet, if it
        is to be copied back (a CUDA one, not prefetched yet)."""
        for i in range(h.index - 1, -1, -1):
            before = self._order[i]()
            if before is None or before.served:
                continue
            return before if before.kind == "cuda" and before.prefetched is None else None
        return None

    def _take_buffer(self, device: torch.device, numel: int, dtype: torch.dtype) -> torch.Tensor:
        free = self._pool.get((device, numel, dtype))
        if free:
            buf = free.pop()
            self._pool_bytes -= buf.numel() * buf.element_size()
            return buf
        return self._transport.alloc_host(numel, dtype)

    def _release(self, h: _Handle) -> None:
        """``h`` was dropped (autograd freed what it saved): uncount it, keep its buffer."""
        with self._lock:
            self._alive -= 1
            self.host_bytes -= h.nbytes
            entry = self._shared.get(h.key)
            if entry is not None and entry[0]() in (None, h):  # (__del__ may run before weakrefs clear)
                del self._shared[h.key]
            if h.kind == "cuda" and h.data is not None and self._pool_bytes + h.nbytes <= self._most_held:
                self._pool.setdefault((h.device, h.data.numel(), h.dtype), []).append(h.data)
                self._pool_bytes += h.nbytes


class _Outer:
    """A tensor packed by the hooks that were active outside :meth:`Offloader.hooks`."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value
