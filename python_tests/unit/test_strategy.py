"""The mesh choice (autosp.cost.strategy) and the sequence layouts it implies (SeqLayout)."""
import pytest
import torch

from autosp.cost.strategy import StrategyError, choose, price
from autosp.runtime.collectives import SeqLayout


@pytest.mark.parametrize("layout", [SeqLayout(4), SeqLayout(1, 4), SeqLayout(1, 2, True), SeqLayout(2, 2, True),
                                    SeqLayout(1, 4, True), SeqLayout(2, 4, True), SeqLayout(4, 2, True)])
@pytest.mark.parametrize("seq", [64, 61, 13, 9])
def test_layout_pieces_partition_the_sequence_in_a_known_order(layout, seq):
    held = [layout.pieces(seq, g) for g in range(layout.size)]
    covered = sorted(p for pieces in held for p in pieces if p[0] < p[1])
    assert [a for a, _ in covered] == [0] + [b for _, b in covered][:-1] and covered[-1][1] == seq, held
    ordered = [held[g][k] for g, k in layout.order()]
    assert [p for p in ordered if p[0] < p[1]] == covered  # order() lays the pieces out in sequence order
    lengths = [sum(b - a for a, b in pieces) for pieces in held]
    assert max(lengths) - min(lengths) <= 2 * layout.ring  # balanced up to rounding
    for i in range(layout.ring):  # a ring group's ranks together hold its frame
        frame = layout.ring_pieces(seq, i)
        mine = sorted(p for g in range(i * layout.ulysses, (i + 1) * layout.ulysses) for p in held[g] if p[0] < p[1])
        assert sum(b - a for a, b in mine) == sum(b - a for a, b in frame)
    assert SeqLayout.parse(layout.describe()) == layout


def test_zigzag_balances_causal_work():
    """Rank i of a zigzag ring holds chunks i and 2R-1-i: the causal pairs each rank's
    queries see are equal; contiguous chunks give the last rank R times the first's."""
    def causal_pairs(layout, g, seq=64):
        return sum(sum(range(a + 1, b + 1)) for a, b in layout.pieces(seq, g))
    zig = [causal_pairs(SeqLayout(1, 4, True), g) for g in range(4)]
    flat = [causal_pairs(SeqLayout(1, 4), g) for g in range(4)]
    assert max(zig) / min(zig) < 1.1 and flat[-1] / flat[0] > 5


def test_choice_follows_heads_and_topology():
    two = choose(2, 2, 4, seq_len=4096, head_dim=64)
    assert two.ring > 1 and "ruled out: 4x1 (2 query heads do not divide by 4)" in two.reason
    llama8b = dict(seq_len=1 << 20, head_dim=128, ranks_per_node=8)
    assert (choose(32, 8, 8, **llama8b).ulysses, choose(32, 8, 8, **llama8b).ring) == (8, 1)
    assert (choose(32, 8, 16, **llama8b).ulysses, choose(32, 8, 16, **llama8b).ring) == (8, 2)  # Ulysses in a node
    big = choose(32, 8, 64, **llama8b)
    assert big.ring > 1 and big.ulysses <= 8, big.reason
    one_node = choose(32, 8, 16, seq_len=1 << 20, head_dim=128, ranks_per_node=16)
    assert one_node.ring == 1, one_node.reason  # the same P inside one node: no ring needed


def test_forced_strategies_and_their_errors():
    assert (choose(4, 1, 4, strategy="ring").ulysses, choose(4, 1, 4, strategy="ring").ring) == (1, 4)
    hybrid = choose(4, 2, 4, strategy="hybrid", ulysses=2)
    assert (hybrid.ulysses, hybrid.ring) == (2, 2) and hybrid.reason.startswith("requested")
    with pytest.raises(StrategyError, match="2 query heads do not divide by 4"):
        choose(2, 2, 4, strategy="ulysses")
    with pytest.raises(StrategyError, match="ulysses degree 3 does not divide sp_size 4"):
        choose(4, 4, 4, ulysses=3)
    with pytest.raises(StrategyError, match="sp_strategy must be one of"):
        choose(4, 4, 4, strategy="zigzag")


