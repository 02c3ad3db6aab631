"""The emitter's battery: models and op mixes, each with an input factory ``make(seq_len)``."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autosp.models import AttentionBlock, GPT2Config, GPT2Like, LlamaConfig, LlamaLike

VOCAB = 64


class OpMix(nn.Module):
    """Ops a transformer touches besides matmuls: reductions, multi-result ops, scans, masks,
    size arithmetic, dtype casts, index ops."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        b, s, d = x.shape
        h = self.proj(x) * self.scale
        values, idx = h.max(dim=-1, keepdim=True)  # multi-result op
        c = torch.cumsum(h, dim=1) / torch.arange(1, s + 1, device=x.device).view(1, s, 1)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        scores = torch.softmax((h @ h.transpose(1, 2)).masked_fill(mask, float("-inf")), dim=-1)
        mixed = scores @ c
        half = s // 2
        first, rest = mixed[:, :half], mixed[:, half:]
        y = torch.cat([rest, first], dim=1) + values - idx.to(x.dtype) * 0.01
        y = y - y.mean(dim=-1, keepdim=True)
        y = y / (y.var(dim=-1, keepdim=True, unbiased=False) + 1e-5).sqrt()
        gathered = torch.index_select(y, 2, torch.tensor([0, 3, 5], device=x.device))
        return {"y": torch.where(y > 0, y, 0.1 * y), "g": gathered.to(torch.float64).sum(-1)}


class CausalConvLM(nn.Module):
    """Embedding + causal depthwise conv over the sequence + GELU MLP + loss inside."""

    def __init__(self, vocab: int = VOCAB, d: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.conv = nn.Conv1d(d, d, kernel_size=3, padding=2, groups=d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, vocab))

    def forward(self, ids, labels):
        x = self.emb(ids)
        s = x.shape[1]
        x = self.conv(x.transpose(1, 2))[..., :s].transpose(1, 2)
        logits = self.mlp(self.norm(x))
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return loss, {"logits": logits, "hidden": x}


class SwiGLUStack(nn.Module):
    """Residual SwiGLU MLPs with RMSNorm and dropout-free scaling (no attention)."""

    def __init__(self, d: int = 24, layers: int = 3):
        super().__init__()
        self.gates = nn.ModuleList(nn.Linear(d, 2 * d, bias=False) for _ in range(layers))
        self.downs = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(layers))

    def forward(self, x):
        for gate, down in zip(self.gates, self.downs):
            a, b = gate(F.rms_norm(x, (x.shape[-1],))).chunk(2, dim=-1)
            x = x + down(F.silu(a) * b)
        return x


def _ids(b, s):
    return torch.randint(0, VOCAB, (b, s))


def _lm_labels(b, s):
    labels = _ids(b, s)
    labels[0, : s // 3] = -100  # ignored tokens, unevenly spread
    return labels


# name -> (factory, make(seq_len) -> (args, kwargs), seq_dim)
BATTERY = {
    "sdpa_block_causal": (lambda: AttentionBlock(32, 4, causal=True), lambda s: ((torch.randn(2, s, 32),), {}), 1),
    "sdpa_block_seq_first": (lambda: AttentionBlock(32, 4, causal=False, seq_first=True),
                             lambda s: ((torch.randn(s, 2, 32),), {}), 0),
    "llama_gqa_tied": (lambda: LlamaLike(LlamaConfig(vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2)),
                       lambda s: ((_ids(2, s),), {"labels": _lm_labels(2, s)}), 1),
    "llama_untied_position_ids": (
        lambda: LlamaLike(LlamaConfig(vocab=VOCAB, hidden=32, layers=1, heads=4, tie_embeddings=False)),
        lambda s: ((_ids(2, s),), {"labels": _ids(2, s), "position_ids": torch.arange(s).expand(2, s) + 3}), 1),
    "gpt2_manual_attention": (lambda: GPT2Like(GPT2Config(vocab=VOCAB, hidden=32, layers=2, heads=4)),
                              lambda s: ((_ids(2, s),), {"labels": _ids(2, s)}), 1),
    "op_mix": (lambda: OpMix(16), lambda s: ((torch.randn(2, s, 16),), {}), 1),
    "causal_conv_lm": (lambda: CausalConvLM(), lambda s: ((_ids(2, s), _lm_labels(2, s)), {}), 1),
    "swiglu_stack": (lambda: SwiGLUStack(), lambda s: ((torch.randn(3, s, 24),), {}), 1),
}
