"""Attention kernels for structured masks the compiler proved (``autosp-causal-mask``).

:func:`sliding_window_attention` runs causal attention restricted to the last ``window``
keys (query ``i`` attends keys ``i - window < j <= i``) without an S x S mask: the queries
go in blocks of ``max(window, 128)`` rows, each against the keys it can reach (its own
rows and the ``window - 1`` before them), with one small band mask shared by every full
block. Each block is a fused attention kernel
(saves its output and log-sum-exp, never the scores), so the bytes kept for backward
grow linearly in S. Where S <= window the window excludes nothing: plain causal attention.

Example::

    >>> out = sliding_window_attention(q, k, v, is_causal=True, window=4096)   # q: [B, H, S, D]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _band(rows: int, cols: int, offset: int, window: int, like: torch.Tensor) -> torch.Tensor:
    """Additive mask [rows, cols]: 0 where query ``offset + i`` may see key ``j``
    (``0 <= offset + i - j < window``), -inf elsewhere."""
    d = torch.arange(rows, device=like.device)[:, None] + offset - torch.arange(cols, device=like.device)[None, :]
    allowed = (d >= 0) & (d < window)
    return torch.where(allowed, 0.0, float("-inf")).to(like.dtype)


def _attend(q, k, v, mask, scale, enable_gqa):
    if q.device.type in ("cpu", "meta"):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            repeat = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(repeat, -3), v.repeat_interleave(repeat, -3)
        # The fused CPU kernel: keeps the output and log-sum-exp for backward, not the scores.
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def sliding_window_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                             enable_gqa=False, *, window: int):
    """``scaled_dot_product_attention(query, key, value, is_causal=True)`` with each query
    seeing only the last ``window`` keys (see the module docstring). Same arguments as
    SDPA (``attn_mask`` must be None, ``dropout_p`` 0, ``is_causal`` True)."""
    if attn_mask is not None or dropout_p != 0.0 or not is_causal:
        raise ValueError("sliding_window_attention: no attn_mask, no dropout, is_causal=True")
    if window < 1:
        raise ValueError(f"sliding_window_attention: window must be >= 1, got {window}")
    s = query.shape[-2]
    if s <= window:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale, enable_gqa=enable_gqa)
    block = max(window, 128)  # rows per block (small windows: fewer, larger blocks)
    masks: dict = {}
    outs = []
    for start in range(0, s, block):
        stop = min(start + block, s)
        lo = max(0, start - window + 1)
        shape = (stop - start, stop - lo, start - lo)
        if shape not in masks:  # one mask for every full block
            masks[shape] = _band(*shape, window, query)
        outs.append(_attend(query[..., start:stop, :], key[..., lo:stop, :], value[..., lo:stop, :],
                            masks[shape], scale, enable_gqa))
    return torch.cat(outs, dim=-2)