def test_price_is_the_documented_volume():
    # Ulysses 4 x 1, 8 heads / 2 KV, S = 1024, d = 16, fp32: 2 * 3/4 * 256 tokens * 16 * 4 B * (16 + 4)
    u = price(8, 2, 4, 1, ranks_per_node=4, seq_len=1024, head_dim=16, elem_bytes=4)
    assert u.ulysses_bytes == 2 * 3 / 4 * 256 * 16 * 4 * (16 + 2 * 4) and u.kv_repeat == 2 and u.ring_bytes == 0
    # Ring 1 x 4: (3R - 2) = 10 hops of K and V at 2 KV heads.
    r = price(8, 2, 1, 4, ranks_per_node=4, seq_len=1024, head_dim=16, elem_bytes=4)
    assert r.ring_bytes == 10 * 2 * 256 * 2 * 16 * 4 and r.ulysses_bytes == 0


def test_compile_rejects_unknown_strategies():
    import autosp
    from autosp.ir.diagnostics import AutospError
    with pytest.raises(AutospError, match="sp_strategy must be one of"):
        autosp.compile(torch.nn.Linear(2, 2), sp_strategy="zigzag")
    with pytest.raises(AutospError, match="ring_degree must be a positive int"):
        autosp.compile(torch.nn.Linear(2, 2), ring_degree=0)


def test_a_later_compilation_keeps_the_first_mesh():
    """The mesh is priced once (at the first call's length); a later compilation (another
    batch size) requests that mesh, so it runs on the same sub-groups and layout."""
    import autosp
    module = autosp.compile(torch.nn.Linear(2, 2))
    assert module._mesh().strategy == "auto"
    for layout, strategy in ((SeqLayout(2, 2, True), "hybrid"), (SeqLayout(1, 4, True), "ring"), (SeqLayout(4), "ulysses")):
        module.layout = layout
        mesh = module._mesh()
        assert (mesh.strategy, mesh.ulysses_degree, mesh.ring_degree) == (strategy, layout.ulysses, layout.ring)
        chosen = choose(8, 4, 4, strategy=mesh.strategy, ulysses=mesh.ulysses_degree, ring=mesh.ring_degree)
        assert (chosen.ulysses, chosen.ring) == (layout.ulysses, layout.ring)


def test_recurrence_prices_follow_the_documented_model():
    """autosp.cost.recurrence: the widening factors, the three prices as documented, and
    the choices they make (prefix where P parts of a chain cost more than one widened
    part, the chain at P = 2 where the widening is 2, heads only where allowed)."""
    from autosp.cost.recurrence import GATED_DELTA_NET, MAMBA2, RecurrenceShape, choose_recurrence, widening
    from autosp.cost.strategy import Hardware
    gdn = RecurrenceShape(GATED_DELTA_NET, heads=32, k_heads=16, key_dim=128, value_dim=128, chunk=64, elem_bytes=2)
    m2 = RecurrenceShape(MAMBA2, heads=128, k_heads=8, key_dim=128, value_dim=64, chunk=256, elem_bytes=2)
    assert widening(gdn) == pytest.approx(1.75) and widening(m2) == pytest.approx(2.0)
    hw = Hardware()
    c = choose_recurrence(gdn, 4, heads_ok=True, seq_len=8192)
    part = 8192 / 4 * gdn.flops() / hw.recurrence_flops
    assert c.prices["chain"] == pytest.approx(16 * part + 2 * gdn.state_elems() * 4 / hw.intra_node_bw)
    assert c.prices["prefix"] == pytest.approx(4 * 1.75 * part + 3 * (gdn.summary_elems() + gdn.state_elems()) * 4
                                               / hw.intra_node_bw)
    assert c.prices["heads"] == pytest.approx(3 * part + 4 * 3 / 4 * 2048 * gdn.io_elems() * 2 / hw.intra_node_bw)
    assert c.method == "prefix" and "prefix" in c.reason and "heads" in c.reason
    assert choose_recurrence(m2, 2, heads_ok=False).method == "chain"  # widening 2: no better than 2 parts
    assert choose_recurrence(m2, 4, heads_ok=False).method == "prefix"
    assert "heads" not in choose_recurrence(gdn, 4, heads_ok=False).prices
    fast_links = Hardware(intra_node_bw=1e15)  # bytes free: the heads path is one part's compute
    assert choose_recurrence(gdn, 4, heads_ok=True, hw=fast_links).method == "heads"


