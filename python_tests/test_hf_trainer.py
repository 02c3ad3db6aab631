"""autosp.hf: transformers' Trainer and TRL's SFTTrainer, sequence-parallel, against their
single-process runs on the same global batches.

The single-process references run in the pytest process (no process group: a Trainer under an
initialised group would think it is distributed); the sequence-parallel runs on gloo ranks with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), as a user's script would. Each run trains
a tiny Llama 6 optimizer steps with gradient accumulation 2, gradient clipping and a linear
schedule with warm-up; labels hold -100s unevenly, so ``num_items_in_batch`` decides the loss
scale. Compared: every logged loss (relative error) and the final parameters (relative L2).

- world 2 = SP 2: the same batches on both ranks; checkpoint at step 3, ``save_model`` then
  ``from_pretrained``, ``resume_from_checkpoint`` reproduces steps 4-6, ``evaluate`` and
  ``predict`` give the single-process loss and the full logits;
- world 4 = DP 2 x SP 2 (``per_device_train_batch_size`` 2 against the reference's 4): the
  replicas' batches together are the reference's, the two ranks of a group see the same one;
- TRL's SFTTrainer with ``padding_free=True`` (documents flattened into one row, position_ids
  per document) and with BFD packing, at SP 2;
- the recurrent hybrids (Qwen3-Next, Granite-4), 3 steps each in one job, at SP 2;
- negative control: the plain ``transformers.Trainer`` on ``autosp.compile(model)`` (each rank
  its own batch, DDP over the world) must not match the reference (or raise AutospError);
- errors: Trainer settings the integration cannot honour, and autosp.data's samplers.
"""
import contextlib
import os
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from autosp.testing.distributed import run_ranks  # noqa: E402

VOCAB = 128
SEQ = 16
ROWS = 48
STEPS = 6
LOSS_TOL = 1e-5
PARAM_TOL = 1e-5
# Ranks get their own pool (a collective timeout of their own) so that the accelerate state
# they build, a process-wide singleton, never meets another test file's bodies.
TIMEOUT = 61.0


# ---------------------------------------------------------------------------- helpers
def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(config)


