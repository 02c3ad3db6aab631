"""Models called the way trainers call them, made sequence-parallel: parity, three AdamW
steps, and bytes kept for backward linear in S.

Call conventions (HF Trainer, TRL, Accelerate, packing collators):

- ``ones`` / ``left`` / ``right``: ``position_ids`` with an ``attention_mask`` that is all
  ones, left-padded or right-padded (transformers builds causal + key padding as [B, 1, S, S]);
- ``packed``: several documents per row, ``position_ids`` restarting at each, no
  ``attention_mask`` (transformers builds per-document masks from the ``position_ids``
  resets; autosp's own Llama-style model builds ``same document & tril`` from
  ``document_ids`` by hand);
- Mistral's sliding window (8) is smaller than every S here;
- GPT-2 with eager (matmul-softmax) attention and a padding mask: the attention is fused
  into SDPA (``autosp-fuse-attention``), then its mask is recognised like any other;
- transformers 4.x's 4-D causal-mask helper with right padding (a hand-written model; with
  left padding its reference, PyTorch's SDPA with an additive mask, returns a gradient S
  times softmax's own on rows masked everywhere, which autosp does not copy: see
  test_runtime.py's kernel tests against eager softmax);
- two masks that must not be recognised, each with its compile warning: a prefix-LM mask
  (kept), and soft-capped hand-written attention (not fused).

Every configuration is compared with single-device eager on the full sequence (loss, gathered
logits, every gradient), trained three AdamW steps beside it, and its masks must be
recognised (no S x S mask kept, no warning). The bytes kept for backward on a rank at S = 128
and 256 must grow at most 2.3x. The configurations are split between P = 2 and P = 4 and
between S divisible by P and not, so that each family meets each call once; one pool of
ranks runs all of a world's configurations.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128
WINDOW = 8

CONFIGS = {
    2: [("llama", "ones", 16), ("llama", "packed", 15), ("qwen2", "left", 15), ("mistral", "right", 16),
        ("mistral", "left", 15), ("mistral", "packed", 16), ("llamalike", "packed", 15), ("gpt2_eager", "right", 15),
        ("prefix_lm", "plain", 16), ("softcap_lm", "plain", 15)],
    4: [("llama", "left", 33), ("llama", "right", 32), ("qwen2", "ones", 32), ("qwen2", "right", 33),
        ("qwen2", "packed", 33), ("mistral", "ones", 33), ("gpt2_eager", "left", 32), ("old_4d", "right", 33)],
}


class PrefixLM(torch.nn.Module):
    """A hand-written prefix-LM: the first 4 tokens see each other, the rest are causal. Its
    mask (``k <= q or k < 4``) is neither causal nor a window: the compiler must keep it,
    correct, and say what it costs."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.qkv = torch.nn.Linear(32, 96)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, input_ids, labels):
        b, s = input_ids.shape
        q, k, v = self.qkv(self.embed(input_ids)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        i = torch.arange(s, device=input_ids.device)
        mask = (i[None, :] <= i[:, None]) | (i[None, :] < 4)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        logits = self.head(o.transpose(1, 2).reshape(b, s, 32))
        return {"loss": torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)),
                "logits": logits}


class SoftcapLM(PrefixLM):
    """Hand-written causal attention with soft-capped scores (``30 tanh(s / 30)``, Gemma 2):
    not softmax(q k^T * scale + mask), so it is not fused; it runs as written, correct,
    and the compile says its scores stay."""

    def forward(self, input_ids, labels):
        b, s = input_ids.shape
        q, k, v = self.qkv(self.embed(input_ids)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        scores = 30.0 * torch.tanh(torch.matmul(q, k.transpose(-1, -2)) / (30.0 * 8 ** 0.5))
        i = torch.arange(s, device=input_ids.device)
        scores = scores + torch.where(i[None, :] <= i[:, None], 0.0, torch.finfo(scores.dtype).min)
        o = torch.matmul(torch.softmax(scores, dim=-1), v)
        logits = self.head(o.transpose(1, 2).reshape(b, s, 32))
        return {"loss": torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)),
                "logits": logits}


def _old_4d_mask(attention_mask, s, dtype, cache_position, batch):
    """transformers 4.4x's ``_prepare_4d_causal_attention_mask_with_cache_position``, as
    written there (a float mask: triu of finfo.min, times a comparison, a clone and an
    in-place masked_fill of a slice for the padding)."""
    min_dtype = torch.finfo(dtype).min
    causal_mask = torch.full((s, s), fill_value=min_dtype, dtype=dtype)
    causal_mask = torch.triu(causal_mask, diagonal=1)
    causal_mask *= torch.arange(s) > cache_position.reshape(-1, 1)
    causal_mask = causal_mask[None, None, :, :].expand(batch, 1, -1, -1)
    causal_mask = causal_mask.clone()
    mask_length = attention_mask.shape[-1]
    padding_mask = (causal_mask[:, :, :, :mask_length] + attention_mask[:, None, None, :]) == 0
    causal_mask[:, :, :, :mask_length] = causal_mask[:, :, :, :mask_length].masked_fill(padding_mask, min_dtype)
    return causal_mask


