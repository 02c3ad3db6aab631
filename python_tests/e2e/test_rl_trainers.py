"""autosp.hf.sequence_parallel(GRPOTrainer) and (RLOOTrainer): SP 2 (world 2, gloo) against
the single-process TRL trainer.

A tiny random Llama, prompts of random tokens, a Python reward (how many completion tokens
are multiples of 3), 3 optimizer steps of gradient accumulation 2 (two micro-batches per
generation round: the round is shuffled and split), 4 generations per prompt, completions of
at most 6 tokens, a reference model (``beta`` > 0: its log-probabilities run through its own
sequence-parallel wrapper). GRPO runs 2 iterations per generation (the old policy's
log-probabilities are computed, sequence-parallel, and the clipped ratio moves off 1).

Compared per generation round: prompt and completion ids (equal on every rank of the group
and to one process's), rewards and advantages (every replica's, as logged for the completions
table, and this rank's slice), the reference and old log-probabilities; per step, every
metric in ``log_history`` (loss, rewards, reward_std, kl, entropy, clip ratios, lengths,
num_tokens, grad_norm); the final parameters (relative L2).

In the same job (one per trainer):

- **broadcast alone**: TRL's per-process seeds kept (rank 1 samples other completions than
  rank 0): the group's first rank's generations, rewards and random state are broadcast, so
  the run is still one process's; rank 1's own first samples are checked to differ;
- **negative control**: seeding by replica and the broadcast both off: the ranks of the group
  feed different sequences to the compiled model, and autosp's input check stops the run;
- the accelerator view's collectives with 2 replicas (each rank its own replica) against
  accelerate's over the world.
"""
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

from test_hf_trainer import _reset_accelerate, _torchrun_env  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

VOCAB = 64
PROMPTS = 16
STEPS = 3
TOL = 1e-5
TIMEOUT = 61.0  # a pool of their own (accelerate's state is a process-wide singleton)
# Logged values that are timings, not results.
_TIMINGS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


# ---------------------------------------------------------------------------- helpers
def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      attn_implementation="sdpa", eos_token_id=1, pad_token_id=0, bos_token_id=None)
    return transformers.LlamaForCausalLM(config)


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _prompts():
    import datasets
    gen = torch.Generator().manual_seed(5)
    rows = []
    for _ in range(PROMPTS):
        n = int(torch.randint(2, 7, (1,), generator=gen))
        rows.append(" ".join(f"t{int(x)}" for x in torch.randint(2, VOCAB, (n,), generator=gen)))
    return datasets.Dataset.from_dict({"prompt": rows})


def threes(completions, completion_ids, **kwargs):
    """The reward: how many completion tokens are multiples of 3."""
    return [float(sum(1 for t in ids if t % 3 == 0)) for ids in completion_ids]


def _trainer_cls(kind):
    return trl.GRPOTrainer if kind == "grpo" else trl.RLOOTrainer


def _config(kind, output_dir):
    config_cls = trl.GRPOConfig if kind == "grpo" else trl.RLOOConfig
    extra = {"num_iterations": 2} if kind == "grpo" else {}
    return config_cls(output_dir=str(output_dir), report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
                      dataloader_num_workers=0, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=6, max_steps=STEPS, logging_steps=1,
                      learning_rate=2e-3, adam_epsilon=1e-5, max_grad_norm=1.0, beta=0.04, bf16=False,
                      gradient_checkpointing=False, save_strategy="no", **extra)


def _recording(cls):
    """``cls`` recording each generation round: what the ranks sampled themselves (before any
    sharing) and the scored batch the trainer trains on."""
    class Recording(cls):
        rounds: list
        sampled: list
        passes: set

        def _generate_single_turn(self, *args, **kwargs):
            out = super()._generate_single_turn(*args, **kwargs)  # GRPO: (ids, logprobs); RLOO: ids
            self.sampled.append([list(c) for c in (out[0] if isinstance(out, tuple) else out)])
            return out

        def _autosp_logps_model(self, model):  # (SP runs only) what each log-prob pass was given and ran on
            mapped = super()._autosp_logps_model(model)
            given = "policy" if model is self.model else "ref" if model is self.ref_model else type(model).__name__
            self.passes.add((given, type(mapped).__name__))
            return mapped

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            keep = ("prompt_ids", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
                    "ref_per_token_logps")
            record = {k: out[k].detach().clone() for k in keep if out.get(k) is not None}
            record["all_advantages"] = torch.tensor(list(self._logs["advantages"]))
            record["all_rewards"] = torch.tensor(list(self._logs["rewards"]["threes"]))
            self.rounds.append(record)
            return out
    Recording.rounds, Recording.sampled, Recording.passes = None, None, None
    return Recording


