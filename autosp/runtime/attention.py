"""Attention kernels for structured masks the compiler proved (``autosp-causal-mask``).

:func:`sliding_window_attention` runs causal attention restricted to the last ``window``
keys (query ``i`` attends keys ``i - window < j <= i``) without an S x S mask: the queries
go in blocks of ``max(window, 128)`` rows, each against the keys it can reach (its own
rows and the ``window - 1`` before them), with one small band mask shared by every full
block. Each block is a fused attention kernel
(saves its output and log-sum-exp, never the scores), so the bytes kept for backward
grow linearly in S. Where S <= window the window excludes nothing: plain causal attention.

:func:`key_padded_causal_attention` is causal attention with a [B, 1, 1, S] key padding
mask (transformers' causal + padding mask, which it builds as [B, 1, S, S]): on CPU one
fused kernel call with ``is_causal`` and the broadcast mask, O(S) bytes. (On CUDA the
padding is combined with an S x S causal bias: correct, not yet memory-saving.)

Example::

    >>> out = sliding_window_attention(q, k, v, is_causal=True, window=4096)   # q: [B, H, S, D]
    >>> out = key_padded_causal_attention(q, k, v, pad[:, None, None, :], is_causal=True)
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


def _attend(q, k, v, mask, scale, enable_gqa, causal: bool = False):
    if q.device.type in ("cpu", "meta"):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            repeat = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(repeat, -3), v.repeat_interleave(repeat, -3)
        # The fused CPU kernel: keeps the output and log-sum-exp for backward, not the scores.
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def _key_bias(key_padding: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [B, 1, 1, S] boolean key mask (True: visible) as an additive mask in ``like``'s dtype."""
    if key_padding.dim() != 4 or key_padding.shape[1] != 1 or key_padding.shape[2] != 1:
        raise ValueError(f"a key padding mask is [B, 1, 1, S], got {tuple(key_padding.shape)}")
    return torch.where(key_padding, 0.0, float("-inf")).to(like.dtype)


def key_padded_causal_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                                enable_gqa=False):
    """Causal attention where key ``j`` of batch ``b`` is visible only if
    ``attn_mask[b, 0, 0, j]`` (a [B, 1, 1, S] boolean key padding mask): what transformers'
    causal + padding mask computes as [B, 1, S, S], with O(S) bytes. A query that sees no
    key (left padding) gets zeros, as SDPA gives."""
    if attn_mask is None or dropout_p != 0.0 or not is_causal:
        raise ValueError("key_padded_causal_attention: a key padding mask, no dropout, is_causal=True")
    bias = _key_bias(attn_mask, query)
    if query.device.type in ("cpu", "meta"):
        # The fused CPU kernel takes is_causal and a broadcast mask together, and keeps
        # the [B, 1, 1, S] mask for backward (never S x S).
        return _attend(query, key, value, bias, scale, enable_gqa, causal=True)
    s = query.shape[-2]
    i = torch.arange(s, device=query.device)
    causal = torch.where(i[None, :] <= i[:, None], 0.0, float("-inf")).to(query.dtype)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias + causal, scale=scale,
                                          enable_gqa=enable_gqa)


def sliding_window_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                             enable_gqa=False, *, window: int):
    """``scaled_dot_product_attention(query, key, value, is_causal=True)`` with each query
    seeing only the last ``window`` keys (see the module docstring). Same arguments as
    SDPA (``dropout_p`` 0, ``is_causal`` True); ``attn_mask``, if given, is a [B, 1, 1, S]
    boolean key padding mask and-ed with the window."""
    if dropout_p != 0.0 or not is_causal:
        raise ValueError("sliding_window_attention: no dropout, is_causal=True")
    if window < 1:
        raise ValueError(f"sliding_window_attention: window must be >= 1, got {window}")
    bias = None if attn_mask is None else _key_bias(attn_mask, query)
    s = query.shape[-2]
    if s <= window:
        if bias is not None:
            return key_padded_causal_attention(query, key, value, attn_mask, scale=scale, enable_gqa=enable_gqa)
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
        mask = masks[shape] if bias is None else masks[shape] + bias[..., lo:stop]
        outs.append(_attend(query[..., start:stop, :], key[..., lo:stop, :], value[..., lo:stop, :],
                            mask, scale, enable_gqa))
    return torch.cat(outs, dim=-2)