class Old4DLM(PrefixLM):
    """Causal attention with padding whose mask comes from transformers 4.x's 4-D helper."""

    def forward(self, input_ids, labels, attention_mask, position_ids=None):
        b, s = input_ids.shape
        q, k, v = self.qkv(self.embed(input_ids)).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        mask = _old_4d_mask(attention_mask, s, q.dtype, torch.arange(s, device=input_ids.device), b)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        logits = self.head(o.transpose(1, 2).reshape(b, s, 32))
        return {"loss": torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)),
                "logits": logits}


def _model(family: str):
    if family == "old_4d":
        return Old4DLM()
    if family == "prefix_lm":
        return PrefixLM()
    if family == "softcap_lm":
        return SoftcapLM()
    if family == "gpt2_eager":  # manual attention: fused into SDPA, then its mask recognised
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512, attn_implementation="eager",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False))
    if family == "llamalike":
        from autosp.models import LlamaConfig, LlamaLike
        return LlamaLike(LlamaConfig(vocab=VOCAB, hidden=64, layers=2, heads=4, kv_heads=2))
    name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[family]
    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, use_cache=False, attn_implementation="sdpa")
    if family == "mistral":
        kwargs["sliding_window"] = WINDOW
    return getattr(transformers, name + "ForCausalLM")(getattr(transformers, name + "Config")(**kwargs))


