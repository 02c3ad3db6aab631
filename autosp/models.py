"""Small reference transformer models, written the way users write them.

They exercise what autosp must handle: SDPA and manual attention, RoPE computed
in-graph, learned positions, tied embeddings, GQA, a causal mask held in a
registered buffer, non-persistent buffers and a loss computed inside forward.

Example::

    >>> from autosp.models import LlamaLike, LlamaConfig
    >>> model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=2, heads=4))
    >>> ids = torch.randint(0, 64, (2, 16))
    >>> out = model(input_ids=ids, labels=ids)
    >>> out["loss"].shape
    torch.Size([])
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaConfig:
    vocab: int = 128
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None
    ffn: int | None = None
    max_positions: int = 2048
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    eps: float = 1e-6
    shift_labels: bool = True  # False: labels arrive already shifted (the caller aligned them)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# Llama-style configurations, from a CPU demo to Llama-3-8B's shape (examples/train.py's
# --size, autosp.estimate_memory's presets).
LLAMA_PRESETS = {
    "tiny": dict(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, ffn=172),
    "small": dict(vocab=1024, hidden=256, layers=4, heads=8, kv_heads=4, ffn=768),
    "1b": dict(vocab=32000, hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192),  # Llama-3.2-1B's body
    "8b": dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, tie_embeddings=False),
}


def init_weights(model: nn.Module, std: float = 0.02) -> None:
    """GPT-style initialisation (normal(0, std) weights, zero biases), so losses start near log(vocab)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE with the inverse frequencies in a non-persistent buffer (as HF does)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads = cfg.heads
        self.kv_heads = cfg.kv_heads or cfg.heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden, bias=False)

    def forward(self, x, cos, sin, mask=None):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype).unsqueeze(1), sin.to(q.dtype).unsqueeze(1)  # as HF: RoPE in the model's dtype
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        ffn = cfg.ffn or 4 * cfg.hidden
        self.gate = nn.Linear(cfg.hidden, ffn, bias=False)
        self.up = nn.Linear(cfg.hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = LlamaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin, mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class LlamaLike(nn.Module):
    """Llama-style decoder: RMSNorm, RoPE, SwiGLU, GQA, tied embeddings, loss inside.

    ``forward(input_ids, labels=None, position_ids=None, document_ids=None)`` returns a
    dict with ``logits`` and, when labels are given, ``loss`` (labels shifted inside, as
    Hugging Face does, with ``ignore_index=-100``). ``document_ids`` ([B, S] integers,
    packed documents) restrict attention to keys of the query's own document: the mask is
    built as a hand-written model would, ``same document & tril``.
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        init_weights(self)

    def forward(self, input_ids, labels=None, position_ids=None, document_ids=None):
        b, s = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
        cos, sin = self.rope(position_ids)
        mask = None
        if document_ids is not None:  # [B, 1, S, S]: causal within each document
            same = document_ids[:, None, :, None] == document_ids[:, None, None, :]
            mask = same & torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()
        x = self.embed(input_ids)
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        out = {"logits": logits}
        # The loss is computed in fp32 whatever the model's dtype, as transformers does: a
        # bf16 cross-entropy rounds the loss (and its gradient) to ~3 significant digits.
        if labels is not None and self.cfg.shift_labels:
            shift_logits = logits[:, :-1, :].float().reshape(-1, self.cfg.vocab)
            shift_labels = labels[:, 1:].reshape(-1)
            out["loss"] = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
        elif labels is not None:
            out["loss"] = F.cross_entropy(logits.float().reshape(-1, self.cfg.vocab), labels.reshape(-1),
                                          ignore_index=-100)
        return out


@dataclass
class GPT2Config:
    vocab: int = 128
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    max_positions: int = 256


class GPT2Attention(nn.Module):
    """Manual attention (matmul, scale, mask from a buffer, softmax, matmul), as GPT-2 eager."""

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.c_attn = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.c_proj = nn.Linear(cfg.hidden, cfg.hidden)
        n = cfg.max_positions
        self.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n), persistent=False)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        mask = self.bias[:, :, :s, :s]
        att = att.masked_fill(~mask, torch.finfo(att.dtype).min)
        att = F.softmax(att, dim=-1)
        o = torch.matmul(att, v)
        return self.c_proj(o.transpose(1, 2).reshape(b, s, c))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden)
        self.fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.proj = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT2Like(nn.Module):
    """GPT-2-style decoder: learned positions, manual causal attention from a buffer, tied head.

    ``forward(input_ids, labels=None)`` returns ``(loss, logits)`` when labels are
    given, else ``(logits,)``.
    """

    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.blocks = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        init_weights(self)

    def forward(self, input_ids, labels=None):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)[None]
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        if labels is None:
            return (logits,)
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, self.cfg.vocab), labels[:, 1:].reshape(-1))
        return loss, logits


class AttentionBlock(nn.Module):
    """One pre-norm SDPA attention block on hidden states ``[B, S, D]`` (or ``[S, B, D]``
    with ``seq_first=True``). ``kv_heads`` < ``heads`` uses SDPA's GQA (``enable_gqa``)."""

    def __init__(self, hidden: int = 32, heads: int = 4, causal: bool = True, seq_first: bool = False,
                 kv_heads: int | None = None):
        super().__init__()
        self.heads, self.causal, self.seq_first = heads, causal, seq_first
        self.kv_heads = kv_heads or heads
        self.head_dim = hidden // heads
        self.norm = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * self.kv_heads * self.head_dim)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        if self.seq_first:
            x = x.transpose(0, 1)
        b, s, d = x.shape
        h = self.norm(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                           enable_gqa=self.kv_heads != self.heads)
        y = x + self.out(o.transpose(1, 2).reshape(b, s, d))
        return y.transpose(0, 1) if self.seq_first else y


