"""FlexAttention as a front end: ``flex_attention`` traced as the attention it computes.

``torch.nn.attention.flex_attention`` takes its mask and score as Python functions of
``(b, h, q_idx, kv_idx)`` (``mask_mod``, ``score_mod``) and a ``BlockMask`` (the mask's
block sparsity, computed for one fixed length). Neither reaches torch-mlir: the
``BlockMask`` construction has data-dependent sizes, and ``flex_attention`` is a
higher-order op. While autosp exports a model (:func:`flex_as_dense`), both functions run
as what they compute instead:

* ``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)`` builds no block structure: it
  returns a :class:`BlockMask` whose ``mask_mod`` is the user's and whose block tensors are
  placeholders (one block), for any length, symbolic ones included;
* ``flex_attention(q, k, v, score_mod, block_mask, scale, enable_gqa)`` evaluates the mask
  and the score on index tensors (``b`` [B,1,1,1], ``h`` [1,H,1,1], ``q_idx`` [1,1,S,1],
  ``kv_idx`` [1,1,1,S]): the functions' formulas become ordinary aten ops (comparisons of
  ``arange``\\ s, lookups of document ids), which the compiler's mask algebra proves
  (``autosp-causal-mask``: causal, windows, documents) or keeps. Without a ``score_mod``
  the result is ``scaled_dot_product_attention`` with that boolean mask, which
  ``autosp-fuse-attention`` and the partition pass already shard; with one, the scores are
  written out (``q @ k^T * scale``, the score function, the mask, softmax, ``@ v``).

The swap is of the functions' code objects, so every reference sees it: a module's
``from ... import flex_attention``, torchtitan's ``torch.compile(flex_attention)`` class
attribute. Outside the export nothing changes: the compiled program contains no
flex_attention, and the user's eager model keeps FlexAttention.

A ``BlockMask`` built outside the model for one length (passed as an input) is refused by
:func:`check_inputs`, naming flex: its block tensors and its length are those of one
batch, and its ``mask_mod`` may read tensors captured from it.
"""
from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F

_MODULE = "torch.nn.attention.flex_attention"


def dense_flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                         return_lse=False, kernel_options=None, return_aux=None):
    """What ``flex_attention`` computes, as ordinary ops (see the module docstring); its
    log-sum-exp too where asked (``return_lse``, ``return_aux=AuxRequest(lse=True)``)."""
    want_lse = bool(return_lse or (return_aux is not None and getattr(return_aux, "lse", False)))
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise NotImplementedError("flex_attention with return_aux=AuxRequest(max_scores=True): autosp computes "
                                  "the output and the log-sum-exp only")
    b, hq, s_q, d = query.shape
    hkv, s_kv = key.shape[1], key.shape[-2]
    if enable_gqa and hkv != hq:
        key = key.repeat_interleave(hq // hkv, dim=1)
        value = value.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    device = query.device
    bi = torch.arange(b, device=device).view(b, 1, 1, 1)
    hi = torch.arange(hq, device=device).view(1, hq, 1, 1)
    qi = torch.arange(s_q, device=device).view(1, 1, s_q, 1)
    ki = torch.arange(s_kv, device=device).view(1, 1, 1, s_kv)
    fa = sys.modules[_MODULE]
    mask = None
    mask_mod = getattr(block_mask, "mask_mod", None) if block_mask is not None else None
    if mask_mod is not None and mask_mod is not fa.noop_mask:  # (flex's own "no mask")
        mask = mask_mod(bi, hi, qi, ki)
    identity = score_mod is None or score_mod is fa._identity
    if identity and not want_lse:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
        lse = None
    else:
        scores = torch.matmul(query, key.transpose(-2, -1)).float() * scale
        if not identity:
            scores = score_mod(scores, bi, hi, qi, ki)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(value.dtype), value)
        lse = torch.logsumexp(scores, dim=-1) if want_lse else None
    if return_aux is not None:
        return out, fa.AuxOutput(lse=lse, max_scores=None)
    return (out, lse) if return_lse else out


def placeholder_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, *args, **kwargs):
    """``create_block_mask`` while exporting: the user's ``mask_mod``, no block structure."""
    fa = sys.modules[_MODULE]
    device = device if device is not None else "cpu"
    b = 1 if B is None else B
    h = 1 if H is None else H
    ones = torch.ones(b, h, 1, dtype=torch.int32, device=device)
    zeros = torch.zeros(b, h, 1, 1, dtype=torch.int32, device=device)
    size = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    return fa.BlockMask(seq_lengths=(Q_LEN, KV_LEN), kv_num_blocks=ones, kv_indices=zeros,
                        full_kv_num_blocks=None, full_kv_indices=None, q_num_blocks=ones, q_indices=zeros,
                        full_q_num_blocks=None, full_q_indices=None, BLOCK_SIZE=size, mask_mod=mask_mod)


# Trampolines with the public functions' signatures and no free variables: their code
# objects replace flex_attention's and create_block_mask's (which have none either).
def _flex_trampoline(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                     return_lse=False, kernel_options=None, *, return_aux=None):
    return __import__("autosp.frontend.flex", fromlist=["flex"]).dense_flex_attention(
        query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options, return_aux)


def _mask_trampoline(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False,
                     separate_full_blocks=True, compute_dq_write_order=False, dq_kv_order=True):
    return __import__("autosp.frontend.flex", fromlist=["flex"]).placeholder_block_mask(
        mask_mod, B, H, Q_LEN, KV_LEN, device, BLOCK_SIZE)


@contextlib.contextmanager
def flex_as_dense() -> Iterator[None]:
    """While exporting: ``flex_attention`` and ``create_block_mask`` run as the attention
    and the mask they stand for (module docstring). A no-op where flex attention was
    never imported."""
    fa = sys.modules.get(_MODULE)
    if fa is None:
        yield
        return
    swaps = [(fa.flex_attention, _flex_trampoline), (fa.create_block_mask, _mask_trampoline)]
    saved = [(fn, fn.__code__, fn.__defaults__, fn.__kwdefaults__) for fn, _ in swaps]
    try:
        for fn, tramp in swaps:
            fn.__code__ = tramp.__code__
            fn.__defaults__ = tramp.__defaults__
            fn.__kwdefaults__ = tramp.__kwdefaults__
        yield
    finally:
        for fn, code, defaults, kwdefaults in saved:
            fn.__code__ = code
            fn.__defaults__ = defaults
            fn.__kwdefaults__ = kwdefaults


def is_block_mask(x) -> bool:
    fa = sys.modules.get(_MODULE)
    return fa is not None and isinstance(x, fa.BlockMask)


def check_inputs(leaves) -> None:
    """Refuse a ``BlockMask`` among a call's inputs (module docstring), naming flex."""
    fa = sys.modules.get(_MODULE)
    if fa is None:
        return
    for leaf in leaves:
        if isinstance(leaf, fa.BlockMask):
            raise ValueError(
                "flex_attention: a BlockMask built outside the model is an input of the call; it was built for one "
                f"length ({tuple(leaf.seq_lengths)}) and its mask_mod may read tensors captured from one batch, so "
                "autosp cannot compile it for every length. Build it inside forward from the call's inputs (e.g. "
                "torchtitan: model.get_attention_masks(positions) inside the model; autosp.titan does this), or pass "
                "document ids / positions and let the model build its mask")
