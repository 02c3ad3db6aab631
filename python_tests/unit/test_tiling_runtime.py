"""autosp.runtime.tiling against plain eager PyTorch on fresh random inputs: the tiled LM
head + log-softmax + label pick (vocab_logprob) and tiled token-wise calls (tiled_call),
their gradients, what they keep for backward, and negative controls that must fail."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autosp.backend.checkpointing import Recompute
from autosp.runtime import tiling
from autosp.runtime.tiling import Tiled, tiled_call, vocab_logprob

SOFTCAP = (("div", 30.0), ("tanh",), ("mul", 30.0))
# fp32 tolerance, relative to the largest magnitude compared: sums over rows (weight grads)
# and matmuls over fewer rows run in another order than eager's (seen up to ~2e-6).
FP32 = 5e-6


# ---------------------------------------------------------------- vocab_logprob


def _eager_logprob(h, weight_t, index, steps=(), softmax_dtype=None):
    logits = h @ weight_t
    for kind, *arg in steps:
        if kind == "tanh":
            logits = torch.tanh(logits)
        else:
            logits = logits.to(arg[0]) if kind == "cast" else logits / arg[0] if kind == "div" else logits * arg[0]
    return torch.log_softmax(logits, dim=-1, dtype=softmax_dtype).gather(1, index)


def _vocab_run(f, h0, w0, index, grad):
    """f(h, w.t(), index) with fresh leaves: (value, grad of h, grad of w)."""
    h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = f(h, w.t(), index)
    out.backward(grad)
    return out.detach(), h.grad, w.grad


def _vocab_parity(n=10, hidden=8, vocab=50, dtype=torch.float32, chunk=3, steps=(), softmax_dtype=None,
                  rtol=1e-6, atol=1e-6, scale=1.0):
    h0 = torch.randn(n, hidden, dtype=dtype) * scale
    w0 = torch.randn(vocab, hidden, dtype=dtype)
    index = torch.randint(vocab, (n, 1))
    grad = torch.randn_like(_eager_logprob(h0, w0.t(), index, steps, softmax_dtype))
    ref = _vocab_run(lambda h, wt, i: _eager_logprob(h, wt, i, steps, softmax_dtype), h0, w0, index, grad)
    got = _vocab_run(lambda h, wt, i: vocab_logprob(h, wt, i, steps=steps, softmax_dtype=softmax_dtype,
                                                    chunk=chunk), h0, w0, index, grad)
    for name, a, b in zip(("value", "grad h", "grad w"), got, ref):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * max(1.0, b.abs().max().item()), msg=name)


@pytest.mark.parametrize("chunk", [1, 3, 10, 17, None])
def test_vocab_logprob_matches_eager_fp32(chunk):
    _vocab_parity(chunk=chunk, rtol=FP32, atol=FP32)


@pytest.mark.parametrize("n,chunk", [(10, 4), (7, 2), (1, 3), (13, 13)])
def test_vocab_logprob_matches_eager_fp64(n, chunk):
    _vocab_parity(n=n, chunk=chunk, dtype=torch.float64, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("steps,softmax_dtype", [((("cast", torch.float32),), None), ((), torch.float32),
                                                 (SOFTCAP + (("cast", torch.float32),), None)])
def test_vocab_logprob_bf16(steps, softmax_dtype):
    # Value and grad h are per row (same as eager); grad w sums chunks in bf16 (up to ~2 bf16 ulps of the largest seen).
    _vocab_parity(n=12, hidden=16, vocab=40, dtype=torch.bfloat16, chunk=5, steps=steps,
                  softmax_dtype=softmax_dtype, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("chunk", [1, 4, None])
def test_vocab_logprob_soft_capping(chunk):
    _vocab_parity(n=11, chunk=chunk, steps=SOFTCAP, scale=20.0, rtol=FP32, atol=FP32)
    _vocab_parity(n=11, chunk=chunk, dtype=torch.float64, steps=SOFTCAP + (("mul", 0.5),), scale=20.0,
                  rtol=1e-12, atol=1e-12)


def test_vocab_logprob_tied_weights_and_ignored_rows():
    vocab, hidden, n = 30, 8, 14
    ids = torch.randint(vocab, (n,))
    labels = torch.randint(vocab, (n,))
    labels[torch.rand(n) < 0.4] = -100
    labels[0] = -100
    embed0 = torch.randn(vocab, hidden, dtype=torch.float64)

    def run(head):
        embed = torch.nn.Embedding(vocab, hidden, dtype=torch.float64)
        embed.weight.data.copy_(embed0)
        h = torch.tanh(embed(ids)).detach().requires_grad_()  # a leaf to read the rows' gradient
        keep = (labels != -100)[:, None]
        lp = head(torch.tanh(embed(ids)) + h, embed.weight.t(), torch.where(labels >= 0, labels, 0)[:, None])
        loss = -torch.where(keep, lp, 0.0).sum()
        loss.backward()
        return loss.detach(), embed.weight.grad, h.grad

    ref = run(_eager_logprob)
    got = run(lambda h, wt, i: vocab_logprob(h, wt, i, chunk=4))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(got[2][labels == -100]) == 0 and torch.count_nonzero(got[2][labels != -100]) > 0


def test_vocab_logprob_one_input_requires_grad_and_no_grad():
    h, w, index = torch.randn(9, 6), torch.randn(20, 6), torch.randint(20, (9, 1))
    for leaf in ("h", "w"):
        a, b = h.clone().requires_grad_(leaf == "h"), w.clone().requires_grad_(leaf == "w")
        (vocab_logprob(a, b.t(), index, chunk=2) * index).sum().backward()
        a2, b2 = h.clone().requires_grad_(leaf == "h"), w.clone().requires_grad_(leaf == "w")
        (_eager_logprob(a2, b2.t(), index) * index).sum().backward()
        got, ref = (a.grad, a2.grad) if leaf == "h" else (b.grad, b2.grad)
        _close(got, ref, FP32)
    with torch.no_grad():
        out = vocab_logprob(h.requires_grad_(), w.t(), index, chunk=4)
    assert out.grad_fn is None
    _close(out, _eager_logprob(h, w.t(), index), FP32)


def test_vocab_logprob_empty_and_meta():
    h, w = torch.randn(0, 8, requires_grad=True), torch.randn(20, 8, requires_grad=True)
    out = vocab_logprob(h, w.t(), torch.zeros(0, 1, dtype=torch.long), steps=(("cast", torch.float64),))
    assert out.shape == (0, 1) and out.dtype == torch.float64
    out.sum().backward()
    assert h.grad.shape == (0, 8) and torch.count_nonzero(w.grad) == 0
    h = torch.empty(10, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(50, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
    out = vocab_logprob(h, w.t(), torch.zeros(10, 1, dtype=torch.long, device="meta"), chunk=3,
                        steps=(("cast", torch.float32),) + SOFTCAP)
    assert out.shape == (10, 1) and out.dtype == torch.float32 and out.device.type == "meta"
    out.sum().backward()
    assert h.grad.shape == h.shape and h.grad.dtype == torch.bfloat16 and w.grad.shape == w.shape


class _Shapes(TorchDispatchMode):
    """Every op output's number of elements, forward and backward."""

    def __init__(self):
        super().__init__()
        self.numels: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numels += [t.numel() for t in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(t, torch.Tensor)]
        return out


