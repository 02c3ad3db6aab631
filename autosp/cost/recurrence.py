"""How a linear recurrence along the sequence runs on P ranks: heads, chain or prefix, priced.

Three exact ways (:mod:`autosp.runtime.recurrences`) for a stated recurrence layer (Gated
DeltaNet, Mamba2, MiniMax's lightning attention):

* **heads** (Gated DeltaNet whose key and value heads divide by P): all-to-alls move the
  five inputs to heads-sharded and the output back; each rank runs the kernel over the
  whole sequence on its heads. Compute: one part's worth (the same FLOPs), under autograd
  (forward 1, backward 2). Bytes: ``2 (P - 1) / P`` of the inputs and output, each way.
* **chain**: each rank runs its part from the previous rank's state, in sequence order;
  backward recomputes the part and sends the state's gradient back. The ranks wait on
  each other: the critical path is ``P`` parts (forward 1 + recompute 1 + backward 2 per
  part). Bytes: one state per rank boundary, each way.
* **prefix**: every rank runs its part at once from the identity appended to the state
  (``d_k`` more value columns for Gated DeltaNet, ``d_state`` more rows for Mamba2: the
  part's FLOPs grow by the factor :func:`widening`), the ranks all-gather their summaries
  (transition and state) and compose them: one part's time (widened) instead of ``P``.
  Lightning attention's state decays by one scalar per head, so its part runs from zeros
  as it is and the incoming state reaches each output through one more ``q S`` product
  (``2 d_k d_v`` per head and token); its transition is one number per head.
  Bytes: ``P - 1`` summaries in, ``P - 1`` state gradients back.

:func:`choose_recurrence` prices the feasible ones and picks the cheapest. The
FLOP counts are the chunked kernels' matmuls (transformers' torch forms, chunk ``c``):

* Gated DeltaNet per head and token: ``4 c d_k + c (d_k + d_v) + 2 c d_v + 6 d_k d_v``;
* Mamba2 per head and token: ``2 c N + 2 c d_head + 4 N d_head``;
* lightning attention per head and token (block ``c``): ``2 c (d_k + d_v) + 4 d_k d_v``;
* Mamba-1 per channel and token (a scan, no chunks): ``6 N`` for the kernel (discretise,
  update, read out) and ``4 N`` for the incoming state (its decay and read-out): ``10 N``
  from a state; the prefix's part reads its basis out instead (``11 N``). Its state and
  its transition are ``N`` per channel (the scan is diagonal).

Throughput and bandwidths are :class:`~autosp.cost.strategy.Hardware`'s defaults
(H100-class, not measured); fixed latencies are left out. Compute and the heads path's
bytes grow with S, the state terms do not: at the default ``S = 8192`` and beyond, the
state terms are small and the choice is the compute's. ``verbose=True`` prints the choice with every price.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autosp.cost.strategy import Hardware

GATED_DELTA_NET = "gated_delta_rule"
MAMBA2 = "mamba2_chunk_scan"
LIGHTNING = "lightning_attention"
MAMBA1 = "selective_scan"
METHODS = ("heads", "chain", "prefix")


@dataclass(frozen=True)
class RecurrenceShape:
    """One recurrence layer's sizes. Gated DeltaNet: ``heads`` value heads, ``k_heads`` key
    heads, ``key_dim`` d_k, ``value_dim`` d_v. Mamba2: ``heads``, ``value_dim`` the head dim,
    ``key_dim`` the state size N (``k_heads`` the groups of B and C). Lightning attention:
    ``heads`` (= ``k_heads``), ``key_dim`` and ``value_dim`` the head dims, ``chunk`` its block.
    Mamba-1: ``heads`` the channels d_inner, ``key_dim`` the state size N, ``value_dim`` 1."""

    kind: str
    heads: int
    k_heads: int
    key_dim: int
    value_dim: int
    chunk: int
    elem_bytes: int = 4

    def flops(self, widened: bool = False) -> float:
        """Forward FLOPs per token (all heads); ``widened``: with the identity appended."""
        c, dk, dv = self.chunk, self.key_dim, self.value_dim
        if self.kind == GATED_DELTA_NET:
            dv = dv + dk if widened else dv
            return self.heads * (4 * c * dk + c * (dk + dv) + 2 * c * dv + 6 * dk * dv)
        if self.kind == MAMBA1:
            return self.heads * (11 if widened else 10) * dk
        if self.kind == LIGHTNING:  # the prefix adds the incoming state's q S per token
            return self.heads * (2 * c * (dk + dv) + 4 * dk * dv + (2 * dk * dv if widened else 0))
        hd = dv + dk if widened else dv  # Mamba2: N rows appended to the head dim
        return self.heads * (2 * c * dk + 2 * c * hd + 4 * dk * hd)

    def state_elems(self) -> int:
        """One sequence's state, all heads."""
        return self.heads * self.key_dim * self.value_dim

    def summary_elems(self) -> int:
        """One sequence's summary: the transition and the state (lightning attention: one
        decay per head)."""
        transition = {LIGHTNING: 1, MAMBA1: self.key_dim}.get(self.kind, self.key_dim * self.key_dim)
        return self.state_elems() + self.heads * transition

    def io_elems(self) -> int:
        """Per token: the inputs and output the heads path moves (Gated DeltaNet)."""
        return 2 * self.k_heads * self.key_dim + 2 * self.heads * self.value_dim + 2 * self.heads


