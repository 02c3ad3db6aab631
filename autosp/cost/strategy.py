"""Which sequence parallelism to run: Ulysses, ring attention, or both (a 2-D mesh).

``P`` ranks form a mesh of ``ring`` groups of ``ulysses`` ranks (``ulysses * ring = P``):

* **Ulysses** (``ring = 1``): 4 all-to-alls per layer move q, k, v and the output
  between sequence- and head-sharded. Needs the query heads to divide by ``ulysses``,
  and the KV heads to divide by it or divide it (then each KV head is repeated: its
  bytes grow). Not overlapped with compute: the attention waits for them.
* **Ring** (``ulysses = 1``): q stays put; K/V blocks travel the ring, ``R - 1`` hops
  forward, ``R - 1`` hops of K/V and ``R`` of dK/dV backward, each hop overlapped with
  the attention of the block at hand. Any head count; only the KV heads travel.
* **Hybrid**: Ulysses inside each ring group (heads split ``ulysses`` ways, keep it
  inside a node), ring across the groups. The layout is zigzag whenever ``ring > 1``
  (ring group i holds sequence chunks i and ``2R - 1 - i``: causal attention then costs
  every ring rank the same).

:func:`choose` prices every feasible ``(ulysses, ring)`` with the communication model
below and picks the one with the least *exposed* communication time per layer; ties (within
5%) go to the larger Ulysses degree (fewer, larger messages). The model, per rank and
layer (forward + backward), with ``T = B * S / P`` tokens per rank, head dim ``d``,
``e`` bytes per element and ``KV'`` the KV heads after any repeat:

* Ulysses bytes: ``2 * (U - 1) / U * T * d * e * (2 * H + 2 * KV')``, at the
  intra-node bandwidth when the Ulysses group fits in a node, else inter-node;
* ring bytes: ``(3R - 2)`` hops of ``2 * T * KV' * d * e``; a hop is exposed only by
  what its transfer takes beyond the block's attention (``flops / R`` at the device's
  attention throughput), at the inter-node bandwidth when the ring spans nodes; plus
  what the ring adds to attention itself: merging each block's output and log-sum-exp
  (fp32, at memory bandwidth), dK/dV accumulation, and a fixed latency per hop.

Candidates whose costs differ by less than 1% of the attention's own time count as a tie.

The topology is ``ranks_per_node`` (torchrun's ``LOCAL_WORLD_SIZE``). The hardware
numbers (:class:`Hardware`) are H100-class defaults, not measurements; the choice and
its numbers are printed with ``verbose=True`` and tabulated by ``bench/strategy_table.py``.

Example::

    >>> c = choose(heads=32, kv_heads=8, sp_size=16, ranks_per_node=8, seq_len=1 << 20, head_dim=128)
    >>> c.strategy, c.ulysses, c.ring
    ('hybrid', 8, 2)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autosp.ir.layout import SeqLayout

STRATEGIES = ("auto", "ulysses", "ring", "hybrid")


@dataclass(frozen=True)
class Hardware:
    """Per-GPU bandwidths (bytes/s) and attention throughput (FLOP/s) of the model."""

    intra_node_bw: float = 150e9   # NVLink all-to-all / p2p, per GPU
    inter_node_bw: float = 25e9    # 200 Gb/s InfiniBand per GPU
    attention_flops: float = 400e12  # a fused attention kernel, bf16
    memory_bw: float = 3e12          # HBM, for the ring's merges
    hop_latency: float = 30e-6       # one ring step's fixed cost (launches, synchronisation)
    recurrence_flops: float = 100e12  # a chunked linear-recurrence kernel (Gated DeltaNet, Mamba2), bf16


class StrategyError(ValueError):
    """No strategy fits the request (names the heads, sizes and degrees)."""


@dataclass(frozen=True)
class Candidate:
    """One ``(ulysses, ring)`` mesh and its predicted cost per layer and rank."""

    ulysses: int
    ring: int
    kv_repeat: int          # each KV head repeated this many times for Ulysses
    ulysses_bytes: float
    ring_bytes: float
    exposed_s: float        # communication time not hidden behind attention, plus the ring's merges
    attention_s: float = 0.0  # the attention's own time (forward + backward), for scale

    @property
    def strategy(self) -> str:
        return "ulysses" if self.ring == 1 else "ring" if self.ulysses == 1 else "hybrid"

    @property
    def bytes(self) -> float:
        return self.ulysses_bytes + self.ring_bytes

    def describe(self) -> str:
        return (f"{self.strategy} {self.ulysses}x{self.ring}: {self.bytes / 2**20:.1f} MiB/layer, "
                f"{self.exposed_s * 1e3:.3f} ms exposed" + (f", KV heads x{self.kv_repeat}" if self.kv_repeat > 1
                                                           else ""))


@dataclass(frozen=True)
class Choice:
    """The chosen mesh (:attr:`layout`), why (:attr:`reason`) and every candidate priced."""

    best: Candidate
    reason: str
    candidates: list = field(default_factory=list)

    @property
    def strategy(self) -> str:
        return self.best.strategy

    @property
    def ulysses(self) -> int:
        return self.best.ulysses

    @property
    def ring(self) -> int:
        return self.best.ring

    @property
    def layout(self) -> SeqLayout:
        return SeqLayout(ulysses=self.best.ulysses, ring=self.best.ring, zigzag=self.best.ring > 1)


def ulysses_feasible(heads: int, kv_heads: int, u: int) -> str | None:
    """Why Ulysses over ``u`` ranks cannot split these heads (None: it can)."""
    if heads % u:
        return f"{heads} query heads do not divide by {u}"
    if kv_heads % u and u % kv_heads:
        return f"{kv_heads} KV heads neither divide nor are divisible by {u}"
    return None


def price(heads: int, kv_heads: int, u: int, r: int, *, ranks_per_node: int, seq_len: int, head_dim: int,
          batch: int = 1, elem_bytes: int = 2, causal: bool = True, hw: Hardware = Hardware()) -> Candidate:
    """The cost model of the module docstring for one mesh."""
    p = u * r
    tokens = batch * seq_len / p
    repeat = u // kv_heads if kv_heads % u else 1
    kv = kv_heads * repeat
    row = tokens * head_dim * elem_bytes
    u_bytes = 2 * (u - 1) / u * row * (2 * heads + 2 * kv) if u > 1 else 0.0
    u_bw = hw.intra_node_bw if u <= ranks_per_node else hw.inter_node_bw
    exposed = u_bytes / u_bw
    r_bytes = 0.0
    fwd_s = attention_seconds(heads, p, seq_len=seq_len, head_dim=head_dim, batch=batch, causal=causal, hw=hw)
    if r > 1:
        hop = 2 * row * kv
        hops_fwd, hops_bwd = r - 1, 2 * r - 1
        r_bytes = (hops_fwd + hops_bwd) * hop
        r_bw = hw.intra_node_bw if p <= ranks_per_node else hw.inter_node_bw
        block_fwd = fwd_s / r
        exposed += hops_fwd * max(0.0, hop / r_bw - block_fwd) + hops_bwd * max(0.0, hop / r_bw - 1.25 * block_fwd)
        # What the ring adds to the attention itself: each forward step merges its block
        # into the fp32 output and log-sum-exp (read both, write both), each backward step
        # adds into the travelling dK/dV; and a step's fixed latency.
        merge = r * tokens * heads * head_dim * 4 * 3 + r * tokens * kv * head_dim * 4 * 2
        exposed += merge / hw.memory_bw + (hops_fwd + hops_bwd) * hw.hop_latency
    return Candidate(u, r, repeat, u_bytes, r_bytes, exposed, 3.5 * fwd_s)


def attention_seconds(heads: int, sp_size: int, *, seq_len: int, head_dim: int, batch: int = 1,
                      causal: bool = True, hw: Hardware = Hardware()) -> float:
    """One rank's forward attention time for one layer at the modelled throughput."""
    flops = 4 * batch * seq_len * seq_len * heads * head_dim / sp_size * (0.5 if causal else 1.0)
    return flops / hw.attention_flops


