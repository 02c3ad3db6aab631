"""Offloading of checkpointed tensors (autosp.runtime.offload).

* ``cpu`` mode (the data stays, the bytes are counted): gradients of a chain of
  checkpointed blocks (autosp's ``Recompute``, parameters passed in) equal the run without
  hooks; exactly the block inputs are counted; parameters, views of them,
  small and integer tensors are left alone (and go to the outer hooks); a tensor saved
  twice is offloaded once.
* ``simulate`` mode on meta: ``PeakTracker`` sees the peak drop by at least k-1 block
  inputs; unpacked tensors have the saved shape, stride and dtype.
* the ``cuda`` mode's bookkeeping (copies, one-ahead prefetch in backward order, pinned
  buffer reuse) runs on CPU through a host-to-host transport; the real CUDA path is tested
  where CUDA is available.
* ``off`` changes nothing; a bad mode is refused; an unpack returning wrong data makes the
  gradients differ (the comparison can fail).
"""
import contextlib

import pytest
import torch

from autosp.backend.checkpointing import Recompute
from autosp.planning.memory import PeakTracker, SavedTensors
from autosp.runtime.offload import MODES, Offloader, _CudaTransport, _Handle, _restored_stride

N, H, K = 32, 64, 3  # rows, width, blocks: a block input is N*H*4 = 8 KiB
BLOCK_BYTES = N * H * 4
MIN = 4096


class _Block(torch.nn.Module):
    """tanh(x @ w.t() + b), the parameters passed in (as autosp's segments get them)."""

    def forward(self, x, w, b):
        return torch.tanh(x @ w.t() + b)


def _model(k=K, device="cpu"):
    return torch.nn.ModuleList(torch.nn.Linear(H, H, device=device) for _ in range(k))


def _forward(model, x, offloader=None):
    """The blocks, each a checkpoint segment that keeps its inputs (parameters included)."""
    y = x * 1.0  # block inputs are all non-leaf activations
    for linear in model:
        with offloader.hooks() if offloader is not None else contextlib.nullcontext():
            y = Recompute(_Block())(y, linear.weight, linear.bias)
    return y


def _step(model, x, offloader=None):
    """Forward and backward; the gradients of x and the parameters."""
    model.zero_grad()
    x = x.detach().requires_grad_()
    _forward(model, x, offloader).square().sum().backward()
    return [x.grad] + [p.grad.clone() for p in model.parameters()]


def _assert_same(a, b):
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def test_cpu_mode_same_grads_counts_block_inputs():
    model, x = _model(), torch.randn(N, H)
    reference = _step(model, x)
    off = Offloader(min_bytes=MIN)
    _assert_same(_step(model, x, off), reference)
    assert off.count == K and off.offloaded_bytes == K * BLOCK_BYTES == off.peak_host_bytes
    assert off.host_bytes == 0  # autograd dropped the handles after backward
    off.reset_stats()
    assert (off.count, off.offloaded_bytes, off.peak_host_bytes) == (0, 0, 0)
    _assert_same(_step(model, x, off), reference)  # a second step
    assert off.count == K and off.peak_host_bytes == K * BLOCK_BYTES


class _Saves(torch.autograd.Function):
    """out = x @ w.t() + small.sum() (+ idx, unused); saves x (twice), w, w.t(), small, idx."""

    @staticmethod
    def forward(ctx, x, w, small, idx):
        ctx.save_for_backward(x, w, w.t(), small, idx, x)
        return x @ w.t() + small.sum()

    @staticmethod
    def backward(ctx, g):
        x, w, wt, small, idx, x2 = ctx.saved_tensors
        assert x2 is x or torch.equal(x2, x)
        assert idx.dtype == torch.int64 and small.shape == (4,)
        return g @ wt.t(), g.t() @ x, g.sum().expand(4).clone(), None


def _saves_step(offloader=None, outer=None):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(H, H))  # 16 KiB: over min_bytes, never offloaded
    x = (torch.randn(N, H) * 1.0).requires_grad_()
    small = torch.randn(4, requires_grad=True)  # under min_bytes
    idx = torch.arange(N * H)  # integer, 16 KiB
    with outer or contextlib.nullcontext(), offloader.hooks() if offloader else contextlib.nullcontext():
        out = _Saves.apply(x, w, small, idx)
    out.square().sum().backward()
    return [x.grad, w.grad, small.grad]


