"""Attention with a relative position bias in O(S) bytes: T5's buckets of ``k - q``.

``autosp-relative-bias`` proves from the IR that an SDPA mask is ``where(keep, T, c)`` (or
``T``) with ``T[b, h, q, k] = table[bucket(k - q), h]``: a per-head bias that depends on
the key and the query only through their distance. It hands the op the ``table`` and the
buckets of every distance, ``buckets[d + S - 1] = bucket(d)`` for ``d`` in ``[1 - S, S - 1]``
(``2 S - 1`` integers), instead of the ``[B, H, S, S]`` mask. This runtime rebuilds the
bias block by block: ``band = table[buckets]`` (``[2 S - 1, H]``, differentiable in the
table), and a block of queries ``[i0, i1)`` reads ``band[k - q + S - 1]``, ``[H, i1 - i0,
S]``. Forward keeps the output and each row's max and sum; backward recomputes each block's
scores, so nothing ``S x S`` is kept: O(S) bytes, on every device (the blocks are plain
tensor ops: CPU, CUDA and the meta memory model run the same code).

The scores of a block are eager's formula, in fp32: ``q kᵀ · scale + where(keep, bias, c)``
(``keep``: key padding ``[B, 1, 1, S]``; ``c``: the mask's masking constant, e.g. the dtype's
lowest, so a row whose keys are all padded is uniform over them, as eager), then the causal
mask (``-inf`` above the diagonal) when ``is_causal``.

Example::

    >>> out = relative_bias_attention(q, k, v, None, 0.0, False, 1.0, False, table, buckets)
"""
from __future__ import annotations

import torch

BLOCK = 256  # queries per block: a block's scores are [B, H, BLOCK, S] fp32, transient


def _scores(q, k, band, keep, fill, causal: bool, scale: float, i0: int) -> torch.Tensor:
    """fp32 scores of queries ``[i0, i0 + q.shape[-2])`` against every key, bias added."""
    s_len, rows = k.shape[-2], q.shape[-2]
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    index = _index(s_len, i0, rows, q.device)
    bias = band[:, index]  # [H, rows, S]
    if keep is not None:
        s = s + torch.where(keep, bias, torch.tensor(fill, dtype=bias.dtype, device=bias.device))
    else:
        s = s + bias
    if causal:
        s = s.masked_fill(index > s_len - 1, float("-inf"))  # k > q
    return s


def _index(s_len: int, i0: int, rows: int, device) -> torch.Tensor:
    """``[rows, S]``: ``k - q + S - 1`` for queries ``[i0, i0 + rows)``, the band's column."""
    pos_k = torch.arange(s_len, device=device)
    pos_q = torch.arange(i0, i0 + rows, device=device)
    return pos_k[None, :] - pos_q[:, None] + (s_len - 1)


