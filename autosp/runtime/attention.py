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
fused kernel call with ``is_causal`` and the broadcast mask, O(S) bytes. On CUDA the
visible tokens of each row are packed and run through the varlen flash kernel in one
launch (left and right padding: each row's visible keys are one run), O(S) bytes.

:func:`document_attention` is causal attention (or a causal sliding window) within
documents: query ``i`` of row ``b`` sees key ``j`` only if ``docs[b, i] == docs[b, j]``
(transformers' packed sequences, whose mask it builds as [B, 1, S, S] from
``position_ids``). Each document runs on its own as a fused causal kernel over its slice
of the sequence (variable-length attention, as flash attention's ``cu_seqlens`` does), so
neither the forward nor the backward ever holds more than one document's outputs and
log-sum-exp: O(S) bytes. On CUDA every document of every row is one run of the varlen
flash kernel: one launch per call.

**CUDA.** Every CUDA call names its kernel (:mod:`autosp.runtime.kernels`): flash, the
varlen flash kernel, or the memory-efficient kernel with a broadcast (stride-0) mask; the
S x S scores are never built. Where a kernel refuses the inputs (dtype, head dim, a
padding pattern it cannot express) the call falls back and warns once with the cost.

Example::

    >>> out = sliding_window_attention(q, k, v, is_causal=True, window=4096)   # q: [B, H, S, D]
    >>> out = key_padded_causal_attention(q, k, v, pad[:, None, None, :], is_causal=True)
    >>> out = document_attention(q, k, v, doc_ids[:, None, None, :], is_causal=True)
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from autosp.ir.contract import EmptyRows
from autosp.runtime import kernels
from autosp.runtime.kernels import has_values, on_cuda


def _band(rows: int, cols: int, offset: int, window: int, like: torch.Tensor) -> torch.Tensor:
    """Additive mask [rows, cols]: 0 where query ``offset + i`` may see key ``j``
    (``0 <= offset + i - j < window``), -inf elsewhere."""
    d = torch.arange(rows, device=like.device)[:, None] + offset - torch.arange(cols, device=like.device)[None, :]
    allowed = (d >= 0) & (d < window)
    return torch.where(allowed, 0.0, float("-inf")).to(like.dtype)


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` as compiled programs call it: on CPU exactly that
    (on meta, the fused CPU kernel the memory model costs); on CUDA the kernel named by
    :func:`autosp.runtime.kernels.dense` (flash; with a mask the efficient kernel)."""
    if on_cuda(query):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # the kernels take an additive mask
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
        return kernels.dense(query, key, value, causal=is_causal, scale=scale, bias=attn_mask, dropout_p=dropout_p)
    if query.device.type == "meta" and value.shape[-1] == query.shape[-1]:  # (the fused kernel: one head dim)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _attend(q, k, v, mask, scale, enable_gqa, causal: bool = False):
    if on_cuda(q):
        return kernels.dense(q, k, v, causal=causal, scale=scale, bias=mask)
    if q.device.type in ("cpu", "meta") and v.shape[-1] == q.shape[-1]:
        # The fused CPU kernel: keeps the output and log-sum-exp for backward, not the scores;
        # with GQA it reads each shared KV head (no repeated copies). It takes one head dim
        # for q, k and v (MLA's narrower v: SDPA chooses).
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
    out = sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
               enable_gqa=enable_gqa)
    if empty_rows is None or attn_mask is None:
        return out
    empty = ~attn_mask.any(dim=-1, keepdim=True)
    return _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows)


def _empty_rows(out, query, key, value, key_padding, window, scale, enable_gqa, empty_rows, causal: bool = True):
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
    if not causal:  # every query of a row sees the row's visible keys: empty only if there are none
        visible = key_padding[:, 0, 0, :].to(torch.int32).sum(-1)  # [B]
        empty = (visible == 0)[:, None, None, None].expand(-1, 1, query.shape[-2], 1)
        return _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows)
    seen = torch.cumsum(key_padding[:, 0, 0, :].to(torch.int32), dim=-1)  # visible keys at or before q
    if window is not None and window < seen.shape[-1]:
        seen = seen - torch.nn.functional.pad(seen, (window, 0))[..., :seen.shape[-1]]
    empty = (seen == 0)[:, None, :, None]  # [B, 1, S, 1]
    return _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows)


def _replace_empty(out, query, key, value, empty, scale, enable_gqa, empty_rows):
    """``out`` where ``empty`` ([B, 1|H, S, 1]) is False; elsewhere eager's answer for a row
    masked everywhere: "mean" (masked_fill: the mean of the values, gradient to the values
    only) or "uniform" (additive mask: the same value, gradient through the scores)."""
    if empty_rows not in tuple(EmptyRows):
        raise ValueError(f"empty_rows must be None, 'mean' or 'uniform', got {empty_rows!r}")
    if has_values(out) and not bool(empty.any()):
        return out
    if enable_gqa and value.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // value.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    if empty_rows == EmptyRows.MEAN:
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


def key_padded_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False, empty_rows=None):
    """Attention under a [B, 1, 1, S] boolean key padding mask (key ``j`` of batch ``b``
    visible only if ``attn_mask[b, 0, 0, j]``), causal or not (an encoder's mask, BERT's
    [B, 1, S, S] from transformers' masking utilities, proven key padding alone), with
    O(S) bytes. ``empty_rows`` as :func:`key_padded_causal_attention`."""
    if is_causal:
        return key_padded_causal_attention(query, key, value, attn_mask, dropout_p, True, scale, enable_gqa,
                                           empty_rows)
    if attn_mask is None or dropout_p != 0.0:
        raise ValueError("key_padded_attention: a key padding mask, no dropout")
    if on_cuda(query):
        out = _key_padded_cuda_bidirectional(query, key, value, attn_mask, scale)
    else:  # the fused CPU kernel with the broadcast [B, 1, 1, S] mask (kept for backward: O(S))
        out = _attend(query, key, value, _key_bias(attn_mask, query), scale, enable_gqa)
    return _empty_rows(out, query, key, value, attn_mask, None, scale, enable_gqa, empty_rows, causal=False)


def _key_padded_cuda_bidirectional(query, key, value, attn_mask, scale):
    """Key padding without causality on CUDA: every query of a row attends to the row's
    visible keys, packed, in one varlen flash launch (queries: whole rows; keys: the
    visible runs). Padding inside a row, or dtypes flash refuses, fall back to the
    efficient kernel with the broadcast mask (warned)."""
    b, _, s, _ = query.shape
    runs = _visible_runs(attn_mask)
    why = kernels.flash_ok(query, value) or (None if runs is not None else
                                      "key padding inside a row (not only left or right padding)")
    if why is None and any(z == a for a, z in runs or []):
        why = "a row with every key padded (its queries see nothing)"
    if why is not None:
        kernels.fallback("key padding attention", why,
                         "the memory-efficient kernel runs with the broadcast [B, 1, 1, S] mask (O(S) bytes; with "
                         "GQA the keys and values are repeated per query head)")
        return kernels.dense(query, key, value, causal=False, scale=scale, bias=_key_bias(attn_mask, query))
    assert runs is not None
    qp, kp, vp = kernels.pack(query), kernels.pack(key), kernels.pack(value)
    dev = query.device
    lengths = [z - a for a, z in runs]
    idx = torch.cat([torch.arange(r * s + a, r * s + z, device=dev) for r, (a, z) in enumerate(runs)])
    cu_q, cu_k = kernels.cumulative([s] * b, dev), kernels.cumulative(lengths, dev)
    out = kernels.varlen(qp, kp.index_select(0, idx), vp.index_select(0, idx), cu_q, cu_k, s, max(lengths),
                         causal=False, scale=scale)
    return kernels.unpack(out, b, s)


def _key_padded_causal(query, key, value, attn_mask, scale, enable_gqa):
    if on_cuda(query):
        return _key_padded_cuda(query, key, value, attn_mask, scale, None)
    bias = _key_bias(attn_mask, query)
    # The fused CPU kernel takes is_causal and a broadcast mask together, and keeps
    # the [B, 1, 1, S] mask for backward (never S x S).
    return _attend(query, key, value, bias, scale, enable_gqa, causal=True)


def _visible_runs(key_padding: torch.Tensor) -> list[tuple[int, int]] | None:
    """Each row's visible keys as one run ``(start, stop)`` (``(0, 0)``: none), or None
    when some row's visible keys are not one run (padding inside the row). One host sync;
    without values (meta, fake) every key is visible: the trainer's all-ones mask."""
    b, s = key_padding.shape[0], key_padding.shape[-1]
    if not has_values(key_padding):
        return [(0, s)] * b
    m = key_padding.reshape(b, s)
    rises = (m[:, 1:] & ~m[:, :-1]).sum(-1) + m[:, 0].long()
    first = m.to(torch.int8).argmax(-1)
    stats = torch.stack([first, m.sum(-1), rises], dim=1).tolist()
    if any(r > 1 for _, _, r in stats):
        return None
    return [(a, a + n) if n else (0, 0) for a, n, _ in stats]


def _key_padded_cuda(query, key, value, attn_mask, scale, window):
    """Causal (or windowed) attention under a [B, 1, 1, S] key padding mask on CUDA: each
    row's visible tokens are packed and attend causally in one varlen flash launch; the
    queries after them (right padding) see all of them, in a second launch over the same
    packed keys; the queries before them (left padding) see nothing (zeros, then the
    ``empty_rows`` rule). Padding inside a row, or dtypes flash refuses, fall back to the
    efficient kernel with the broadcast mask (warned)."""
    b, _, s, _ = query.shape
    runs = _visible_runs(attn_mask)
    why = kernels.flash_ok(query, value)
    trailing = runs is not None and any(0 < z < s for _, z in runs)
    if why is None and runs is not None and window is not None and trailing:
        why = "a sliding window with right padding (the padded queries' windows are not one varlen launch)"
    elif why is None and runs is None:
        why = "key padding inside a row (not only left or right padding)"
    if why is not None:
        kernels.fallback("key padding attention", why,
                         "the memory-efficient kernel runs with the broadcast [B, 1, 1, S] mask (O(S) bytes; with "
                         "GQA the keys and values are repeated per query head)" if window is None else
                         "blocks of the efficient kernel with a band mask run instead (O(S x window) bytes)")
        if window is not None:
            return _sliding_window(query, key, value, attn_mask, 0.0, True, scale, False, window, cuda_fallback=True)
        return kernels.dense(query, key, value, causal=True, scale=scale, bias=_key_bias(attn_mask, query))
    assert runs is not None  # (None fell back above)
    qp, kp, vp = kernels.pack(query), kernels.pack(key), kernels.pack(value)
    lengths = [z - a for a, z in runs]
    dev = query.device
    if all(n == s for n in lengths):  # no padding: the rows themselves are the runs
        cu = kernels.cumulative(lengths, dev)
        out = kernels.varlen(qp, kp, vp, cu, cu, s, s, causal=True, scale=scale, window=window)
        return kernels.unpack(out, b, s)
    idx = torch.cat([torch.arange(r * s + a, r * s + z, device=dev) for r, (a, z) in enumerate(runs)])
    kv_k, kv_v = kp.index_select(0, idx), vp.index_select(0, idx)
    cu = kernels.cumulative(lengths, dev)
    longest = max(lengths)
    out = qp.new_zeros(qp.shape)
    if longest:
        seen = kernels.varlen(qp.index_select(0, idx), kv_k, kv_v, cu, cu, longest, longest, causal=True,
                              scale=scale, window=window)
        out = out.index_copy(0, idx, seen)
    after = [s - z if z > 0 else 0 for _, z in runs]  # right padding: queries after the row's last key
    if any(after):
        t_idx = torch.cat([torch.arange(r * s + z, (r + 1) * s, device=dev) for r, (_, z) in enumerate(runs)
                           if after[r]])
        cu_q = kernels.cumulative(after, dev)
        late = kernels.varlen(qp.index_select(0, t_idx), kv_k, kv_v, cu_q, cu, max(after), longest, causal=False,
                              scale=scale)
        out = out.index_copy(0, t_idx, late)
    return kernels.unpack(out, b, s)


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


def _sliding_window(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, window,
                    cuda_fallback: bool = False):
    if dropout_p != 0.0 or not is_causal:
        raise ValueError("sliding_window_attention: no dropout, is_causal=True")
    if window < 1:
        raise ValueError(f"sliding_window_attention: window must be >= 1, got {window}")
    bias = None if attn_mask is None else _key_bias(attn_mask, query)
    s = query.shape[-2]
    if on_cuda(query) and s > window and not cuda_fallback:
        if attn_mask is not None:  # (falls back to the blocks below where varlen cannot express it)
            return _key_padded_cuda(query, key, value, attn_mask, scale, window)
        why = kernels.flash_ok(query, value)
        if why is None:  # every row one run of the varlen kernel, with the window
            b = query.shape[0]
            cu = kernels.cumulative([s] * b, query.device)
            out = kernels.varlen(kernels.pack(query), kernels.pack(key), kernels.pack(value), cu, cu, s, s,
                                 causal=True, scale=scale, window=window)
            return kernels.unpack(out, b, s)
        kernels.fallback("sliding window attention", why, "blocks of the efficient kernel with a band mask run "
                         "instead (O(S x window) bytes)")
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
    # CPU and meta: the fused CPU kernel (the memory model costs it); CUDA: flash (kernels.dense)
    return _attend(q, k, v, None, scale, enable_gqa, causal=True)


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


def _documents_cuda(query, key, value, attn_mask, scale, window):
    """Every document of every row as one run of the varlen flash kernel (one launch, two
    host syncs for the runs), or None where that kernel cannot run it (warned)."""
    b, _, s, _ = query.shape
    why = kernels.flash_ok(query, value)
    lengths = [s] * b  # without values (meta, fake): one document per row
    ids = attn_mask[:, 0, 0, :].expand(b, s)
    if why is None and has_values(ids):
        first = torch.ones(b, 1, dtype=torch.bool, device=ids.device)
        starts = torch.nonzero(torch.cat([first, ids[:, 1:] != ids[:, :-1]], dim=1).reshape(-1)).flatten()
        ordered = ids.sort(dim=-1).values
        distinct = (ordered[:, 1:] != ordered[:, :-1]).sum() + b
        found = torch.cat([starts, distinct.view(1)]).tolist()
        starts, distinct = found[:-1], found[-1]
        if distinct != len(starts):
            why = "a document whose tokens are not one run"
        bounds = starts + [b * s]
        lengths = [z - a for a, z in zip(bounds[:-1], bounds[1:])]
    if why is not None:
        kernels.fallback("document attention", why, "one attention launch per document")
        return None
    cu = kernels.cumulative(lengths, query.device)
    longest = max(lengths)
    out = kernels.varlen(kernels.pack(query), kernels.pack(key), kernels.pack(value), cu, cu, longest, longest,
                         causal=True, scale=scale, window=window)
    return kernels.unpack(out, b, s)


def document_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None,
                       enable_gqa=False, *, window: int | None = None):
    """Causal attention within documents: ``attn_mask`` is a [B, 1, 1, S] (or [1, 1, 1, S])
    integer tensor of document ids and query ``i`` of row ``b`` sees key ``j`` only if
    ``j <= i`` (and ``i - j < window`` with a window) and ``attn_mask[b, 0, 0, i] ==
    attn_mask[b, 0, 0, j]``. Same result as SDPA with the [B, 1, S, S] mask that
    describes, in O(S) bytes (module docstring). A document need not be contiguous (its
    positions are gathered), except with a window.

    On CUDA every document of every row is one run of one varlen flash launch (a
    document that is not one run, or a dtype flash refuses, falls back to one launch per
    document, warned). On the meta device (the memory model) the ids have no values: it
    runs as one document per row, which keeps the same bytes as any split into documents."""
    if dropout_p != 0.0 or not is_causal:
        raise ValueError("document_attention: no dropout, is_causal=True")
    if attn_mask is None or attn_mask.dim() != 4 or attn_mask.shape[1] != 1 or attn_mask.shape[2] != 1 \
            or attn_mask.shape[-1] != query.shape[-2] or attn_mask.dtype.is_floating_point or attn_mask.dtype == torch.bool:
        raise ValueError(f"document_attention: document ids are an integer [B, 1, 1, S] tensor with S = "
                         f"{query.shape[-2]}, got {None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)}")
    if window is not None and window < 1:
        raise ValueError(f"document_attention: window must be >= 1, got {window}")
    if on_cuda(query):
        out = _documents_cuda(query, key, value, attn_mask, scale, window)
        if out is not None:
            return out
    if not has_values(attn_mask):
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


def key_bias_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, bias=None, *, key_padding: bool = False, documents: bool = False,
                       window: int | None = None, empty_rows=None):
    """Softmax attention with an additive ``bias`` that depends on the key alone
    (``[B|1, H|1, 1, S|1]``: ALiBi as MPT and BLOOM write it), under SDPA's other
    arguments as ``autosp-causal-mask`` left them (``attn_mask``: None, a [B, 1, 1, S] key
    padding with ``key_padding``, document ids with ``documents``, or a kept mask).

    Causal or bidirectional, with or without key padding: one fused kernel with the bias
    broadcast over the queries (stride 0), which keeps only its output, log-sum-exp and
    the broadcast bias for backward: O(S) bytes. On CPU the fused CPU kernel (it takes
    ``is_causal`` and the mask together); on CUDA :func:`autosp.runtime.kernels.dense`
    (the memory-efficient kernel, the bias expanded without a copy). Documents, a window
    or a kept mask build the [B, H, S, S] additive mask and run SDPA on it: correct, at the
    S x S cost, warned once; so does a bias that requires grad (a learned one: the fused
    kernels differentiate q, k and v only). ``empty_rows`` as :func:`key_padded_causal_attention`."""
    if bias is None:
        raise ValueError("key_bias_attention: a bias is required")
    if dropout_p != 0.0:
        raise ValueError("key_bias_attention: no dropout")
    if bias.dim() != 4 or bias.shape[2] != 1:
        raise ValueError(f"key_bias_attention: the bias is [B|1, H|1, 1, S|1], got {tuple(bias.shape)}")
    if bias.is_floating_point() and torch.finfo(bias.dtype).bits > torch.finfo(query.dtype).bits:
        # A wider bias (MPT's fp32 ALiBi over bf16 scores: eager adds it in fp32): the kernel runs
        # in the bias's dtype, as rounding the bias would lose its far keys' differences.
        q, k, v = (t.to(bias.dtype) for t in (query, key, value))
        mask = attn_mask.to(bias.dtype) if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
        return key_bias_attention(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, bias,
                                  key_padding=key_padding, documents=documents, window=window,
                                  empty_rows=empty_rows).to(query.dtype)
    bias = bias.to(query.dtype)
    if not documents and window is None and (attn_mask is None or key_padding) and not bias.requires_grad:
        mask = bias if attn_mask is None else bias + _key_bias(attn_mask, query)
        out = _attend(query, key, value, mask, scale, enable_gqa, causal=bool(is_causal))
        if attn_mask is None:
            return out
        return _empty_rows(out, query, key, value, attn_mask, None, scale, enable_gqa, empty_rows,
                           causal=bool(is_causal))
    warnings.warn("autosp: key bias attention whose mask is documents, a window or a kept mask, or whose bias is "
                  "learned (the fused kernels give no gradient to it), builds the [B, H, S, S] additive mask "
                  "(O(S^2) bytes)", RuntimeWarning, stacklevel=2)
    s = query.shape[-2]
    allowed = None
    if documents:
        ids = attn_mask[:, :, 0, :]  # [B, 1, S]
        allowed = ids[..., :, None] == ids[..., None, :]
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask
    if is_causal or window is not None:
        d = torch.arange(s, device=query.device)[:, None] - torch.arange(s, device=query.device)[None, :]
        band = (d >= 0) & (d < window) if window is not None else d >= 0
        allowed = band if allowed is None else allowed & band
    full = bias
    if allowed is not None:
        full = full + torch.where(allowed, 0.0, float("-inf")).to(query.dtype)
    if attn_mask is not None and attn_mask.dtype != torch.bool and not documents:
        full = full + attn_mask.to(query.dtype)
    out = sdpa(query, key, value, attn_mask=full, scale=scale, enable_gqa=enable_gqa)
    if empty_rows is None or allowed is None:
        return out
    return _replace_empty(out, query, key, value, ~allowed.any(dim=-1, keepdim=True), scale, enable_gqa, empty_rows)


def sink_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                   sinks=None, *, window: int | None = None, documents: bool = False, key_padding: bool = False,
                   heads_group: str | None = None):
    """Softmax attention with per-head sink logits in the denominator (gpt-oss): for head
    h, ``softmax([scores, sinks[h]])`` with the sink's column dropped before ``@ v``.
    SDPA's arguments (``attn_mask`` as ``autosp-causal-mask`` left it: None, a [B, 1, 1, S]
    key padding with ``key_padding``, document ids with ``documents``, or a kept mask) and
    the full ``[H]`` ``sinks``; inside Ulysses attention (``heads_group``) this rank holds
    heads ``[r * H/P, (r + 1) * H/P)`` of the group and reads that chunk of the sinks.

    Proven masks run as :func:`autosp.runtime.ring.local_attention` (fused kernels, the
    sinks folded into the log-sum-exp, O(S) bytes). A query that sees no key gets zeros,
    which is eager's answer too: its masked scores are swamped by the sink. A kept mask
    runs the math form (its [S, S] scores: the mask is [S, S] already)."""
    from autosp.runtime import ring
    if sinks is None:
        raise ValueError("sink_attention: sinks are required")
    if dropout_p != 0.0:
        raise ValueError("sink_attention: no dropout")
    heads = query.shape[1]
    if key.shape[1] != heads and not enable_gqa:
        raise ValueError(f"sink_attention: {heads} query heads and {key.shape[1]} key heads without enable_gqa")
    sinks = heads_chunk(sinks, heads, heads_group)
    if attn_mask is not None and not (documents or key_padding):
        return _sink_math(query, key, value, attn_mask, is_causal, scale, sinks)
    rows = None if attn_mask is None else attn_mask.reshape(attn_mask.shape[0], attn_mask.shape[-1])
    return ring.local_attention(query, key, value, is_causal=bool(is_causal), scale=scale,
                                doc_ids=rows if documents else None, window=window,
                                key_padding=rows if key_padding else None, sinks=sinks)


def heads_chunk(sinks: torch.Tensor, heads: int, group: str | None) -> torch.Tensor:
    """The sinks of this rank's ``heads`` query heads: all of ``sinks`` where it has that
    many, else (inside Ulysses attention on ``group``) the chunk ``[r * heads, (r + 1) *
    heads)`` of group rank r, as the all-to-all split the heads."""
    if sinks.shape[0] == heads:
        return sinks
    from autosp.runtime import collectives
    if group is None or sinks.shape[0] != heads * collectives.group_size(group):
        raise ValueError(f"attention sinks: {sinks.shape[0]} sinks for {heads} query heads"
                         + ("" if group is None else f" on each of the {collectives.group_size(group)} ranks of {group}"))
    return sinks.narrow(0, collectives.group_rank(group) * heads, heads)


def _sink_math(query, key, value, mask, is_causal, scale, sinks):
    """Sink attention written out, under a kept (arbitrary) mask: what eager computes."""
    s = query.shape[-2]
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if key.shape[1] != query.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    scores = (query @ key.transpose(-1, -2)) * scale
    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(scores.dtype)
    scores = scores + mask
    if is_causal:
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=query.device).tril(), float("-inf"))
    column = sinks.reshape(1, -1, 1, 1).expand(scores.shape[0], -1, s, 1).to(scores.dtype)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return probs @ value
