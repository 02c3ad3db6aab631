"""Attention with a key bias (ALiBi as MPT and BLOOM write it): the runtime against eager.

``autosp.runtime.attention.key_bias_attention`` (what autosp-fuse-attention's
``torch.autosp.key_bias_attention`` runs on each rank's heads) must equal the eager chain
``softmax(q kᵀ · scale + bias, masked) @ v`` in output and in the gradients of q, k and v,
under each mask autosp-causal-mask leaves it (none, causal, key padding with eager's
empty-row answer, documents, a kept mask), on fresh random inputs, and keep O(S) bytes
for backward where the mask is proven (the bias broadcast over the queries, never S x S).
Negative control: the next head's bias misses by far more than the tolerance.
"""
import pytest
import torch

from autosp.planning.memory import SavedTensors
from autosp.runtime import attention

TOL = 1e-5


def _alibi(heads: int, s: int, batch: int = 1) -> torch.Tensor:
    """[batch, H, 1, S]: slope_h * key position (BLOOM's form; MPT's is shifted by S - 1 per row)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)
    return (slopes[:, None] * torch.arange(s)[None, :]).reshape(1, heads, 1, s).expand(batch, -1, -1, -1).contiguous()


def _eager(q, k, v, bias, visible, fill):
    """The eager chain in fp64: scores + bias, masked_fill(~visible, finfo.min) (``fill``:
    how transformers' eager attention masks), softmax, @ v."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + bias
    if visible is not None:
        scores = scores.masked_fill(~visible, fill)
    return torch.softmax(scores, -1) @ v


def _inputs(b, h, s, d, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=gen, requires_grad=True) for _ in range(3)]


def _compare(got, want, inputs):
    grad = torch.randn(got.shape, generator=torch.Generator().manual_seed(7))
    g1 = torch.autograd.grad(got, inputs, grad)
    g2 = torch.autograd.grad(want, inputs, grad.double())
    return max([(got.double() - want).abs().max().item()] + [(a.double() - e).abs().max().item()
                                                              for a, e in zip(g1, g2)])


@pytest.mark.parametrize("causal", [True, False])
def test_key_bias_matches_eager(causal, _fresh_seed):
    b, h, s, d = 2, 4, 37, 8
    q, k, v = _inputs(b, h, s, d, _fresh_seed)
    bias = _alibi(h, s)
    visible = torch.ones(s, s, dtype=torch.bool).tril() if causal else None
    got = attention.key_bias_attention(q, k, v, None, 0.0, causal, None, False, bias)
    want = _eager(q, k, v, bias, visible, float("-inf"))
    assert _compare(got, want, (q, k, v)) <= TOL
    # control: the next head's bias
    wrong = attention.key_bias_attention(q, k, v, None, 0.0, causal, None, False, bias.roll(1, dims=1))
    assert (wrong.double() - want).abs().max().item() > 1e-3


def test_key_padding_with_empty_rows_matches_eager(_fresh_seed):
    """Left padding (BLOOM's batch): the first 4 keys of row 1 padded; its first 4 queries
    see no key and get eager's masked_fill answer (the mean of the values)."""
    b, h, s, d = 2, 4, 19, 8
    q, k, v = _inputs(b, h, s, d, _fresh_seed)
    bias = _alibi(h, s, b)
    pad = torch.ones(b, s, dtype=torch.bool)
    pad[1, :4] = False
    visible = torch.ones(s, s, dtype=torch.bool).tril()[None, None] & pad[:, None, None, :]
    got = attention.key_bias_attention(q, k, v, pad[:, None, None, :], 0.0, True, None, False, bias,
                                       key_padding=True, empty_rows="mean")
    want = _eager(q, k, v, bias, visible, torch.finfo(torch.float64).min)
    assert _compare(got, want, (q, k, v)) <= TOL


@pytest.mark.parametrize("form", ["documents", "kept"])
def test_structured_masks_build_the_full_mask_and_match(form, _fresh_seed):
    b, h, s, d = 1, 2, 16, 8
    q, k, v = _inputs(b, h, s, d, _fresh_seed)
    bias = _alibi(h, s)
    ids = torch.tensor([[0] * 6 + [1] * 10])
    same = ids[:, None, :, None] == ids[:, None, None, :]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    with pytest.warns(RuntimeWarning, match="builds the"):
        if form == "documents":
            got = attention.key_bias_attention(q, k, v, ids[:, None, None, :], 0.0, True, None, False, bias,
                                               documents=True)
        else:
            got = attention.key_bias_attention(q, k, v, same & causal, 0.0, False, None, False, bias)
    want = _eager(q, k, v, bias, same & causal, float("-inf"))
    assert _compare(got, want, (q, k, v)) <= TOL


def test_bias_that_varies_with_the_query_is_refused():
    q = k = v = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"\[B\|1, H\|1, 1, S\|1\]"):
        attention.key_bias_attention(q, k, v, None, 0.0, True, None, False, torch.randn(1, 2, 8, 8))


def test_bytes_kept_for_backward_grow_linearly():
    """Doubling S doubles the bytes autograd keeps (the eager chain's quadruple: its
    [B, H, S, S] scores and probabilities)."""
    def kept(fn, s):
        q, k, v = _inputs(1, 4, s, 16, 0)
        with SavedTensors([q, k, v]) as saved:
            fn(q, k, v, _alibi(4, s))
        return saved.bytes

    fused = lambda q, k, v, bias: attention.key_bias_attention(q, k, v, None, 0.0, True, None, False, bias)  # noqa: E731
    causal = torch.ones(512, 512, dtype=torch.bool).tril()
    eager = lambda q, k, v, bias: _eager(q, k, v, bias, causal[:q.shape[2], :q.shape[2]], float("-inf"))  # noqa: E731
    assert kept(fused, 512) / kept(fused, 256) <= 2.3
    assert kept(eager, 512) / kept(eager, 256) > 3.0  # control: the scores kept


def test_learned_bias_gets_its_gradient(_fresh_seed):
    """A key bias that requires grad (a learned per-key bias): the fused kernels give it no
    gradient, so the call builds the full mask (warned) and the bias's gradient is eager's."""
    b, h, s, d = 1, 2, 12, 8
    q, k, v = _inputs(b, h, s, d, _fresh_seed)
    bias = torch.randn(1, h, 1, s, generator=torch.Generator().manual_seed(_fresh_seed), requires_grad=True)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    with pytest.warns(RuntimeWarning, match="learned"):
        got = attention.key_bias_attention(q, k, v, None, 0.0, True, None, False, bias)
    want = _eager(q, k, v, bias, causal, float("-inf"))
    assert _compare(got, want, (q, k, v, bias)) <= TOL
