"""Exact ring attention over a sequence sharded in arbitrary pieces (forward and backward).

:func:`ring_attention` computes, for this rank's query rows, exactly what
``F.scaled_dot_product_attention`` computes on the whole sequence under the mask

    query ``i`` sees key ``j``  iff  (not is_causal or j <= i)
                                     and (window is None or i - j < window)
                                     and (doc_ids is None or doc_ids[b, i] == doc_ids[b, j])
                                     and (key_padding is None or key_padding[b, j])

(positions are absolute), while each rank only ever holds its own queries and one other
rank's keys/values at a time. The ``R`` ranks of the group form a ring: rank ``r`` sends
to ``r + 1`` and receives from ``r - 1`` (mod R).

**Layout.** ``pieces[s]`` lists the ``(start, end)`` position ranges held by ring rank
``s``, in the order they are concatenated along dim -2 of its tensors; together the
ranges of all ranks partition ``[0, S)``. Contiguous chunks, zigzag (rank i holds chunks
i and 2R-1-i, which balances causal work), uneven and empty pieces are all fine: every
mask decision is made from these intervals.

**Schedule.**

- Forward, R steps: at step ``t`` this rank holds the K/V of ring rank ``(r - t) % R``.
  Before computing with it, it posts the exchange of that block (K and V packed in one
  buffer ``[2, B, Hkv, L_s, D]``: one send to ``r + 1``, one receive from ``r - 1``), so
  the transfer overlaps the compute; R - 1 hops in all. Only the KV heads travel (GQA and
  MQA keys are never repeated).
- Backward, R steps over the same ring: K/V circulate again (R - 1 hops, posted before
  each step's compute), and each block's dK/dV accumulator (one packed buffer ``[2, B,
  Hkv, L_s, D]`` in the accumulation dtype: fp32, fp64 for fp64 inputs) travels *with*
  its block: after computing its contribution a rank adds the accumulator that arrived
  from ``r - 1`` (received while it computed) and passes the sum to ``r + 1``. After the
  R-th hop every rank holds the complete dK/dV of its own K/V. dQ accumulates locally.

Per block, every (query piece, key piece) pair is classified from the intervals: *skip*
(no key visible), *full* (every key visible: no mask), *diagonal* (same range, causal,
no window, documents or padding: the kernel's own causal mode) or *masked* (an additive
mask built from positions, document ids and key padding). With documents or padding, a
pair whose mask is all False (or all True) is skipped (or run unmasked) where that costs
no device sync (CPU). Pair
results are merged with their log-sum-exp in the accumulation dtype (rows that see no key
yet have lse = -inf and contribute nothing).

**Kernels.** On CPU (and on the meta device) the fused flash kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` (which returns the log-sum-exp and
reads shared KV heads natively) and its backward, called with the *final* merged output
and lse, which gives each block's exact share of the gradient. On CUDA (and on meta under
``kernels.target("cuda")``) the same with CUDA's kernels, named explicitly
(:mod:`autosp.runtime.kernels`): full and diagonal pairs run the flash kernel
(``aten._scaled_dot_product_flash_attention`` and its backward; GQA native), masked pairs
(windows, documents) the memory-efficient kernel with the pair's mask broadcast over the
heads; dtypes or head dims a kernel refuses fall to the next one (warned once). The last
resort is a plain math path in the accumulation dtype (scores, masked log-sum-exp,
softmax @ V; backward dS = P * (dP - rowsum(dO * O))), for fp64 on CUDA; inside
``with force_math():`` it runs everywhere (tests: the path a GPU takes for fp64, and
negative controls).

**Memory.** Saved for backward: q, k, v (local), the output and the lse: O(L), not O(S)
(``doc_ids`` and ``key_padding``, the caller's replicated tensors, are referenced, not copied). Transient: two
K/V blocks (the current one, being sent, and the arriving one), in backward also up to
three dK/dV accumulators (being sent, arriving, being computed), and one pair's mask (and,
on the math path, its scores) at a time.

**Simulation.** Under :class:`autosp.runtime.collectives.simulate` (the memory model, on
meta tensors) nothing is sent: each step allocates the buffer the receive would have
filled (``new_empty``, contents undefined) and computes with it, so shapes, saved tensors
and allocations are those of a real run.

**Counters.** :func:`stats` reads this process's ring traffic since :func:`reset_stats`:
sends posted and bytes sent, forward and backward (none under simulation).

Example::

    >>> # S = 10 on 2 ranks, zigzag: rank 0 holds [0, 3) and [8, 10), rank 1 holds [3, 8)
    >>> pieces = [[(0, 3), (8, 10)], [(3, 5), (5, 8)]]
    >>> out = ring_attention(q, k, v, pieces=pieces, group="autosp0", is_causal=True)
    >>> # q: [B, Hq, 5, D] on rank 0 (rows 0,1,2,8,9), k, v: [B, Hkv, 5, D]; out like q
    >>> reset_stats(); out.sum().backward(); stats()
    {'sends': 3, 'bytes': ...}
    >>> with force_math():          # the plain math path instead of the fused kernels
    ...     out = ring_attention(q, k, v, pieces=pieces, group="autosp0", is_causal=True)
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from autosp.runtime import collectives, kernels

_STATS = {"sends": 0, "bytes": 0}  # read with stats(), zeroed by reset_stats()
_FORCE_MATH = [False]  # force_math()'s stack, innermost last

_SKIP, _FULL, _DIAG, _MASK = "skip", "full", "diag", "mask"
_TAG_KV, _TAG_BWD_KV, _TAG_DKV = 0, 1, 2


def stats() -> dict[str, int]:
    """This process's ring traffic since :func:`reset_stats` (or the start): ``{"sends":
    sends posted, "bytes": bytes sent}``, forward and backward together. A copy.

    Example::

        >>> reset_stats(); ring_attention(q, k, v, pieces=pieces, group=g, is_causal=True); stats()
        {'sends': 1, 'bytes': 4096}
    """
    return dict(_STATS)


def reset_stats() -> None:
    """Zero the counters :func:`stats` reads."""
    _STATS["sends"] = 0
    _STATS["bytes"] = 0


@contextmanager
def force_math(enabled: bool = True):
    """Context manager: ring attention started inside it uses the plain math path
    (``enabled=False``: the kernels again, in a nested block). Read when a ring call starts;
    an eager call's backward keeps its forward's choice.

    Example::

        >>> with force_math():
        ...     out = ring_attention(q, k, v, pieces=pieces, group=g, is_causal=True)
    """
    _FORCE_MATH.append(bool(enabled))
    try:
        yield
    finally:
        _FORCE_MATH.pop()


def math_forced() -> bool:
    """Whether a :func:`force_math` block is active (innermost wins)."""
    return _FORCE_MATH[-1]


# ----------------------------------------------------------------------------- layout
def _layout(ranges) -> list[tuple[int, int, int]]:
    """``[(start, end, local_offset)]`` of one rank's pieces: empty pieces dropped, pieces
    adjacent both in position and in the local order merged (fewer kernel calls)."""
    out: list[list[int]] = []
    offset = 0
    for start, end in ranges:
        if end > start:
            if out and out[-1][1] == start:  # continues the previous piece, locally adjacent too
                out[-1][1] = end
            else:
                out.append([start, end, offset])
            offset += end - start
    return [(a, b, o) for a, b, o in out]


def _check_pieces(pieces, ranks: int) -> tuple[list[list[tuple[int, int]]], int]:
    """Normalised pieces and the sequence length S they cover; ValueError if they do not
    partition ``[0, S)``."""
    if not isinstance(pieces, (list, tuple)) or len(pieces) != ranks:
        n = len(pieces) if isinstance(pieces, (list, tuple)) else type(pieces).__name__
        raise ValueError(f"ring_attention: pieces must list the ranges of each of the {ranks} ring ranks, "
                         f"got {n} entries")
    norm = []
    for s, ranges in enumerate(pieces):
        rs = []
        for rng in ranges:
            try:
                a, b = (int(x) for x in rng)
            except (TypeError, ValueError):
                raise ValueError(f"ring_attention: pieces[{s}] holds {rng!r}, not a (start, end) pair") from None
            if a < 0 or b < a:
                raise ValueError(f"ring_attention: pieces[{s}] holds the range ({a}, {b}): need 0 <= start <= end")
            rs.append((a, b))
        norm.append(rs)
    spans = sorted((a, b) for rs in norm for a, b in rs if b > a)
    pos = 0
    for a, b in spans:
        if a != pos:
            what = "overlap" if a < pos else "leave a gap"
            raise ValueError(f"ring_attention: pieces {what} at position {min(a, pos)}; they must partition "
                             f"[0, S) (got {spans})")
        pos = b
    return norm, pos


# ----------------------------------------------------------------------------- masks
def _classify(qa: int, qb: int, ka: int, kb: int, causal: bool, window, data: bool) -> str:
    """What the pair (queries [qa, qb), keys [ka, kb)) needs, from the intervals alone
    (``data``: documents or key padding make the mask depend on input data too)."""
    if causal and ka >= qb:  # every key after every query
        return _SKIP
    if window is not None and qa - (kb - 1) >= window:  # every key too far back
        return _SKIP
    if data:
        return _MASK
    full = (not causal or kb - 1 <= qa) and (window is None or (qb - 1) - ka < window)
    if full:
        return _FULL
    if causal and window is None and (qa, qb) == (ka, kb):
        return _DIAG
    return _MASK


def _visible(qa, qb, ka, kb, causal, window, docs, keep, device) -> torch.Tensor:
    """Boolean ``[Bd or 1, 1, qb - qa, kb - ka]``: which keys each query sees."""
    vis = torch.ones(qb - qa, kb - ka, dtype=torch.bool, device=device)
    if causal:
        d = torch.arange(qa, qb, device=device)[:, None] - torch.arange(ka, kb, device=device)[None, :]
        vis = d >= 0
        if window is not None:
            vis = vis & (d < window)
    vis = vis[None, None]
    if docs is not None:
        same = docs[:, qa:qb, None] == docs[:, None, ka:kb]
        vis = vis & same[:, None]
    if keep is not None:  # [Bk, S] key padding: the pair's keys
        vis = vis & keep[:, None, None, ka:kb]
    return vis


def _concrete(t: torch.Tensor) -> bool:
    """Data-dependent decisions (document masks) only where they cost no device sync: CPU data."""
    return t.device.type == "cpu"


def _pair_plan(qa, qb, ka, kb, spec, device):
    """(kind, visibility or None) of a pair. On CPU data, a pair inside one document (in
    every batch row) is planned as without documents, one whose keys are all unpadded as
    without padding (full, diagonal, or a position mask); one that sees nothing is skipped
    and one that sees everything is full."""
    docs, keep = spec.docs, spec.keep
    if docs is not None and _concrete(docs):
        ids = torch.cat([docs[:, qa:qb], docs[:, ka:kb]], dim=1)
        if bool((ids == ids[:, :1]).all()):
            docs = None
    if keep is not None and _concrete(keep) and bool(keep[:, ka:kb].all()):
        keep = None
    data = docs is not None or keep is not None
    kind = _classify(qa, qb, ka, kb, spec.causal, spec.window, data)
    vis = None
    if kind == _MASK:
        vis = _visible(qa, qb, ka, kb, spec.causal, spec.window, docs, keep, device)
        if data and _concrete(vis):
            if not bool(vis.any()):
                return _SKIP, None
            if bool(vis.all()):
                return _FULL, None
    return kind, vis


def _additive(vis: torch.Tensor, dtype) -> torch.Tensor:
    """The CPU kernel's forward takes no boolean mask: 0 where visible, -inf elsewhere."""
    return torch.zeros(vis.shape, dtype=dtype, device=vis.device).masked_fill(~vis, float("-inf"))


