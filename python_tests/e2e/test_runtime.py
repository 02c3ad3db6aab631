"""Runtime collectives on spawned gloo ranks, autosp ops emitted into FX graphs, and the
gradient synchronisation armed by compiled calls (buckets, sync points, overlap)."""
import pytest
import torch

from autosp.testing.distributed import run_ranks

IR = """
func.func @main(%x: !torch.vtensor<[2,8,4,3],f32>) -> !torch.vtensor<[2,4,8,3],f32> {
  %0 = "autosp.all_to_all"(%x) {split_dim = 1 : i64, concat_dim = 2 : i64, seq_dim = -1 : i64, group = "sp"}
      : (!torch.vtensor<[2,8,4,3],f32>) -> !torch.vtensor<[2,4,8,3],f32>
  return %0 : !torch.vtensor<[2,4,8,3],f32>
}
"""


def _ulysses_round_trip(rank, world, queue, seed):
    """Sequence-sharded -> head-sharded -> back, through the emitted graph and autograd."""
    from autosp.backend.fx_emitter import emit_graph_module
    from autosp.ir.core import parse_module
    from autosp.runtime import collectives as c

    torch.manual_seed(seed)
    full = torch.randn(2, 8, 4 * world, 3)  # [B, H, S, D], identical on every rank
    local = full.chunk(world, dim=2)[rank].clone().requires_grad_()
    # emitted: seq-sharded [B, H, S/P, D] -> head-sharded [B, H/P, S, D]
    text = IR.replace("[2,8,4,3]", f"[2,8,{4},3]").replace("[2,4,8,3]", f"[2,{8 // world},{4 * world},3]")
    gm = emit_graph_module(parse_module(text, "a2a.mlir"))
    heads = gm(local)[0]
    expected = full.chunk(world, dim=1)[rank]
    back = c.all_to_all(heads, split_dim=2, concat_dim=1, seq_dim=-1, group="sp")
    weight = torch.arange(back.numel(), dtype=back.dtype).view_as(back)
    (back * weight).sum().backward()
    queue.put((rank, dict(
        heads_ok=torch.equal(heads, expected),
        back_ok=torch.equal(back, local.detach()),
        grad_ok=torch.equal(local.grad, weight),
        gather_ok=torch.equal(c.all_gather(local.detach(), dim=2, group="sp"), full),
        shard_ok=torch.equal(c.shard(full, seq_len=full.shape[2], dim=2, lo=0, trim=0, group="sp"),
                             local.detach()),
        reduce_ok=torch.equal(c.all_reduce(torch.full((2,), float(rank)), "sum", "sp"),
                              torch.full((2,), float(sum(range(world))))),
    )))


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_emitted_and_inverse(world, _fresh_seed):
    results = run_ranks(_ulysses_round_trip, world, args=(_fresh_seed,))
    assert sorted(results) == list(range(world))
    for rank, checks in results.items():
        assert all(checks.values()), f"rank {rank}: {checks}"


def _wrong_order(rank, world, queue, seed):
    """Negative control: concatenating in the wrong order must not match."""
    from autosp.runtime import collectives as c
    torch.manual_seed(seed)
    full = torch.randn(1, 4, 2 * world, 2)
    local = full.chunk(world, dim=2)[world - 1 - rank]  # shards swapped
    heads = c.all_to_all(local, split_dim=1, concat_dim=2, seq_dim=-1, group="sp")
    queue.put((rank, torch.equal(heads, full.chunk(world, dim=1)[rank])))


def test_swapped_shards_are_detected(_fresh_seed):
    results = run_ranks(_wrong_order, 2, args=(_fresh_seed,))
    assert not any(results.values())


def _fails_on_rank_one(rank, world, queue):
    from autosp.runtime import collectives as c
    if rank == 1:
        raise ValueError("boom on rank 1")
    c.all_reduce(torch.ones(1), "sum", "sp")  # would wait forever for rank 1


def test_a_failing_rank_ends_with_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="boom on rank 1"):
        run_ranks(_fails_on_rank_one, 2, timeout=120, collective_timeout=10)