def widening(shape: RecurrenceShape) -> float:
    """How much more a part costs run from the identity (the prefix) than from zeros."""
    return shape.flops(widened=True) / shape.flops()


@dataclass(frozen=True)
class RecurrenceChoice:
    """The chosen method, why, and each feasible method's price (seconds per layer and
    rank, forward + backward, at the ``seq_len`` priced)."""

    method: str
    reason: str
    prices: dict = field(default_factory=dict)


def price_recurrence(shape: RecurrenceShape, sp_size: int, *, heads_ok: bool, seq_len: int = 8192,
                     ranks_per_node: int | None = None, hw: Hardware | None = None) -> dict:
    """Seconds per layer and rank (one sequence of ``seq_len``) of each feasible method
    (``hw``: :class:`~autosp.cost.strategy.Hardware`'s defaults when None)."""
    hw = hw or Hardware()
    p = sp_size
    bw = hw.intra_node_bw if p <= (ranks_per_node or p) else hw.inter_node_bw
    part = seq_len / p * shape.flops() / hw.recurrence_flops
    e = shape.elem_bytes
    prices = {"chain": 4 * p * part + 2 * shape.state_elems() * 4 / bw,
              "prefix": 4 * widening(shape) * part + (p - 1) * (shape.summary_elems() + shape.state_elems()) * 4 / bw}
    if heads_ok:
        prices["heads"] = 3 * part + 2 * 2 * (p - 1) / p * seq_len / p * shape.io_elems() * e / bw
    return prices


def choose_recurrence(shape: RecurrenceShape, sp_size: int, *, heads_ok: bool, seq_len: int = 8192,
                      ranks_per_node: int | None = None, hw: Hardware | None = None) -> RecurrenceChoice:
    """The cheapest of :func:`price_recurrence`'s methods (ties go heads, then prefix)."""
    prices = price_recurrence(shape, sp_size, heads_ok=heads_ok, seq_len=seq_len, ranks_per_node=ranks_per_node,
                              hw=hw)
    order = {m: i for i, m in enumerate(("heads", "prefix", "chain"))}
    best = min(prices, key=lambda m: (prices[m], order[m]))
    listed = ", ".join(f"{m} {prices[m] * 1e6:.1f} us" for m in sorted(prices, key=order.__getitem__))
    sizes = (f"{shape.heads} channels, N {shape.key_dim}" if shape.kind == MAMBA1 else
             f"{shape.heads} heads, d_k/N {shape.key_dim}, d_v/d_head {shape.value_dim}, chunk {shape.chunk}")
    reason = (f"{shape.kind} ({sizes}) on {sp_size} ranks: {best}; priced per layer at S={seq_len}: {listed}"
              + ("" if heads_ok else "; heads: the heads do not divide by the ranks (or not built for this kernel)"))
    return RecurrenceChoice(best, reason, prices)