def _pair_mask(vis, bias, dtype):
    """A pair's additive mask: its visibility (None: every key), plus its keys' slice of the
    key bias (``[B|1, H|1, 1, Lk]``, broadcast over the queries; None: no bias)."""
    if bias is None:
        return None if vis is None else _additive(vis, dtype)
    bias = bias.to(dtype)
    return bias if vis is None else _additive(vis, dtype) + bias


# ----------------------------------------------------------------------------- kernels
def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: fp32, or fp64 for fp64 inputs (the CPU kernel's lse is fp64 there)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _use_kernel(q: torch.Tensor) -> tuple[str, str]:
    """The kernels of (full and diagonal pairs, masked pairs): ``"cpu"`` (the fused CPU
    kernel), a CUDA kernel name (``"flash"``, ``"efficient"``) or ``"math"``."""
    if math_forced():
        return "math", "math"
    if kernels.on_cuda(q):
        return kernels.choose_dense(q, None), kernels.choose_dense(q, True)
    return "cpu", "cpu"


def _math_scores(q, k, vis, diag, scale, bias=None):
    """Scores ``[B, Hkv, G, Lq, Lk]`` in the accumulation dtype (query head h uses KV head
    h // G), masked, plus the pair's key bias slice."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    acc = _acc(q.dtype)
    qf = q.to(acc).reshape(b, hkv, hq // hkv, lq, d)
    s = (qf @ k.to(acc).unsqueeze(2).transpose(-1, -2)) * scale
    if bias is not None:  # [B|1, H|1, 1, Lk] -> [B|1, Hkv|1, G|1, 1, Lk]
        hb = bias.shape[1]
        s = s + (bias.to(acc).reshape(bias.shape[0], hkv, hq // hkv, 1, lk) if hb == hq
                 else bias.to(acc).reshape(bias.shape[0], 1, 1, 1, lk))
    if diag:
        vis = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()[None, None]
    if vis is not None:
        s = s.masked_fill(~vis[:, :, None], float("-inf"))
    return s, qf


def _pick(kernel, vis):
    """This pair's kernel from the spec's (full/diagonal, masked) pair."""
    return kernel[0] if vis is None else kernel[1]


def _pair_forward(q, k, v, kind, vis, scale, kernel, bias=None):
    """One pair's (out [B, Hq, Lq, D], lse [B, Hq, Lq]) in the accumulation dtype; rows
    that see no key in this pair get out 0 and lse -inf. ``bias``: the pair's keys' slice
    of the key bias (the masked kernel then runs every pair)."""
    name = _pick(kernel, vis if bias is None else True)
    if name != "math":
        mask = _pair_mask(vis, bias, q.dtype)
        if name == "cpu":
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, kind == _DIAG, attn_mask=mask, scale=scale)
        else:
            o, lse, _ = kernels.dense_lse(q, k, v, causal=kind == _DIAG, scale=scale, bias=mask, kernel=name)
        o, lse = o.to(_acc(q.dtype)), lse.to(_acc(q.dtype))
        if vis is not None:  # the kernel gives such rows out 0 but lse 0 (not -inf)
            empty = ~vis.any(-1)  # [Bd, 1, Lq]
            o = o.masked_fill(empty[..., None], 0.0)
            lse = lse.masked_fill(empty, float("-inf"))
        return o, lse
    b, hq, lq, d = q.shape
    s, _ = _math_scores(q, k, vis, kind == _DIAG, scale, bias)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    o = p @ v.to(p.dtype).unsqueeze(2)
    return o.reshape(b, hq, lq, d), lse.reshape(b, hq, lq)


def _pair_backward(dout, q, k, v, out, lse, delta, kind, vis, scale, kernel, bias=None):
    """One pair's (dq, dk, dv) given the FINAL output and lse of these query rows (lse of a
    row that saw nothing is +inf here, so its probabilities are 0)."""
    name = _pick(kernel, vis if bias is None else True)
    if name != "math":
        mask = _pair_mask(vis, bias, q.dtype)
        if name == "cpu":
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, kind == _DIAG, attn_mask=mask, scale=scale)
        return kernels.dense_lse_backward(dout, q, k, v, out, lse.to(_acc(q.dtype)), causal=kind == _DIAG,
                                          scale=scale, bias=mask, kernel=name)
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    s, qf = _math_scores(q, k, vis, kind == _DIAG, scale, bias)
    p = torch.exp(s - lse.reshape(b, hkv, g, lq)[..., None])
    do = dout.to(qf.dtype).reshape(b, hkv, g, lq, d)
    dv = (p.transpose(-1, -2) @ do).sum(2)
    dp = do @ v.to(qf.dtype).unsqueeze(2).transpose(-1, -2)
    ds = p * (dp - delta.reshape(b, hkv, g, lq)[..., None])
    dq = (ds @ k.to(qf.dtype).unsqueeze(2)) * scale
    dk = (ds.transpose(-1, -2) @ qf).sum(2) * scale
    return dq.reshape(b, hq, lq, d), dk, dv


def _merge(out, lse, o, o_lse):
    """Fold a pair's (o, o_lse) into the running (out, lse) views, in place, without NaN
    for rows where both are empty (-inf)."""
    new = torch.logaddexp(lse, o_lse)
    safe = new.masked_fill(new == float("-inf"), 0.0)
    out.mul_(torch.exp(lse - safe)[..., None]).add_(o * torch.exp(o_lse - safe)[..., None])
    lse.copy_(new)


# ----------------------------------------------------------------------------- ring
@dataclass
class _Spec:
    layouts: list          # per ring rank: [(start, end, local offset)]
    lengths: list          # per ring rank: local length
    group: str
    ranks: int
    rank: int
    causal: bool
    window: int | None
    docs: torch.Tensor | None
    keep: torch.Tensor | None  # [B or 1, S] boolean key padding (True: visible)
    scale: float
    simulated: bool
    kernel: tuple          # (full/diagonal pairs, masked pairs): "cpu", "flash", "efficient" or "math"
    bias: torch.Tensor | None = None  # [B or 1, H or 1, 1, S] additive key bias (ALiBi), whole


class _Ring:
    """Non-blocking sends to ``rank + 1`` / receives from ``rank - 1`` on the group's
    process group; waits are bounded by the group's timeout (CPU/gloo)."""

    def __init__(self, spec: _Spec, device):
        self.live = spec.ranks > 1 and not spec.simulated
        self.ranks, self.group = spec.ranks, spec.group
        if not self.live:
            return
        self.pg = collectives.process_group(spec.group)
        self.next = dist.get_global_rank(self.pg, (spec.rank + 1) % spec.ranks)
        self.prev = dist.get_global_rank(self.pg, (spec.rank - 1) % spec.ranks)
        self.timeout = _timeout(self.pg) if device.type == "cpu" else None

    def post(self, send, recv, tag) -> list:
        """Post a send of ``send`` and a receive into ``recv`` (either may be None or empty:
        both ends know every block's size, so they skip the same messages)."""
        if send is not None and send.numel() and self.ranks > 1:
            collectives.record("send", self.group, send, backward=tag != _TAG_KV)
        if not self.live:
            return []
        ops = []
        if send is not None and send.numel():
            ops.append(dist.P2POp(dist.isend, send, self.next, self.pg, tag))
            _STATS["sends"] += 1
            _STATS["bytes"] += send.numel() * send.element_size()
        if recv is not None and recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, self.prev, self.pg, tag))
        return dist.batch_isend_irecv(ops) if ops else []

    def pass_kv(self, kv, spec: _Spec, t: int, tag: int):
        """Step ``t`` holds the block of ring rank ``r - t``: post its send to ``r + 1`` and
        the receive of the next one (except at the last step); ``(works, arriving)``."""
        if t == spec.ranks - 1:
            return [], None
        src = (spec.rank - t) % spec.ranks
        arriving = kv.new_empty(_block_shape(kv[0], spec.lengths[(src - 1) % spec.ranks]))
        return self.post(kv, arriving, tag), arriving

    def wait(self, works) -> None:
        for w in works:
            if self.timeout is None:
                w.wait()
            else:
                w.wait(self.timeout)