def test_filters_and_dedup():
    reference = _saves_step()
    off = Offloader(min_bytes=MIN)
    _assert_same(_saves_step(off), reference)
    assert off.count == 1 and off.offloaded_bytes == N * H * 4  # x only, once
    w = torch.nn.Parameter(torch.randn(H, H))
    for t in (w, w.t(), w[1:], torch.randn(4), torch.arange(N * H), torch.randn(N, H).to(torch.int32)):
        assert off.pack(t) is t  # a parameter, views of it, small, integer: unchanged
    assert off.unpack(w) is w


def test_dedup_same_storage_only():
    off = Offloader(mode="simulate", min_bytes=MIN)
    x = torch.empty(N, H, device="meta")
    h1, h2, ht = off.pack(x), off.pack(x), off.pack(x.t())
    assert h1 is h2 and ht is not h1 and off.count == 2
    del x
    y = torch.empty(N, H, device="meta")  # a new storage: never the dead one's handle
    hy = off.pack(y)
    assert hy is not h1 and off.count == 3 and off.host_bytes == 3 * N * H * 4
    del h1, h2, ht
    assert off.host_bytes == N * H * 4 and off.unpack(hy).shape == y.shape


def test_outer_hooks_get_what_is_not_offloaded():
    reference = _saves_step()
    off = Offloader(min_bytes=MIN)
    counter = SavedTensors()
    _assert_same(_saves_step(off, outer=counter), reference)
    # The outer counter sees w, w.t() (same storage), small and idx; x went to the offloader.
    assert counter.count == 3 and off.count == 1
    assert counter.bytes == H * H * 4 + 4 * 4 + N * H * 8


def test_simulate_on_meta_lowers_peak():
    n, h, k = 4096, 64, 6  # block input: 1 MiB; a weight: 16 KiB
    block = n * h * 4

    def peak(offloader):
        model = torch.nn.ModuleList(torch.nn.Linear(h, h, device="meta") for _ in range(k))
        x = torch.empty(n, h, device="meta", requires_grad=True)
        tracker = PeakTracker()
        with tracker:
            y = _forward(model, x, offloader)  # x * 1.0: the first block input is counted too
            loss = y.square().sum()
            del y
            retained = tracker.current()
            loss.backward()
        return tracker.peak_bytes, retained

    plain, plain_retained = peak(None)
    off = Offloader(min_bytes=1 << 20)
    offloaded, retained = peak(off)
    assert off.count == k and off.offloaded_bytes == k * block and off.host_bytes == 0
    assert plain_retained - retained == k * block  # nothing kept on the device after forward
    # Backward needs one block input back at a time: the others stay on the host. (The
    # offloaded run peaks later in backward, with up to all parameter gradients made.)
    grads = k * (h * h + h) * 4
    assert (k - 1) * block - grads <= plain - offloaded <= k * block, (plain / block, offloaded / block)
    assert plain - offloaded > (k - 2) * block


@pytest.mark.parametrize("make", [
    lambda: torch.empty(N, H, dtype=torch.bfloat16, device="meta").t(),        # permuted: stride kept
    lambda: torch.empty(N, 3 * H, device="meta")[:, H:2 * H],                  # gaps: comes back dense
    lambda: torch.empty(2, N, H, device="meta").permute(2, 0, 1)[:, 1:],       # both
])
def test_simulate_unpack_shape_stride_dtype(make):
    t = make()
    off = Offloader(min_bytes=0)
    h = off.pack(t)
    assert isinstance(h, _Handle) and h.data is None  # nothing of t is kept
    u = off.unpack(h)
    assert u.device.type == "meta" and u.shape == t.shape and u.dtype == t.dtype
    assert u.stride() == _restored_stride(tuple(t.shape), t.stride())
    if t.is_contiguous() or t.transpose(-1, -2).is_contiguous():
        assert u.stride() == t.stride()
    assert u.untyped_storage().nbytes() == t.numel() * t.element_size()  # dense
    # dimension order kept: sorting dims by stride gives the same permutation
    assert sorted(range(t.dim()), key=lambda d: (t.stride(d), -d)) == sorted(range(t.dim()), key=lambda d: (u.stride(d), -d))