def choose(heads: int, kv_heads: int, sp_size: int, *, ranks_per_node: int | None = None, seq_len: int = 8192,
           head_dim: int = 128, batch: int = 1, elem_bytes: int = 2, causal: bool = True, strategy: str = "auto",
           ulysses: int = 0, ring: int = 0, hw: Hardware = Hardware()) -> Choice:
    """The mesh for attention with ``heads`` query and ``kv_heads`` KV heads on
    ``sp_size`` ranks (module docstring). ``strategy`` other than ``"auto"`` and nonzero
    ``ulysses``/``ring`` degrees restrict the candidates; a request nothing satisfies
    raises :class:`StrategyError` saying why."""
    if strategy not in STRATEGIES:
        raise StrategyError(f"sp_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    p = sp_size
    node = ranks_per_node or p
    if ulysses and ring and ulysses * ring != p:
        raise StrategyError(f"ulysses degree {ulysses} x ring degree {ring} != sp_size {p}")
    for name, d in (("ulysses", ulysses), ("ring", ring)):
        if d and (d < 1 or p % d):
            raise StrategyError(f"{name} degree {d} does not divide sp_size {p}")
    meshes = [(u, p // u) for u in range(1, p + 1) if p % u == 0]
    if strategy == "ulysses":
        meshes = [(p, 1)]
    elif strategy == "ring":
        meshes = [(1, p)]
    elif strategy == "hybrid":
        meshes = [(u, r) for u, r in meshes if u > 1 and r > 1]
    meshes = [(u, r) for u, r in meshes if (not ulysses or u == ulysses) and (not ring or r == ring)]
    why_not = {}
    for u, r in list(meshes):
        reason = ulysses_feasible(heads, kv_heads, u) if u > 1 else None
        if reason:
            why_not[(u, r)] = reason
    feasible = [m for m in meshes if m not in why_not]
    if not feasible:
        detail = "; ".join(f"{u}x{r}: {why}" for (u, r), why in why_not.items()) or "no mesh of that shape"
        raise StrategyError(f"no {strategy} mesh of {p} ranks fits {heads} query / {kv_heads} KV heads "
                            f"(ulysses={ulysses or 'any'}, ring={ring or 'any'}): {detail}")
    priced = [price(heads, kv_heads, u, r, ranks_per_node=node, seq_len=seq_len, head_dim=head_dim, batch=batch,
                    elem_bytes=elem_bytes, causal=causal, hw=hw) for u, r in feasible]
    least = min(c.exposed_s for c in priced)
    # Differences under 1% of the attention's own time are below what the model can tell.
    near = [c for c in priced if c.exposed_s <= max(least * 1.05, least + 0.01 * c.attention_s) + 1e-12]
    best = max(near, key=lambda c: (c.ulysses, -c.bytes))
    forced = strategy != "auto" or ulysses or ring
    reason = (f"{'requested' if forced else 'chosen'}: {best.describe()}; {heads} query / {kv_heads} KV heads, "
              f"P={p}, {node} ranks per node, S={seq_len}")
    others = [c.describe() for c in priced if c is not best]
    if others:
        reason += "; also priced: " + ", ".join(others)
    if why_not:
        reason += "; ruled out: " + ", ".join(f"{u}x{r} ({why})" for (u, r), why in why_not.items())
    return Choice(best, reason, priced)


@dataclass(frozen=True)
class CutChoice:
    """Which attention operands cross the ranks as smaller sources (:func:`choose_cut`).

    ``cut``: the operands (``"q"``, ``"k"``, ``"v"``) computed on each rank from gathered
    sources instead of all-to-all'd; ``bytes_before`` / ``bytes_after``: what a rank
    receives per token of the sequence either way (forward; backward mirrors it)."""

    cut: tuple[str, ...]
    bytes_before: float
    bytes_after: float
    reason: str


def choose_cut(operands: dict[str, int], sources: dict[str, dict[str, int]], ranks: int) -> CutChoice:
    """The cheapest way for q, k and v to reach their heads (the Ulysses cut), per token.

    ``operands``: each operand's bytes per token (``H x D x e``; an all-to-all hands a rank
    ``(P - 1) / P`` of ``1 / P`` of it per token of the sequence), the output (``"o"``,
    always all-to-all'd back) among them so that the figures are the layer's; ``sources``: for each
    operand that can be computed token by token from values without heads, those values
    (by name) and their bytes per token (an all-gather hands a rank ``(P - 1) / P`` of them
    per token). Only a *bottleneck* is a candidate: an operand whose own sources cost fewer
    bytes than its own all-to-all (MLA's latents; not the layer's input, which q, k and v
    share but which is wider than each one's share: gathering it would trade bytes for
    memory, the whole input kept on every rank). Candidates that share a source (MLA's k
    and v, from one latent) pay for it once; every subset of them is priced, the cheapest
    wins, the all-to-alls on ties.

    Example (DeepSeek-V3's attention at P = 8, bf16: q and k 128 heads x 192, v and the
    output 128 x 128; k and v from the 512-value latent and the 64-value shared rope key)::

        >>> c = choose_cut({"q": 49152, "k": 49152, "v": 32768, "o": 32768},
        ...                {"k": {"latent": 1024, "k_rope": 128}, "v": {"latent": 1024}}, ranks=8)
        >>> c.cut, round(c.bytes_before / c.bytes_after, 2)
        (('k', 'v'), 1.8)
    """
    share = (ranks - 1) / ranks
    names = [n for n in sorted(sources, key=list(operands).index)
             if sum(sources[n].values()) < operands[n] / ranks]  # bottlenecks only
    best: tuple[float, tuple[str, ...]] | None = None
    for mask in range(1 << len(names)):
        cut = tuple(n for i, n in enumerate(names) if mask >> i & 1)
        moved = sum(size / ranks for n, size in operands.items() if n not in cut)
        gathered: dict[str, int] = {}
        for n in cut:
            gathered.update(sources[n])
        cost = share * (moved + sum(gathered.values()))
        if best is None or cost < best[0] - 1e-9:
            best = (cost, cut)
    assert best is not None  # the empty cut is always priced
    before = share * sum(size / ranks for size in operands.values())
    cost, cut = best
    if not cut:
        reason = "q, k, v all-to-all'd (no smaller source)" if sources else "q, k, v all-to-all'd"
    else:
        gathered = {}
        for n in cut:
            gathered.update(sources[n])
        reason = (f"{', '.join(cut)} computed from gathered {' + '.join(sorted(gathered))} "
                  f"({sum(gathered.values())} bytes/token) instead of all-to-alls: "
                  f"{before / cost:.2f}x fewer bytes per layer forward")
    return CutChoice(cut, before, cost, reason)