def _timeout(pg) -> timedelta:
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except Exception:  # noqa: BLE001 - a backend without options: torch's default
        return dist.distributed_c10d.default_pg_timeout


def _block_shape(like: torch.Tensor, length: int) -> tuple:
    b, h, _, d = like.shape
    return (2, b, h, length, d)


def _pairs(spec: _Spec, src: int, device):
    """The (query piece, key piece) pairs of this rank's rows against ring rank ``src``'s
    block that see some key: ``(qo, n, ko, m, kind, vis)`` (local offsets and lengths, the
    pair's kind and mask)."""
    for qa, qb, qo in spec.layouts[spec.rank]:
        for ka, kb, ko in spec.layouts[src]:
            kind, vis = _pair_plan(qa, qb, ka, kb, spec, device)
            if kind != _SKIP:
                yield qo, qb - qa, ko, kb - ka, kind, vis, (None if spec.bias is None else spec.bias[..., ka:kb])


def _ring_forward(q, k, v, spec: _Spec):
    ring = _Ring(spec, q.device)
    r, R = spec.rank, spec.ranks
    acc = _acc(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)
    kv = torch.stack([k, v])  # the packed block that travels
    for t in range(R):
        src = (r - t) % R
        works, arriving = ring.pass_kv(kv, spec, t, _TAG_KV)
        kb_, vb_ = kv[0], kv[1]
        for qo, n, ko, m, kind, vis, bias in _pairs(spec, src, q.device):
            o, o_lse = _pair_forward(q.narrow(2, qo, n), kb_.narrow(2, ko, m), vb_.narrow(2, ko, m),
                                     kind, vis, spec.scale, spec.kernel, bias)
            _merge(out.narrow(2, qo, n), lse.narrow(2, qo, n), o, o_lse)
        ring.wait(works)
        if arriving is not None:
            kv = arriving
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, spec: _Spec):
    ring = _Ring(spec, q.device)
    r, R = spec.rank, spec.ranks
    acc = _acc(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse_bw = lse.masked_fill(lse == float("-inf"), float("inf"))  # a row that saw nothing: P = 0
    delta = (dout.to(acc) * out.to(acc)).sum(-1) if "math" in spec.kernel else None
    dout = dout.contiguous()
    kv = torch.stack([k, v])
    incoming, in_flight = None, None
    acc_works: list = []
    for t in range(R):
        src = (r - t) % R
        kv_works, arriving = ring.pass_kv(kv, spec, t, _TAG_BWD_KV)
        part = torch.zeros(_block_shape(k, spec.lengths[src]), dtype=acc, device=q.device)
        kb_, vb_ = kv[0], kv[1]
        for qo, n, ko, m, kind, vis, bias in _pairs(spec, src, q.device):
            g_q, g_k, g_v = _pair_backward(
                dout.narrow(2, qo, n), q.narrow(2, qo, n), kb_.narrow(2, ko, m), vb_.narrow(2, ko, m),
                out.narrow(2, qo, n), lse_bw.narrow(2, qo, n).contiguous(),
                None if delta is None else delta.narrow(2, qo, n), kind, vis, spec.scale, spec.kernel, bias)
            dq.narrow(2, qo, n).add_(g_q)
            part[0].narrow(2, ko, m).add_(g_k)
            part[1].narrow(2, ko, m).add_(g_v)
        if t > 0:  # the accumulator of this block, from the ranks before: received while computing
            ring.wait(acc_works)  # also the send of the previous block's accumulator
            in_flight = None
            part.add_(incoming)
        if R > 1:  # pass the block's dK/dV on (the R-th hop brings each rank its own)
            incoming = part.new_empty(_block_shape(k, spec.lengths[(src - 1) % R]))
            acc_works = ring.post(part, incoming, _TAG_DKV)
            in_flight = part  # kept alive until its send completes
        ring.wait(kv_works)
        if arriving is not None:
            kv = arriving
    if R > 1:
        ring.wait(acc_works)
        part = incoming  # after the R-th hop: this rank's own block, complete
    del in_flight
    return dq.to(q.dtype), part[0].to(k.dtype), part[1].to(v.dtype)


def _add_sinks(out, lse, sinks):
    """Fold per-head sink logits into the softmax denominator of finished rows: with
    ``L' = logaddexp(L, sink_h)`` the output is ``out * exp(L - L')`` and ``L'`` is the
    log-sum-exp the backward reads (a row that saw no key: zeros, as eager gives it)."""
    s = sinks.to(lse.dtype)[None, :, None]
    new = torch.logaddexp(lse, s)
    return (out.to(lse.dtype) * torch.exp(lse - new)[..., None]).to(out.dtype), new


def _sink_grad(dout, out, lse, sinks):
    """d loss / d sinks: the sink's probability ``exp(sink_h - L')`` times ``-rowsum(dO * O)``
    (softmax's backward for the sink column, whose value is 0), summed over batch and rows."""
    acc = lse.dtype
    delta = (dout.to(acc) * out.to(acc)).sum(-1)
    p_sink = torch.exp(sinks.to(acc)[None, :, None] - lse)
    return -(p_sink * delta).sum((0, 2)).to(sinks.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, sinks=None):
        out, lse = _ring_forward(q, k, v, spec)
        if sinks is not None:  # the sinks enter once, after every block is merged
            out, lse = _add_sinks(out, lse, sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.spec = spec
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        # With sinks, out and lse are the final ones: each block's share of dq, dk, dv is
        # the kernel's backward at them (P = exp(S - L'), delta = rowsum(dO * O)).
        dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, ctx.spec)
        dsinks = None if sinks is None else _sink_grad(dout, out, lse, sinks)
        return dq, dk, dv, None, dsinks


# ----------------------------------------------------------------------------- entry
def ring_attention(query, key, value, *, pieces, group: str, is_causal: bool, scale: float | None = None,
                   doc_ids: torch.Tensor | None = None, window: int | None = None,
                   key_padding: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                   key_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Exact attention of this rank's queries over the whole ring's keys (see the module doc).

    ``query`` is ``[B, Hq, L, D]``, ``key``/``value`` ``[B, Hkv, L, D]`` with ``Hq % Hkv ==
    0`` (query head h reads KV head ``h // (Hq // Hkv)``, as SDPA's ``enable_gqa``), where
    L is the total length of ``pieces[rank]``. ``pieces[s]`` lists ring rank s's ``(start,
    end)`` position ranges in local order; all ranks' ranges partition ``[0, S)``.
    ``group`` is a group name (:func:`autosp.runtime.collectives.register_group`).
    ``doc_ids`` is the full ``[B, S]`` or ``[1, S]`` integer tensor (replicated, not
    sharded): keys of another document are invisible. ``window`` (with ``is_causal``) keeps
    the keys ``i - window < j <= i``. ``key_padding`` is the full ``[B, S]`` or ``[1, S]``
    boolean tensor (replicated): key ``j`` of row ``b`` is visible only where it is True; a
    query that sees no key gets zeros (SDPA's answer under a boolean mask). ``scale``
    defaults to ``1 / sqrt(D)``. ``sinks`` (``[Hq]``, gpt-oss's learned sink logits) adds
    ``exp(sinks[h])`` to every row's softmax denominator of head h, once, after the ring's
    blocks are merged; it is differentiable too. ``key_bias`` (``[B|1, Hq|1, 1, S]``, the
    whole sequence, replicated: ALiBi) is added to every score of key ``j``; each pair adds
    its keys' slice (not differentiable: a bias that requires grad is refused).

    Returns ``[B, Hq, L, D]`` in ``query``'s dtype: rows of
    ``F.scaled_dot_product_attention(q_full, k_full, v_full, attn_mask=mask)`` at this
    rank's positions; differentiable in query, key and value (ring backward).
    Every rank of the group must call it with the same ``pieces``.
    """
    spec = _make_spec(query, key, value, pieces, group, is_causal, scale, doc_ids, window, key_padding, key_bias)
    return _RingAttention.apply(query, key, value, spec, _check_sinks(sinks, query))


def _check_key_bias(bias, b: int, hq: int, seq_len: int, device):
    """``bias`` checked to be the whole ``[B|1, Hq|1, 1, S]`` key bias without a gradient, or None."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.dim() != 4 or bias.shape[0] not in (1, b) \
            or bias.shape[1] not in (1, hq) or bias.shape[2] != 1 or bias.shape[3] != seq_len:
        shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"ring_attention: key_bias must be the whole [B|1, H|1, 1, S] bias (B = {b}, H = {hq}, "
                         f"S = {seq_len}), got {shape}")
    if bias.requires_grad:
        raise ValueError("ring_attention: a key bias that requires grad (a learned one) is not differentiated "
                         "by the ring; use Ulysses (strategy='ulysses')")
    return bias if bias.device == device else bias.to(device)


def _check_sinks(sinks, query):
    """``sinks`` checked to be one value per query head, or None."""
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.shape != (query.shape[1],)):
        shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"attention sinks must be one value per query head [{query.shape[1]}], got {shape}")
    return sinks


def local_attention(query, key, value, *, is_causal: bool, scale: float | None = None,
                    doc_ids: torch.Tensor | None = None, window: int | None = None,
                    key_padding: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                    block: int = 512) -> torch.Tensor:
    """:func:`ring_attention` on one rank holding the whole sequence (no communication):
    the same masks and sinks, with the same fused kernels and backward. Plain causal or
    unmasked attention is one kernel call; with a window, documents or key padding the
    sequence is cut into pieces of ``max(block, window)`` positions so that each (query
    piece, key piece) pair is skipped, run whole, run causal, or masked by a piece-sized
    mask: never an S x S one (O(S) bytes kept; the pairs cost one kernel call each)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"local_attention: {name} must be [B, H, S, D], got {getattr(t, 'shape', t)!r}")
    b, _, s, d = query.shape
    if window is not None and (not is_causal or int(window) < 1):
        raise ValueError(f"local_attention: a window needs is_causal=True and window >= 1, got {window}")
    if doc_ids is not None:
        doc_ids = _full_rows("doc_ids", doc_ids, b, s, query.device)
    if key_padding is not None:
        key_padding = _full_rows("key_padding", key_padding, b, s, query.device)
        if key_padding.dtype != torch.bool:
            raise ValueError(f"local_attention: key_padding must be boolean (True: visible), got {key_padding.dtype}")
    piece = s if window is None and doc_ids is None and key_padding is None else max(int(block), int(window or 0))
    layout = [(a, min(a + piece, s), a) for a in range(0, s, max(piece, 1))]
    spec = _Spec(layouts=[layout], lengths=[s], group="", ranks=1, rank=0, causal=bool(is_causal),
                 window=None if window is None else int(window), docs=doc_ids, keep=key_padding,
                 scale=float(scale) if scale is not None else 1.0 / math.sqrt(d), simulated=True,
                 kernel=_use_kernel(query))
    return _RingAttention.apply(query, key, value, spec, _check_sinks(sinks, query))


def _full_rows(name: str, t, b: int, seq_len: int, device) -> torch.Tensor:
    """``t`` checked to be the full [B, S] or [1, S] tensor, on ``device``."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] not in (1, b) or t.shape[1] != seq_len:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"ring_attention: {name} must be the full [B, S] or [1, S] tensor "
                         f"(B = {b}, S = {seq_len}), got {shape}")
    return t if t.device == device else t.to(device)