def test_restored_stride_is_empty_likes():
    base = torch.empty(2, 6, 8, 10)
    for t in (base, base.permute(3, 0, 2, 1), base[:, 1:4], base[..., ::2].transpose(1, 2), base[:1].expand(3, 6, 8, 10),
              base[:, :, :1].expand(2, 6, 5, 10).permute(2, 3, 0, 1), torch.empty(4, 1, 5).as_strided((4, 1, 5), (5, 77, 1))):
        assert _restored_stride(tuple(t.shape), t.stride()) == torch.empty_like(t).stride()
    assert _restored_stride((4, 1, 5), (5, 77, 1)) == (5, 77, 1)  # dense: kept as it is


def test_off_and_bad_mode():
    model, x = _model(), torch.randn(N, H)
    reference = _step(model, x)
    off = Offloader(mode="off", min_bytes=0)
    assert isinstance(off.hooks(), contextlib.nullcontext)
    _assert_same(_step(model, x, off), reference)
    t = torch.randn(N, H)
    assert off.pack(t) is t and (off.count, off.offloaded_bytes, off.host_bytes) == (0, 0, 0)
    with pytest.raises(ValueError) as err:
        Offloader(mode="gpu")
    assert all(repr(m) in str(err.value) for m in MODES) and "'gpu'" in str(err.value)


def test_forced_mode_checks_device():
    t = torch.randn(N, H)
    with pytest.raises(ValueError, match="meta tensors only"):
        Offloader(mode="simulate", min_bytes=0).pack(t)
    with pytest.raises(ValueError, match="CUDA tensors only"):
        Offloader(mode="cuda", min_bytes=0).pack(t)
    counting = Offloader(mode="cpu", min_bytes=0)  # count only, whatever the device
    m = torch.empty(N, H, device="meta")
    assert counting.unpack(counting.pack(m)) is m and counting.offloaded_bytes == N * H * 4


class _ZeroingOffloader(Offloader):
    """Deliberately broken: backward gets zeros instead of the saved tensors."""

    def unpack(self, handle):
        out = super().unpack(handle)
        return torch.zeros_like(out) if isinstance(handle, _Handle) else out


def test_negative_control_wrong_unpack_changes_grads():
    model, x = _model(), torch.randn(N, H)
    reference = _step(model, x)
    broken = _step(model, x, _ZeroingOffloader(min_bytes=MIN))
    assert not all(torch.allclose(u, v) for u, v in zip(broken, reference))
    with pytest.raises(AssertionError):
        _assert_same(broken, reference)


class _HostTransport(_CudaTransport):
    """The CUDA mode's transport with host-to-host copies, logging what it is asked to do."""

    def __init__(self):
        super().__init__()
        self.log, self.allocated = [], 0

    def check(self, t):
        pass

    def alloc_host(self, numel, dtype):
        self.allocated += 1
        return torch.empty(numel, dtype=dtype)

    def to_host(self, t, host):
        host.view(t.shape).copy_(t)
        self.log.append(("to_host", host.data_ptr()))
        return "event"

    def to_device(self, h):
        out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
        out.copy_(h.data.view(h.shape))
        self.log.append(("to_device", h.index))
        return out, h.index

    def hand_over(self, out, event):
        self.log.append(("hand_over", event))


