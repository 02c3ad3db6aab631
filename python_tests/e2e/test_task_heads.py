"""Task heads that pick positions or normalise over the sequence, made sequence-parallel (issue 39).

A reward model's score is read at the last non-pad token, BERT's at ``[CLS]``, a hand-written
head at ``h[:, -1]``; extractive QA takes a log-softmax over the positions and reads the
label's. ``autosp-shard-sequence`` splits them (``Rules.decide_selection`` / ``decide_reduction``):
a selection becomes this rank's rows (``autosp.local_positions`` into a zero-padded shard: zeros
where another rank holds the position) and a sum all-reduce; the log-softmax over positions is
``autosp.softmax`` (a max all-reduce, a sum of exponentials, the backward's sum all-reduced).

Each model against single-device eager on the full sequence, S not divisible by P, at P = 2
and P = 4: loss, outputs, every gradient and the parameters after each of 3 AdamW steps, on
fresh random inputs. Negative control: each rank taking the pooled row from its own shard
(the position clamped into its rows instead of zeros elsewhere) breaks parity.
"""
import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
# Parameters after AdamW steps: AdamW divides each gradient element by its own size, so
# rounding-level gradient differences (here <= 2e-6 relative) move small-gradient elements
# by up to ~lr; the QA head's log-softmax over the sequence has seeds at 1.3e-5 (seed 5330).
PARAM_TOL = 5e-5
VOCAB = 96
PAD = 0


def _llama_config(**extra):
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                    pad_token_id=PAD, use_cache=False, attn_implementation="sdpa", **extra)


class LastTokenHead(torch.nn.Module):
    """A head written by hand on the last position of a decoder's hidden states."""

    def __init__(self):
        super().__init__()
        self.body = transformers.LlamaModel(_llama_config())
        self.head = torch.nn.Linear(32, 1)

    def forward(self, input_ids, target):
        h = self.body(input_ids=input_ids).last_hidden_state
        score = self.head(h[:, -1]).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(score, target), "score": score}


def _model(name: str) -> torch.nn.Module:
    if name == "llama-cls":
        return transformers.LlamaForSequenceClassification(_llama_config(num_labels=3))
    if name == "bert-cls":
        cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, num_labels=3, attn_implementation="sdpa")
        return transformers.BertForSequenceClassification(cfg)
    if name == "last-token":
        return LastTokenHead()
    return transformers.LlamaForQuestionAnswering(_llama_config())