class AlibiBlock(nn.Module):
    """One causal attention block written out (matmul, scale, a per-head ALiBi bias
    ``[H, 1, S]`` of slopes x key position added to the scores, causal mask, softmax,
    matmul), as MPT writes it, on hidden states ``[B, S, D]``."""

    def __init__(self, hidden: int = 32, heads: int = 4):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.register_buffer("slopes", 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        keys = torch.arange(s, device=x.device, dtype=x.dtype)
        bias = (self.slopes[:, None, None] * keys[None, None, :])  # [H, 1, S]
        scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5 + bias
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return x + self.out((weights @ v).transpose(1, 2).reshape(b, s, d))


class RelativeBiasBlock(nn.Module):
    """One bidirectional SDPA attention block whose ``attn_mask`` is a per-head bias from a
    learned table of clipped key - query distances (``[1, H, S, S]``, as T5 passes its
    bucketed position bias), on hidden states ``[B, S, D]``."""

    def __init__(self, hidden: int = 32, heads: int = 4, reach: int = 4):
        super().__init__()
        self.heads, self.head_dim, self.reach = heads, hidden // heads, reach
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.table = nn.Embedding(2 * reach + 1, heads)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        pos = torch.arange(s, device=x.device)
        distance = (pos[None, :] - pos[:, None]).clamp(-self.reach, self.reach) + self.reach
        bias = self.table(distance).permute(2, 0, 1)[None]  # [1, H, S, S]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return x + self.out(o.transpose(1, 2).reshape(b, s, d))


def reference_model(name: str, layers: int = 1, seq: int = 16, batch: int = 2):
    """``(model, args, kwargs, seq_dim)`` for a named reference model, with random inputs.

    Names: ``attention`` (SDPA block), ``attention-seq-first``, ``llama`` (GQA, tied,
    loss inside), ``gpt2`` (manual attention, learned positions, loss inside), ``alibi``
    (manual attention with a per-head ALiBi bias), ``relative-bias`` (SDPA with a learned
    per-head bias as its ``attn_mask``).
    """
    if name == "relative-bias":
        return RelativeBiasBlock(32, 4), (torch.randn(batch, seq, 32),), {}, 1
    if name == "alibi":
        return AlibiBlock(32, 4), (torch.randn(batch, seq, 32),), {}, 1
    if name == "attention":
        return AttentionBlock(32, 4), (torch.randn(batch, seq, 32),), {}, 1
    if name == "attention-seq-first":
        return AttentionBlock(32, 4, seq_first=True), (torch.randn(seq, batch, 32),), {}, 0
    if name == "llama":
        model = LlamaLike(LlamaConfig(vocab=64, hidden=32, layers=layers, heads=4, kv_heads=2))
        ids, labels = torch.randint(0, 64, (2, batch, seq))
        return model, (ids,), {"labels": labels}, 1
    if name == "gpt2":
        model = GPT2Like(GPT2Config(vocab=64, hidden=32, layers=layers, heads=4))
        ids, labels = torch.randint(0, 64, (2, batch, seq))
        return model, (ids,), {"labels": labels}, 1
    raise ValueError(f"unknown reference model '{name}' (attention, attention-seq-first, llama, gpt2, alibi, "
                     "relative-bias)")
