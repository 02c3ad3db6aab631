"""Buffers a forward writes: counters updated by the compiled call, as on one device.

torchtitan's MoE counts the tokens routed to each expert in a buffer during the training
forward (``tokens_per_expert.add_(counts)``, under ``no_grad``); its load balancing updates
the expert bias from those counts. Before, autosp refused the write and advised eval mode,
which would have switched the balancing off. Now the importer makes the buffer's new value
a result of the program (``autosp.buffer_writes``), the layout rules reduce the count over
the sequence like any sum (an all-reduce over the group), and the call writes it back: every
rank holds the count of the whole batch.

Checked at P = 2 and 4, S divisible and not, against one device: loss, every gradient and the
counts after two training calls; eval mode writes nothing; parameters are still never
written. A buffer written with a value sharded along the sequence is refused by
``autosp-shard-sequence`` (lit_tests/shard_sequence_invalid.mlir; with a dynamic S the
export itself refuses a fixed-shape buffer of the sequence's length). Negative control: the rank's own
count differs from the whole batch's (what the counter would hold without the reduction).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB, EXPERTS, D = 64, 4, 16


class CountingMoE(torch.nn.Module):
    """Embedding, a top-2 router whose choices are counted in ``tokens_per_expert`` (training
    only), dense experts weighted per token, causal attention, head."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, D)
        self.router = torch.nn.Linear(D, EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(EXPERTS))
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.head = torch.nn.Linear(D, VOCAB)
        self.register_buffer("tokens_per_expert", torch.zeros(EXPERTS))

    def forward(self, ids):
        x = self.emb(ids)
        scores, chosen = self.router(x).softmax(-1).topk(2, dim=-1)
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert.add_(F.one_hot(chosen, EXPERTS).sum(dim=(0, 1, 2)).float())
        weights = torch.zeros_like(self.router(x)).scatter(-1, chosen, scores)
        x = x + sum(weights[..., e:e + 1] * expert(x) for e, expert in enumerate(self.experts))
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, D)
        return self.head(x)


def _loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _body(rank, world, queue, seed, seq):
    import autosp
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = CountingMoE()
    reference = copy.deepcopy(model)
    sp = autosp.compile(model, gather_outputs=True)
    gen = torch.Generator().manual_seed(seed + 1)
    result = {}
    for step in range(2):
        ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
        expected = _loss(reference(ids), ids)
        expected.backward()
        loss = _loss(sp(ids), ids)
        loss.backward()
        result[f"loss{step}"] = relative_error(loss.detach(), expected.detach())
    result["grads"] = max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    result["counts"] = relative_error(model.tokens_per_expert, reference.tokens_per_expert)
    result["total"] = float(model.tokens_per_expert.sum())
    # the control: this rank's own tokens' count, what a counter without the reduction holds
    local = sp.shard_sequence(ids)
    with torch.no_grad():
        chosen = reference.router(reference.emb(local)).softmax(-1).topk(2, dim=-1)[1]
        before = reference.tokens_per_expert.clone()
        reference(ids)
        whole = reference.tokens_per_expert - before
    result["control"] = relative_error(F.one_hot(chosen, EXPERTS).sum(dim=(0, 1, 2)).float(), whole)
    model.eval()
    kept = model.tokens_per_expert.clone()
    with torch.no_grad():
        sp(ids)
    result["eval_writes"] = float((model.tokens_per_expert - kept).abs().max())
    queue.put((rank, result))


@pytest.mark.parametrize("world,seq", [(2, 16), (4, 19)])
def test_a_counter_buffer_holds_the_whole_batch_count(world, seq, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, seq), timeout=300)
    for rank, r in results.items():
        assert r["loss0"] <= TOL and r["loss1"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"
        assert r["counts"] == 0.0 and r["total"] == 2 * 2 * 2 * seq, f"rank {rank}: {r}"
        assert r["control"] > 0.1, f"rank {rank}: a rank's own count should differ from the batch's: {r}"
        assert r["eval_writes"] == 0.0, r


def test_parameters_and_inputs_are_still_never_written():
    import autosp
    from autosp.ir.diagnostics import AutospError

    class WritesWeight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                self.lin.weight.mul_(0.5)
            return self.lin(x)

    with pytest.raises(AutospError, match="writes to parameter 'lin.weight'"):
        autosp.compile(WritesWeight(), sp_size=1)(torch.randn(2, 8, 4))