def _batch(name: str, seq: int, gen: torch.Generator) -> dict:
    ids = torch.randint(1, VOCAB, (2, seq), generator=gen)
    if name == "llama-cls":  # right padding: the score is read at each row's last real token
        ids[1, -(seq // 3):] = PAD
        return {"input_ids": ids, "attention_mask": (ids != PAD).long(),
                "labels": torch.randint(0, 3, (2,), generator=gen)}
    if name == "bert-cls":
        return {"input_ids": ids, "labels": torch.randint(0, 3, (2,), generator=gen)}
    if name == "last-token":
        return {"input_ids": ids, "target": torch.randn(2, generator=gen)}
    starts = torch.randint(0, seq, (2,), generator=gen)
    return {"input_ids": ids, "start_positions": starts,
            "end_positions": torch.minimum(starts + torch.randint(0, 4, (2,), generator=gen), torch.tensor(seq - 1))}


def _grad_error(model, reference) -> float:
    """The largest relative gradient error. Two biases get no gradient in exact arithmetic,
    so there both sides are rounding noise (~1e-9) and the bound is absolute (as in
    test_encoders): BERT's key bias (it shifts every score of a query alike) and the QA head's
    bias (it shifts every position's logit alike, and the loss is a log-softmax over them)."""
    from autosp.testing.parity import relative_error
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if p.grad is None and q.grad is None:
            continue
        if name.endswith(("attention.self.key.bias", "qa_outputs.bias")):
            worst = max(worst, (p.grad - q.grad).abs().max().item() / 1e-6 * TOL)
        else:
            worst = max(worst, relative_error(p.grad, q.grad))
    return worst


def _outputs(out) -> list:
    names = ("loss", "logits", "score", "start_logits", "end_logits")
    return [out[k].detach() for k in names if k in out and out[k] is not None]


NAMES = ("llama-cls", "bert-cls", "last-token", "llama-qa")


def _body(rank, world, queue, seq, seed, clamp_to_own_rows):
    import autosp
    from autosp.backend import fx_emitter
    from autosp.ir.contract import LOCAL_POSITIONS
    from autosp.runtime import sequence_ops
    from autosp.testing.parity import adamw_steps, relative_error
    original = sequence_ops.local_positions
    if clamp_to_own_rows:  # negative control: every rank reads the pooled row from its own shard
        def own_rows(positions, seq_len, *, lo, trim, group):
            local = original(positions, seq_len, lo=lo, trim=trim, group=group)
            rows = autosp.runtime.collectives.local_len(seq_len, lo, trim, group)
            window = seq_len - lo - trim
            return torch.where(local == rows, torch.where(positions < 0, positions + window, positions) % rows, local)
        fx_emitter._AUTOSP_OPS[LOCAL_POSITIONS] = (own_rows, fx_emitter._AUTOSP_OPS[LOCAL_POSITIONS][1])
    results = {}
    try:
        for name in NAMES:
            torch.manual_seed(seed)
            model = _model(name)
            reference = copy.deepcopy(model)
            compiled = autosp.compile(model, gather_outputs=True)
            gen = torch.Generator().manual_seed(seed + 1)
            seen = []  # each call's outputs: the reference's, then the compiled model's, per step

            def loss_of(m, batch, seen=seen):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = m(**batch)
                seen.append(_outputs(out))
                return out["loss"]
            steps = [{"grads": grads, "params": params} for grads, params in adamw_steps(
                reference, model, compiled, loss_of, [_batch(name, seq, gen) for _ in range(3)],
                grad_error=_grad_error, lr=1e-2)]
            for errors, ref, got in zip(steps, seen[0::2], seen[1::2]):
                errors["outputs"] = max(relative_error(b, a) for a, b in zip(ref, got))
            ir = compiled.programs[0].mlir["transformed"]
            results[name] = {"steps": steps, "selections": ir.count('"autosp.local_positions"'),
                             "softmaxes": ir.count('"autosp.softmax"')}
        queue.put((rank, results))
    finally:
        fx_emitter._AUTOSP_OPS[LOCAL_POSITIONS] = (original, fx_emitter._AUTOSP_OPS[LOCAL_POSITIONS][1])


# (the QA loss selects twice; the classification losses once; their log-softmax is over the labels)
SELECTIONS = {"llama-cls": 1, "bert-cls": 1, "last-token": 1, "llama-qa": 2}
SOFTMAXES = {"llama-cls": 0, "bert-cls": 0, "last-token": 0, "llama-qa": 2}


@pytest.mark.parametrize("world,seq", [(2, 15), (4, 19)])
def test_task_heads_match_single_device(world, seq, _fresh_seed):
    results = run_ranks(_body, world, args=(seq, _fresh_seed % 10000, False), timeout=900)
    for rank, per_model in results.items():
        for name, r in per_model.items():
            where = f"{name}, rank {rank}, P={world}: {r}"
            for errors in r["steps"]:
                assert errors["grads"] <= TOL and errors["outputs"] <= TOL, where
                assert errors["params"] <= PARAM_TOL, where
            assert r["selections"] == SELECTIONS[name] and r["softmaxes"] == SOFTMAXES[name], where


def test_negative_control_pooled_row_from_the_local_shard_breaks_parity(_fresh_seed):
    results = run_ranks(_body, 2, args=(15, _fresh_seed % 10000, True), timeout=900)
    for rank, per_model in results.items():
        for name, r in per_model.items():
            assert r["steps"][0]["outputs"] > 1e-3, (name, rank, r)


def _reductions_body(rank, world, queue, seq, seed):
    """Each runtime reduction over a sharded dim against torch on the whole tensor, forward
    and backward, with ties across the ranks (a constant row: every position ties)."""
    from autosp.runtime import collectives, sequence_ops
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, seq, 3, generator=gen)
    x[1] = 0.5  # row 1: every position ties (amax splits its gradient over all of them; argmax: position 0)
    x[0, 2, 0] = x[0, seq - 2, 0] = x[0, :, 0].max() + 1.0  # ties on two ranks: argmax takes the first
    dy = torch.randn(2, seq, 3, generator=gen)
    errors = {}
    cases = {
        "softmax": (lambda t: torch.softmax(t, 1), lambda t: sequence_ops.softmax(t, dim=1, log=0, group="sp"), True),
        "log_softmax": (lambda t: torch.log_softmax(t, 1),
                        lambda t: sequence_ops.softmax(t, dim=1, log=1, group="sp"), True),
        "logsumexp": (lambda t: torch.logsumexp(t, 1, keepdim=True),
                      lambda t: sequence_ops.logsumexp(t, dim=1, group="sp"), False),
        "amax": (lambda t: torch.amax(t, 1, keepdim=True), lambda t: sequence_ops.amax(t, dim=1, group="sp"), False),
    }
    for name, (full, split, sharded_out) in cases.items():
        ref_in = x.clone().requires_grad_(True)
        ref = full(ref_in)
        weight = dy if sharded_out else dy[:, :1]
        (ref * weight).sum().backward()
        mine = collectives.shard(x, seq, 1, 0, 0, "sp").clone().requires_grad_(True)
        out = split(mine)
        mine_w = collectives.shard(weight, seq, 1, 0, 0, "sp") if sharded_out else weight
        (out * mine_w).sum().backward()
        ref_out = collectives.shard(ref.detach(), seq, 1, 0, 0, "sp") if sharded_out else ref.detach()
        errors[name] = max((out.detach() - ref_out).abs().max().item(),
                           (mine.grad - collectives.shard(ref_in.grad, seq, 1, 0, 0, "sp")).abs().max().item())
    local = collectives.shard(x, seq, 1, 0, 0, "sp")
    errors["argmax"] = float((sequence_ops.argmax(local, seq, dim=1, lo=0, trim=0, group="sp")
                              != x.argmax(1, keepdim=True)).sum())
    queue.put((rank, errors))


@pytest.mark.parametrize("world,seq", [(2, 15), (4, 19)])
def test_reductions_over_the_sequence_match_torch_with_ties(world, seq, _fresh_seed):
    results = run_ranks(_reductions_body, world, args=(seq, _fresh_seed % 10000))
    for rank, errors in results.items():
        assert max(errors.values()) <= 1e-6, (rank, errors)
