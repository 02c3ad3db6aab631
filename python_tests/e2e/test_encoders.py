"""Encoders (non-causal attention) with key padding, made sequence-parallel (issue 25).

transformers' BERT builds a bidirectional [B, 1, S, S] mask from ``attention_mask``;
``autosp-causal-mask`` proves it is key padding alone and hands the SDPA op the [B, 1, 1, S]
padding (``autosp.key_padding``, is_causal false), run by ``key_padded_attention`` in O(S):
no S x S mask is kept. Loss, gathered logits and every gradient against single-device
eager at P = 2 (S = 15) and P = 4 (S = 19) with right padding, and as a ring at P = 2
(the padding an operand of ``autosp.ring_attention``), then 3 AdamW steps; bytes
kept for backward grow at most 2.3x from S to 2S. Negative control: a kernel that drops
the padding breaks parity.

The key projections' bias gets no gradient in exact arithmetic (it adds the same
``q . b`` to every score of a query: softmax is shift-invariant), so both sides' values
are rounding noise (~1e-9); it is compared with an absolute bound instead of a relative one.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import families  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
VOCAB = 128


def _bert():
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    return transformers.BertForMaskedLM(cfg)


def _batch(seq, gen):
    ids = torch.randint(0, VOCAB, (2, seq), generator=gen)
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, -(seq // 3):] = 0  # right padding
    labels = ids.clone()
    labels[mask == 0] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _grad_error(model, reference) -> float:
    from autosp.testing.parity import relative_error
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if name.endswith("attention.self.key.bias"):  # analytically zero (module docstring)
            worst = max(worst, (p.grad - q.grad).abs().max().item() / 1e-6 * TOL)
        else:
            worst = max(worst, relative_error(p.grad, q.grad))
    return worst


def _body(rank, world, queue, seq, seed, drop_padding, options=None):
    import autosp
    from autosp.planning.memory import SavedTensors
    from autosp.runtime import attention
    from autosp.testing.parity import ADAM_EPS, align_parameters, parameter_distance, relative_error
    original = attention.key_padded_attention
    if drop_padding:  # negative control: every key visible
        attention.key_padded_attention = lambda q, k, v, attn_mask, *args, **kw: original(
            q, k, v, torch.ones_like(attn_mask), *args, **kw)
    try:
        torch.manual_seed(seed)
        model = _bert()
        reference = copy.deepcopy(model)
        compiled = autosp.compile(model, gather_outputs=True, **(options or {}))
        gen = torch.Generator().manual_seed(seed)
        opt_ref = torch.optim.AdamW(reference.parameters(), lr=1e-3, eps=ADAM_EPS)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=ADAM_EPS)
        steps = []
        for _ in range(3):
            batch = _batch(seq, gen)
            outs = []
            for m, o in ((reference, opt_ref), (compiled, opt)):
                o.zero_grad()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = m(**batch)
                out.loss.backward()
                outs.append(out)
            errors = {"loss": relative_error(outs[1].loss.detach(), outs[0].loss.detach()),
                      "logits": relative_error(outs[1].logits.detach(), outs[0].logits.detach()),
                      "grads": _grad_error(model, reference)}
            opt_ref.step()
            opt.step()
            errors["params"] = parameter_distance(reference, model)
            steps.append(errors)
            align_parameters(model, reference)
            if drop_padding:
                break
        ir = compiled.programs[0].mlir["transformed"]
        result = {"steps": steps, "key_padding": ir.count("autosp.key_padding") + ir.count("key_padding = 1 : i64"),
                  "kept": ir.count("autosp.mask_kept"), "rings": ir.count('"autosp.ring_attention"')}
        if not drop_padding:
            saved = []
            for s in (2 * seq, 4 * seq):
                with SavedTensors(list(model.parameters())) as kept:
                    out = compiled(**_batch(s, gen))
                saved.append(kept.bytes)
                del out
            result["saved_growth"] = saved[1] / saved[0]
        queue.put((rank, result))
    finally:
        attention.key_padded_attention = original


@pytest.mark.parametrize("case", families.params("bert"))
def test_bert_with_key_padding_matches_single_device_without_an_s_by_s_mask(case, _fresh_seed):
    world, seq, strategy = case.world, case.seq, "ring" if case.has("ring") else None
    options = {"sp_strategy": strategy} if strategy else {}
    results = run_ranks(_body, world, args=(seq, _fresh_seed % 10000, False, options), timeout=600)
    for rank, r in results.items():
        where = f"rank {rank}, P={world}: {r}"
        for errors in r["steps"]:
            assert max(errors.values()) <= TOL, where
        assert r["key_padding"] == 2 and r["kept"] == 0, where  # both layers: the padding proven, no mask kept
        assert r["rings"] == (2 if strategy == "ring" else 0), where  # (ring: the padding travels in the op)
        assert r["saved_growth"] <= 2.3, where


def test_negative_control_dropped_key_padding_breaks_parity(_fresh_seed):
    results = run_ranks(_body, 2, args=(15, _fresh_seed % 10000, True), timeout=600)
    for rank, r in results.items():
        assert r["steps"][0]["logits"] > 1e-3, (rank, r)
