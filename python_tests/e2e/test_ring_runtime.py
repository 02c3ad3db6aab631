"""autosp.runtime.ring.ring_attention: exact ring attention, forward and backward.

Every rank builds the same full-sequence inputs (from the test's fresh seed plus a
per-case offset, printed on failure), takes its own rows
(in its pieces' order), runs the ring and back-propagates a fixed random weighting of its
own output rows. The ring backward hands each rank the gradient of the *total* loss for
its own K/V rows, so each rank compares its output and its q/k/v gradients with the same
rows of single-device ``F.scaled_dot_product_attention`` (float64, dense boolean mask,
``enable_gqa``) over the full sequence, and its traffic (``ring.stats()``) with the
analytical volume.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from autosp.runtime import collectives, ring
from autosp.testing.distributed import run_ranks

TOL = 1e-5


# ----------------------------------------------------------------------------- layouts
def contiguous(S: int, R: int) -> list:
    return [[collectives.chunk(S, R, i)] for i in range(R)]


def zigzag(S: int, R: int) -> list:
    c = [collectives.chunk(S, 2 * R, i) for i in range(2 * R)]
    return [[c[i], c[2 * R - 1 - i]] for i in range(R)]


def _positions(ranges) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges] + [torch.zeros(0, dtype=torch.long)])


def case(name, S, pieces, *, B=2, Hq=2, Hkv=2, D=8, causal=True, window=None, docs=False, pad=False,
         math=False, data_pieces=None, transposed=False, ring_ranks=None, seed=0, drop_pad=False):
    return dict(name=name, S=S, pieces=pieces, B=B, Hq=Hq, Hkv=Hkv, D=D, causal=causal, window=window,
                docs=docs, pad=pad, math=math, data_pieces=data_pieces or pieces, transposed=transposed,
                ring_ranks=ring_ranks, seed=seed, drop_pad=drop_pad)


def _seeded(cases, base: int) -> list:
    """The cases with their seed offsets added to the test's fresh seed (conftest)."""
    return [dict(c, seed=(base + c["seed"]) % 2 ** 62) for c in cases]


