"""Which attention kernel runs, named explicitly, on every device (the CUDA path included).

Every attention call of a compiled program ends here. On CPU it is what it always was
(``F.scaled_dot_product_attention``, or the fused CPU flash kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` where the caller needs it). On CUDA the
high-level ``F.scaled_dot_product_attention`` is never called: its kernel choice is made at
run time, may fall to the math kernel (which builds the S x S scores), and cannot be checked
without a GPU. Instead each call names its kernel:

=====================  ==========================================================  ==========
call                   CUDA kernel                                                  bytes
=====================  ==========================================================  ==========
dense (no mask)        ``aten._scaled_dot_product_flash_attention`` (GQA native)   O(S)
dense, broadcast mask  ``aten._scaled_dot_product_efficient_attention``, the mask  O(S)
                       ``expand``-ed to [B, H, Lq, Lk] (stride 0, never copied)
variable length        ``aten._flash_attention_forward`` with ``cum_seq_q/k`` and   O(S)
(documents, padding,   ``window_size_left/right``: one launch for every run of
windows)               every row
=====================  ==========================================================  ==========

The flash kernels take fp16/bf16 and head dims that are multiples of 8 up to 256; the
efficient kernel also fp32 (it reads each KV head once per query head: with GQA the keys
and values are repeated for it, a cost it states). When the inputs are outside a kernel's
contract the call falls back to the next one and :func:`fallback` warns once per reason
with what it costs; the math kernel is the last resort (fp64), never a silent choice.

**The target device.** The memory model and the fake-CUDA harness run programs on the meta
device. :func:`target` says which device's kernels a meta tensor stands for:
``with kernels.target("cuda"):`` makes every meta call take the CUDA branch (the CUDA
kernels' meta implementations give their shapes, saved tensors and allocations), so CUDA
programs are costed on CUDA's kernels. The default is ``"cpu"``.

Example::

    >>> with kernels.target("cuda"):
    ...     out = kernels.dense(q, k, v, causal=True, scale=None)   # q on meta: the flash kernel
"""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F

aten = torch.ops.aten

# The target stack, innermost last ("cpu" at the bottom); a plain list, not a ContextVar:
# torch.compile traces reads of it.
_TARGET: list[str] = ["cpu"]
_WARNED: set = set()

FLASH_DTYPES = (torch.float16, torch.bfloat16)
EFFICIENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLASH_MAX_HEAD_DIM = 256
LSE_ALIGN = 32  # the efficient CUDA kernel's log-sum-exp rows are padded to a multiple of this


@contextlib.contextmanager
def target(device: str):
    """Within this context, meta tensors stand for ``device``'s tensors (``"cpu"`` or
    ``"cuda"``): the kernels chosen for them are that device's."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"kernels.target: device must be 'cpu' or 'cuda', got {device!r}")
    _TARGET.append(device)
    try:
        yield
    finally:
        _TARGET.pop()


def current_target() -> str:
    """The device meta tensors stand for now (:func:`target`)."""
    return _TARGET[-1]


def on_cuda(t: torch.Tensor) -> bool:
    """True where ``t``'s attention runs CUDA's kernels: a CUDA tensor (real or fake), or a
    meta tensor under ``target("cuda")``."""
    return t.device.type == "cuda" or (t.device.type == "meta" and _TARGET[-1] == "cuda")


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t`` holds data (not meta, not a fake tensor): data-dependent plans need it."""
    from torch._subclasses.fake_tensor import FakeTensor
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


def fallback(kind: str, reason: str, cost: str) -> None:
    """Warn once per (kind, reason) that a CUDA call left its kernel, and what that costs."""
    key = (kind, reason)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"autosp: {kind} on CUDA: {reason}; {cost}", RuntimeWarning, stacklevel=3)