def test_vocab_logprob_never_holds_n_by_v():
    n, hidden, vocab, chunk = 64, 8, 50, 16
    h, w = torch.randn(n, hidden, requires_grad=True), torch.randn(vocab, hidden, requires_grad=True)
    index = torch.randint(vocab, (n, 1))

    def record(f):
        saved: list[torch.Size] = []

        def pack(t):
            saved.append(t.shape)
            return t
        with _Shapes() as shapes:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = f(h, w.t(), index)
            out.sum().backward()
        return saved, max(shapes.numels)

    saved, biggest = record(lambda *a: vocab_logprob(*a, steps=SOFTCAP, chunk=chunk))
    assert sorted(saved) == sorted([h.shape, (hidden, vocab), index.shape])
    assert biggest == chunk * vocab  # one chunk's logits; no [N, V] tensor, forward or backward
    saved, biggest = record(lambda *a: _eager_logprob(*a, steps=SOFTCAP))  # the control sees eager's
    assert (n, vocab) in saved and biggest >= n * vocab


def test_vocab_logprob_negative_controls(monkeypatch):
    h, w, index = torch.randn(10, 8), torch.randn(30, 8), torch.randint(30, (10, 1))
    ref = _eager_logprob(h, w.t(), index)
    dropped = torch.cat([vocab_logprob(h[:7], w.t(), index[:7], chunk=3), torch.zeros(3, 1)])
    assert not torch.allclose(dropped, ref)
    spans, calls = tiling._row_spans, []

    def backward_drops_last(n, chunk):  # the forward's spans, then the backward's without the last
        calls.append(n)
        return spans(n, chunk)[:-1] if len(calls) == 2 else spans(n, chunk)

    monkeypatch.setattr(tiling, "_row_spans", backward_drops_last)
    with pytest.raises(AssertionError, match="grad [hw]"):
        _vocab_parity(chunk=3, rtol=FP32, atol=FP32)
    assert len(calls) == 2
    monkeypatch.setattr(tiling, "_row_spans", lambda n, chunk: spans(n, chunk)[1:] + spans(n, chunk)[:1])
    with pytest.raises(AssertionError):  # chunks out of order
        _vocab_parity(chunk=3, rtol=FP32, atol=FP32)