def _uneven(rank, world, queue, seed, seq):
    """Sequence lengths not divisible by P: chunks differ by one, nothing is dropped."""
    from autosp.runtime import collectives as c
    torch.manual_seed(seed)
    full = torch.randn(2, 4, seq, 3, requires_grad=True)  # [B, H, S, D]
    local = c.shard(full, seq_len=seq, dim=2, lo=0, trim=0, group="sp")
    heads = c.all_to_all(local, split_dim=1, concat_dim=2, seq_dim=2, group="sp", seq_len=seq)
    back = c.all_to_all(heads, split_dim=2, concat_dim=1, seq_dim=2, group="sp")
    labels = c.shard(full[:, :, 1:], seq_len=seq, dim=2, lo=0, trim=1, group="sp")   # window [0, S-1)
    logits = c.rewindow(local, seq_len=seq, dim=2, lo=0, trim=0, new_lo=0, new_trim=1, group="sp")
    gathered = c.all_gather(logits - labels, dim=2, group="sp", seq_len=seq, lo=0, trim=1)
    queue.put((rank, dict(
        local=tuple(local.shape), sizes=c.local_len(seq, 0, 1, "sp"),
        heads_ok=torch.equal(heads, full.detach().chunk(world, dim=1)[rank]),
        back_ok=torch.equal(back, local.detach()),
        shift_ok=torch.equal(gathered, (full[:, :, :-1] - full[:, :, 1:]).detach()),
    )))


@pytest.mark.parametrize("world, seq", [(2, 7), (4, 15), (4, 33)])
def test_uneven_sequence_chunks(world, seq, _fresh_seed):
    results = run_ranks(_uneven, world, args=(_fresh_seed, seq))
    lengths = [results[r]["local"][2] for r in range(world)]
    assert sum(lengths) == seq and max(lengths) - min(lengths) == 1
    assert sum(results[r]["sizes"] for r in range(world)) == seq - 1
    for rank, r in results.items():
        assert r["heads_ok"] and r["back_ok"] and r["shift_ok"], f"rank {rank}: {r}"


# ----------------------------------------------------------------------------- gradient sync
def _two_matmuls():
    graph = torch.fx.Graph()
    w1, w2, unused, x = (graph.placeholder(n) for n in ("w1", "w2", "unused", "x"))
    y = graph.call_function(torch.ops.aten.mm.default, (x, w1))
    z = graph.call_function(torch.ops.aten.mm.default, (y, w2))
    graph.output((z,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_grad_buckets_follow_backward_order_and_sit_before_first_use():
    from autosp.runtime.grad_sync import insert_sync_points, plan_buckets, sync_point
    gm = _two_matmuls()
    sizes = {0: 64, 1: 64, 2: 64}
    assert plan_buckets(gm, sizes, bucket_bytes=1) == [[1], [0]], "w2 is complete first in backward"
    assert plan_buckets(gm, sizes, bucket_bytes=1 << 20) == [[1, 0]], "unused placeholders get no bucket"
    insert_sync_points(gm, [[1], [0]])
    points = [n for n in gm.graph.nodes if n.target is sync_point]
    assert [p.args[0].name for p in points] == ["w1", "w2"]
    for point in points:  # right before the mm that first reads its parameter, which reads it through the point
        item = point.next
        assert item.args == (point, 0) and item.next.target is torch.ops.aten.mm.default
        assert item in item.next.args and point.args[0] not in item.next.args
    x, w1, w2 = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5, 2)
    assert torch.equal(gm(w1, w2, None, x)[0], x @ w1 @ w2), "unarmed sync points are identities"


def _overlap_body(rank, world, queue, seed, in_graph, checkpointing="off"):
    """One bucket per parameter: with sync points in the graph, buckets are issued while the
    backward still runs (also with checkpointing, where each sync point must stay before
    its first use in the split graph); without (the negative control), only after its last op."""
    import copy
    import time

    from torch.utils._python_dispatch import TorchDispatchMode

    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.testing.parity import parity

    class Times(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.times = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.namespace not in ("c10d", "_c10d_functional"):
                self.times.append(time.perf_counter())
            return out

    torch.manual_seed(seed)
    model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4))
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True, grad_bucket_bytes=1, checkpointing=checkpointing)
    ids = torch.randint(0, 64, (2, 16))
    error = parity(reference, compiled, ids, labels=ids).max_error
    compiled.programs[0].sync_points_in_graph = in_graph
    loss = compiled(ids, labels=ids)["loss"]
    times = Times()
    with times:
        loss.backward()
    step = compiled.grad_sync.last_step
    compute = [t for t in times.times if t < step["first_wait"]
               and not any(a <= t <= b for a, b, _ in step["issues"])]
    early = sum(1 for a, _, _ in step["issues"] if a < max(compute))
    queue.put((rank, (error, compiled.grad_sync.collectives_last_step,
                      len(list(model.parameters())), early)))


