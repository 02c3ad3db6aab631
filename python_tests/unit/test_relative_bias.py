"""The blocked relative-bias kernel (:mod:`autosp.runtime.relative_bias`) against eager SDPA
with the whole ``[B, H, S, S]`` mask ``where(keep, table[buckets[k - q + S - 1]], c)``:
output and the gradients of q, k, v and the table, over several query blocks, with key
padding (a row padded everywhere included: uniform, as eager) and causal. Control: the
distance read the other way round (q - k) must fail."""
import pytest
import torch

from autosp.runtime.relative_bias import relative_bias_attention


def _eager(q, k, v, table, buckets, keep, fill, causal, flip=False):
    s = q.shape[-2]
    pos = torch.arange(s)
    dist = (pos[:, None] - pos[None, :]) if flip else (pos[None, :] - pos[:, None])
    bias = table[buckets[dist + s - 1]].permute(2, 0, 1)[None]  # [1, H, S, S]
    mask = bias if keep is None else torch.where(keep, bias, torch.tensor(fill))
    if causal:
        mask = mask.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)


def _inputs(seed, s=11, padded=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, s, 4, generator=gen, requires_grad=True) for _ in range(3))
    table = torch.randn(8, 3, generator=gen, requires_grad=True)
    buckets = torch.randint(0, 8, (2 * s - 1,), generator=gen)
    keep = None
    if padded:
        keep = torch.ones(2, 1, 1, s, dtype=torch.bool)
        keep[0, ..., :3] = False  # left padding
        keep[1] = False           # a row padded everywhere: uniform over its keys
    return q, k, v, table, buckets, keep


def _grads(out, tensors, seed):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad((out * w).sum(), tensors)


@pytest.mark.parametrize("padded,causal", [(False, False), (True, False), (False, True)])
def test_blocked_relative_bias_matches_eager(padded, causal):
    q, k, v, table, buckets, keep = _inputs(1, padded=padded)
    fill = torch.finfo(torch.float32).min
    ref = _eager(q, k, v, table, buckets, keep, fill, causal)
    out = relative_bias_attention(q, k, v, keep, 0.0, causal, 1.0, False, table, buckets, fill if padded else None,
                                  block=4)
    assert (out - ref).abs().max() < 1e-5
    for a, r in zip(_grads(out, (q, k, v, table), 2), _grads(ref, (q, k, v, table), 2)):
        assert (a - r).abs().max() < 1e-5


def test_negative_control_the_distance_the_other_way_fails():
    q, k, v, table, buckets, keep = _inputs(3)
    ref = _eager(q, k, v, table, buckets, None, 0.0, False, flip=True)
    out = relative_bias_attention(q, k, v, None, 0.0, False, 1.0, False, table, buckets, block=4)
    assert (out - ref).abs().max() > 1e-3


def test_keeps_no_s_by_s_tensor_for_backward():
    """Saved for backward: q, k, v, the band, the output and the log-sum-exp (O(S))."""
    from autosp.planning.memory import SavedTensors
    sizes = {}
    for s in (64, 128):
        q, k, v, table, buckets, _ = _inputs(4, s=s)
        with SavedTensors([table]) as kept:
            out = relative_bias_attention(q, k, v, None, 0.0, False, 1.0, False, table, buckets, block=16)
        sizes[s] = kept.bytes
        del out
    assert sizes[128] / sizes[64] <= 2.1, sizes
