"""FlexAttention as a front end (``autosp/frontend/flex.py``).

Models written with ``torch.nn.attention.flex_attention``: a ``BlockMask`` built inside
``forward`` by ``create_block_mask`` from the call's inputs, a ``mask_mod`` (causal,
packed documents, a sliding window) and a ``score_mod`` (a softcap). While autosp exports,
the mask and the score run as the ops they stand for, and the compiler's mask algebra
proves them (the documents and the window are not kept as [S, S] masks).

Each model is checked at P = 2 and 4, S divisible and not, against single-device eager:
the forward against FlexAttention itself (CPU flex has no backward: ``torch 2.13`` refuses
``requires_grad`` inputs), the loss and every gradient against the same model with
``flex_as_dense`` (the same mask and score as ordinary ops). Negative control: the
documents dropped from the mask must break the forward parity.

On CUDA (``FakeTensorMode``, 4 ranks, S = 3000) the documents and the window run flash's
varlen kernel; control: a mask no algebra proves stays an [S, S] tensor, which the check
refuses.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from autosp.testing.distributed import run_ranks

TOL = 1e-5
VOCAB = 64


class FlexLM(torch.nn.Module):
    """Embedding, ``layers`` flex-attention blocks (pre-norm, residual), head, loss."""

    def __init__(self, kind: str, d: int = 32, heads: int = 4, layers: int = 2, window: int = 5):
        super().__init__()
        self.kind, self.heads, self.window = kind, heads, window
        self.emb = torch.nn.Embedding(VOCAB, d)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))
        self.o = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, VOCAB)

    def mask_mod(self, document_ids):
        window = self.window

        def causal(b, h, q, k):
            return q >= k

        def documents(b, h, q, k):
            return document_ids[b, q] == document_ids[b, k]

        def sliding(b, h, q, k):
            return q - k < window

        from torch.nn.attention.flex_attention import and_masks
        if self.kind == "documents":
            return and_masks(causal, documents)
        if self.kind == "window":
            return and_masks(causal, sliding)
        if self.kind == "unproven":  # no algebra proves this one: it stays an [S, S] mask
            return and_masks(causal, lambda b, h, q, k: (q + k) % 3 != 0)
        return causal

    def forward(self, input_ids, document_ids, labels):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        b, s = input_ids.shape
        block_mask = create_block_mask(self.mask_mod(document_ids), b, None, s, s, device=input_ids.device)
        score_mod = None
        if self.kind == "softcap":
            def score_mod(score, b, h, q, k):
                return 5.0 * torch.tanh(score / 5.0)
        x = self.emb(input_ids)
        for qkv, o in zip(self.qkv, self.o):
            q, k, v = qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
            x = x + o(att.transpose(1, 2).reshape(b, s, -1))
        logits = self.head(x)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()), logits


def _documents(gen, batch, seq):
    """Packed rows: 2-3 documents each, at random boundaries."""
    rows = []
    for _ in range(batch):
        cuts = sorted(torch.randperm(seq - 2, generator=gen)[:2].add(1).tolist())
        ids = torch.zeros(seq, dtype=torch.long)
        for c in cuts:
            ids[c:] += 1
        rows.append(ids)
    return torch.stack(rows)


def _body(rank, world, queue, seed, kind, seq):
    import autosp
    from autosp.frontend.flex import flex_as_dense
    from autosp.testing.parity import relative_error
    torch.manual_seed(seed)
    model = FlexLM(kind)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
    docs = _documents(gen, 2, seq)
    with torch.no_grad():
        _, flex_logits = reference(ids, docs, ids)  # FlexAttention itself (forward only on CPU)
    with flex_as_dense():
        loss_ref, _ = reference(ids, docs, ids)
        loss_ref.backward()
    sp = autosp.compile(model, gather_outputs=True)
    loss, logits = sp(ids, docs, ids)
    loss.backward()
    transformed = sp.programs[0].mlir["transformed"]
    result = dict(forward=relative_error(logits.detach(), flex_logits),
                  loss=relative_error(loss.detach(), loss_ref.detach()),
                  grads=max(relative_error(p.grad, q.grad) for p, q in zip(model.parameters(),
                                                                          reference.parameters())),
                  kept=transformed.count("autosp.mask_kept"), documents=transformed.count("autosp.documents"),
                  windows=transformed.count("autosp.window ="), all_to_all=transformed.count("autosp.all_to_all"))
    if kind == "documents" and rank == 0:  # the control: the documents dropped from the mask
        def causal_only(self, document_ids):
            return lambda b, h, q, k: q >= k
        original = FlexLM.mask_mod
        FlexLM.mask_mod = causal_only
        try:
            with torch.no_grad():
                result["control"] = relative_error(model(ids, docs, ids)[1], flex_logits)
        finally:
            FlexLM.mask_mod = original
    queue.put((rank, result))


@pytest.mark.parametrize("kind,world,seq", [("documents", 2, 16), ("documents", 4, 19), ("window", 2, 15),
                                            ("softcap", 2, 16)])
def test_flex_attention_matches_single_device(kind, world, seq, _fresh_seed):
    results = run_ranks(_body, world, args=(_fresh_seed % 10000, kind, seq), timeout=400)
    for rank, r in results.items():
        assert r["forward"] <= TOL, f"rank {rank}: the forward against FlexAttention: {r}"
        assert r["loss"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"
        assert r["all_to_all"] > 0, r  # sequence-parallel attention, not a gathered one
        if kind in ("documents", "window"):
            assert r["kept"] == 0, f"the {kind} mask should be proven, not kept: {r}"
        if kind == "documents":
            assert r["documents"] > 0, r
    if kind == "documents":
        assert results[0]["control"] > 1e-3, results[0]


def test_a_block_mask_built_outside_is_refused_naming_flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import autosp
    from autosp.ir.diagnostics import AutospError

    class Outside(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x, block_mask):
            q = self.proj(x).view(1, 16, 2, 4).transpose(1, 2)
            return flex_attention(q, q, q, block_mask=block_mask)

    mask = create_block_mask(lambda b, h, q, k: q >= k, 1, None, 16, 16, device="cpu")
    with pytest.raises(AutospError, match="flex_attention: a BlockMask built outside the model"):
        autosp.compile(Outside(), sp_size=1)(torch.randn(1, 16, 8), mask)


def _fake_cuda_step(kind):
    from autosp.planning.fake_cuda import cuda_step

    def call(ids):
        documents = (torch.arange(ids.shape[1], device=ids.device) // 1024)[None].expand(*ids.shape)
        return {"document_ids": documents, "labels": ids}
    return cuda_step(FlexLM(kind, d=64), 3000, sp_size=4, call=call, ranks=[0])[0]


@pytest.mark.parametrize("kind", ["documents", "window"])
def test_flex_masks_run_varlen_flash_on_fake_cuda(kind):
    """On CUDA (FakeTensorMode, 4 ranks, S = 3000) the proven flex masks run flash's varlen
    kernel, forward and backward, and no tensor holds two sequence dims."""
    step = _fake_cuda_step(kind)
    step.check()
    assert step.kernels() == {"varlen flash": 2, "varlen flash backward": 2}, step.kernels()


def test_negative_control_an_unproven_flex_mask_is_quadratic_on_fake_cuda():
    step = _fake_cuda_step("unproven")
    with pytest.raises(AssertionError, match="two sequence dims"):
        step.check()


def test_flex_defaults_run_as_plain_attention():
    """No block mask, flex's own ``noop_mask`` and no ``score_mod`` are plain attention (no
    mask tensor built); a causal ``mask_mod`` matches ``is_causal``."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention, noop_mask

    from autosp.frontend.flex import flex_as_dense
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    plain = F.scaled_dot_product_attention(q, k, v)
    with flex_as_dense():
        for block_mask in (None, create_block_mask(noop_mask, 1, None, 8, 8, device="cpu")):
            torch.testing.assert_close(flex_attention(q, k, v, block_mask=block_mask), plain)
        causal = create_block_mask(lambda b, h, qi, ki: qi >= ki, 1, None, 8, 8, device="cpu")
        torch.testing.assert_close(flex_attention(q, k, v, block_mask=causal),
                                   F.scaled_dot_product_attention(q, k, v, is_causal=True))
