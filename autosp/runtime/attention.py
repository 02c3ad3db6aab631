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

:func:`document_attention` is causal attention (or a causal sliding window) within
documents: query ``i`` of row ``b`` sees key ``j`` only if ``docs[b, i] == docs[b, j]``
(transformers' packed sequences, whose mask it builds as [B, 1, S, S] from
``position_ids``). Each document runs on its own as a fused causal kernel over its slice
of the sequence (variable-length attention, as flash attention's ``cu_seqlens`` does), so
neither the forward nor the backward ever holds more than one document's outputs and
log-sum-exp: O(S) bytes.

Example::

    >>> out = sliding_window_attention(q, k, v, is_causal=True, window=4096)   # q: [B, H, S, D]
    >>> out = key_padded_causal_attention(q, k, v, pad[:, None, None, :], is_causal=True)
    >>> out = document_attention(q, k, v, doc_ids[:, None, None, :], is_causal=True)
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
        # The fused CPU kernel: keeps the output and log-sum-exp for backward, not the scores;
        # with GQA it reads each shared KV head (no repeated copies).
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)


def _key_bias(key_padding: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [B, 1, 1, S] boolean key mask (True: visible) as an additive mask in ``like``'s dtype."""
    if key_padding.dim() != 4 or key_padding.shape[1] != 1 or key_padding.shape[2] != 1:
        raise ValueError(f"a key padding mask is [B, 1, 1, S], got {tuple(key_padding.shape)}")
    return torch.where(key_padding, 0.0, float("-inf")).to(like.dtype)


def masked_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False, empty_rows=None):
    """SDPA with a boolean ``attn_mask`` (the mask the compiler kept), where a query whose
    mask row is all False gets what fused eager attention gave it: ``empty_rows="mean"``
    (``scores.masked_fill(~mask, finfo.min)``: uniform over every key, no gradient to the
    scores) rather than SDPA's zeros."""
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if empty_rows is None or attn_mask is None:
        return out
    empty = ~attn_mask.any(dim=-1, keepdim=True)
    return _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows)


def _empty_rows(out, query, key, value, key_padding, window, scale, enable_gqa, empty_rows):
    """``out`` with each query that sees no key (all its keys padded) replaced as
    ``empty_rows`` says: None keeps SDPA's zeros; "uniform" is eager softmax attention
    under an additive mask whose masking constant swamps every score: every key gets the
    same score, so the output is the mean of all values, and the gradient is softmax's at
    that uniform point (it still reaches the queries and keys). Computed in O(S) from its
    first-order form ``mean(v) + (1/S) sum_j (t_j - mean(t)) v_j`` with ``t = u - u.detach()``
    (value 0, gradient of the scores ``u = scale q.k_j``), contracted as ``q @ (K^T V)``:
    no [S, S] scores."""
    if empty_rows is None:
        return out
    seen = torch.cumsum(key_padding[:, 0, 0, :].to(torch.int32), dim=-1)  # visible keys at or before q
    if window is not None and window < seen.shape[-1]:
        seen = seen - torch.nn.functional.pad(seen, (window, 0))[..., :seen.shape[-1]]
    empty = (seen == 0)[:, None, :, None]  # [B, 1, S, 1]
    return _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows)


def _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows):
    """``out`` where ``empty`` ([B, 1|H, S, 1]) is False; elsewhere eager's answer for a row
    masked everywhere: "mean" (masked_fill: the mean of the values, gradient to the values
    only) or "uniform" (additive mask: the same value, gradient through the scores)."""
    if empty_rows not in ("mean", "uniform"):
        raise ValueError(f"empty_rows must be None, 'mean' or 'uniform', got {empty_rows!r}")
    if out.device.type != "meta" and not bool(empty.any()):
        return out
    if enable_gqa and value.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // value.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    if empty_rows == "mean":
        return torch.where(empty, value.mean(dim=-2, keepdim=True).to(out.dtype), out)
    s = key.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    q_d, k_d = query.detach(), key.detach()
    v_mean, k_mean, kd_mean = value.mean(dim=-2, keepdim=True), key.mean(dim=-2, keepdim=True), k_d.mean(dim=-2, keepdim=True)
    kv = key.transpose(-1, -2) @ value                      # [B, H, D, Dv]
    kv_d = k_d.transpose(-1, -2) @ value                    # keys detached, values not
    t_v = scale * (query @ kv - q_d @ kv_d) / s             # (1/S) sum_j t_j v_j
    t_mean = scale * ((query * k_mean).sum(-1, keepdim=True) - (q_d * kd_mean).sum(-1, keepdim=True))
    return torch.where(empty, (v_mean + t_v - t_mean * v_mean).to(out.dtype), out)


def key_padded_causal_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                                enable_gqa=False, empty_rows=None):
    """Causal attention where key ``j`` of batch ``b`` is visible only if
    ``attn_mask[b, 0, 0, j]`` (a [B, 1, 1, S] boolean key padding mask): what transformers'
    causal + padding mask computes as [B, 1, S, S], with O(S) bytes. A query that sees no
    key (left padding) gets zeros, as SDPA with a boolean mask gives; with
    ``empty_rows="uniform"`` the mean of all values, as an additive (finite) mask gives."""
    if attn_mask is None or dropout_p != 0.0 or not is_causal:
        raise ValueError("key_padded_causal_attention: a key padding mask, no dropout, is_causal=True")
    out = _key_padded_causal(query, key, value, attn_mask, scale, enable_gqa)
    return _empty_rows(out, query, key, value, attn_mask, None, scale, enable_gqa, empty_rows)