@pytest.mark.parametrize("in_graph,checkpointing", [(True, "off"), (True, "sac"), (False, "off")])
def test_gradient_all_reduces_start_during_backward(in_graph, checkpointing, _fresh_seed):
    results = run_ranks(_overlap_body, 2, args=(_fresh_seed % 10000, in_graph, checkpointing), timeout=300)
    for rank, (error, buckets, params, early) in results.items():
        assert error <= 1e-5, f"rank {rank}: rel err {error:.2e}"
        assert buckets == params, "one all-reduce per bucket, one parameter per bucket here"
        if in_graph and checkpointing == "off":
            assert early >= params - 2, f"rank {rank}: only {early}/{params} buckets issued during backward"
        elif in_graph:  # a recomputed layer yields all its gradients at once: the first layer's
            # (plus the embedding) come last, with no compute left to overlap. Before: 0.
            assert early >= (params - 2) // 2, f"rank {rank}: only {early}/{params} buckets issued during backward"
        else:  # negative control: all issued after the model's backward
            assert early == 0, f"rank {rank}: {early} buckets issued early without sync points"


# ---------------------------------------------------------------- structured-mask kernels
def _eager_attention(q, k, v, allowed, fill):
    """Softmax attention as eager code writes it: additive (scores + where(allowed, 0, min)),
    masked_fill (scores.masked_fill(~allowed, min)), or boolean SDPA semantics (zeros)."""
    import math
    low = torch.finfo(q.dtype).min
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if fill == "additive":
        probs = torch.softmax(scores + torch.where(allowed, 0.0, low), -1)
    elif fill == "masked_fill":
        probs = torch.softmax(scores.masked_fill(~allowed, low), -1)
    else:
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return probs @ v


@pytest.mark.parametrize("kernel", ["key_padding", "window", "documents", "non_contiguous_documents", "kept"])
def test_structured_mask_kernels_match_eager_softmax_attention(kernel, _fresh_seed):
    """Each kernel the emitter calls for a proven mask against eager softmax attention with
    the dense mask, forward and gradients (GQA, batch 2, fresh inputs). Rows whose keys are
    all padded (left padding) give what the original mask gave: zeros for a boolean mask,
    eager's uniform average with softmax's gradient for an additive one, the plain average
    for masked_fill. The control: the same kernel without its structure fails."""
    from autosp.runtime import attention
    b, s = 2, 40
    q = torch.randn(b, 4, s, 8, requires_grad=True)
    k, v = (torch.randn(b, 2, s, 8, requires_grad=True) for _ in range(2))
    i = torch.arange(s)
    causal = (i[None, :] <= i[:, None])[None, None]
    pad = torch.ones(b, s, dtype=torch.bool)
    pad[1, :7] = False  # left padding: rows 0..6 of batch 1 see no key
    pad[0, -5:] = False
    docs = torch.tensor([[0] * 9 + [1] * 20 + [2] * 11, [0] * 3 + [1] * 37])
    cases = []
    if kernel == "key_padding":
        allowed = causal & pad[:, None, None, :]
        for fill, mode in (("bool", None), ("additive", "uniform"), ("masked_fill", "mean")):
            cases.append((fill, allowed, lambda q, k, v, mode=mode: attention.key_padded_causal_attention(
                q, k, v, pad[:, None, None, :], enable_gqa=True, empty_rows=mode)))
    elif kernel == "window":
        allowed = causal & (i[:, None] - i[None, :] < 6)[None, None] & pad[:, None, None, :]
        cases.append(("additive", allowed, lambda q, k, v: attention.sliding_window_attention(
            q, k, v, pad[:, None, None, :], enable_gqa=True, window=6, empty_rows="uniform")))
    elif kernel in ("documents", "non_contiguous_documents"):
        if kernel == "non_contiguous_documents":
            docs = torch.tensor([[0] * 9 + [1] * 20 + [0] * 11, [2] * 3 + [1] * 30 + [2] * 7])
        allowed = causal & (docs[:, None, :, None] == docs[:, None, None, :])
        cases.append(("bool", allowed, lambda q, k, v: attention.document_attention(
            q, k, v, docs[:, None, None, :], enable_gqa=True)))
    else:  # a kept boolean mask from fused masked_fill attention: a prefix-LM and padding
        allowed = (causal | (i[None, :] < 4)[None, None]) & pad[:, None, None, :]
        cases.append(("masked_fill", allowed, lambda q, k, v: attention.masked_attention(
            q, k, v, allowed, enable_gqa=True, empty_rows="mean")))
    for fill, allowed, fn in cases:
        expected = _eager_attention(q, k, v, allowed, fill)
        out = fn(q, k, v)
        grad = torch.randn_like(out)
        for a, e in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
            assert (a - e).abs().max() <= 1e-5 * max(1.0, e.abs().max()), (kernel, fill)
        assert (out - expected).abs().max() <= 1e-5, (kernel, fill)
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert (plain - expected).abs().max() > 1e-2, "control: the structure matters here"