def _make_spec(query, key, value, pieces, group, is_causal, scale, doc_ids, window, key_padding=None,
               key_bias=None) -> _Spec:
    """Validate :func:`ring_attention`'s arguments (``ValueError`` naming the bad one) and
    plan the ring: this rank's place in it and every rank's pieces."""
    ranks, rank = collectives.group_size(group), collectives.group_rank(group)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"ring_attention: {name} must be [B, H, L, D], got {shape}")
    if key.shape != value.shape:
        raise ValueError(f"ring_attention: key {tuple(key.shape)} and value {tuple(value.shape)} must have "
                         "the same shape [B, Hkv, L, D]")
    b, hq, length, d = query.shape
    if key.shape[0] != b or key.shape[2] != length or key.shape[3] != d:
        raise ValueError(f"ring_attention: key {tuple(key.shape)} does not match query {tuple(query.shape)} "
                         "in B, L or D")
    hkv = key.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"ring_attention: query heads ({hq}) must be a multiple of key/value heads ({hkv}); "
                         f"query {tuple(query.shape)}, key {tuple(key.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"ring_attention: query, key, value dtypes differ ({query.dtype}, {key.dtype}, "
                         f"{value.dtype})")
    norm, seq_len = _check_pieces(pieces, ranks)
    lengths = [sum(e - s for s, e in rs) for rs in norm]
    if lengths[rank] != length:
        raise ValueError(f"ring_attention: pieces[{rank}] = {norm[rank]} cover {lengths[rank]} positions but "
                         f"query {tuple(query.shape)} holds L = {length} on ring rank {rank}")
    if window is not None:
        if not is_causal:
            raise ValueError("ring_attention: window requires is_causal=True")
        if int(window) < 1:
            raise ValueError(f"ring_attention: window must be >= 1, got {window}")
        window = int(window)
    if doc_ids is not None:
        doc_ids = _full_rows("doc_ids", doc_ids, b, seq_len, query.device)
        if doc_ids.is_floating_point():
            raise ValueError(f"ring_attention: doc_ids must be integers, got {doc_ids.dtype}")
    if key_padding is not None:
        key_padding = _full_rows("key_padding", key_padding, b, seq_len, query.device)
        if key_padding.dtype != torch.bool:
            raise ValueError(f"ring_attention: key_padding must be boolean (True: visible), got {key_padding.dtype}")
    return _Spec(layouts=[_layout(rs) for rs in norm], lengths=lengths, group=group, ranks=ranks, rank=rank,
                 causal=bool(is_causal), window=window, docs=doc_ids, keep=key_padding,
                 scale=float(scale) if scale is not None else 1.0 / math.sqrt(d),
                 simulated=collectives.simulating(), kernel=_use_kernel(query),
                 bias=_check_key_bias(key_bias, b, hq, seq_len, query.device))