# ---------------------------------------------------------------- tiled_call

B, S, H, FFN = 2, 37, 16, 24


def _mlp(x, w_norm, w_gate, w_up, w_down):
    """RMSNorm -> gate/up -> silu * up -> down -> residual add: token-wise along S."""
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w_norm
    return x + (F.silu(n @ w_gate) * (n @ w_up)) @ w_down


def _mlp_args(dtype=torch.float32, device="cpu"):
    def t(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    return [t(B, S, H), t(H), t(H, FFN) / 4, t(H, FFN) / 4, t(FFN, H) / 5]


MLP_DIMS = ((1, None, None, None, None), (1,))


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _leaves(args):
    return [a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args]


def _close(a, b, tol):
    """``a`` equals ``b`` within ``tol`` relative to ``b``'s largest magnitude (sums in another order)."""
    assert a is not None and a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()) if b.numel() else tol)


def _parity(tiled, eager, args, tol=FP32):
    """Outputs and the gradients of every float argument, tiled vs eager, under the same
    random output gradients. Returns the tiled run's (outputs, arg grads)."""
    runs, grads = [], None
    for f in (eager, tiled):
        leaves = _leaves(args)
        outs = _as_tuple(f(*leaves))
        if grads is None:
            grads = [torch.randn_like(o) if o.is_floating_point() else None for o in outs]
        else:
            assert len(outs) == len(runs[0][0])
            for a, b in zip(outs, runs[0][0]):
                _close(a.detach(), b, tol)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        runs.append(([o.detach() for o in outs], [a.grad for a in leaves if isinstance(a, torch.Tensor)
                                                  and a.requires_grad]))
    (_, ref_grads), (out, got_grads) = runs
    for a, b in zip(got_grads, ref_grads):
        _close(a, b, tol)
    return out, got_grads


@pytest.mark.parametrize("tiles", [1, 2, 5, 37, 50])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32), (torch.float64, 1e-12)])
def test_tiled_mlp_matches_eager(tiles, dtype, tol):
    _parity(lambda *a: tiled_call(_mlp, tiles, *MLP_DIMS, *a), _mlp, _mlp_args(dtype), tol)


def test_tiled_mlp_float64_and_autograd_grad():
    _parity(Tiled(_mlp, 4, *MLP_DIMS), _mlp, _mlp_args(torch.float64), tol=1e-12)
    x, *ws = _leaves(_mlp_args())
    g = torch.randn(B, S, H)
    got = torch.autograd.grad(tiled_call(_mlp, 3, *MLP_DIMS, x, *ws), [x, ws[2]], g)
    ref = torch.autograd.grad(_mlp(x, *ws), [x, ws[2]], g)
    for a, b in zip(got, ref):
        _close(a, b, FP32)
    assert ws[0].grad is None and x.grad is None


def _two_in_two_out(a, b, w, scale):
    """a: [B, S, H] (split on 1), b: [S, B] (split on 0) -> [S, B] and [B, S, H], plus an int output."""
    mixed = (a @ w) * b.t()[..., None] * scale
    return mixed.mean(-1).t().tanh(), (mixed + a).tanh(), mixed.argmax(-1)


