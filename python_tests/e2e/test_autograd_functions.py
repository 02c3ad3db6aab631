"""A model's own ``torch.autograd.Function`` kept whole, with its own backward (``autosp::autograd_function``).

The model below routes its hidden states through two Functions of its own:
``StraightThroughClamp`` (forward: a clamp; backward: the gradient passed through
unchanged, a straight-through estimator, which is not the clamp's derivative) and
``RowScale`` (a per-feature scale by a parameter, its backward written by hand). Both are
row-wise over the tokens: their statement holds on random inputs, so each becomes one op
that the emitted program applies with the Function itself, and the gradients are the ones
its backward gives on one device. P = 2 and 4, S divisible and not, 3 AdamW steps.

Control: with the statement switched off (``AUTOSP_TRUST_AUTOGRAD_FUNCTIONS=1``, the export
keeps the forward's ops) the clamp's derivative replaces the straight-through gradient and
the gradients differ. A Function that mixes positions (a running sum with its own
backward) is refused, naming it and why.
"""
from __future__ import annotations

import copy

import pytest
import torch

from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB = 64


class StraightThroughClamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bound):
        return x.clamp(-bound, bound)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class RowScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad * weight, (grad * x).reshape(-1, x.shape[-1]).sum(0)


class RunningSum(torch.autograd.Function):
    """Mixes positions (dim 1): its statement fails."""

    @staticmethod
    def forward(ctx, x):
        return x.cumsum(1)

    @staticmethod
    def backward(ctx, grad):
        return grad.flip(1).cumsum(1).flip(1)


class FunctionsLM(torch.nn.Module):
    def __init__(self, hidden=32, heads=4, mixing=False):
        super().__init__()
        self.heads, self.mixing = heads, mixing
        self.emb = torch.nn.Embedding(VOCAB, hidden)
        self.inp = torch.nn.Linear(hidden, hidden)
        self.scale = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.head = torch.nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, ids, labels):
        x = self.emb(ids)
        h = StraightThroughClamp.apply(self.inp(x), 0.5)
        if self.mixing:
            h = RunningSum.apply(h)
        x = x + RowScale.apply(h, self.scale)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


def test_the_statement_holds_for_row_wise_functions_and_not_for_a_running_sum():
    from autosp.runtime.functions import statement_holds
    x, w = torch.randn(2, 15, 8), torch.randn(8)
    assert statement_holds(StraightThroughClamp, [{"tensor": 0}, 0.5], [x]) is None
    assert statement_holds(RowScale, [{"tensor": 0}, {"tensor": 1}], [x, w]) is None
    why = statement_holds(RunningSum, [{"tensor": 0}], [x])
    assert why is not None and "mixes positions" in why and "dim 1" in why, why


def test_kept_whole_at_import_and_a_mixing_function_refused_naming_it(monkeypatch):
    import autosp
    from autosp.frontend.importer import TRUST_FUNCTIONS_ENV
    ids = torch.randint(0, VOCAB, (2, 15))
    text = str(autosp.import_model(FunctionsLM(), ids, ids).module)
    assert text.count('torch.operator "torch.autosp.autograd_function"') == 2, text
    assert "StraightThroughClamp" in text and "RowScale" in text
    with pytest.raises(autosp.AutospError, match=r"RunningSum \(its output along dim 1 of its first input mixes"):
        autosp.import_model(FunctionsLM(mixing=True), ids, ids)
    monkeypatch.setenv(TRUST_FUNCTIONS_ENV, "1")  # trusted: its forward's ops, as before
    assert "aten.cumsum" in str(autosp.import_model(FunctionsLM(mixing=True), ids, ids).module)


def _body(rank, world, queue, seed, control):
    import os

    import autosp
    from autosp.frontend.importer import TRUST_FUNCTIONS_ENV
    from autosp.ir import stated
    from autosp.testing.parity import adamw_steps, parity
    records = stated.STATED_OPS
    if control:  # the statement off: the export keeps the Functions' forward ops
        stated.STATED_OPS = tuple(r for r in records if r.op != "torch.autosp.autograd_function")
        os.environ[TRUST_FUNCTIONS_ENV] = "1"
    out = {}
    try:
        for seq in ((15, 16) if world == 2 else (19, 20)):
            torch.manual_seed(seed + seq)
            model = FunctionsLM()
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model)
            gen = torch.Generator().manual_seed(seed + seq)
            ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
            report = parity(reference, compiled, ids, ids)
            steps = [] if control else adamw_steps(reference, model, compiled, lambda m, x: m(x, x),
                                                   [torch.randint(0, VOCAB, (2, seq), generator=gen) for _ in range(3)])
            out[seq] = {"outputs": max(report.outputs.values()), "grads": report.max_grad_error, "steps": steps,
                        "ops": compiled.programs[0].mlir["transformed"].count("torch.autosp.autograd_function")}
    finally:
        stated.STATED_OPS = records
        os.environ.pop(TRUST_FUNCTIONS_ENV, None)
    queue.put((rank, out))


@pytest.mark.parametrize("world", [2, 4])
def test_functions_run_their_own_backward_over_the_ranks(world, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, False), timeout=300)
    for rank, by_seq in results.items():
        for seq, r in by_seq.items():
            where = f"rank {rank}, S={seq}: {r}"
            assert r["outputs"] <= TOL and r["grads"] <= TOL and r["ops"] == 2, where
            assert all(g <= TOL and q <= TOL for g, q in r["steps"]), where


def test_negative_control_the_forward_traced_loses_the_straight_through_gradient(_fresh_seed):
    results = run_ranks(_body, 2, args=(_fresh_seed % 10000, True), timeout=300, fresh=True)
    for rank, by_seq in results.items():
        for seq, r in by_seq.items():
            assert r["ops"] == 0 and r["outputs"] <= TOL and r["grads"] > 1e-2, (rank, seq, r)