def flash_ok(q: torch.Tensor, v: torch.Tensor | None = None) -> str | None:
    """None if the flash kernels accept ``q``'s dtype and head dim (and ``v``'s, which they
    take equal to q's: MLA's narrower v is refused), else why not."""
    d = q.shape[-1]
    if v is not None and v.shape[-1] != d:
        return f"the flash kernel takes one head dim for q, k and v, not {d} and {v.shape[-1]}"
    if q.dtype not in FLASH_DTYPES:
        return f"the flash kernel takes fp16/bf16, not {q.dtype}"
    if d % 8 or d > FLASH_MAX_HEAD_DIM:
        return f"the flash kernel takes head dims that are multiples of 8 up to {FLASH_MAX_HEAD_DIM}, not {d}"
    return None


def efficient_ok(q: torch.Tensor) -> str | None:
    """None if the memory-efficient kernel accepts ``q``'s dtype and head dim, else why not."""
    if q.dtype not in EFFICIENT_DTYPES:
        return f"the memory-efficient kernel takes fp16/bf16/fp32, not {q.dtype}"
    if q.shape[-1] % 8:
        return f"the memory-efficient kernel takes head dims that are multiples of 8, not {q.shape[-1]}"
    return None


def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """K and V with one head per query head (the efficient kernel reads equal head counts)."""
    g = q.shape[-3] // k.shape[-3]
    if g == 1:
        return k, v
    return k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)


def _broadcast_bias(bias: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor):
    """An additive mask broadcast to [B, H, Lq, Lk] by ``expand`` (stride 0: no copy)."""
    if bias is None:
        return None
    return bias.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


# ----------------------------------------------------------------------------- dense
def dense(q, k, v, *, causal: bool, scale, bias: torch.Tensor | None = None, dropout_p: float = 0.0):
    """Attention of ``q`` [B, Hq, Lq, D] over ``k``/``v`` [B, Hkv, Lk, D] (Hq a multiple of
    Hkv), causal or not, with an optional additive ``bias`` broadcastable to [B, 1|H, Lq,
    Lk] (a broadcast dim is never materialised on CUDA). Differentiable."""
    if not on_cuda(q):
        if q.device.type == "meta" and v.shape[-1] == q.shape[-1]:  # the memory model for CPU: the fused
            # CPU kernel (which takes one head dim; MLA's v is narrower than q and k: SDPA's own choice)
            return aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout_p, causal, attn_mask=bias, scale=scale)[0]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=causal,
                                              scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return dense_lse(q, k, v, causal=causal, scale=scale, bias=bias, dropout_p=dropout_p)[0]


def dense_lse(q, k, v, *, causal: bool, scale, bias=None, dropout_p: float = 0.0, kernel: str | None = None):
    """CUDA: ``(out, lse, kernel)``: out [B, Hq, Lq, D], the log-sum-exp [B, Hq, Lq] in fp32
    (rows that see no key: -inf is *not* guaranteed; callers mask them), and the kernel's
    name (``"flash"``, ``"efficient"`` or ``"math"``). ``kernel`` forces one (tests)."""
    kernel = kernel or choose_dense(q, bias, v)
    if kernel == "flash":
        r = aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, causal, False, scale=scale)
        return r[0], r[1], kernel
    if kernel == "efficient":
        kr, vr = _repeat_kv(q, k, v)
        r = aten._scaled_dot_product_efficient_attention(q, kr, vr, _broadcast_bias(bias, q, k), True, dropout_p,
                                                         causal, scale=scale)
        return r[0], r[1][..., :q.shape[2]], kernel
    return _math(q, k, v, causal, scale, bias)


def choose_dense(q: torch.Tensor, bias, v: torch.Tensor | None = None) -> str:
    """The CUDA kernel for a dense call: flash without a mask, efficient with one (or when
    flash refuses the inputs: a value head dim other than q's, as MLA's), math only when
    both refuse (warned)."""
    why_flash = flash_ok(q, v)
    if bias is None and why_flash is None:
        return "flash"
    why_eff = efficient_ok(q)
    if why_eff is None:
        if bias is None:
            fallback("attention", str(why_flash), "the memory-efficient kernel runs instead (O(S) bytes; with GQA the "
                     "keys and values are repeated per query head)")
        return "efficient"
    fallback("attention", f"{why_eff}" if bias is not None else f"{why_flash} and {why_eff}",
             "the math kernel runs: it builds the [B, H, Lq, Lk] scores (O(S^2) bytes)")
    return "math"