def _packed_positions(seq: int, gen) -> torch.Tensor:
    """One row's position_ids: documents of 1 .. seq // 2 tokens, each counting from 0."""
    pos = []
    while len(pos) < seq:
        pos += range(int(torch.randint(1, max(2, seq // 2), (1,), generator=gen)))
    return torch.tensor(pos[:seq])


def _batch(family: str, call: str, seq: int, gen):
    """(input_ids, keyword arguments) of one trainer-style call, batch 2. The ids are a view
    (``tokens[:, :-1]``), as a data loader hands them out."""
    ids = torch.randint(0, VOCAB, (2, seq + 1), generator=gen)[:, :-1]
    labels = ids.clone()
    kwargs = {}
    if call == "plain":
        return ids, {"labels": labels}
    if call == "packed":
        pos = torch.stack([_packed_positions(seq, gen) for _ in range(2)])
        labels[pos == 0] = -100  # no document's first token is predicted from the one before
        if family == "llamalike":
            kwargs["document_ids"] = (pos == 0).cumsum(-1)
    else:
        mask = torch.ones(2, seq, dtype=torch.long)
        pad = seq // 3
        if call == "left":
            mask[1, :pad] = 0
        elif call == "right":
            mask[1, -pad:] = 0
        kwargs["attention_mask"] = mask
        labels[mask == 0] = -100

        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # what generation-style collators pass
    kwargs["position_ids"] = pos
    kwargs["labels"] = labels
    if family not in ("llamalike", "old_4d"):
        kwargs["use_cache"] = False
    return ids, kwargs


def _loss(out):
    return out["loss"] if isinstance(out, dict) else out.loss


def _run_config(family, call, seq, seed, ignore_documents=False):
    import autosp
    from autosp.planning.memory import SavedTensors
    from autosp.testing.parity import parameter_distance, parity
    torch.manual_seed(seed)
    model = _model(family)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    ids, kwargs = _batch(family, call, seq, torch.Generator().manual_seed(seed))
    with warnings.catch_warnings(record=True) as caught:  # the first call compiles
        warnings.simplefilter("always")
        report = parity(reference, compiled, input_ids=ids, **kwargs)
    transformed = compiled.programs[0].mlir["transformed"]
    result = {"outputs": report.max_output_error, "grads": report.max_grad_error,
              "documents": transformed.count("autosp.documents"), "key_padding": transformed.count("autosp.key_padding"),
              "window": transformed.count(f"autosp.window = {WINDOW}"), "kept": transformed.count("autosp.mask_kept"),
              "warnings": [str(w.message) for w in caught if str(w.message).startswith("autosp:")]}
    if ignore_documents:
        return result
    saved = []
    for n in (128, 256):  # the same call convention at S and 2S (the program serves any S)
        long_ids, long_kwargs = _batch(family, call, n, torch.Generator().manual_seed(seed + n))
        with SavedTensors(list(model.parameters())) as counter:
            compiled(input_ids=long_ids, **long_kwargs)
        saved.append(counter.bytes)
    result["saved"] = saved
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
    for step in range(3):
        ids, kwargs = _batch(family, call, seq, torch.Generator().manual_seed(seed + step + 1))
        for m, o in ((reference, opt_ref), (compiled, opt)):
            o.zero_grad()
            _loss(m(input_ids=ids, **kwargs)).backward()
            o.step()
    result["params"] = parameter_distance(reference, model)  # relative L2 (see its docstring)
    return result


def _body(rank, world, queue, configs, seed):
    queue.put((rank, {cfg: _run_config(*cfg, seed=seed + i) for i, cfg in enumerate(configs)}))


@pytest.mark.parametrize("world", sorted(CONFIGS))
def test_trainer_calls_match_single_device_with_linear_memory(world, _fresh_seed):
    results = run_ranks(_body, world, args=(CONFIGS[world], _fresh_seed % 10000), timeout=600)
    for rank, by_config in results.items():
        for (family, call, seq), r in by_config.items():
            where = f"rank {rank}, {family} {call} S={seq} P={world}: {r}"
            assert r["outputs"] <= TOL and r["grads"] <= TOL, where
            assert r["params"] <= 1e-4, where
            if family == "softcap_lm":  # not fused, correct, and rank 0 says so once
                if rank == 0:
                    (line,) = r["warnings"]
                    assert "hand-written attention at" in line and "test_trainer_calls.py" in line, line
                    assert "[2, 2, S, S] scores and probabilities stay" in line and "torch.aten.tanh" in line, line
                else:
                    assert r["warnings"] == [], where
                continue
            if family == "prefix_lm":  # kept, correct, and rank 0 says so once with its cost
                assert r["kept"] == 1, where
                if rank == 0:
                    (line,) = r["warnings"]
                    assert "scaled_dot_product_attention at" in line and "test_trainer_calls.py" in line, line
                    assert f"keeps its [S, S] i1 attention mask materialised: {seq * seq} B per rank at S={seq}" in line
                    assert "(16.0 GiB at S=131072)" in line and "or(" in line, line
                else:
                    assert r["warnings"] == [], where
                continue
            # Recognised: per-document causal attention, causal + key padding, and the window.
            assert r["kept"] == 0 and r["warnings"] == [], where
            assert r["documents" if call == "packed" else "key_padding"] == (1 if family == "old_4d" else 2), where
            assert r["window"] == (2 if family == "mistral" else 0), where
            small, large = r["saved"]
            assert large <= 2.3 * small, f"{where}: saved {small} B at S=128, {large} B at S=256"


def _ignore_documents_body(rank, world, queue, seed):
    from autosp.runtime import attention  # negative control: the kernel drops the documents

    def causal_only(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, enable_gqa=False, window=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                                enable_gqa=enable_gqa)
    original = attention.document_attention
    attention.document_attention = causal_only  # the emitter looks it up when it emits this model
    try:
        queue.put((rank, _run_config("llama", "packed", 16, seed, ignore_documents=True)))
    finally:  # the ranks are pooled: later tests get the real kernel back
        attention.document_attention = original


def test_attention_across_documents_breaks_parity(_fresh_seed):
    """Negative control: the packed call with the documents dropped (causal over the row) fails."""
    results = run_ranks(_ignore_documents_body, 2, args=(_fresh_seed % 10000,), timeout=300)
    for rank, r in results.items():
        assert r["documents"] == 2 and r["outputs"] > 100 * TOL, (rank, r)


LONG = 16384


def _long_document_body(rank, world, queue, seed):
    import autosp
    from autosp.planning.memory import SavedTensors
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=LONG,
                                      use_cache=False, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    gen = torch.Generator().manual_seed(seed)
    kwargs = {"position_ids": torch.arange(LONG)[None], "use_cache": False}
    ids = torch.randint(0, VOCAB, (1, LONG), generator=gen)
    report = parity(reference, compiled, input_ids=ids, labels=ids, **kwargs)
    with SavedTensors(list(model.parameters())) as counter:
        compiled(input_ids=ids, labels=ids, **kwargs)
    opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
    losses = []
    for _ in range(2):  # train on it (the gradients of the parity call are those of step 1)
        ids = torch.randint(0, VOCAB, (1, LONG), generator=gen)
        pair = []
        for m, o in ((reference, opt_ref), (compiled, opt)):
            o.zero_grad()
            loss = m(input_ids=ids, labels=ids, **kwargs).loss
            loss.backward()
            o.step()
            pair.append(float(loss))
        losses.append(pair)
    transformed = compiled.programs[0].mlir["transformed"]
    queue.put((rank, {"outputs": report.max_output_error, "grads": report.max_grad_error, "saved": counter.bytes,
                      "losses": losses, "documents": transformed.count("autosp.documents")}))


def test_one_16k_document_trains_over_two_ranks_with_position_ids(_fresh_seed):
    """One 16K-token document, called with position_ids and no mask (transformers builds its
    packed-documents mask, [1, 1, S, S]: 256 MiB as booleans), split across 2 ranks: it
    matches one device (loss, gathered logits, every gradient; two AdamW steps), runs as a
    single causal document, and a rank keeps less for backward than the S x S mask alone."""
    results = run_ranks(_long_document_body, 2, args=(_fresh_seed % 10000,), timeout=600)
    for rank, r in results.items():
        assert r["outputs"] <= TOL and r["grads"] <= TOL, (rank, r)
        assert r["documents"] == 1, (rank, r)
        assert all(abs(a - b) <= TOL * abs(a) for a, b in r["losses"]), (rank, r)
        assert r["saved"] < LONG * LONG // 4, f"rank {rank} keeps {r['saved']} B for backward"
