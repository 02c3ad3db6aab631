"""The CUDA branches' arithmetic, run on CPU against eager attention with the dense mask.

No GPU here, and the fake-CUDA harness (test_fake_cuda) checks only what CUDA's kernels
are handed and what they allocate, not what they compute. This file checks the rest: every
CUDA branch of ``autosp.runtime.attention`` and ``ring`` is taken on CPU tensors
(``on_cuda`` patched to True) with the three CUDA kernels replaced by float64 emulations
of their contracts:

- ``kernels.varlen``: FlashAttention-2's varlen forward (runs given by int32 cumulative
  lengths, causal aligned to the end of each run's keys, ``window`` as
  ``window_size_left = window - 1``, a query that sees no key gets zeros), asserting its
  input contract (int32 offsets that cover the packed tensors, the true longest runs,
  head dim last and contiguous, GQA by head groups);
- ``kernels.dense_lse`` / ``dense_lse_backward``: the flash and efficient kernels
  (output, log-sum-exp, and the gradients at a given output and log-sum-exp).

So the packing, the runs, the left/right padding launches, the empty-row rule and the
ring's merge are exact (1e-10 in float64) and a wrong run boundary, a missing launch or a
dropped window fails (negative controls). What only a GPU can show (the kernels'
own numerics, bf16) is bench/gpu_check.sh's job.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from autosp.runtime import attention, kernels, ring

TOL = 1e-10


# ----------------------------------------------------------------------------- emulations
class Emulated:
    """The CUDA kernels on CPU float64 (see the module docstring); counts each call."""

    def __init__(self, ignore_runs: bool = False, ignore_window: bool = False, own_lse: bool = False):
        self.calls: dict = {}
        self.ignore_runs, self.ignore_window = ignore_runs, ignore_window
        self.own_lse = own_lse  # control: the backward differentiates at the pair's own lse, not the given one

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, *, causal, scale, window=None):
        self._count("varlen")
        assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32, (cu_q.dtype, cu_k.dtype)
        assert q.dim() == 3 and k.dim() == 3 and q.shape[1] % k.shape[1] == 0, (q.shape, k.shape)
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1, "head dim contiguous"
        lq, lk = cu_q.diff().tolist(), cu_k.diff().tolist()
        assert len(lq) == len(lk) and cu_q[0] == 0 and cu_k[0] == 0, (cu_q, cu_k)
        assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0], "offsets cover the packed tensors"
        assert max_q == max(lq) and max_k == max(lk), ("the true longest runs", max_q, max(lq), max_k, max(lk))
        assert window is None or causal, "a window is causal"
        if self.ignore_runs:  # control: the runs' boundaries ignored (one run)
            lq, lk = [q.shape[0]], [k.shape[0]]
        g = q.shape[1] // k.shape[1]
        outs = []
        aq = ak = 0
        for nq, nk in zip(lq, lk):
            qs, ks, vs = q[aq:aq + nq], k[ak:ak + nk], v[ak:ak + nk]
            aq, ak = aq + nq, ak + nk
            i = torch.arange(nq)[:, None] + (nk - nq)  # bottom-right aligned
            j = torch.arange(nk)[None, :]
            keep = torch.ones(nq, nk, dtype=torch.bool)
            if causal:
                keep &= j <= i
            if window is not None and not self.ignore_window:
                keep &= j > i - window
            kk, vv = ks.repeat_interleave(g, 1), vs.repeat_interleave(g, 1)  # [nk, Hq, D]
            s = torch.einsum("qhd,khd->hqk", qs, kk) * scale_of(q, scale)
            s = s.masked_fill(~keep, float("-inf"))
            p = torch.softmax(s, -1).nan_to_num(0.0)  # a query that sees no key: zeros
            outs.append(torch.einsum("hqk,khd->qhd", p, vv))
        return torch.cat(outs) if outs else q.new_zeros(q.shape)

    def dense_lse(self, q, k, v, *, causal, scale, bias=None, dropout_p=0.0, kernel=None):
        kernel = kernel or kernels.choose_dense(q, bias)
        self._count(f"dense {kernel}")
        assert dropout_p == 0.0
        assert kernel in ("flash", "efficient"), kernel
        assert kernel == "efficient" or bias is None, "flash takes no mask"
        s = self._scores(q, k, causal, scale, bias)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
        return p @ _rep(v, q), lse, kernel

    def dense_lse_backward(self, dout, q, k, v, out, lse, *, causal, scale, bias=None, kernel):
        self._count(f"dense {kernel} backward")
        assert kernel in ("flash", "efficient"), kernel
        s = self._scores(q, k, causal, scale, bias)
        if self.own_lse:
            lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None])
        dv = p.transpose(-1, -2) @ dout
        ds = p * (dout @ _rep(v, q).transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
        dq = ds @ _rep(k, q) * scale_of(q, scale)
        dk = ds.transpose(-1, -2) @ q * scale_of(q, scale)
        g = q.shape[1] // k.shape[1]
        b, _, n, d = dk.shape
        return dq, dk.view(b, k.shape[1], g, n, d).sum(2), dv.view(b, k.shape[1], g, n, d).sum(2)

    @staticmethod
    def _scores(q, k, causal, scale, bias):
        s = q @ _rep(k, q).transpose(-1, -2) * scale_of(q, scale)
        if causal:
            lq, lk = q.shape[-2], k.shape[-2]
            s = s.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(), float("-inf"))
        return s if bias is None else s + bias


def scale_of(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _rep(t, q):
    g = q.shape[-3] // t.shape[-3]
    return t if g == 1 else t.repeat_interleave(g, dim=-3)


def _emulate(monkeypatch, emu: Emulated) -> Emulated:
    """CPU tensors take the CUDA branches, on ``emu``'s kernels; float64 counts as a dtype
    the fused kernels take (so the exact float64 comparison runs the fused paths)."""
    for module in (kernels, attention):
        monkeypatch.setattr(module, "on_cuda", lambda t: True)
    monkeypatch.setattr(kernels, "FLASH_DTYPES", kernels.FLASH_DTYPES + (torch.float64,))
    monkeypatch.setattr(kernels, "EFFICIENT_DTYPES", kernels.EFFICIENT_DTYPES + (torch.float64,))
    for name in ("varlen", "dense_lse", "dense_lse_backward"):
        monkeypatch.setattr(kernels, name, getattr(emu, name))
    kernels._WARNED.clear()
    return emu


@pytest.fixture
def cuda(monkeypatch):
    return _emulate(monkeypatch, Emulated())


# ----------------------------------------------------------------------------- reference
def _eager(q, k, v, allowed, empty_rows=None):
    """Eager softmax attention under the dense mask ``allowed`` [B, 1, S, S]; a query that
    sees no key: zeros (boolean SDPA), the mean of the values (``"mean"``), or the additive
    mask's uniform average with softmax's gradient (``"uniform"``)."""
    k, v = _rep(k, q), _rep(v, q)
    s = q @ k.transpose(-1, -2) * scale_of(q, None)
    low = torch.finfo(q.dtype).min
    if empty_rows == "uniform":
        p = torch.softmax(s + torch.where(allowed, 0.0, torch.tensor(low, dtype=q.dtype)), -1)
    elif empty_rows == "mean":
        p = torch.softmax(s.masked_fill(~allowed, low), -1)
    else:
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return p @ v


def _inputs(b=2, hq=4, hkv=2, s=40, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    return q, k, v


def _compare(fn, reference, q, k, v, tol=TOL):
    """fn's output and gradients (q, k, v) against reference's; returns the largest error."""
    out = fn(q, k, v)
    expected = reference(q, k, v)
    grad = torch.randn_like(expected)
    errs = [(out - expected).abs().max().item()]
    for a, e in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        errs.append((a - e).abs().max().item())
    return max(errs)


def _causal(s):
    i = torch.arange(s)
    return (i[None, :] <= i[:, None])[None, None]


def _padding(b, s, kind):
    pad = torch.ones(b, s, dtype=torch.bool)
    if kind in ("left", "both"):
        pad[1, :7] = False
    if kind in ("right", "both"):
        pad[0, -5:] = False
    if kind == "middle":
        pad[0, 10:14] = False
    if kind == "empty_row":
        pad[1, :] = False
    return pad


# ----------------------------------------------------------------------------- key padding
@pytest.mark.parametrize("padding", ["none", "left", "right", "both", "empty_row"])
@pytest.mark.parametrize("empty_rows", [None, "uniform", "mean"])
def test_key_padding_runs_varlen_and_matches_eager(cuda, padding, empty_rows, _fresh_seed):
    q, k, v = _inputs(seed=_fresh_seed)
    b, _, s, _ = q.shape
    pad = _padding(b, s, padding)
    allowed = _causal(s) & pad[:, None, None, :]
    err = _compare(lambda q, k, v: attention.key_padded_causal_attention(q, k, v, pad[:, None, None, :],
                                                                          enable_gqa=True, empty_rows=empty_rows),
                   lambda q, k, v: _eager(q, k, v, allowed, empty_rows), q, k, v)
    assert err <= TOL, (padding, empty_rows, err)
    # One launch for the visible tokens, a second for the queries after them (right padding).
    right = padding in ("right", "both")
    assert cuda.calls == {"varlen": 2 if right else 1}, cuda.calls


@pytest.mark.parametrize("padding", ["none", "left", "right", "both", "middle", "empty_row"])
@pytest.mark.parametrize("empty_rows", [None, "uniform"])
def test_bidirectional_key_padding_runs_one_varlen_launch_and_matches_eager(cuda, padding, empty_rows, _fresh_seed):
    """An encoder's key padding (no causality): every query of a row attends to the row's
    visible keys in one varlen launch; padding inside a row or an all-padded row falls
    back to the efficient kernel with the broadcast mask. Same answer as eager under the
    dense [B, 1, S, S] mask, on CUDA's branch (emulated) and on CPU."""
    q, k, v = _inputs(seed=_fresh_seed)
    b, _, s, _ = q.shape
    pad = _padding(b, s, padding)
    allowed = pad[:, None, None, :].expand(b, 1, s, s)

    def mine(q, k, v):
        return attention.key_padded_attention(q, k, v, pad[:, None, None, :], enable_gqa=True, empty_rows=empty_rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        err = _compare(mine, lambda q, k, v: _eager(q, k, v, allowed, empty_rows), q, k, v)
    assert err <= TOL, (padding, empty_rows, err)
    fallback = padding in ("middle", "empty_row")
    assert cuda.calls == ({"dense efficient": 1} if fallback else {"varlen": 1}), cuda.calls
    monkeypatch_cpu = pytest.MonkeyPatch()
    monkeypatch_cpu.setattr(attention, "on_cuda", lambda t: False)
    try:
        err = _compare(mine, lambda q, k, v: _eager(q, k, v, allowed, empty_rows), q, k, v)
    finally:
        monkeypatch_cpu.undo()
    assert err <= TOL, ("cpu", padding, empty_rows, err)


def test_negative_control_bidirectional_key_padding_without_run_boundaries_fails(monkeypatch, _fresh_seed):
    _emulate(monkeypatch, Emulated(ignore_runs=True))
    q, k, v = _inputs(seed=_fresh_seed)
    pad = _padding(2, 40, "both")
    err = _compare(lambda q, k, v: attention.key_padded_attention(q, k, v, pad[:, None, None, :], enable_gqa=True),
                   lambda q, k, v: _eager(q, k, v, pad[:, None, None, :].expand(2, 1, 40, 40)), q, k, v)
    assert err > 1e-3


def test_key_padding_inside_a_row_falls_back_to_the_efficient_kernel(cuda, _fresh_seed):
    q, k, v = _inputs(seed=_fresh_seed)
    pad = _padding(2, 40, "middle")
    allowed = _causal(40) & pad[:, None, None, :]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = _compare(lambda q, k, v: attention.key_padded_causal_attention(q, k, v, pad[:, None, None, :],
                                                                              enable_gqa=True),
                       lambda q, k, v: _eager(q, k, v, allowed), q, k, v)
    assert err <= TOL
    assert cuda.calls == {"dense efficient": 1}, cuda.calls  # (its backward: autograd through the emulation)
    assert any("key padding inside a row" in str(w.message) for w in caught)


def test_negative_control_key_padding_without_run_boundaries_fails(monkeypatch, _fresh_seed):
    _emulate(monkeypatch, Emulated(ignore_runs=True))
    q, k, v = _inputs(seed=_fresh_seed)
    pad = _padding(2, 40, "both")
    allowed = _causal(40) & pad[:, None, None, :]
    err = _compare(lambda q, k, v: attention.key_padded_causal_attention(q, k, v, pad[:, None, None, :],
                                                                          enable_gqa=True),
                   lambda q, k, v: _eager(q, k, v, allowed), q, k, v)
    assert err > 1e-3


# ----------------------------------------------------------------------------- windows
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_sliding_window_matches_eager(cuda, padding, _fresh_seed):
    q, k, v = _inputs(seed=_fresh_seed)
    b, _, s, _ = q.shape
    w = 6
    i = torch.arange(s)
    allowed = _causal(s) & (i[:, None] - i[None, :] < w)[None, None]
    mask = None
    if padding != "none":
        pad = _padding(b, s, padding)
        allowed = allowed & pad[:, None, None, :]
        mask = pad[:, None, None, :]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = _compare(lambda q, k, v: attention.sliding_window_attention(
            q, k, v, mask, enable_gqa=True, window=w, empty_rows=None if mask is None else "uniform"),
            lambda q, k, v: _eager(q, k, v, allowed, None if mask is None else "uniform"), q, k, v)
    assert err <= TOL, (padding, err)
    if padding == "right":  # the padded queries' windows are not one launch: the band blocks (warned)
        assert set(cuda.calls) <= {"dense efficient", "dense efficient backward", "dense flash",
                                   "dense flash backward"} and cuda.calls, cuda.calls
        assert any("sliding window with right padding" in str(m.message) for m in caught)
    else:
        assert cuda.calls == {"varlen": 1}, cuda.calls


def test_negative_control_window_dropped_fails(monkeypatch, _fresh_seed):
    _emulate(monkeypatch, Emulated(ignore_window=True))
    q, k, v = _inputs(seed=_fresh_seed)
    i = torch.arange(40)
    allowed = _causal(40) & (i[:, None] - i[None, :] < 6)[None, None]
    err = _compare(lambda q, k, v: attention.sliding_window_attention(q, k, v, enable_gqa=True, window=6),
                   lambda q, k, v: _eager(q, k, v, allowed), q, k, v)
    assert err > 1e-3


# ----------------------------------------------------------------------------- documents
@pytest.mark.parametrize("layout", ["contiguous", "one_per_row", "not_contiguous"])
def test_documents_one_varlen_launch_and_match_eager(cuda, layout, _fresh_seed):
    q, k, v = _inputs(seed=_fresh_seed)
    docs = {"contiguous": [[0] * 9 + [1] * 20 + [2] * 11, [0] * 3 + [1] * 37],
            "one_per_row": [[5] * 40, [5] * 40],
            "not_contiguous": [[0] * 9 + [1] * 20 + [0] * 11, [2] * 3 + [1] * 30 + [2] * 7]}[layout]
    docs = torch.tensor(docs)
    allowed = _causal(40) & (docs[:, None, :, None] == docs[:, None, None, :])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = _compare(lambda q, k, v: attention.document_attention(q, k, v, docs[:, None, None, :], enable_gqa=True),
                       lambda q, k, v: _eager(q, k, v, allowed), q, k, v)
    assert err <= TOL, (layout, err)
    if layout == "not_contiguous":
        assert "varlen" not in cuda.calls and any("not one run" in str(m.message) for m in caught)
    else:
        assert cuda.calls == {"varlen": 1}, cuda.calls


def test_negative_control_documents_without_run_boundaries_fail(monkeypatch, _fresh_seed):
    _emulate(monkeypatch, Emulated(ignore_runs=True))
    q, k, v = _inputs(seed=_fresh_seed)
    docs = torch.tensor([[0] * 9 + [1] * 20 + [2] * 11, [0] * 3 + [1] * 37])
    allowed = _causal(40) & (docs[:, None, :, None] == docs[:, None, None, :])
    err = _compare(lambda q, k, v: attention.document_attention(q, k, v, docs[:, None, None, :], enable_gqa=True),
                   lambda q, k, v: _eager(q, k, v, allowed), q, k, v)
    assert err > 1e-3


# ----------------------------------------------------------------------------- dense and ring
def test_plain_causal_sdpa_runs_flash(cuda, _fresh_seed):
    q, k, v = _inputs(seed=_fresh_seed)
    err = _compare(lambda q, k, v: attention.sdpa(q, k, v, is_causal=True, enable_gqa=True),
                   lambda q, k, v: _eager(q, k, v, _causal(40)), q, k, v)
    assert err <= TOL
    assert cuda.calls == {"dense flash": 1}, cuda.calls  # the backward: autograd through the emulation


@pytest.mark.parametrize("docs,window,pad", [(False, None, False), (True, None, False), (False, 5, False),
                                              (True, 5, False), (False, None, True), (False, 5, True)])
def test_ring_pairs_on_cuda_kernels_merge_exactly(cuda, docs, window, pad, _fresh_seed):
    """One ring rank holding the sequence as permuted pieces: full, diagonal and masked
    pairs run the CUDA kernels (forward and the explicit backward at the merged output and
    log-sum-exp) and match eager attention over the whole sequence (with key padding:
    left padding, so the first queries see no key and get zeros)."""
    s = 24
    pieces = [[(12, 24), (0, 5), (5, 12)]]
    q, k, v = _inputs(b=2, hq=4, hkv=2, s=s, seed=_fresh_seed)
    g = torch.Generator().manual_seed(_fresh_seed + 1)
    ids = torch.randint(0, 3, (2, s), generator=g).sort().values if docs else None
    i = torch.arange(s)
    allowed = _causal(s)
    if window is not None:
        allowed = allowed & (i[:, None] - i[None, :] < window)[None, None]
    if ids is not None:
        allowed = allowed & (ids[:, None, :, None] == ids[:, None, None, :])
    keep = None
    if pad:
        keep = torch.ones(2, s, dtype=torch.bool)
        keep[1, :7] = False
        allowed = allowed & keep[:, None, None, :]
    idx = torch.cat([torch.arange(a, z) for a, z in pieces[0]])
    local = [t.detach()[:, :, idx].clone().requires_grad_() for t in (q, k, v)]
    out = ring.ring_attention(*local, pieces=pieces, group="ring_r1", is_causal=True, doc_ids=ids, window=window,
                              key_padding=keep)
    expected = _eager(q, k, v, allowed)
    grad = torch.randn_like(expected)
    (out * grad[:, :, idx]).sum().backward()
    (expected * grad).sum().backward()
    assert (out - expected.detach()[:, :, idx]).abs().max() <= TOL
    for mine, full in zip(local, (q, k, v)):
        assert (mine.grad - full.grad[:, :, idx]).abs().max() <= TOL
    kernel = "efficient" if docs or window or pad else "flash"  # masked pairs: the efficient kernel with their mask
    # (random documents can leave one masked pair only: the others then see no key or every key)
    least = 1 if docs else 2
    assert cuda.calls.get(f"dense {kernel}", 0) >= least and cuda.calls.get(f"dense {kernel} backward", 0) >= least, \
        cuda.calls


def test_negative_control_ring_backward_at_each_pairs_own_lse_fails(monkeypatch, _fresh_seed):
    """The ring's backward must give each pair the merged log-sum-exp: differentiating a
    pair at its own is wrong (the control for the merge)."""
    _emulate(monkeypatch, Emulated(own_lse=True))
    pieces = [[(12, 24), (0, 5), (5, 12)]]
    q, k, v = _inputs(b=1, hq=2, hkv=2, s=24, seed=_fresh_seed)
    idx = torch.cat([torch.arange(a, z) for a, z in pieces[0]])
    local = [t.detach()[:, :, idx].clone().requires_grad_() for t in (q, k, v)]
    ring.ring_attention(*local, pieces=pieces, group="ring_r1", is_causal=True).sum().backward()
    _eager(q, k, v, _causal(24)).sum().backward()
    assert (local[0].grad - q.grad[:, :, idx]).abs().max() > 1e-3


def test_emulated_kernels_hold_the_varlen_contract():
    emu = Emulated()
    q = torch.randn(10, 2, 8, dtype=torch.float64)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    emu.varlen(q, q, q, cu, cu, 6, 6, causal=True, scale=None)
    with pytest.raises(AssertionError, match="true longest"):
        emu.varlen(q, q, q, cu, cu, 10, 10, causal=True, scale=None)
    with pytest.raises(AssertionError):
        emu.varlen(q, q, q, cu.long(), cu.long(), 6, 6, causal=True, scale=None)
    ref = F.scaled_dot_product_attention(q[:4].transpose(0, 1), q[:4].transpose(0, 1), q[:4].transpose(0, 1),
                                         is_causal=True).transpose(0, 1)
    assert (emu.varlen(q, q, q, cu, cu, 6, 6, causal=True, scale=None)[:4] - ref).abs().max() < 1e-12