def test_cuda_logic_prefetch_and_pool_on_host():
    model, x = _model(4), torch.randn(N, H)
    reference = _step(model, x)
    off = Offloader(mode="cuda", min_bytes=MIN)
    off._transport = transport = _HostTransport()
    _assert_same(_step(model, x, off), reference)
    buffers = {ptr for op, ptr in transport.log if op == "to_host"}
    assert len(buffers) == 4 and transport.allocated == 4
    # Backward: the last block input is fetched; each unpack starts copying the one before.
    expected = [("to_device", 3), ("to_device", 2), ("hand_over", 3), ("to_device", 1), ("hand_over", 2),
                ("to_device", 0), ("hand_over", 1), ("hand_over", 0)]
    assert transport.log[4:] == expected
    assert off.host_bytes == 0 and off._pool_bytes == 4 * BLOCK_BYTES
    transport.log.clear()
    _assert_same(_step(model, x, off), reference)  # second step: the pinned buffers are reused
    assert transport.allocated == 4 and {ptr for op, ptr in transport.log if op == "to_host"} == buffers
    off.clear_pool()
    assert off._pool_bytes == 0


def test_cuda_logic_saved_twice_unpacked_twice():
    off = Offloader(mode="cuda", min_bytes=MIN)
    off._transport = transport = _HostTransport()
    reference = _saves_step()
    _assert_same(_saves_step(off), reference)
    assert off.count == 1 and transport.log.count(("to_device", 0)) == 1  # one copy back, shared


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_cuda_offload_grads_and_device_memory():
    n, k = 4096, 4
    block = n * H * 4  # 1 MiB
    model, x = _model(k, device="cuda"), torch.randn(n, H, device="cuda")
    reference = _step(model, x)

    def retained(offloader):
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        y = x.detach().requires_grad_() * 1.0
        for b in model:
            with offloader.hooks() if offloader is not None else contextlib.nullcontext():
                y = Recompute(b)(y)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - start

    off = Offloader(min_bytes=1 << 20)
    assert retained(None) - retained(off) == k * block
    off = Offloader(min_bytes=1 << 20)
    for _ in range(2):
        off.reset_stats()
        grads = _step(model, x, off)
        torch.cuda.synchronize()
        for u, v in zip(grads, reference, strict=True):
            torch.testing.assert_close(u, v)
        assert off.count == k and off.offloaded_bytes == k * block and off.host_bytes == 0
    assert off._pool_bytes == k * block


@cuda
def test_cuda_negative_control():
    model, x = _model(device="cuda"), torch.randn(N, H, device="cuda")
    broken = _step(model, x, _ZeroingOffloader(min_bytes=MIN))
    assert not all(torch.allclose(u, v) for u, v in zip(broken, _step(model, x)))


def test_offload_applies_to_the_chosen_layers_only():
    """A plan that offloads the middle layer only: only that layer's segment gets the
    offloader (a segment's placeholders carry the meta of the ops that made them, in the
    layer before, which must not decide), and the memory model's saved bytes lie between
    offloading nothing and offloading every layer. One compilation, each plan's memory
    passes run on a copy (as the planner does)."""
    from autosp.cost.plan import MemoryPlan
    from autosp.driver import Transformed, transform
    from autosp.models import LlamaConfig
    from autosp.pipeline import run_pipeline
    from autosp.planning.estimate import MemoryModel, meta_model
    from autosp.runtime import collectives
    model = meta_model(LlamaConfig(vocab=128, hidden=128, layers=3, heads=4, kv_heads=2, ffn=256), torch.bfloat16)
    ids = torch.zeros(1, 8192, dtype=torch.long, device="meta")
    with collectives.simulate(1, 0):
        base = transform(model, (ids,), {"labels": ids}, sp_size=1).to_bytes()
    saved = {}
    for layers in (("full",) * 3, ("full", "full+offload", "full"), ("full+offload",) * 3):
        transformed = Transformed.from_bytes(base)
        run_pipeline(transformed.module, MemoryPlan(layers=layers, tiles=2, loss_chunk=64, drop_logits=True).pipeline())
        memory = MemoryModel(model, 1, None, optimizer="none", call=lambda n: ((ids,), {"labels": ids}),
                             transformed=transformed)
        segments = [c for n, c in sorted(memory.program.runner.named_children()) if n.startswith("submod_segment")]
        assert [s.offload is not None for s in segments] == [c.endswith("+offload") for c in layers], layers
        saved[layers.count("full+offload")] = memory.estimate(8192).saved_bytes
    assert saved[0] > saved[1] > saved[3], saved