@pytest.mark.parametrize("tiles", [1, 3, 8, 40])
def test_tiled_two_split_inputs_two_outputs(tiles):
    args = [torch.randn(B, S, H), torch.randn(S, B), torch.randn(H, H), 0.5]
    out, _ = _parity(lambda *a: tiled_call(_two_in_two_out, tiles, (1, 0, None, None), (0, 1, 1), *a),
                     _two_in_two_out, args)
    assert out[2].dtype == torch.long


def test_tiled_output_without_gradient_and_merged_rows_view():
    def merged(x, w):  # written with -1 sizes: works on any tile of S
        y = (x.view(-1, H) @ w).view(x.shape[0], -1, w.shape[1])
        return y, y.sum()[None] * 0 + x.shape[1]  # second output: length of the tile, no use downstream

    args = [torch.randn(B, S, H), torch.randn(H, 5)]
    x, w = _leaves(args)
    y, lengths = tiled_call(merged, 4, (1, None), (1, 0), x, w)
    assert lengths.tolist() == [10.0, 9.0, 9.0, 9.0]
    g = torch.randn_like(y)
    y.backward(g)  # the second output gets no gradient (None)
    x2, w2 = _leaves(args)
    merged(x2, w2)[0].backward(g)
    _close(x.grad, x2.grad, FP32)
    _close(w.grad, w2.grad, FP32)


class _Block(torch.nn.Module):
    """A layer whose MLP is tiled: the whole layer goes into an outer Recompute."""

    def __init__(self, tiles):
        super().__init__()
        self.mlp = Tiled(_mlp, tiles, *MLP_DIMS) if tiles else _mlp

    def forward(self, x, *ws):
        return self.mlp(x.sin() * 2, *ws).cos()


@pytest.mark.parametrize("tiles", [1, 4, 37])
def test_tiled_inside_recompute(tiles):
    _parity(Recompute(_Block(tiles)), _Block(None), _mlp_args())
    x, *ws = _leaves(_mlp_args())  # and under torch.autograd.grad
    g = torch.randn(B, S, H)
    got = torch.autograd.grad(Recompute(_Block(tiles))(x, *ws), [x, *ws], g)
    ref = torch.autograd.grad(_Block(None)(x, *ws), [x, *ws], g)
    for a, b in zip(got, ref):
        _close(a, b, FP32)


def _dropout_mlp(x, w):
    return F.dropout(x * w, p=0.5, training=True)


@pytest.mark.parametrize("outer", [False, True])
def test_tiled_replays_randomness(outer):
    # dropout's mask per tile must be the same in the recomputation: dx = g * mask * 2 * w.
    x, w = torch.randn(B, S, H, requires_grad=True), (torch.randn(H) + 3).requires_grad_()
    tiled = Tiled(_dropout_mlp, 5, (1, None), (1,))
    y = (Recompute(tiled) if outer else tiled)(x, w)
    g = torch.randn_like(y)
    y.backward(g)
    mask = (y != 0).to(x.dtype)
    assert 0 < mask.mean() < 1
    _close(x.grad, g * mask * 2 * w.detach(), FP32)
    _close(w.grad, (g * mask * 2 * x.detach()).sum((0, 1)), FP32)


def test_tiled_saves_only_inputs():
    def saved(f, args):
        shapes: list[torch.Size] = []

        def pack(t):
            shapes.append(t.shape)
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = f(*args)
        out.sum().backward()
        return sorted(shapes)

    args = _leaves(_mlp_args())
    assert saved(lambda *a: tiled_call(_mlp, 5, *MLP_DIMS, *a), args) == sorted(a.shape for a in args)
    assert torch.Size([B, S, FFN]) in saved(_mlp, args)  # the control: eager keeps [B, S, ffn]


def test_tiled_module_parameters_get_gradients():
    inner = torch.nn.Sequential(torch.nn.Linear(H, FFN), torch.nn.GELU(), torch.nn.Linear(FFN, H))
    x = torch.randn(B, S, H, requires_grad=True)
    g = torch.randn(B, S, H)
    Tiled(inner, 6, (1,), (1,))(x).backward(g)
    got = [x.grad] + [p.grad for p in inner.parameters()]
    x.grad = None
    inner.zero_grad()
    inner(x).backward(g)
    for a, b in zip(got, [x.grad] + [p.grad for p in inner.parameters()]):
        _close(a, b, FP32)