def _key_padded_causal(query, key, value, attn_mask, scale, enable_gqa):
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
                             enable_gqa=False, *, window: int, empty_rows=None):
    """``scaled_dot_product_attention(query, key, value, is_causal=True)`` with each query
    seeing only the last ``window`` keys (see the module docstring). Same arguments as
    SDPA (``dropout_p`` 0, ``is_causal`` True); ``attn_mask``, if given, is a [B, 1, 1, S]
    boolean key padding mask and-ed with the window (``empty_rows``: as
    :func:`key_padded_causal_attention`)."""
    out = _sliding_window(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window)
    if attn_mask is None:
        return out
    return _empty_rows(out, query, key, value, attn_mask, window, scale, enable_gqa, empty_rows)


def _sliding_window(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window):
    if dropout_p != 0.0 or not is_causal:
        raise ValueError("sliding_window_attention: no dropout, is_causal=True")
    if window < 1:
        raise ValueError(f"sliding_window_attention: window must be >= 1, got {window}")
    bias = None if attn_mask is None else _key_bias(attn_mask, query)
    s = query.shape[-2]
    if s <= window:
        if bias is not None:
            return key_padded_causal_attention(query, key, value, attn_mask, scale=scale, enable_gqa=enable_gqa)
        return _causal(query, key, value, scale, enable_gqa, None)
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


def _causal(q, k, v, scale, enable_gqa, window):
    """Causal attention over one document (windowed when it is longer than ``window``)."""
    if window is not None and q.shape[-2] > window:
        return sliding_window_attention(q, k, v, scale=scale, enable_gqa=enable_gqa, window=window)
    if q.device.type in ("cpu", "meta"):  # (meta: the memory model costs the fused kernel)
        return _attend(q, k, v, None, scale, enable_gqa, causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)


def _documents(ids: torch.Tensor) -> tuple[list, bool]:
    """The documents of one row of ids: ``(spans, contiguous)``. Contiguous: each id is
    one run and ``spans`` are its ``(start, stop)``; otherwise ``spans`` are the positions
    (a LongTensor) of each distinct id, in increasing order."""
    s = ids.numel()
    starts = (torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist()  # one host sync
    bounds = [0] + starts + [s]
    runs = list(zip(bounds[:-1], bounds[1:]))
    if len(runs) == 1 or torch.unique(ids).numel() == len(runs):
        return runs, True
    return [torch.nonzero(ids == u).flatten() for u in torch.unique(ids)], False


def document_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                       enable_gqa=False, *, window: int | None = None):
    """Causal attention within documents: ``attn_mask`` is a [B, 1, 1, S] (or [1, 1, 1, S])
    integer tensor of document ids and query ``i`` of row ``b`` sees key ``j`` only if
    ``j <= i`` (and ``i - j < window`` with a window) and ``attn_mask[b, 0, 0, i] ==
    attn_mask[b, 0, 0, j]``. Same result as SDPA with the [B, 1, S, S] mask that
    describes, in O(S) bytes (module docstring). A document need not be contiguous (its
    positions are gathered), except with a window.

    On the meta device (the memory model) the ids have no values: it runs as one
    document, which keeps the same bytes for backward as any split into documents."""
    if dropout_p != 0.0 or not is_causal:
        raise ValueError("document_attention: no dropout, is_causal=True")
    if attn_mask is None or attn_mask.dim() != 4 or attn_mask.shape[1] != 1 or attn_mask.shape[2] != 1 \
            or attn_mask.shape[-1] != query.shape[-2] or attn_mask.dtype.is_floating_point or attn_mask.dtype == torch.bool:
        raise ValueError(f"document_attention: document ids are an integer [B, 1, 1, S] tensor with S = "
                         f"{query.shape[-2]}, got {None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)}")
    if window is not None and window < 1:
        raise ValueError(f"document_attention: window must be >= 1, got {window}")
    if query.device.type == "meta":
        return _causal(query, key, value, scale, enable_gqa, window)
    ids = attn_mask[:, 0, 0, :]
    same_rows = ids.shape[0] == 1 or bool((ids == ids[:1]).all())
    rows = [slice(None)] if same_rows else [slice(b, b + 1) for b in range(query.shape[0])]
    outs = []
    for row in rows:
        q, k, v = query[row], key[row], value[row]
        spans, contiguous = _documents(ids[0] if same_rows else ids[row][0])
        if contiguous:
            if len(spans) == 1:
                outs.append(_causal(q, k, v, scale, enable_gqa, window))
                continue
            outs.append(torch.cat([_causal(q[..., a:z, :], k[..., a:z, :], v[..., a:z, :], scale, enable_gqa, window)
                                   for a, z in spans], dim=-2))
            continue
        if window is not None:
            raise ValueError("document_attention: a sliding window over a document whose tokens are not "
                             "contiguous (its positions are not one run) is not supported")
        # Gathered in increasing order, "k <= q" within a document is causal in the gathered order.
        parts = [_causal(q.index_select(-2, p), k.index_select(-2, p), v.index_select(-2, p), scale, enable_gqa, None)
                 for p in spans]
        order = torch.cat(spans)
        outs.append(torch.cat(parts, dim=-2).index_select(-2, torch.argsort(order)))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
