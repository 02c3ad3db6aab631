"""TRL's RewardTrainer under ``autosp.hf.sequence_parallel``, SP 2 against one process (issue 39).

- **RewardTrainer**: ``LlamaForSequenceClassification`` (``num_labels=1``) reads its score at each
  row's last non-pad token (right padding, chosen and rejected rows of different lengths in one
  batch). That selection is split by ``autosp-shard-sequence`` (the owning rank's row, a sum
  all-reduce: ``test_task_heads``); the Trainer's loss (``-logsigmoid(chosen - rejected)``) runs
  on the replicated scores. Logged losses, accuracy, margin and rewards, and the final
  parameters, within 1e-5 of one process.

(DPOTrainer at SP 2, whose log-probabilities go through the fused LM head: ``test_logprobs``.)

The single-process references run in the pytest process, the SP runs on two gloo ranks with
torchrun's environment (the helpers of ``test_hf_trainer``).
"""

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
# what RewardTrainer logs per step, which one process and SP 2 must agree on
LOGGED = ("loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward")


def _preferences(rows=16, seed=5):
    """Chosen and rejected rows (prompt + completion ids) of different lengths: a batch's rows
    are padded on the right, so the score is read at each row's own last token."""
    import datasets
    gen = torch.Generator().manual_seed(seed)

    def tokens(lo, hi):
        return torch.randint(2, VOCAB, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()
    return datasets.Dataset.from_list([{"chosen_ids": tokens(3, 7) + tokens(2, 9),
                                        "rejected_ids": tokens(3, 7) + tokens(2, 9)} for _ in range(rows)])


def _run(trainer_cls, output_dir, **extra):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      pad_token_id=0, attn_implementation="sdpa", num_labels=1)
    base = _args(output_dir, per_device=4, max_steps=STEPS, warmup_steps=0).to_dict()
    keep = ("output_dir", "report_to", "use_cpu", "disable_tqdm", "seed", "dataloader_num_workers",
            "gradient_accumulation_steps", "max_steps", "logging_steps", "learning_rate", "adam_epsilon",
            "warmup_steps", "lr_scheduler_type", "max_grad_norm", "save_strategy", "per_device_train_batch_size")
    args = trl.RewardConfig(**{k: v for k, v in base.items() if k in keep}, bf16=False, gradient_checkpointing=False,
                            max_length=None)
    trainer = trainer_cls(model=transformers.LlamaForSequenceClassification(config), args=args,
                          train_dataset=_preferences(), processing_class=_tokenizer(), **extra)
    trainer.train()
    logged = [{k: h[k] for k in LOGGED if k in h} for h in trainer.state.log_history if "loss" in h]
    return {"logged": logged, "params": _full_params(trainer.model)}


def _sp_ranks(rank, world, queue, root):
    with _torchrun_env(rank, world):
        import autosp.hf
        queue.put((rank, _run(autosp.hf.sequence_parallel(trl.RewardTrainer), root, sp_size=2)))


def test_reward_trainer_sp2_matches_single_process(tmp_path):
    _reset_accelerate()
    ref = _run(trl.RewardTrainer, tmp_path / "ref")
    _reset_accelerate()
    results = run_ranks(_sp_ranks, world_size=2, args=(str(tmp_path / "sp"),), timeout=300,
                        collective_timeout=TIMEOUT)
    for rank, got in results.items():
        assert len(got["logged"]) == STEPS and all(set(g) == set(LOGGED) for g in got["logged"]), got
        for key in LOGGED:  # (relative, or absolute below 1)
            err = max(abs(g[key] - h[key]) / max(1.0, abs(h[key])) for g, h in zip(got["logged"], ref["logged"]))
            print(f"reward {key} rank {rank}: error {err:.2e}")
            assert err <= TOL, (key, [g[key] for g in got["logged"]], [h[key] for h in ref["logged"]])
        param_err = _rel_l2(got["params"], ref["params"])
        print(f"reward params rank {rank}: rel L2 {param_err:.2e}")
        assert param_err <= TOL