def test_tiled_no_grad_and_meta():
    args = _mlp_args()
    with torch.no_grad():
        y = tiled_call(_mlp, 5, *MLP_DIMS, *_leaves(args))
    assert y.grad_fn is None
    _close(y, _mlp(*args), FP32)
    x, *ws = _leaves(_mlp_args(torch.bfloat16, "meta"))
    y = Recompute(_Block(5))(x, *ws)
    assert y.shape == (B, S, H) and y.device.type == "meta"
    y.sum().backward()
    assert all(a.grad is not None and a.grad.shape == a.shape for a in [x, *ws])


def test_tiled_negative_controls(monkeypatch):
    args = _mlp_args()
    for dim in (0, 2):  # tiles concatenated along the wrong dim (equal tiles: cat succeeds)
        with pytest.raises(AssertionError):
            _parity(lambda *a, d=dim: tiled_call(_mlp, S, MLP_DIMS[0], (d,), *a), _mlp, args)
    calls = []

    def drops_third_tile_grad(*a):
        out = _mlp(*a)
        calls.append(torch.is_grad_enabled())
        return out.detach() if sum(calls) == 3 else out  # the third recomputed tile: no gradient

    with pytest.raises(AssertionError):
        _parity(lambda *a: tiled_call(drops_third_tile_grad, 5, *MLP_DIMS, *a), _mlp, args)
    spans = tiling._tile_spans
    monkeypatch.setattr(tiling, "_tile_spans", lambda n, t: spans(n, t)[:-1])
    with pytest.raises(AssertionError):  # a tile dropped
        _parity(lambda *a: tiled_call(_mlp, 5, *MLP_DIMS, *a), _mlp, args)


def test_tiled_call_rejects_bad_dims():
    x, w = torch.randn(2, 6, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match="differ in length"):
        tiled_call(lambda a, b: a, 2, (1, 0), (1,), x, w)
    with pytest.raises(ValueError, match="in_dims"):
        tiled_call(lambda a: a, 2, (1, None), (1,), x)
    with pytest.raises(ValueError, match="out_dims"):
        tiled_call(lambda a: (a, a), 2, (1,), (1,), x)


@pytest.mark.parametrize("whole", ["scaled", "view", "same"])
def test_tiled_output_made_of_whole_args(whole):
    # out dim None: the same in every tile; its gradient must reach w once, not once per tile.
    def fn(x, w):
        extra = {"scaled": lambda: w * 2, "view": lambda: w.t(), "same": lambda: w}[whole]()
        return x @ w, extra

    _parity(lambda *a: tiled_call(fn, 5, (1, None), (1, None), *a), fn, [torch.randn(B, S, H), torch.randn(H, H)])


def _meta_peak(monkeypatch, simulate: bool, f, *args):
    """(peak live bytes of f(*args).sum().backward() on meta, how many times f's inner
    function ran) with the middle tiles allocated only (simulate) or all run."""
    from autosp.planning.memory import PeakTracker
    if not simulate:
        monkeypatch.setattr(tiling, "_simulated", lambda *t: False)
    tracker = PeakTracker()
    with tracker:
        f(*args).float().sum().backward()
    monkeypatch.undo()
    return tracker.peak_bytes


def test_meta_runs_first_and_last_tile_with_the_same_peak(monkeypatch):
    """On meta (the memory model) only the first and the last tile or chunk run, the middle
    ones are allocated: the same peak as running every one, in far fewer ops."""
    calls = []

    def mlp(*a):
        calls.append(a[0].shape[1])
        return _mlp(*a)
    peaks = {}
    for simulate in (True, False):
        calls.clear()
        x, *ws = _leaves(_mlp_args(torch.bfloat16, "meta"))
        peaks[simulate] = _meta_peak(monkeypatch, simulate, lambda *a: tiled_call(mlp, 5, *MLP_DIMS, *a), x, *ws)
        assert len(calls) == (4 if simulate else 10), calls  # forward + backward recompute
    assert peaks[True] == peaks[False] > 0, peaks
    for simulate in (True, False):
        h = torch.empty(1000, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(512, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
        index = torch.zeros(1000, 1, dtype=torch.long, device="meta")
        peaks[simulate] = _meta_peak(monkeypatch, simulate, lambda h, w, index: vocab_logprob(
            h, w.t(), index, chunk=64, steps=(("cast", torch.float32),)), h, w, index)
    assert peaks[True] == peaks[False] > 0, peaks