def test_recomputed_outputs_without_a_differentiable_source_are_not_differentiable():
    """A checkpointed segment's output that depends on no input requiring grad (RoPE's
    tables, made from positions and a buffer, next to the hidden states) is marked
    non-differentiable, also through nested submodules: its consumers save nothing for
    its gradient. Negative control: the unmarked function makes it require grad."""
    from torch.fx.passes.split_module import split_module

    import autosp.backend.checkpointing as ckpt

    def f(x, pos, inv_freq):
        n = x.shape[1]
        table = (pos[:, :n, None].float() * inv_freq).cos()
        return x * 2 + table.sum(), table
    gm = torch.fx.symbolic_trace(f)
    nodes = list(gm.graph.nodes)
    nested = split_module(gm, gm, lambda n: int(nodes.index(n) >= len(nodes) // 2))  # submodules, getitems
    x = torch.randn(2, 5, 4, requires_grad=True)
    pos, inv_freq = torch.arange(5)[None].expand(2, 5), torch.rand(4)
    for fn in (gm, nested):
        hidden, table = ckpt.Recompute(fn)(x, pos, inv_freq)
        assert hidden.requires_grad and not table.requires_grad
        hidden.sum().backward()
        assert torch.allclose(x.grad, torch.full_like(x, 2.0))
        x.grad = None
    original = ckpt._differentiable_outputs
    try:
        ckpt._differentiable_outputs = lambda fn, requires: None
        assert ckpt.Recompute(gm)(x, pos, inv_freq)[1].requires_grad
    finally:
        ckpt._differentiable_outputs = original


def test_a_recomputed_output_nothing_saved_is_released_before_its_gradient():
    """Backward of a checkpointed segment recomputes its outputs only as roots for
    ``torch.autograd.grad``: an output nothing saved (``sin(x) + 1``: the add keeps no
    result) has its data freed first, so the segment's backward peak (its gradient:
    ``cos(x)`` and the product) is one [N] tensor lower (measured on meta by the memory model's tracker); an output its own
    node saved (``exp``) or that is a view of the input is kept, and every gradient is
    exact. Negative control: with the release disabled the peak is one tensor higher."""
    import autosp.backend.checkpointing as ckpt
    from autosp.planning.memory import PeakTracker

    n = 1 << 20

    def peak(fn, release=True):
        original = ckpt._SavedStorages.release
        if not release:
            ckpt._SavedStorages.release = lambda self, outputs: None
        try:
            with PeakTracker() as tracker:
                x = torch.empty(n, device="meta", requires_grad=True)
                y = ckpt.Recompute(fn)(x)
                del x
                tracker._sweep()
                before = tracker.current()
                y.backward(torch.empty(n, device="meta"))
                del y
        finally:
            ckpt._SavedStorages.release = original
        return tracker.peak_bytes - before

    def shifted_sin(x):
        return x.sin() + 1
    assert peak(shifted_sin) == peak(shifted_sin, release=False) - 4 * n
    for fn, grad in ((shifted_sin, torch.cos), (torch.exp, torch.exp),
                     (lambda x: x.view(-1), torch.ones_like)):
        x = torch.randn(64, dtype=torch.float64, requires_grad=True)
        ckpt.Recompute(fn)(x).sum().backward()
        assert torch.equal(x.grad, grad(x.detach())), fn
