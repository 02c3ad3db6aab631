"""autosp.local_heads at run time: this rank's block of heads of a replicated per-head
tensor, as the all-to-all to heads gives the rank its heads (simulated ranks)."""
import pytest
import torch

from autosp.runtime import collectives


@pytest.mark.parametrize("p", [2, 4])
def test_each_rank_takes_its_block_of_heads_and_the_gradients_add_up(p):
    heads, batch, seq = 4, 3, 5
    bias = torch.randn(heads, 1, seq, requires_grad=True)
    folded = torch.randn(batch * heads, 1, seq, requires_grad=True)
    total_bias, total_folded = torch.zeros_like(bias), torch.zeros_like(folded)
    for r in range(p):
        with collectives.simulate(p, r):
            mine = collectives.local_heads(bias, 0, heads, "sp")
            mine_folded = collectives.local_heads(folded, 0, heads, "sp")
        n = heads // p
        assert torch.equal(mine, bias[r * n:(r + 1) * n])
        # folded [B * H]: each batch row's block of heads, in the order of [B, H / P] folded again
        assert torch.equal(mine_folded, folded.view(batch, heads, 1, seq)[:, r * n:(r + 1) * n].reshape(-1, 1, seq))
        total_bias += torch.autograd.grad(mine.sum(), bias)[0]
        total_folded += torch.autograd.grad(mine_folded.sum(), folded)[0]
    assert torch.equal(total_bias, torch.ones_like(bias)) and torch.equal(total_folded, torch.ones_like(folded))


def test_one_rank_keeps_every_head():
    x = torch.randn(4, 1, 5)
    assert collectives.local_heads(x, 0, 4, "sp") is x