# ----------------------------------------------------------------------------- reference
def _inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, S, D = c["B"], c["S"], c["D"]
    q = torch.randn(B, c["Hq"], S, D, generator=g)
    k = torch.randn(B, c["Hkv"], S, D, generator=g)
    v = torch.randn(B, c["Hkv"], S, D, generator=g)
    w = torch.randn(B, c["Hq"], S, D, generator=g)
    docs = None
    if c["docs"]:  # packed documents of random lengths, different per batch row
        docs = torch.stack([torch.randint(0, 3, (S,), generator=g).sort().values for _ in range(B)])
        docs[:, S // 2:] += 3 * torch.randint(0, 2, (B, 1), generator=g)  # and a break mid-sequence
    keep = None
    if c["pad"]:  # key padding: row 0 right-padded, row 1 left-padded (its first queries see no key)
        keep = torch.ones(B, S, dtype=torch.bool)
        cut = 1 + int(torch.randint(0, S // 2, (1,), generator=g))
        keep[0, S - cut:] = False
        keep[-1, :cut] = False
    return q, k, v, w, docs, keep


def _reference(c, q, k, v, w, docs, keep):
    S = c["S"]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    mask = torch.ones(S, S, dtype=torch.bool)
    if c["causal"]:
        mask &= j <= i
    if c["window"] is not None:
        mask &= (i - j) < c["window"]
    mask = mask[None, None]
    if docs is not None:
        mask = mask & (docs[:, :, None] == docs[:, None, :])[:, None]
    if keep is not None:
        mask = mask & keep[:, None, None, :]
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, enable_gqa=True)
    (out * w.double()).sum().backward()
    return out.detach(), *(t.grad for t in leaves)


def _run_case(c, rank: int, group: str, ring_rank: int):
    q, k, v, w, docs, keep = _inputs(c)
    ref = _reference(c, q, k, v, w, docs, keep)
    if c["drop_pad"]:  # negative control: the ring is not told the padding
        keep = None
    idx = _positions(c["data_pieces"][ring_rank])

    def local(t):
        t = t[:, :, idx].clone()
        if c["transposed"]:  # the [B, L, H, D] storage a model's projections produce: strided views
            t = t.transpose(1, 2).contiguous().transpose(1, 2)
        return t.requires_grad_()

    ql, kl, vl = local(q), local(k), local(v)
    ring.reset_stats()
    with ring.force_math(c["math"]):
        out = ring.ring_attention(ql, kl, vl, pieces=c["pieces"], group=group, is_causal=c["causal"],
                                  doc_ids=docs, window=c["window"], key_padding=keep)
    fwd = ring.stats()
    (out * w[:, :, idx]).sum().backward()
    total = ring.stats()
    errs = [(out.double() - ref[0][:, :, idx]).abs().max().item() if out.numel() else 0.0]
    for mine, full in ((ql, ref[1]), (kl, ref[2]), (vl, ref[3])):
        errs.append((mine.grad.double() - full[:, :, idx]).abs().max().item() if mine.numel() else 0.0)
    ok_shapes = out.shape == ql.shape and ql.grad.shape == ql.shape and kl.grad.shape == kl.shape
    return dict(errs=errs, fwd=fwd, total=total, shapes=ok_shapes, finite=bool(torch.isfinite(out).all()))


def _ring_body(rank, world, queue, cases):
    registered = ["ring"]
    collectives.register_group("ring", None)
    results = {}
    subgroups = {}
    try:
        for c in cases:
            group, ring_rank = "ring", rank
            if c["ring_ranks"] is not None:
                key = str(c["ring_ranks"])
                if key not in subgroups:  # every rank creates every subgroup, in the same order
                    made = [dist.new_group(ranks) for ranks in c["ring_ranks"]]
                    subgroups[key] = next((g, rs) for g, rs in zip(made, c["ring_ranks"]) if rank in rs)
                pg, members = subgroups[key]
                group = f"ring_sub{len(subgroups)}"
                collectives.register_group(group, pg)
                registered.append(group)
                ring_rank = members.index(rank)
                assert collectives.group_rank(group) == ring_rank
            results[c["name"]] = (ring_rank, _run_case(c, rank, group, ring_rank))
    finally:  # pooled ranks run the next test in this process
        for name in registered:
            collectives.unregister_group(name)
    queue.put((rank, results))


def _expected_stats(c, ring_rank: int, R: int) -> tuple[dict, dict]:
    """Forward: blocks (r - t) % R for t < R - 1 (K and V, fp32); backward: those again, plus
    R hops of the fp32 dK/dV accumulators (every block once). Empty blocks are not sent."""
    lengths = [sum(b - a for a, b in rs) for rs in c["pieces"]]
    block = [2 * c["B"] * c["Hkv"] * n * c["D"] * 4 for n in lengths]
    kv = [block[(ring_rank - t) % R] for t in range(R - 1)]
    acc = [block[(ring_rank - t) % R] for t in range(R)] if R > 1 else []
    fwd = {"sends": sum(1 for b in kv if b), "bytes": sum(kv)}
    total = {"sends": 2 * fwd["sends"] + sum(1 for b in acc if b), "bytes": 2 * fwd["bytes"] + sum(acc)}
    return fwd, total


def _check(cases, results, world, seed):
    by_name = {c["name"]: c for c in cases}
    failures = []
    for rank, per_case in results.items():
        for name, (ring_rank, res) in per_case.items():
            c = by_name[name]
            R = len(c["pieces"])
            worst = max(res["errs"])
            if name.startswith("neg_"):
                if worst <= 1e-3:
                    failures.append(f"{name} rank {rank}: lying pieces matched the reference ({worst:.2e})")
                continue
            if worst > TOL or not res["shapes"] or not res["finite"]:
                failures.append(f"{name} rank {rank}: errors out/dq/dk/dv {[f'{e:.1e}' for e in res['errs']]}")
            fwd, total = _expected_stats(c, ring_rank, R)
            if res["fwd"] != fwd or res["total"] != total:
                failures.append(f"{name} rank {rank}: stats fwd {res['fwd']} total {res['total']}, "
                                f"expected {fwd} {total}")
    assert not failures, f"seed {seed}:\n" + "\n".join(failures)
    assert set(results) == set(range(world))


# ----------------------------------------------------------------------------- tests
_ALTERNATING = [[(0, 2), (4, 6), (8, 10)], [(2, 4), (6, 8), (10, 12)]]


def _cases_world2():
    return [
        case("contig16_mha_causal_kernel", 16, contiguous(16, 2)),
        case("contig16_mha_causal_math", 16, contiguous(16, 2), math=True),
        case("zigzag13_gqa_causal_kernel", 13, zigzag(13, 2), Hq=4, Hkv=2, seed=1),
        case("zigzag13_gqa_causal_math", 13, zigzag(13, 2), Hq=4, Hkv=2, math=True, seed=1),
        case("zigzag16_mqa_full_kernel", 16, zigzag(16, 2), Hq=4, Hkv=1, causal=False, seed=2),
        case("zigzag16_mqa_full_math", 16, zigzag(16, 2), Hq=4, Hkv=1, causal=False, math=True, seed=2),
        case("zigzag16_gqa_docs_kernel", 16, zigzag(16, 2), Hq=4, Hkv=2, docs=True, seed=3),
        case("contig13_gqa_docs_full_math", 13, contiguous(13, 2), Hq=4, Hkv=2, docs=True, causal=False,
             math=True, seed=4),
        case("contig13_window3_kernel", 13, contiguous(13, 2), window=3, seed=5),
        case("zigzag16_window5_docs_math", 16, zigzag(16, 2), Hq=4, Hkv=1, window=5, docs=True, math=True,
             seed=6),
        # Chunks of 2 alternating: pairs at every distance around the window's edges (min and
        # max key distance equal to window - 1 and to window), for skip/full/masked decisions.
        case("alternating_window4_kernel", 12, _ALTERNATING, Hq=4, Hkv=2, window=4, seed=12),
        case("alternating_window5_math", 12, _ALTERNATING, Hq=4, Hkv=2, window=5, math=True, seed=13),
        case("uneven_empty_piece_kernel", 13, [[(0, 0), (0, 4), (4, 4)], [(4, 13)]], Hq=4, Hkv=2, seed=7),
        case("empty_rank_kernel", 13, [[(0, 0)], [(0, 13)]], Hq=4, Hkv=1, seed=8),
        case("empty_rank_math", 13, [[(9, 13), (0, 9)], [(9, 9)]], Hq=4, Hkv=2, math=True, seed=8),
        case("interleaved_docs_kernel", 13, [[(0, 2), (6, 8), (12, 13)], [(2, 6), (8, 12)]], docs=True,
             seed=9),
        case("transposed_zigzag13_kernel", 13, zigzag(13, 2), Hq=4, Hkv=2, transposed=True, seed=10),
        # Key padding (causal: left padding gives queries that see no key; encoders: not causal).
        case("zigzag13_gqa_pad_causal_kernel", 13, zigzag(13, 2), Hq=4, Hkv=2, pad=True, seed=14),
        case("zigzag13_gqa_pad_causal_math", 13, zigzag(13, 2), Hq=4, Hkv=2, pad=True, math=True, seed=14),
        case("contig15_pad_full_kernel", 15, contiguous(15, 2), causal=False, pad=True, seed=15),
        case("contig15_pad_full_math", 15, contiguous(15, 2), causal=False, pad=True, math=True, seed=15),
        case("contig13_pad_window4_kernel", 13, contiguous(13, 2), Hq=4, Hkv=1, window=4, pad=True, seed=16),
        # Zigzag-sharded data described as contiguous: must NOT match (the pieces drive the masks).
        case("neg_lying_pieces", 16, contiguous(16, 2), data_pieces=zigzag(16, 2), seed=11),
        case("neg_dropped_padding", 15, contiguous(15, 2), causal=False, pad=True, drop_pad=True, seed=17),
    ]


def _cases_world4():
    return [
        case("zigzag13_gqa_causal_kernel", 13, zigzag(13, 4), Hq=4, Hkv=2, seed=21),
        case("zigzag16_window5_docs_math", 16, zigzag(16, 4), Hq=4, Hkv=2, window=5, docs=True, math=True,
             seed=22),
        case("zigzag16_window5_kernel", 16, zigzag(16, 4), Hq=4, Hkv=1, window=5, seed=28),
        case("contig16_mqa_full_kernel", 16, contiguous(16, 4), Hq=4, Hkv=1, causal=False, seed=23),
        case("contig16_docs_kernel", 16, contiguous(16, 4), docs=True, seed=24),
        case("empty_rank_causal_kernel", 13, [[(0, 4)], [(4, 4)], [(4, 9)], [(9, 13)]], Hq=4, Hkv=2, seed=25),
        # Two rings of two over {0, 2} and {1, 3}: group ranks differ from global ranks.
        case("subgroup_zigzag13_kernel", 13, zigzag(13, 2), Hq=4, Hkv=2, ring_ranks=[[0, 2], [1, 3]], seed=26),
        case("zigzag19_pad_full_kernel", 19, zigzag(19, 4), Hq=4, Hkv=2, causal=False, pad=True, seed=29),
        case("zigzag19_pad_causal_math", 19, zigzag(19, 4), Hq=4, Hkv=2, pad=True, math=True, seed=30),
        case("neg_lying_pieces_r4", 16, contiguous(16, 4), data_pieces=zigzag(16, 4), seed=27),
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_full_attention(world, _fresh_seed):
    cases = _seeded(_cases_world2() if world == 2 else _cases_world4(), _fresh_seed)
    results = run_ranks(_ring_body, world, args=(cases,), timeout=120, collective_timeout=30)
    _check(cases, results, world, _fresh_seed)


def test_single_rank_without_process_group(_fresh_seed):
    """R == 1: no communication (no process group at all here), pieces in any order."""
    assert collectives.group_size("ring_r1") == 1 or collectives.simulating()
    cases = [
        case("r1_permuted_gqa_kernel", 13, [[(5, 13), (0, 2), (2, 5)]], Hq=4, Hkv=2),
        case("r1_permuted_gqa_math", 13, [[(5, 13), (0, 2), (2, 5)]], Hq=4, Hkv=2, math=True),
        case("r1_docs_window_kernel", 16, [[(0, 16)]], Hq=4, Hkv=1, window=4, docs=True, seed=3),
        case("r1_docs_full_math", 16, [[(8, 16), (0, 8)]], Hq=2, Hkv=1, causal=False, docs=True, math=True),
    ]
    for c in _seeded(cases, _fresh_seed):
        res = _run_case(c, 0, "ring_r1", 0)
        assert max(res["errs"]) <= TOL, (c["name"], _fresh_seed, res["errs"])
        assert res["total"] == {"sends": 0, "bytes": 0}


@pytest.mark.parametrize("math", [False, True])
def test_single_rank_float64(math):
    """fp64 inputs accumulate in fp64 (the CPU kernel's lse is fp64 there): exact to 1e-12."""
    S, B, Hq, Hkv, D = 11, 1, 4, 1, 8
    perm = [(4, 11), (0, 4)]
    q, k, v = torch.randn(B, Hq, S, D, dtype=torch.float64), *torch.randn(2, B, Hkv, S, D, dtype=torch.float64)
    w = torch.randn(B, Hq, S, D, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
    (ref * w).sum().backward()
    idx = _positions(perm)
    local = [t[:, :, idx].clone().requires_grad_() for t in (q, k, v)]
    with ring.force_math(math):
        out = ring.ring_attention(*local, pieces=[perm], group="ring_r1", is_causal=True)
        (out * w[:, :, idx]).sum().backward()
    assert out.dtype == torch.float64
    assert (out - ref[:, :, idx]).abs().max() < 1e-12
    for mine, full in zip(local, leaves):
        assert (mine.grad - full.grad[:, :, idx]).abs().max() < 1e-12


@pytest.mark.parametrize("math", [False, True])
def test_simulated_meta_shapes(math):
    """Under collectives.simulate on meta tensors: no communication, right shapes everywhere."""
    S, R, B, Hq, Hkv, D = 13, 4, 2, 4, 2, 8
    pieces = zigzag(S, R)
    ring.reset_stats()
    with ring.force_math(math):
        for rank in (0, 3):
            L = sum(b - a for a, b in pieces[rank])
            q = torch.empty(B, Hq, L, D, device="meta", requires_grad=True)
            k = torch.empty(B, Hkv, L, D, device="meta", requires_grad=True)
            v = torch.empty(B, Hkv, L, D, device="meta", requires_grad=True)
            docs = torch.zeros(1, S, dtype=torch.long, device="meta")
            saved: list = []  # what autograd keeps: O(L) (q, k, v, out, lse), nothing of size S

            def pack(t, saved=saved):
                saved.append(tuple(t.shape))
                return t

            with collectives.simulate(R, rank=rank), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = ring.ring_attention(q, k, v, pieces=pieces, group="autosp_sim", is_causal=True,
                                          doc_ids=docs, window=6)
            assert sorted(saved) == sorted([q.shape, k.shape, v.shape, q.shape, q.shape[:3]])
            with collectives.simulate(R, rank=rank):
                out.sum().backward()
            assert out.shape == (B, Hq, L, D) and out.device.type == "meta" and out.dtype == torch.float32
            assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
            assert k.grad.device.type == "meta"
        assert ring.stats() == {"sends": 0, "bytes": 0}


def test_bad_input_errors():
    q = torch.randn(1, 4, 6, 8)
    kv = torch.randn(1, 2, 6, 8)
    ok = dict(pieces=[[(0, 6)]], group="bad", is_causal=True)
    with pytest.raises(ValueError, match="query must be"):
        ring.ring_attention(q[0], kv, kv, **ok)
    with pytest.raises(ValueError, match=r"multiple of key/value heads"):
        ring.ring_attention(q, torch.randn(1, 3, 6, 8), torch.randn(1, 3, 6, 8), **ok)
    with pytest.raises(ValueError, match=r"key .* and value .* same shape"):
        ring.ring_attention(q, kv, torch.randn(1, 2, 6, 4), **ok)
    with pytest.raises(ValueError, match=r"cover 5 positions .* L = 6"):
        ring.ring_attention(q, kv, kv, pieces=[[(0, 5)]], group="bad", is_causal=True)
    with pytest.raises(ValueError, match="gap"):
        ring.ring_attention(q, kv, kv, pieces=[[(0, 2), (3, 7)]], group="bad", is_causal=True)
    with pytest.raises(ValueError, match="2 ring ranks"):
        with collectives.simulate(2, 0):
            ring.ring_attention(q, kv, kv, **ok)
    with pytest.raises(ValueError, match="window requires is_causal"):
        ring.ring_attention(q, kv, kv, pieces=[[(0, 6)]], group="bad", is_causal=False, window=2)
    with pytest.raises(ValueError, match=r"doc_ids .* \[B, S\]"):
        ring.ring_attention(q, kv, kv, doc_ids=torch.zeros(1, 5, dtype=torch.long), **ok)