# ----------------------------------------------------------------------------- torch.compile
# Under torch.compile (``autosp.compile(..., backend=...)``, one graph) the ring is an opaque
# custom op pair: Dynamo cannot trace its sends, and AOT autograd traces the backward, so
# the backward is an op too. The pieces are read from the group's layout at run time (the
# graph carries only the symbolic length). Eager calls use ring_attention above.

def layout_pieces(group: str, seq_len: int) -> list[list[tuple[int, int]]]:
    """``pieces`` for :func:`ring_attention` from the layout of ``group``'s sequence-parallel
    group: ring rank i attends with ring group i's frame (its Ulysses ranks' rows)."""
    lay = collectives.layout(group)
    return [lay.ring_pieces(seq_len, i) for i in range(lay.ring)]


def _layout_spec(q, k, v, seq_len, group, is_causal, scale, doc_ids, window, key_padding, key_bias=None) -> _Spec:
    return _make_spec(q, k, v, layout_pieces(group, int(seq_len)), group, is_causal, scale or None, doc_ids,
                      window or None, key_padding, key_bias)


@torch.library.custom_op("autosp::ring_attention", mutates_args=())
def ring_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor | None,
                      key_padding: torch.Tensor | None, seq_len: int, group: str, is_causal: bool, scale: float,
                      window: int, sinks: torch.Tensor | None = None,
                      key_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's forward as one op: ``(out, lse)`` for this rank's rows, the pieces of
    every ring rank taken from ``group``'s layout at ``seq_len`` (``scale`` 0.0 and
    ``window`` 0 mean none); ``sinks`` (``[H]``) enter once, after every block is merged;
    ``key_bias`` as :func:`ring_attention`'s."""
    spec = _layout_spec(q, k, v, seq_len, group, is_causal, scale, doc_ids, window, key_padding, key_bias)
    out, lse = _ring_forward(q, k, v, spec)
    if sinks is not None:
        out, lse = _add_sinks(out, lse, _check_sinks(sinks, q))
    return torch.empty_like(q).copy_(out), lse.contiguous()