def _math(q, k, v, causal, scale, bias):
    """The last resort: scores in the inputs' dtype, explicit (the S x S cost is warned)."""
    kr, vr = _repeat_kv(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q @ kr.transpose(-1, -2)) * scale
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
    if bias is not None:
        s = s + bias
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.exp(s.float() - lse.masked_fill(lse == float("-inf"), 0.0)[..., None]).to(q.dtype)
    return p @ vr, lse, "math"


def dense_lse_backward(dout, q, k, v, out, lse, *, causal: bool, scale, bias=None, kernel: str):
    """CUDA: the gradients ``(dq, dk, dv)`` of :func:`dense_lse` run with ``kernel``, given
    the output and log-sum-exp to differentiate at (the ring passes its *merged* ones, so
    each block gets its exact share)."""
    if kernel == "flash":
        s = q.shape[2]
        empty = torch.empty(0, device=q.device)
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, None, None, s, k.shape[2], 0.0, causal, empty, empty, scale=scale)
        return dq, dk, dv
    if kernel == "efficient":
        kr, vr = _repeat_kv(q, k, v)
        pad = (-lse.shape[-1]) % LSE_ALIGN if q.device.type == "cuda" else 0
        lse_k = F.pad(lse, (0, pad)) if pad else lse
        seed = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
            dout, q, kr, vr, _broadcast_bias(bias, q, k), out, lse_k, seed, seed, 0.0, [True, True, True, False],
            causal, scale=scale)
        g = q.shape[1] // k.shape[1]
        if g > 1:  # each KV head's gradient: the sum over the query heads that read it
            b, _, lk, d = dk.shape
            dk = dk.view(b, k.shape[1], g, lk, d).sum(2)
            dv = dv.view(b, k.shape[1], g, lk, d).sum(2)
        return dq, dk, dv
    raise ValueError(f"dense_lse_backward: no explicit backward for kernel {kernel!r}")


# ----------------------------------------------------------------------------- varlen
def varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, *, causal: bool, scale, window: int | None = None):
    """The varlen flash kernel (CUDA, fp16/bf16): ``q`` [Tq, Hq, D], ``k``/``v`` [Tk, Hkv, D]
    packed runs, run i being rows ``cu_q[i]:cu_q[i+1]`` against keys ``cu_k[i]:cu_k[i+1]``
    (int32 cumulative lengths on the device). ``max_q``/``max_k`` are the longest runs (the
    kernel sizes its backward workspace by runs x ``max_q``: pass the true maxima).
    ``causal`` aligns each run's queries to the end of its keys; ``window`` (with
    ``causal``) keeps each query's last ``window`` keys. Differentiable."""
    extra = {} if window is None else {"window_size_left": window - 1, "window_size_right": 0}
    return aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale,
                                         **extra)[0]


def pack(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] as the varlen kernel's [B * S, H, D] (a view when ``x`` is a transposed
    [B, S, H, D] tensor, as attention's projections make it; otherwise one copy)."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b * s, h, d)


def unpack(x: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """[B * S, H, D] back as [B, H, S, D] (a transposed view)."""
    return x.view(b, s, x.shape[-2], x.shape[-1]).transpose(1, 2)


def cumulative(lengths: list[int], device) -> torch.Tensor:
    """The int32 cumulative lengths ``[0, l0, l0 + l1, ...]`` the varlen kernel takes."""
    out, total = [0], 0
    for n in lengths:
        total += n
        out.append(total)
    return torch.tensor(out, dtype=torch.int32, device=device)