class _BlockedRelativeBias(torch.autograd.Function):
    """Softmax attention with ``band``'s bias, one block of queries at a time; backward
    recomputes each block's scores from q, k, the band and each row's kept max and sum."""

    @staticmethod
    def forward(ctx, q, k, v, band, keep, fill, causal, scale, block):
        b, h, s_len, _ = q.shape
        out = torch.empty(b, h, s_len, v.shape[-1], dtype=v.dtype, device=v.device)
        # Each row's max and sum of exponentials, apart: their log-sum-exp would round away
        # log(S) next to a masking constant like the dtype's lowest (a row padded everywhere).
        row_max = torch.empty(b, h, s_len, dtype=torch.float32, device=q.device)
        row_sum = torch.empty(b, h, s_len, dtype=torch.float32, device=q.device)
        for i0 in range(0, s_len, block):
            i1 = min(s_len, i0 + block)
            s = _scores(q[:, :, i0:i1], k, band, keep, fill, causal, scale, i0)
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            total = p.sum(-1, keepdim=True)
            out[:, :, i0:i1] = torch.matmul(p / total, v.float()).to(v.dtype)
            row_max[:, :, i0:i1], row_sum[:, :, i0:i1] = m.squeeze(-1), total.squeeze(-1)
        ctx.save_for_backward(q, k, v, band, keep if keep is not None else torch.empty(0), out, row_max, row_sum)
        ctx.meta = (keep is not None, fill, causal, scale, block)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, band, keep, out, row_max, row_sum = ctx.saved_tensors
        has_keep, fill, causal, scale, block = ctx.meta
        keep = keep if has_keep else None
        s_len, heads = q.shape[-2], q.shape[1]
        dq = torch.zeros_like(q, dtype=torch.float32)
        dk = torch.zeros_like(k, dtype=torch.float32)
        dv = torch.zeros_like(v, dtype=torch.float32)
        dband = torch.zeros_like(band, dtype=torch.float32)
        g = grad.float()
        delta = (g * out.float()).sum(-1)  # [B, H, S]
        kf, vf = k.float(), v.float()
        for i0 in range(0, s_len, block):
            i1 = min(s_len, i0 + block)
            qb = q[:, :, i0:i1]
            s = _scores(qb, k, band, keep, fill, causal, scale, i0)
            p = torch.exp(s - row_max[:, :, i0:i1, None]) / row_sum[:, :, i0:i1, None]
            gb = g[:, :, i0:i1]
            dv += torch.matmul(p.transpose(-1, -2), gb)
            dp = torch.matmul(gb, vf.transpose(-1, -2))
            ds = p * (dp - delta[:, :, i0:i1, None])
            dq[:, :, i0:i1] = torch.matmul(ds, kf) * scale
            dk += torch.matmul(ds.transpose(-1, -2), qb.float()) * scale
            dbias = ds if keep is None else ds * keep  # the bias counts only where a key is kept
            index = _index(s_len, i0, i1 - i0, q.device).reshape(1, -1).expand(heads, -1)
            dband.scatter_add_(1, index, dbias.sum(0).reshape(heads, -1))
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dband.to(band.dtype),
                None, None, None, None, None)


def relative_bias_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                            enable_gqa=False, table=None, buckets=None, fill=None, *, block: int = BLOCK):
    """SDPA whose mask is ``where(attn_mask, T, fill)`` (or ``T`` where ``attn_mask`` is None)
    with ``T[b, h, q, k] = table[buckets[k - q + S - 1], h]``; see the module docstring.
    ``attn_mask``: key padding ``[B, 1, 1, S]`` (boolean, True: kept) or None. ``table``:
    ``[buckets, H]`` (this rank's heads under Ulysses); ``buckets``: ``[2 S - 1]`` integers.
    Same heads for q, k and v; no dropout."""
    if table is None or buckets is None:
        raise ValueError("relative_bias_attention: a table and its buckets are required")
    if dropout_p != 0.0:
        raise ValueError("relative_bias_attention: no dropout")
    b, h, s_len, d = query.shape
    if key.shape[1] != h or buckets.shape != (2 * s_len - 1,) or table.shape[1] != h:
        raise ValueError(f"relative_bias_attention: q {tuple(query.shape)}, k {tuple(key.shape)}, table "
                         f"{tuple(table.shape)} and buckets {tuple(buckets.shape)} do not agree (H heads for each, "
                         "2 S - 1 buckets)")
    keep = None
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[1:3] != (1, 1):
            raise ValueError(f"relative_bias_attention: the mask is a [B, 1, 1, S] key padding, got "
                             f"{attn_mask.dtype} {tuple(attn_mask.shape)}")
        keep = attn_mask
    band = torch.nn.functional.embedding(buckets, table).transpose(0, 1)  # [H, 2 S - 1]
    scale = d ** -0.5 if scale is None else scale
    return _BlockedRelativeBias.apply(query, key, value, band, keep, float(fill) if fill is not None else 0.0,
                                      bool(is_causal), float(scale), block)
