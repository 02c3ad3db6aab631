"""Hugging Face transformers models, unmodified, made sequence-parallel on gloo ranks.

Built from configs with random weights (no hub access). Every rank checks the loss, the
gathered logits and every gradient against single-device eager, and three AdamW steps
against single-device training.
"""
import copy
import re
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128
# repeat_kv's widened [B, KV, reps, S, D] key or value (broadcast_to / expand), as exported.
REPEAT_KV = re.compile(r"torch\.aten\.(broadcast_to|expand) .*-> !torch\.vtensor<\[\d+,\d+,\d+,\?,\d+\],f32>")


def _model(kind, attn):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          attn_implementation=attn, tie_word_embeddings=True, use_cache=False)
        return LlamaForCausalLM(cfg)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, attn_implementation=attn,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(cfg)


def _batch(seq, extra, gen):
    ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
    kwargs = {"labels": ids.clone(), "use_cache": False}
    if "position_ids" in extra:
        kwargs["position_ids"] = torch.arange(seq).expand(2, seq)
    if "mask" in extra:
        mask = torch.ones(2, seq, dtype=torch.long)
        pad = seq // 3
        if "right_pad" in extra:
            mask[1, -pad:] = 0
        if "left_pad" in extra:
            mask[1, :pad] = 0
        kwargs["attention_mask"] = mask
        kwargs["labels"][mask == 0] = -100
    return ids, kwargs


def _ignore_padding_body(rank, world, queue, *args):
    """Negative control: the structured kernel drops the key padding (restored afterwards:
    the ranks are pooled, and the emitter looks the kernel up when it emits a model)."""
    from autosp.runtime import attention
    original = attention.key_padded_causal_attention
    attention.key_padded_causal_attention = (
        lambda q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, enable_gqa=False, empty_rows=None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa))
    try:
        _body(rank, world, queue, *args)
    finally:
        attention.key_padded_causal_attention = original


def _body(rank, world, queue, kind, attn, seq, extra, seed, steps):
    import autosp
    from autosp.testing.parity import parameter_distance, parity, relative_error
    torch.manual_seed(seed)
    model = _model(kind, attn)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    ids, kwargs = _batch(seq, extra, torch.Generator().manual_seed(seed))
    with warnings.catch_warnings(record=True) as caught:  # the first call compiles
        warnings.simplefilter("always")
        report = parity(reference, compiled, input_ids=ids, **kwargs)
    transformed = compiled.programs[0].mlir["transformed"]
    result = {"outputs": report.max_output_error, "grads": report.max_grad_error,
              "a2a": transformed.count('"autosp.all_to_all"'), "key_padding": transformed.count("autosp.key_padding"),
              "repeats": [len(REPEAT_KV.findall(compiled.programs[0].mlir[k])) for k in ("imported", "transformed")],
              "mask_warnings": [str(w.message) for w in caught if str(w.message).startswith("autosp:")]}
    if steps:
        opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3)
        opt = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
        for step in range(steps):
            ids, kwargs = _batch(seq, extra, torch.Generator().manual_seed(seed + step + 1))
            for m, o in ((reference, opt_ref), (compiled, opt)):
                o.zero_grad()
                m(input_ids=ids, **kwargs).loss.backward()
                o.step()
        result["params"] = parameter_distance(reference, model)  # relative L2 (see its docstring)
        result["params_max_elementwise"] = max(relative_error(q, p)
                                               for p, q in zip(reference.parameters(), model.parameters()))
    queue.put((rank, result))


# Trainer-style calls (position_ids, padding masks, packed documents) of Llama, Qwen2 and
# Mistral, with their memory: test_trainer_calls.py. (Variant words: the attention
# implementation, then the batch's padding.)
@pytest.mark.parametrize("kind, case", families.params("llama", lead=("llama",)) +
                         families.params("gpt2", lead=("gpt2",)))
def test_hf_model_matches_single_device(kind, case, _fresh_seed):
    world, seq, attn, extra = case.world, case.seq, case.variant[0], ",".join(case.variant[1:])
    results = run_ranks(_body, world, args=(kind, attn, seq, extra, _fresh_seed % 10000, 0), timeout=300)
    for rank, r in results.items():
        assert r["outputs"] <= TOL and r["grads"] <= TOL, f"rank {rank}: {r}"
        assert r["a2a"] == 8, "4 all-to-alls per layer, 2 layers"
        if kind == "llama":  # GQA: transformers' repeat_kv (k and v, 2 layers) is gone, SDPA reads the KV heads
            assert r["repeats"] == [4, 0], r["repeats"]
    # An SDPA padding mask (causal and attention_mask[b, k]) is proven and runs without
    # S x S; a mask proven causal says nothing.
    warned = results[0]["mask_warnings"]
    if "mask" in extra and attn == "sdpa":
        assert results[0]["key_padding"] == 2, results[0]
    assert warned == [], warned


def test_dropping_the_key_padding_breaks_parity(_fresh_seed):
    """Negative control: the structured kernel without the padding must fail."""
    results = run_ranks(_ignore_padding_body, 2, args=("llama", "sdpa", 16, "mask,right_pad", _fresh_seed % 10000, 0),
                        timeout=300)
    assert all(r["outputs"] > 100 * TOL for r in results.values()), results


@pytest.mark.parametrize("repeat", range(3))
def test_three_adamw_steps_match_single_device_training(repeat, _fresh_seed):
    results = run_ranks(_body, 2, args=("llama", "sdpa", 16, "", _fresh_seed % 10000, 3), timeout=300)
    for rank, r in results.items():
        assert r["params"] <= 1e-4, f"rank {rank}: parameters after 3 AdamW steps differ by {r['params']:.2e}"


# More decoder families, plain calls (Mistral and Qwen2 called trainer-style: test_trainer_calls.py).


def _family_body(rank, world, queue, family, seed):
    import autosp
    from autosp.testing.parity import parity
    torch.manual_seed(seed)
    config = getattr(transformers, family + "Config")(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_cache=False, attn_implementation="sdpa")
    model = getattr(transformers, family + "ForCausalLM")(config)
    reference = copy.deepcopy(model)
    compiled = autosp.compile(model, gather_outputs=True)
    ids, kwargs = _batch(15, "", torch.Generator().manual_seed(seed))
    error = parity(reference, compiled, input_ids=ids, **kwargs).max_error
    queue.put((rank, (error, compiled.programs[0].mlir["transformed"].count("autosp.key_padding"))))


@pytest.mark.parametrize("family", ["Qwen3", "Gemma"])
def test_other_decoder_families_follow_the_same_conventions(family, _fresh_seed):
    results = run_ranks(_family_body, 2, args=(family, _fresh_seed % 10000), timeout=300)
    assert max(error for error, _ in results.values()) <= TOL, results
