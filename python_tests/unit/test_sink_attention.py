"""Attention with sinks (gpt-oss, issue 26): the runtime against eager's formula.

``autosp.runtime.ring.local_attention`` with ``sinks`` (what Ulysses runs on each rank's
heads, and the ring's single-rank case) must equal gpt-oss's eager attention,
``softmax(cat([scores + mask, sinks_h]))[..., :-1] @ v``, in output and in the gradients
of q, k, v and the sinks, under every mask the compiler proves (causal, a sliding
window, key padding left and right, documents, none) and with GQA, on fresh random
inputs. Windows, padding and documents run in pieces smaller than S here (the pieces a
long sequence is cut into), so the pair planning is exercised. Negative control: the
same call without sinks misses by far more than the tolerance.
"""
import pytest
import torch

from autosp.runtime import attention, ring

TOL = 1e-5
SUM_TOL = 5e-5  # a gradient that is one cancelling sum per head (the sinks')


def _eager(q, k, v, sinks, visible):
    """gpt-oss's eager attention (fp64): ``visible`` [B, 1, S, S] boolean."""
    q, k, v, sinks = (t.double() for t in (q, k, v, sinks))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    column = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
    combined = torch.cat([scores, column], -1)
    combined = combined - combined.max(-1, keepdim=True).values
    return torch.softmax(combined, -1)[..., :-1] @ v


def _visible(s, causal, window, docs, keep):
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    vis = torch.ones(s, s, dtype=torch.bool)
    if causal:
        vis = j <= i
    if window is not None:
        vis = vis & (i - j < window)
    vis = vis[None, None]
    if docs is not None:
        vis = vis & (docs[:, :, None] == docs[:, None, :])[:, None]
    if keep is not None:
        vis = vis & keep[:, None, None, :]
    return vis


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _case(name, seed):
    gen = torch.Generator().manual_seed(seed)
    b, hq, hkv, s, d = 2, 4, 2, 23, 8
    causal, window, docs, keep = True, None, None, None
    if name == "window":
        window = 5
    elif name == "padding":
        keep = torch.ones(b, s, dtype=torch.bool)
        keep[0, :4] = False  # left padding: its first queries see no key
        keep[1, -6:] = False  # right padding
    elif name == "documents":
        docs = torch.tensor([[0] * 9 + [1] * 14, [0] * 15 + [1] * 8])
    elif name == "bidirectional":
        causal = False
    elif name == "bidirectional_padding":
        causal, keep = False, torch.ones(b, s, dtype=torch.bool)
        keep[1, -7:] = False
    q = torch.randn(b, hq, s, d, generator=gen, requires_grad=True)
    k = torch.randn(b, hkv, s, d, generator=gen, requires_grad=True)
    v = torch.randn(b, hkv, s, d, generator=gen, requires_grad=True)
    sinks = torch.randn(hq, generator=gen, requires_grad=True)
    return (q, k, v, sinks), dict(is_causal=causal, window=window, doc_ids=docs, key_padding=keep)


CASES = ["causal", "window", "padding", "documents", "bidirectional", "bidirectional_padding"]


@pytest.mark.parametrize("name", CASES)
def test_local_attention_with_sinks_matches_eager(name, _fresh_seed):
    (q, k, v, sinks), kw = _case(name, _fresh_seed)
    visible = _visible(q.shape[2], kw["is_causal"], kw["window"], kw["doc_ids"], kw["key_padding"])
    expected = _eager(q, k, v, sinks, visible)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(_fresh_seed + 1), dtype=torch.float64)
    want = torch.autograd.grad((expected * grad).sum(), (q, k, v, sinks))
    out = ring.local_attention(q, k, v, sinks=sinks, block=4, **kw)  # pieces of max(4, window) positions
    got = torch.autograd.grad((out * grad.float()).sum(), (q, k, v, sinks))
    assert _rel(out, expected) <= TOL, name
    for n, g, w in zip("q k v sinks".split(), got, want):
        # (a sink's gradient is one number per head summed over every batch row and query,
        # with terms that cancel: two float32 orders of that sum were 1.06e-5 apart on one
        # seed; held to SUM_TOL. q, k, v, element by element, to TOL)
        assert _rel(g, w) <= (SUM_TOL if n == "sinks" else TOL), (name, n, _rel(g, w))
    # Negative control: the sinks left out of the denominator.
    plain = ring.local_attention(q, k, v, block=4, **kw)
    assert _rel(plain, expected) > 1e-3, name


def test_sink_attention_reads_its_heads_chunk_and_a_kept_mask(_fresh_seed):
    """The emitted op's entry: Ulysses' chunk of the sinks by group rank (one rank here:
    the whole vector), and a kept [B, 1, S, S] mask runs the math form, still exact."""
    (q, k, v, sinks), _ = _case("causal", _fresh_seed)
    s = q.shape[2]
    visible = _visible(s, False, None, None, None) & (torch.rand(2, 1, s, s) > 0.3)
    visible = visible | torch.eye(s, dtype=torch.bool)  # every query sees itself
    expected = _eager(q, k, v, sinks, visible)
    out = attention.sink_attention(q, k, v, visible, 0.0, False, None, True, sinks)
    assert _rel(out, expected) <= TOL
    with pytest.raises(ValueError, match="3 sinks for 4 query heads"):
        attention.heads_chunk(sinks[:3], 4, None)