def _train(cls, kind, root, model_path, **extra):
    trainer = cls(model=model_path, reward_funcs=threes, args=_config(kind, root), train_dataset=_prompts(),
                  processing_class=_tokenizer(), **extra)
    trainer.rounds, trainer.sampled, trainer.passes = [], [], set()
    trainer.train()
    return {"logs": [dict(h) for h in trainer.state.log_history], "rounds": trainer.rounds, "sampled": trainer.sampled,
            "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, "passes": trainer.passes}


def _replica_view_collectives(rank: int) -> dict:
    """The view's collectives with each rank its own replica (2 replicas) against accelerate's
    over the world (2 processes): the same values."""
    import torch.distributed as dist
    from accelerate.utils import gather, gather_object, pad_across_processes, reduce

    from autosp.hf.rl import _ReplicaAccelerator
    view = _ReplicaAccelerator(object(), rank, 2, dist.group.WORLD)
    rows = torch.arange(3.0) + 10 * rank
    scalar = torch.tensor(1.5 + rank)
    ragged = torch.arange(rank + 1.0)
    same = {
        "process": (view.process_index, view.num_processes) == (rank, 2),
        "gather": torch.equal(view.gather(rows), gather(rows)),
        "gather_0d": torch.equal(view.gather(scalar), gather(scalar)),
        "gather_object": view.gather_object([f"r{rank}", rank]) == gather_object([f"r{rank}", rank]),
        "pad": torch.equal(view.pad_across_processes(ragged, pad_index=-1),
                           pad_across_processes(ragged, pad_index=-1)),
        "pad_first": torch.equal(view.pad_across_processes(ragged, pad_first=True),
                                 pad_across_processes(ragged, pad_first=True)),
    }
    for how in ("sum", "mean", "max"):
        same[f"reduce_{how}"] = torch.equal(view.reduce(rows, reduction=how), reduce(rows, reduction=how))
    return same


def _rank_body(rank, world, queue, root, kind, model_path):
    from autosp.ir.diagnostics import AutospError
    with _torchrun_env(rank, world):
        import autosp.hf
        cls = _recording(autosp.hf.sequence_parallel(_trainer_cls(kind)))
        out = {"shared": _train(cls, kind, os.path.join(root, "shared"), model_path, sp_size=2)}
        # TRL's per-process seeds kept: only the broadcast keeps the group together.
        apart = type("SampledApart", (cls,), {"_autosp_seed_by_replica": False})
        out["broadcast_only"] = _train(apart, kind, os.path.join(root, "apart"), model_path, sp_size=2)
        out["collectives"] = _replica_view_collectives(rank)
    with _torchrun_env(rank, world):
        unshared = type("Unshared", (cls,), {"_autosp_seed_by_replica": False, "_autosp_broadcast_generations": False})
        try:
            _train(unshared, kind, os.path.join(root, "unshared"), model_path, sp_size=2)
            out["unshared"] = None
        except AutospError as e:
            out["unshared"] = str(e)
    queue.put((rank, out))


# ---------------------------------------------------------------------------- checks
def _rel_l2(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in b)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return (num / den) ** 0.5


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max absolute difference, relative to the reference's scale where it exceeds 1."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double() - b.double()).abs().max() / max(1.0, float(b.double().abs().max()))) if b.numel() else 0.0


def _compare(got: dict, ref: dict, where: str) -> dict:
    """Asserts ``got`` is ``ref``'s run; returns the largest differences."""
    assert len(got["rounds"]) == len(ref["rounds"]) >= 2, where
    worst = {"rounds": 0.0, "metrics": 0.0}
    for i, (g, r) in enumerate(zip(got["rounds"], ref["rounds"])):
        assert set(g) == set(r), (where, i, set(g) ^ set(r))
        for key in ("prompt_ids", "completion_ids", "completion_mask"):
            assert torch.equal(g[key], r[key]), f"{where}: round {i}: {key} differs from one process's"
        for key in ("advantages", "all_advantages", "all_rewards", "old_per_token_logps", "ref_per_token_logps"):
            if key in r:
                err = _close(g[key], r[key])
                worst["rounds"] = max(worst["rounds"], err)
                assert err <= TOL, f"{where}: round {i}: {key} off by {err:.2e}"
    assert len(got["logs"]) == len(ref["logs"]) == STEPS + 1, where
    for g, r in zip(got["logs"], ref["logs"]):
        keys = [k for k, v in r.items() if isinstance(v, (int, float)) and k not in _TIMINGS]
        assert set(keys) <= set(g), (where, set(keys) - set(g))
        for k in keys:
            err = abs(g[k] - r[k]) / max(1.0, abs(r[k]))
            worst["metrics"] = max(worst["metrics"], err)
            assert err <= TOL, f"{where}: step {r['step']}: {k} = {g[k]} against one process's {r[k]}"
    worst["params"] = _rel_l2(got["params"], ref["params"])
    assert worst["params"] <= TOL, f"{where}: parameters rel L2 {worst['params']:.2e}"
    return worst


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_rl_trainer_sp2_shares_generations_and_matches_one_process(kind, tmp_path):
    model_path = str(tmp_path / "tiny")
    _model().save_pretrained(model_path)
    _reset_accelerate()
    reference = _train(_recording(_trainer_cls(kind)), kind, tmp_path / "reference", model_path)
    _reset_accelerate()
    results = run_ranks(_rank_body, world_size=2, args=(str(tmp_path), kind, model_path), timeout=300,
                        collective_timeout=TIMEOUT)
    assert sorted(results) == [0, 1]
    for name in ("shared", "broadcast_only"):
        runs = [results[rank][name] for rank in (0, 1)]
        for a, b in zip(runs[0]["rounds"], runs[1]["rounds"]):  # one group: one set of samples
            assert torch.equal(a["prompt_ids"], b["prompt_ids"]) and torch.equal(a["completion_ids"], b["completion_ids"])
        for rank, run in enumerate(runs):
            worst = _compare(run, reference, f"{kind} {name} rank {rank}")
            print(f"{kind} {name} rank {rank}: rounds max diff {worst['rounds']:.1e}, metrics {worst['metrics']:.1e}, "
                  f"params rel L2 {worst['params']:.1e}")
            # every log-probability pass ran sequence-parallel: the loss's (on model_wrapped), the old policy's and
            # the reference model's (TRL passes the plain modules)
            assert run["passes"] == {("SequenceParallelModel", "SequenceParallelModel"),
                                     ("policy", "SequenceParallelModel"), ("ref", "SequenceParallelModel")}, run["passes"]
    # without the per-replica seed, rank 1 sampled other completions (then replaced by the first rank's)
    own, shared = results[1]["broadcast_only"]["sampled"][0], results[0]["broadcast_only"]["sampled"][0]
    assert own != shared, "rank 1 sampled what rank 0 did: the broadcast was not exercised"
    assert results[0]["shared"]["sampled"] == results[1]["shared"]["sampled"]  # seeded by replica: same draws
    for rank in (0, 1):
        assert all(results[rank]["collectives"].values()), results[rank]["collectives"]
        # negative control: nothing shared, the group's ranks feed different sequences
        message = results[rank]["unshared"]
        assert message is not None, f"rank {rank}: the unshared run trained without error"
        print(f"{kind} unshared rank {rank}: {message[:200]}")
        assert "differs across the ranks of the sequence-parallel group" in message, message
        assert "broadcast from the group's first rank" in message, message  # advice for autosp.hf users too


def test_sequence_parallel_rl_trainers_get_the_sharing_mixin():
    import autosp.hf
    from autosp.hf.rl import SharedGenerationMixin
    for cls in (trl.GRPOTrainer, trl.RLOOTrainer):
        sp = autosp.hf.sequence_parallel(cls)
        assert issubclass(sp, cls) and sp.__mro__[1] is SharedGenerationMixin
    assert not issubclass(autosp.hf.sequence_parallel(trl.SFTTrainer), SharedGenerationMixin)