def test_lightning_attention_prefix_adds_one_product_and_sends_one_decay_per_head():
    """MiniMax's lightning attention (64 heads of 128, block 256): a part run from zeros as it
    is plus the incoming state's ``q S`` per token (widening 7/6), a summary of the state and
    one decay per head; so the prefix wins already at P = 2."""
    from autosp.cost.recurrence import LIGHTNING, RecurrenceShape, choose_recurrence, widening
    from autosp.cost.strategy import Hardware
    shape = RecurrenceShape(LIGHTNING, heads=64, k_heads=64, key_dim=128, value_dim=128, chunk=256, elem_bytes=2)
    assert shape.flops() == 64 * (2 * 256 * 256 + 4 * 128 * 128)
    assert widening(shape) == pytest.approx(7 / 6)
    assert shape.summary_elems() == 64 * 128 * 128 + 64
    c = choose_recurrence(shape, 2, heads_ok=False, seq_len=8192)
    part = 8192 / 2 * shape.flops() / Hardware().recurrence_flops
    assert c.prices["prefix"] == pytest.approx(4 * 7 / 6 * part + (shape.summary_elems() + shape.state_elems()) * 4
                                               / Hardware().intra_node_bw)
    assert c.method == "prefix" and "lightning_attention (64 heads" in c.reason


def test_compile_rejects_unknown_recurrence_methods():
    import autosp
    with pytest.raises(autosp.AutospError, match="sp_recurrence must be one of"):
        autosp.compile(torch.nn.Linear(2, 2), sp_size=1, sp_recurrence="scan")


def test_mamba1_prefix_reads_its_basis_out_and_sends_a_diagonal_transition():
    """Mamba-1's scan (2048 channels, N = 16): 10 N per channel and token from a state, 11 N
    for the prefix's part; its state and its transition are N per channel. The prefix wins
    from P = 2 (one part's time, 1.1 widened, against two)."""
    from autosp.cost.recurrence import MAMBA1, RecurrenceShape, choose_recurrence, widening
    shape = RecurrenceShape(MAMBA1, heads=2048, k_heads=2048, key_dim=16, value_dim=1, chunk=1, elem_bytes=2)
    assert shape.flops() == 2048 * 160 and widening(shape) == pytest.approx(1.1)
    assert shape.state_elems() == 2048 * 16 and shape.summary_elems() == 2 * 2048 * 16
    c = choose_recurrence(shape, 2, heads_ok=False)
    assert c.method == "prefix" and c.reason.startswith("selective_scan (2048 channels, N 16) on 2 ranks: prefix")


def test_choose_cut_prices_gathered_sources_against_the_all_to_alls():
    """DeepSeek-V3 at P = 8 (bf16): k and v from one 512-value latent plus the 64-value rope
    key (shared: paid once), q from its 1536-value latent; every cut is cheaper than its
    all-to-alls, so all three are cut: 2.46x fewer bytes per layer forward. A source that
    costs what the all-to-all costs is not taken (ties go to the all-to-alls), nor one
    that is cheaper only because operands share it."""
    from autosp.cost.strategy import choose_cut
    ops = {"q": 49152, "k": 49152, "v": 32768, "o": 32768}
    sources = {"q": {"q_latent": 3072}, "k": {"kv_latent": 1024, "rope_key": 128}, "v": {"kv_latent": 1024}}
    c = choose_cut(ops, sources, ranks=8)
    assert c.cut == ("q", "k", "v") and round(c.bytes_before / c.bytes_after, 2) == 2.46, c
    assert "q, k, v computed from gathered kv_latent + q_latent + rope_key" in c.reason
    assert choose_cut(ops, {"v": {"kv_latent": 1024}}, ranks=8).cut == ("v",)  # 1024 < 32768 / 8
    # the layer's input, shared by q, k and v (T5 at P = 2: d per token against 3 x d / 2): cheaper
    # in bytes together, but no bottleneck for any of them, so not gathered
    shared = choose_cut({"q": 128, "k": 128, "v": 128, "o": 128}, {n: {"hidden": 128} for n in "qkv"}, ranks=2)
    assert shared.cut == (), shared
    tie = choose_cut({"k": 64, "o": 64}, {"k": {"x": 16}}, ranks=4)  # 16 == 64 / 4
    assert tie.cut == () and tie.bytes_before == tie.bytes_after
    assert choose_cut(ops, {}, ranks=8).cut == ()
