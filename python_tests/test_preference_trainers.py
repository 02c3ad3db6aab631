"""TRL's RewardTrainer and DPOTrainer under ``autosp.hf.sequence_parallel``, SP 2 against one process (issue 39).

- **RewardTrainer**: ``LlamaForSequenceClassification`` (``num_labels=1``) reads its score at each
  row's last non-pad token (right padding, chosen and rejected rows of different lengths in one
  batch). That selection is split by ``autosp-shard-sequence`` (the owning rank's row, a sum
  all-reduce: ``test_task_heads``); the Trainer's loss (``-logsigmoid(chosen - rejected)``) runs
  on the replicated scores. Logged losses, accuracy, margin and rewards, and the final
  parameters, within 1e-5 of one process.
- **DPOTrainer** with a reference model: the policy's and the reference's per-token
  log-probabilities through TRL's ``fused_lm_head=True`` call; logged losses, reward margins
  and accuracies, and the final parameters within 1e-5 of one process (DPO stays exact).

The single-process references run in the pytest process, the SP runs on two gloo ranks with
torchrun's environment (the helpers of ``test_hf_trainer``).
"""
import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

from test_hf_trainer import (  # noqa: E402
    TIMEOUT,
    VOCAB,
    _args,
    _full_params,
    _rel_l2,
    _reset_accelerate,
    _tokenizer,
    _torchrun_env,
)

from autosp.testing.distributed import run_ranks  # noqa: E402

TOL = 1e-5
STEPS = 3
# what each trainer logs per step that one process and SP 2 must agree on
LOGGED = {"reward": ("loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"),
          "dpo": ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                  "logps/chosen", "logps/rejected")}


def _config(num_labels=None):
    extra = {"num_labels": num_labels} if num_labels else {}
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                    pad_token_id=0, attn_implementation="sdpa", **extra)


def _word_tokenizer():
    """``_tokenizer``'s vocabulary, split on white space (DPO tokenizes text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _preferences(rows=16, seed=5):
    """Prompts and completions of different lengths (a batch's rows padded on the right):
    token ids for the reward model, the same as text for DPO (which tokenizes it)."""
    import datasets
    gen = torch.Generator().manual_seed(seed)

    def tokens(lo, hi):
        return torch.randint(2, VOCAB, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()
    rows_ = [{"prompt_ids": tokens(3, 7), "chosen_ids": tokens(2, 9), "rejected_ids": tokens(2, 9)}
             for _ in range(rows)]

    def text(ids, eos=False):
        return " ".join(f"t{i}" for i in ids) + (" <eos>" if eos else "")
    as_text = [{"prompt": text(r["prompt_ids"]), "chosen": " " + text(r["chosen_ids"], True),
                "rejected": " " + text(r["rejected_ids"], True)} for r in rows_]
    return datasets.Dataset.from_list(rows_), datasets.Dataset.from_list(as_text)


def _trainer_args(kind, output_dir):
    base = _args(output_dir, per_device=4, max_steps=STEPS, warmup_steps=0).to_dict()
    keep = ("output_dir", "report_to", "use_cpu", "disable_tqdm", "seed", "dataloader_num_workers",
            "gradient_accumulation_steps", "max_steps", "logging_steps", "learning_rate", "adam_epsilon",
            "warmup_steps", "lr_scheduler_type", "max_grad_norm", "save_strategy", "per_device_train_batch_size")
    base = {k: v for k, v in base.items() if k in keep}
    if kind == "reward":
        return trl.RewardConfig(**base, bf16=False, gradient_checkpointing=False, max_length=None)
    return trl.DPOConfig(**base, bf16=False, gradient_checkpointing=False, max_length=None, beta=0.5)


def _run(kind, trainer_cls, output_dir, **extra):
    torch.manual_seed(0)
    data, as_text = _preferences()
    if kind == "reward":
        model = transformers.LlamaForSequenceClassification(_config(num_labels=1))
        data = data.map(lambda r: {"chosen_ids": r["prompt_ids"] + r["chosen_ids"],
                                   "rejected_ids": r["prompt_ids"] + r["rejected_ids"]}, remove_columns=["prompt_ids"])
        trainer = trainer_cls(model=model, args=_trainer_args(kind, output_dir), train_dataset=data,
                              processing_class=_tokenizer(), **extra)
    else:
        model = transformers.LlamaForCausalLM(_config())
        trainer = trainer_cls(model=model, ref_model=copy.deepcopy(model), args=_trainer_args(kind, output_dir),
                              train_dataset=as_text, processing_class=_word_tokenizer(), **extra)
    trainer.train()
    logged = [{k: h[k] for k in LOGGED[kind] if k in h} for h in trainer.state.log_history if "loss" in h]
    return {"logged": logged, "params": _full_params(trainer.model)}


def _sp_ranks(rank, world, queue, root):
    with _torchrun_env(rank, world):
        import autosp.hf
        out = {"reward": _run("reward", autosp.hf.sequence_parallel(trl.RewardTrainer), os.path.join(root, "reward"),
                              sp_size=2),
               "dpo": _run("dpo", autosp.hf.sequence_parallel(trl.DPOTrainer), os.path.join(root, "dpo"), sp_size=2)}
        queue.put((rank, out))


def test_reward_and_dpo_trainers_sp2_match_single_process(tmp_path):
    reference = {}
    for kind, cls in (("reward", trl.RewardTrainer), ("dpo", trl.DPOTrainer)):
        _reset_accelerate()
        reference[kind] = _run(kind, cls, tmp_path / f"ref-{kind}")
    _reset_accelerate()
    results = run_ranks(_sp_ranks, world_size=2, args=(str(tmp_path),), timeout=300, collective_timeout=TIMEOUT)
    for rank, r in results.items():
        for kind in ("reward", "dpo"):
            ref, got = reference[kind], r[kind]
            assert len(got["logged"]) == STEPS and all(set(g) == set(LOGGED[kind]) for g in got["logged"]), got
            for key in LOGGED[kind]:
                # (relative, or absolute below 1: DPO's rewards start at 0, the policy being its reference; so
                # at step 1 its accuracies count chosen > rejected on rounding noise, and are compared from step 2)
                first = 1 if key == "rewards/accuracies" else 0
                err = max(abs(g[key] - h[key]) / max(1.0, abs(h[key]))
                          for g, h in zip(got["logged"][first:], ref["logged"][first:]))
                print(f"{kind} {key} rank {rank}: error {err:.2e}")
                assert err <= TOL, (kind, key, [g[key] for g in got["logged"]], [h[key] for h in ref["logged"]])
            param_err = _rel_l2(got["params"], ref["params"])
            print(f"{kind} params rank {rank}: rel L2 {param_err:.2e}")
            assert param_err <= TOL