def _dataset(rows=ROWS, seq=SEQ, seed=1):
    """Rows of random tokens; labels with a random prefix of -100 (0 .. seq/2 tokens) per row."""
    gen = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(rows):
        ids = torch.randint(0, VOCAB, (seq,), generator=gen)
        labels = ids.clone()
        labels[:int(torch.randint(0, seq // 2, (1,), generator=gen))] = -100
        data.append({"input_ids": ids, "labels": labels})
    return data


def _args(output_dir, per_device=2, **overrides):
    from autosp.testing.parity import ADAM_EPS
    kwargs = dict(output_dir=str(output_dir), report_to="none", use_cpu=True, disable_tqdm=True,
                  dataloader_num_workers=0, seed=0, per_device_train_batch_size=per_device,
                  per_device_eval_batch_size=per_device, gradient_accumulation_steps=2, max_steps=STEPS,
                  logging_steps=1, learning_rate=2e-3, adam_epsilon=ADAM_EPS, warmup_steps=2,
                  lr_scheduler_type="linear", max_grad_norm=0.5, save_strategy="no")
    kwargs.update(overrides)
    return transformers.TrainingArguments(**kwargs)


def _reset_accelerate():
    from accelerate.state import AcceleratorState, GradientState
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@contextlib.contextmanager
def _torchrun_env(rank, world):
    """The environment torchrun gives a rank (the Trainer reads it), and a fresh accelerate state."""
    env = dict(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _reset_accelerate()
    try:
        yield
    finally:
        _reset_accelerate()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _losses(trainer, after_step=0):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] > after_step]


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _recording(cls):
    """``cls`` recording the input_ids of every micro-batch it trains on."""
    class Recording(cls):
        def training_step(self, model, inputs, num_items_in_batch=None):
            self.seen = getattr(self, "seen", [])
            self.seen.append(inputs["input_ids"].clone())
            return super().training_step(model, inputs, num_items_in_batch)
    return Recording


def _evaluate(trainer, dataset):
    """(eval loss, the logits compute_metrics receives)."""
    seen = {}

    def metrics(prediction):
        logits = prediction.predictions
        seen["logits"] = torch.as_tensor(logits[0] if isinstance(logits, tuple) else logits)
        return {}
    trainer.compute_metrics = metrics
    loss = trainer.evaluate(dataset)["eval_loss"]
    trainer.compute_metrics = None
    return loss, seen["logits"]


def _evaluations(trainer) -> dict:
    """The eval loss over 8 rows, and the logits of 6 (a last batch that the replicas pad)."""
    return {"eval_loss": _evaluate(trainer, _dataset(rows=8, seed=7))[0],
            "logits": _evaluate(trainer, _dataset(rows=6, seed=8))[1]}


def _check_evaluations(got: dict, ref: dict) -> None:
    assert abs(got["eval_loss"] - ref["eval_loss"]) <= LOSS_TOL * abs(ref["eval_loss"])
    assert got["logits"].shape == ref["logits"].shape  # every row once, in order, full sequence
    assert (got["logits"] - ref["logits"]).abs().max() <= 1e-4 * ref["logits"].abs().max()


def _rel_l2(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in b)
    den = sum(float(b[n].double().pow(2).sum()) for n in b)
    return (num / den) ** 0.5


def _rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if len(a) == len(b) else float("inf")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Single-process transformers.Trainer runs (batch 2 and 4 per step), evaluation included."""
    out = {}
    for per_device in (2, 4):
        _reset_accelerate()
        trainer = _recording(transformers.Trainer)(model=_model(), args=_args(tmp_path_factory.mktemp("ref"),
                                                   per_device=per_device), train_dataset=_dataset())
        trainer.train()
        out[per_device] = {"losses": _losses(trainer), "params": _params(trainer.model), "seen": trainer.seen,
                           **_evaluations(trainer)}
    _reset_accelerate()
    return out


# ---------------------------------------------------------------------------- SP 2 (world 2)
def _train_sp2(rank, world, queue, root):
    with _torchrun_env(rank, world):
        _train_sp2_body(rank, world, queue, root)


def _train_sp2_body(rank, world, queue, root):
    import autosp.hf
    trainer = _recording(autosp.hf.Trainer)(
        model=_model(), args=_args(root, save_strategy="steps", save_steps=3), train_dataset=_dataset(), sp_size=2)
    t = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t
    result = {"losses": _losses(trainer), "params": _params(trainer.model), "seen": trainer.seen,
              "wrapped": type(trainer.model_wrapped).__name__, "programs": len(trainer.model_wrapped.sharded.programs), "train_s": train_s}
    trainer.save_model(os.path.join(root, "final"))
    t = time.perf_counter()
    result.update(_evaluations(trainer))
    result["eval_s"] = time.perf_counter() - t
    # Resume from the step-3 checkpoint: steps 4-6 again (weights, optimizer, schedule, RNG and data
    # position from the checkpoint; first the same Trainer, so its compiled programs are reused).
    t = time.perf_counter()
    trainer.state.log_history = []
    trainer.train(resume_from_checkpoint=os.path.join(root, "checkpoint-3"))
    result["resume_s"] = time.perf_counter() - t
    result["resumed_losses"] = _losses(trainer, after_step=3)
    result["resumed_params"] = _params(trainer.model)
    # ... and in a new Trainer around a new model whose weights differ (as a new process
    # starts): everything must come from the checkpoint.
    fresh = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(torch.randn_like(p))
    again = _recording(autosp.hf.Trainer)(model=fresh, args=_args(root), train_dataset=_dataset(), sp_size=2)
    again.train(resume_from_checkpoint=os.path.join(root, "checkpoint-3"))
    result["fresh_resumed_losses"] = _losses(again, after_step=3)
    result["fresh_resumed_params"] = _params(again.model)
    queue.put((rank, result))


def test_trainer_sp2_matches_single_process(reference, tmp_path):
    results = run_ranks(_train_sp2, world_size=2, args=(str(tmp_path),), timeout=300, collective_timeout=TIMEOUT)
    ref = reference[2]
    for rank, r in results.items():
        print(f"rank {rank}: train {r['train_s']:.1f}s, eval {r['eval_s']:.1f}s, resume {r['resume_s']:.1f}s")
        assert r["wrapped"] == "SequenceParallelModel"
        assert r["programs"] == 1, "one training program for every num_items_in_batch"
        assert all(torch.equal(a, b) for a, b in zip(r["seen"], ref["seen"])), f"rank {rank}: other batches"
        loss_err, param_err = _rel(r["losses"], ref["losses"]), _rel_l2(r["params"], ref["params"])
        print(f"SP2 rank {rank}: loss rel err {loss_err:.2e}, params rel L2 {param_err:.2e}")
        assert len(r["losses"]) == STEPS and loss_err <= LOSS_TOL
        assert param_err <= PARAM_TOL
        _check_evaluations(r, ref)  # the global loss; the full logits of every row once
        # resume from step 3 reproduces steps 4-6 and the final weights
        assert _rel(r["resumed_losses"], r["losses"][3:]) <= 1e-6, (r["resumed_losses"], r["losses"][3:])
        assert _rel_l2(r["resumed_params"], r["params"]) <= 1e-6
        assert _rel(r["fresh_resumed_losses"], r["losses"][3:]) <= 1e-6, (r["fresh_resumed_losses"], r["losses"][3:])
        assert _rel_l2(r["fresh_resumed_params"], r["params"]) <= 1e-6
    # save_model: the user's model (config and weights, no wrapper prefix)
    final = tmp_path / "final"
    assert (final / "config.json").exists()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(final))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    trained = results[0]["params"]
    assert set(dict(loaded.named_parameters())) == set(trained)
    assert all(torch.equal(p, trained[n]) for n, p in loaded.named_parameters())


# ---------------------------------------------------------------------------- DP 2 x SP 2 (world 4)
def _train_dp2_sp2(rank, world, queue, root):
    with _torchrun_env(rank, world):
        _train_dp2_sp2_body(rank, world, queue, root)


def _train_dp2_sp2_body(rank, world, queue, root):
    import autosp.hf
    trainer = _recording(autosp.hf.Trainer)(model=_model(), args=_args(root), train_dataset=_dataset(), sp_size=2)
    trainer.train()
    queue.put((rank, {"losses": _losses(trainer), "params": _params(trainer.model), "seen": trainer.seen,
                      **_evaluations(trainer)}))


def test_trainer_dp2_sp2_matches_single_process(reference, tmp_path):
    results = run_ranks(_train_dp2_sp2, world_size=4, args=(str(tmp_path),), timeout=300,
                        collective_timeout=TIMEOUT)
    ref = reference[4]
    for rank, r in results.items():
        partner = results[rank ^ 1]  # the other rank of its SP group
        assert all(torch.equal(a, b) for a, b in zip(r["seen"], partner["seen"]))
        loss_err, param_err = _rel(r["losses"], ref["losses"]), _rel_l2(r["params"], ref["params"])
        print(f"DP2xSP2 rank {rank}: loss rel err {loss_err:.2e}, params rel L2 {param_err:.2e}")
        assert len(r["losses"]) == STEPS and loss_err <= LOSS_TOL
        assert param_err <= PARAM_TOL
        _check_evaluations(r, ref)  # gathered over the replicas, the padding of the last batch dropped
    # the replicas' micro-batches, side by side, are the reference's (batch 4 = 2 per replica x 2)
    for step, expected in enumerate(ref["seen"]):
        assert torch.equal(torch.cat([results[0]["seen"][step], results[2]["seen"][step]]), expected)


# ---------------------------------------------------------------------------- TRL SFTTrainer, SP 2
def _tokenizer():
    from tokenizers import Tokenizer, models
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                                pad_token="<pad>", eos_token="<eos>")


def _documents(rows=36, seed=3):
    import datasets
    gen = torch.Generator().manual_seed(seed)
    docs = [torch.randint(2, VOCAB, (int(torch.randint(4, 13, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(rows)]
    return datasets.Dataset.from_dict({"input_ids": docs})


SFT_CASES = {
    # documents of one batch flattened into one row, position_ids restarting per document, no mask
    "padding_free": dict(padding_free=True, max_length=None, per_device=3),
    # best-fit-decreasing packing into rows of 24 tokens (padding-free too)
    "packing": dict(packing=True, packing_strategy="bfd", max_length=24, per_device=2),
}


def _sft(trainer_cls, output_dir, case, **extra):
    import trl
    options = dict(SFT_CASES[case])
    per_device = options.pop("per_device")
    base = _args(output_dir, per_device=per_device).to_dict()
    base = {k: v for k, v in base.items() if k in ("output_dir", "report_to", "use_cpu", "disable_tqdm", "seed",
                                                  "dataloader_num_workers", "gradient_accumulation_steps", "max_steps",
                                                  "logging_steps", "learning_rate", "adam_epsilon", "warmup_steps",
                                                  "lr_scheduler_type", "max_grad_norm", "save_strategy")}
    config = trl.SFTConfig(**base, per_device_train_batch_size=per_device, bf16=False, gradient_checkpointing=False,
                           **options)
    trainer = trainer_cls(model=_model(), args=config, train_dataset=_documents(), processing_class=_tokenizer(),
                          **extra)
    trainer.train()
    wrapped = trainer.model_wrapped
    programs = len(wrapped.gathered.programs) if hasattr(wrapped, "gathered") else None
    return {"losses": _losses(trainer), "params": _params(trainer.model), "programs": programs}


def _train_sft(rank, world, queue, root):
    with _torchrun_env(rank, world):
        _train_sft_body(rank, world, queue, root)


def _train_sft_body(rank, world, queue, root):
    import trl

    import autosp.hf
    out = {case: _sft(autosp.hf.sequence_parallel(trl.SFTTrainer), os.path.join(root, case), case, sp_size=2)
           for case in SFT_CASES}
    queue.put((rank, out))


def test_trl_sft_sp2_matches_single_process(tmp_path):
    trl = pytest.importorskip("trl")
    pytest.importorskip("datasets")
    reference = {}
    for case in SFT_CASES:
        _reset_accelerate()
        reference[case] = _sft(trl.SFTTrainer, tmp_path / f"ref-{case}", case)
    _reset_accelerate()
    results = run_ranks(_train_sft, world_size=2, args=(str(tmp_path),), timeout=300, collective_timeout=TIMEOUT)
    for rank, r in results.items():
        for case in SFT_CASES:
            ref, got = reference[case], r[case]
            loss_err, param_err = _rel(got["losses"], ref["losses"]), _rel_l2(got["params"], ref["params"])
            print(f"SFT {case} rank {rank}: loss rel err {loss_err:.2e}, params rel L2 {param_err:.2e}")
            assert len(got["losses"]) == STEPS and loss_err <= LOSS_TOL
            assert param_err <= PARAM_TOL
            # TRL computes its loss from per-token log-probabilities outside the model (fused_lm_head=True): one
            # gathered-outputs program, whatever each batch's flattened length
            assert got["programs"] == 1


# ---------------------------------------------------------------------------- negative control
def _plain_trainer_on_compiled(rank, world, queue, root):
    with _torchrun_env(rank, world):
        _plain_trainer_on_compiled_body(rank, world, queue, root)


def _plain_trainer_on_compiled_body(rank, world, queue, root):
    import autosp
    from autosp.ir.diagnostics import AutospError
    model = _model()
    # What a user gets without autosp.hf: each rank its own batch (the sampler shards over the world), DDP over the
    # world on top of autosp's own gradient sum. remove_unused_columns=False: the wrapper's signature is *args/**kwargs.
    trainer = transformers.Trainer(model=autosp.compile(model), args=_args(root, remove_unused_columns=False),
                                   train_dataset=_dataset())
    try:
        trainer.train()
    except AutospError as e:
        queue.put((rank, {"error": str(e)}))
        return
    queue.put((rank, {"losses": _losses(trainer), "params": _params(model)}))


def test_plain_trainer_on_compiled_model_does_not_match(reference, tmp_path):
    results = run_ranks(_plain_trainer_on_compiled, world_size=2, args=(str(tmp_path),), timeout=300,
                        collective_timeout=TIMEOUT)
    ref = reference[2]
    for rank, r in results.items():
        if "error" in r:  # autosp's input check: the ranks of the group were given different batches
            print(f"negative control rank {rank}: {r['error']}")
            continue
        loss_err, param_err = _rel(r["losses"], ref["losses"]), _rel_l2(r["params"], ref["params"])
        print(f"negative control rank {rank}: loss rel err {loss_err:.2e}, params rel L2 {param_err:.2e}")
        assert loss_err > 1e-3 or param_err > 1e-3, "the plain Trainer on a compiled model silently matched"


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize("what, kwargs, args, message", [
    ("torch_compile", {}, {"torch_compile": True}, "torch_compile=True"),
    ("bf16", {}, {"bf16": True}, "bf16=True"),
    ("sp_size on one process", {"sp_size": 2}, {}, "needs 2 ranks"),
    ("an owned option", {"autosp_options": {"gather_outputs": True}}, {}, "autosp_options['gather_outputs']"),
    ("DDP instead", {"autosp_options": {"sync_data_parallel": False}}, {}, "never wraps the model in DDP"),
])
def test_unsupported_settings_raise(tmp_path, what, kwargs, args, message):
    import autosp.hf
    from autosp.ir.diagnostics import AutospError
    _reset_accelerate()
    try:
        with pytest.raises(AutospError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
            autosp.hf.Trainer(model=_model(), args=_args(tmp_path, **args), train_dataset=_dataset(rows=4), **kwargs)
    finally:
        _reset_accelerate()
    assert "\n" not in str(caught.value), "one line"


def test_sequence_parallel_is_a_subclass():
    import autosp.hf
    assert issubclass(autosp.hf.Trainer, transformers.Trainer)
    assert autosp.hf.sequence_parallel(autosp.hf.Trainer) is autosp.hf.Trainer
    with pytest.raises(TypeError):
        autosp.hf.sequence_parallel(torch.nn.Module)


# ---------------------------------------------------------------------------- the 2026 families (issue 26)
HYBRID_STEPS = 3


def _hybrid(family: str):
    """A tiny Qwen3-Next (Gated DeltaNet, conv, attention, MoE) or Granite-4 hybrid (Mamba2,
    conv, attention, MoE), as test_recurrences builds them (long-memory decays)."""
    from test_recurrences import _granite
    from test_recurrences import _model as _qwen3_next
    torch.manual_seed(0)
    return _qwen3_next(False) if family == "qwen3_next" else _granite()


def _train_hybrids(rank, world, queue, root):
    with _torchrun_env(rank, world):
        import autosp.hf
        out = {}
        for family in ("qwen3_next", "granite"):
            trainer = autosp.hf.Trainer(model=_hybrid(family), train_dataset=_dataset(rows=24), sp_size=2,
                                        args=_args(os.path.join(root, family), max_steps=HYBRID_STEPS))
            trainer.train()
            out[family] = {"losses": _losses(trainer), "params": _params(trainer.model),
                           "programs": len(trainer.model_wrapped.sharded.programs)}
            _reset_accelerate()
        queue.put((rank, out))


def test_trainer_sp2_trains_the_hybrids_like_one_process(tmp_path):
    """autosp.hf.Trainer with its defaults (gradient accumulation 2, clipping, warm-up) on the
    recurrent hybrids: every logged loss and the final parameters against one process's
    transformers.Trainer on the same batches."""
    reference = {}
    for family in ("qwen3_next", "granite"):
        _reset_accelerate()
        trainer = transformers.Trainer(model=_hybrid(family), train_dataset=_dataset(rows=24),
                                       args=_args(tmp_path / f"ref-{family}", max_steps=HYBRID_STEPS))
        trainer.train()
        reference[family] = {"losses": _losses(trainer), "params": _params(trainer.model)}
    _reset_accelerate()
    results = run_ranks(_train_hybrids, world_size=2, args=(str(tmp_path),), timeout=400, collective_timeout=TIMEOUT)
    for rank, by_family in results.items():
        for family, r in by_family.items():
            ref = reference[family]
            where = f"rank {rank}, {family}"
            assert len(r["losses"]) == HYBRID_STEPS and _rel(r["losses"], ref["losses"]) <= LOSS_TOL, where
            assert _rel_l2(r["params"], ref["params"]) <= PARAM_TOL, where
            assert r["programs"] == 1, where