@ring_attention_op.register_fake
def _(q, k, v, doc_ids, key_padding, seq_len, group, is_causal, scale, window, sinks=None, key_bias=None):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=_acc(q.dtype))


@torch.library.custom_op("autosp::ring_attention_backward", mutates_args=())
def ring_attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, doc_ids: torch.Tensor | None,
                               key_padding: torch.Tensor | None, seq_len: int, group: str, is_causal: bool,
                               scale: float, window: int, sinks: torch.Tensor | None = None,
                               key_bias: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ring's backward as one op: ``(dq, dk, dv, dsinks)`` (``dsinks`` empty without sinks)."""
    spec = _layout_spec(q, k, v, seq_len, group, is_causal, scale, doc_ids, window, key_padding, key_bias)
    dq, dk, dv = _ring_backward(dout, q, k, v, out, lse, spec)
    dsinks = q.new_empty(0) if sinks is None else _sink_grad(dout, out, lse, sinks)
    # Laid out as the inputs, as the fake says (fresh tensors: dk and dv are views of one buffer).
    return (*(torch.empty_like(x).copy_(g) for x, g in ((q, dq), (k, dk), (v, dv))), dsinks)


@ring_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, doc_ids, key_padding, seq_len, group, is_causal, scale, window, sinks=None,
      key_bias=None):
    # (laid out as the inputs, as the real ones)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty(0) if sinks is None else torch.empty_like(sinks))


def _setup_context(ctx, inputs, output):
    q, k, v, doc_ids, key_padding, seq_len, group, is_causal, scale, window, sinks, key_bias = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], doc_ids, key_padding, sinks, key_bias)
    ctx.args = (seq_len, group, is_causal, scale, window)


def _op_backward(ctx, dout, _dlse):
    q, k, v, out, lse, doc_ids, key_padding, sinks, key_bias = ctx.saved_tensors
    dq, dk, dv, dsinks = ring_attention_backward_op(dout.contiguous(), q, k, v, out, lse, doc_ids, key_padding,
                                                    *ctx.args, sinks, key_bias)
    return dq, dk, dv, None, None, None, None, None, None, None, (dsinks if sinks is not None else None), None


ring_attention_op.register_autograd(_op_backward, setup_context=_setup_context)
