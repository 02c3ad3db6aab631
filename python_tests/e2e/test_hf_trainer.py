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


def _sft(trainer_cls, output_dir, case, overrides=None, **extra):
    import trl
    options = dict(SFT_CASES[case])
    per_device = options.pop("per_device")
    base = _args(output_dir, per_device=per_device).to_dict()
    base = {k: v for k, v in base.items() if k in ("output_dir", "report_to", "use_cpu", "disable_tqdm", "seed",
                                                  "dataloader_num_workers", "gradient_accumulation_steps", "max_steps",
                                                  "logging_steps", "learning_rate", "adam_epsilon", "warmup_steps",
                                                  "lr_scheduler_type", "max_grad_norm", "save_strategy")}
    options = {"bf16": False, "gradient_checkpointing": False, **options, **(overrides or {})}
    config = trl.SFTConfig(**base, per_device_train_batch_size=per_device, **options)
    trainer = trainer_cls(model=_model(), args=config, train_dataset=_documents(), processing_class=_tokenizer(),
                          **extra)
    trainer.train()
    wrapped = trainer.model_wrapped
    head = getattr(wrapped, "_logprob_head", None)  # TRL's fused LM head: the tiled log-prob path (hf.logprobs)
    programs = len(head.compiled.programs) if head is not None else None
    gathered = len(wrapped.gathered.programs) if getattr(wrapped, "gathered", None) is not None else 0
    out = {"losses": _losses(trainer), "params": _full_params(trainer.model), "programs": programs,
           "gathered": gathered}
    if overrides and overrides.get("fsdp"):
        out.update(_state_bytes(trainer))
        trainer.save_model(os.path.join(output_dir, "final"))
    return out


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
            # program of the model's body (the tiled LM head runs on its sharded hidden states), whatever each
            # batch's flattened length, and no gathered-logits program
            assert got["programs"] == 1 and got["gathered"] == 0


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
    ("fp16", {}, {"fp16": True}, "fp16=True"),
    ("bf16_full_eval", {}, {"bf16": True, "bf16_full_eval": True}, "bf16_full_eval=True"),
    ("FSDP1", {}, {"fsdp": True, "fsdp_config": {"version": 1}}, "fsdp_version 1"),
    ("FSDP offload", {}, {"fsdp": "full_shard offload", "fsdp_config": {"version": 2}}, "cpu_offload"),
    ("FSDP shard_grad_op", {}, {"fsdp": "shard_grad_op", "fsdp_config": {"version": 2}}, "shard_grad_op"),
    ("FSDP on one process", {}, {"fsdp": True, "fsdp_config": {"version": 2}}, "FSDP2 needs torch.distributed"),
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


# ---------------------------------------------------------------------------- bf16 + FSDP2 + checkpointing (issue 38)
# The standard recipe: bf16=True (fp32 master weights, the forward under the Trainer's autocast),
# FSDP2 (fsdp=..., fsdp_config={"fsdp_version": 2}: applied by autosp.hf itself) and
# gradient_checkpointing=True (autosp's checkpointing). References: one process with bf16 and
# checkpointing (FSDP needs several ranks; on CPU accelerate would drop it anyway), and in fp32.
FSDP = dict(fsdp="full_shard", fsdp_config={"fsdp_version": 2}, gradient_checkpointing=True)


def _bf16_step(x: float) -> float:
    """One bf16 step at ``x``: 2^(floor(log2 |x|) - 7) (the --verify bf16 rule of examples/train.py)."""
    import math
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def _same_weights(cls):
    """``cls`` recording, for every training micro-batch, (the loss of the call the Trainer
    made, the user's model's eager loss under bf16 autocast, in fp32) at the same weights and
    ``num_items_in_batch`` (under FSDP2 every rank calls the eager references together, and the
    model is resharded after)."""
    class SameWeights(_recording(cls)):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            if model.training:
                kwargs = dict(inputs)
                if num_items_in_batch is not None:
                    kwargs["num_items_in_batch"] = num_items_in_batch
                with torch.no_grad():
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        bf16 = float(self.model(**kwargs).loss)
                    fp32 = float(self.model(**kwargs).loss)
                _reshard(self.model)
                self.same_weights = getattr(self, "same_weights", [])
                # compute_loss scaled the model's loss in place by the number of replicas
                scale = self.accelerator.num_processes // self.get_tp_size() if num_items_in_batch is not None else 1
                self.same_weights.append((float(outputs["loss"]) / scale, bf16, fp32))
            return (loss, outputs) if return_outputs else loss
    return SameWeights


def _reshard(model):
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def _full_params(model) -> dict:
    """Every parameter whole (FSDP2's DTensors gathered: a collective), as _params."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _local_bytes(t) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _state_bytes(trainer) -> dict:
    """This rank's bytes of parameters and optimizer state, and the whole model's."""
    params = list(trainer.model.parameters())
    optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
    opt = sum(_local_bytes(v) for st in optimizer.state.values() for v in st.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"param_bytes": sum(_local_bytes(p) for p in params), "opt_bytes": opt,
            "model_bytes": sum(p.numel() * p.element_size() for p in params)}


def _saved_bytes(trainer) -> dict:
    """Bytes saved for backward by one training call of the Trainer's model (the checkpointing
    the Trainer set), and by the same call after activation_checkpointing_disable() (a control)."""
    from autosp.planning.memory import SavedTensors
    batch = _dataset(rows=2, seed=9)
    kwargs = dict(input_ids=torch.stack([b["input_ids"] for b in batch]),
                  labels=torch.stack([b["labels"] for b in batch]), num_items_in_batch=torch.tensor(20.0))
    wrapped = trainer.model_wrapped
    wrapped.train()
    out = {}
    for what in ("on", "off"):
        if what == "off":
            trainer.model.activation_checkpointing_disable()
        with SavedTensors(list(trainer.model.parameters())) as counter:
            loss = wrapped(**kwargs).loss
        loss.backward()
        out[f"saved_{what}"] = counter.bytes
    trainer.model.zero_grad(set_to_none=True)
    return out


def _train_recipe(rank, world, queue, root, per_device):
    """bf16 alone (at world 2: the controls), then bf16 + FSDP2 + checkpointing, saved at the end."""
    with _torchrun_env(rank, world):
        import autosp.hf
        out = {}
        cases = [("bf16", {})] if world == 2 else []
        for case, overrides in cases + [("recipe", dict(FSDP, save_strategy="steps", save_steps=3))]:
            trainer = _same_weights(autosp.hf.Trainer)(
                model=_model(), args=_args(os.path.join(root, case), per_device=per_device, bf16=True, **overrides),
                train_dataset=_dataset(), sp_size=2)
            trainer.train()
            r = {"losses": _losses(trainer), "params": _full_params(trainer.model), "seen": trainer.seen,
                 "same_weights": trainer.same_weights,
                 "autocast": [k[2] for k in trainer.model_wrapped.sharded._programs],
                 **_state_bytes(trainer)}
            if case == "recipe":
                trainer.save_model(os.path.join(root, "final"))
                # resume from the step-3 checkpoint (full weights and optimizer state into the shards)
                trainer.state.log_history = []
                # only the first rank reads the weights; the others get their shards by broadcast
                import safetensors.torch
                read = safetensors.torch.load_file
                if rank != 0:
                    safetensors.torch.load_file = _refuse_read
                try:
                    trainer.train(resume_from_checkpoint=os.path.join(root, case, "checkpoint-3"))
                finally:
                    safetensors.torch.load_file = read
                r["resumed_losses"], r["resumed_params"] = _losses(trainer, after_step=3), _full_params(trainer.model)
                r.update(_saved_bytes(trainer))
            out[case] = r
            _reset_accelerate()
        queue.put((rank, out))


def _refuse_read(*args, **kwargs):
    raise AssertionError("a rank other than the first read the whole checkpoint")


def _check_mixed_precision(same_weights, where):
    """Each micro-batch's loss against the user's model at the same weights: within
    |bf16 autocast - fp32| + one bf16 step of fp32 (the criterion), and bf16 indeed: over the
    run, at most half as far from eager bf16 autocast as eager bf16 is from fp32 (an fp32
    program is exactly that far)."""
    for sp, bf16, fp32 in same_weights:
        assert abs(sp - fp32) <= abs(bf16 - fp32) + _bf16_step(fp32), (where, sp, bf16, fp32)
    off = sum(abs(sp - bf16) for sp, bf16, _ in same_weights)
    assert off <= 0.5 * sum(abs(bf16 - fp32) for _, bf16, fp32 in same_weights), (where, "not bf16 autocast")


def _check_free_running(got: dict, ref16: dict, ref32: dict, where) -> None:
    """A run against one process's with the same settings: every logged loss within one
    process's own distance to fp32 plus one bf16 step, and the final parameters within one
    process's relative distance to fp32 plus one bf16 step (2^-8)."""
    assert len(got["losses"]) == STEPS, where
    for step, (a, b, c) in enumerate(zip(got["losses"], ref16["losses"], ref32["losses"])):
        print(f"{where} step {step + 1}: |got - one bf16| {abs(a - b):.2e}, |one bf16 - one fp32| {abs(b - c):.2e}, "
              f"bound {abs(b - c) + _bf16_step(b):.2e}")
        assert abs(a - b) <= abs(b - c) + _bf16_step(b), (where, step, a, b, c)
    err, own = _rel_l2(got["params"], ref16["params"]), _rel_l2(ref16["params"], ref32["params"])
    print(f"{where}: params rel L2 to one bf16 {err:.2e}, one bf16 to one fp32 {own:.2e}")
    assert err <= own + 2.0 ** -8, where


@pytest.fixture(scope="module")
def reference_bf16(tmp_path_factory):
    """One process, bf16=True and gradient_checkpointing=True, batch 2 and 4 per step."""
    out = {}
    for per_device in (2, 4):
        _reset_accelerate()
        trainer = transformers.Trainer(model=_model(), train_dataset=_dataset(),
                                       args=_args(tmp_path_factory.mktemp("ref16"), per_device=per_device, bf16=True,
                                                  gradient_checkpointing=True))
        trainer.train()
        out[per_device] = {"losses": _losses(trainer), "params": _params(trainer.model)}
    _reset_accelerate()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_trainer_fsdp2_bf16_checkpointing(reference, reference_bf16, tmp_path, world):
    """SP 2 (world 2) and DP 2 x SP 2 (world 4), 6 steps with accumulation and clipping: bf16
    alone (world 2) and the recipe (FSDP2 + bf16 + checkpointing) against one process, at the
    same weights and free-running; per-rank state 1/world; saved bytes of checkpointing; resume
    from step 3; save_model loadable by from_pretrained. Controls: an fp32 program is not bf16;
    the run without FSDP holds the whole model; the call with the model's checkpointing off
    saves more."""
    per_device = 2 if world == 2 else 2 * 2 // (world // 2)  # the replicas' batches together: the reference's
    results = run_ranks(_train_recipe, world_size=world, args=(str(tmp_path), per_device), timeout=300,
                        collective_timeout=TIMEOUT)
    ref_per_device = per_device * (world // 2)
    ref16, ref32 = reference_bf16[ref_per_device], reference[ref_per_device]
    for rank, by_case in results.items():
        for case, r in by_case.items():
            where = f"world {world} {case} rank {rank}"
            assert r["autocast"] == [(("cpu", torch.bfloat16),)], r["autocast"]  # one program, under its autocast
            assert len(r["same_weights"]) >= STEPS * 2
            _check_mixed_precision(r["same_weights"], where)
            _check_free_running(r, ref16, ref32, where)
            if world == 2:  # the reference's batches (the replicas' together at world 4, below)
                assert all(torch.equal(a, b) for a, b in zip(r["seen"], ref32["seen"], strict=False)), where
        recipe = by_case["recipe"]
        print(f"world {world} rank {rank}: model {recipe['model_bytes']} B; per rank: parameters "
              f"{recipe['param_bytes']} B, optimizer {recipe['opt_bytes']} B; saved for backward "
              f"{recipe['saved_on']} B (checkpointing off {recipe['saved_off']} B)")
        whole = recipe["model_bytes"]
        assert recipe["param_bytes"] <= 1.1 * whole / world and recipe["opt_bytes"] <= 2.2 * whole / world
        if "bf16" in by_case:  # control: without FSDP every rank holds the whole model and its moments
            assert by_case["bf16"]["param_bytes"] == whole and by_case["bf16"]["opt_bytes"] == 2 * whole
        assert recipe["saved_on"] <= 0.2 * recipe["saved_off"]
        assert _rel(recipe["resumed_losses"], recipe["losses"][3:]) <= 1e-6, recipe["resumed_losses"]
        assert _rel_l2(recipe["resumed_params"], recipe["params"]) <= 1e-6
    if world == 4:
        for step, expected in enumerate(ref32["seen"]):
            assert torch.equal(torch.cat([results[0]["recipe"]["seen"][step], results[2]["recipe"]["seen"][step]]),
                               expected)
    # negative control: an fp32 program (the eager fp32 losses) passes the criterion but is not bf16
    fp32_run = [(fp32, bf16, fp32) for _, bf16, fp32 in results[0]["recipe"]["same_weights"]]
    with pytest.raises(AssertionError, match="not bf16 autocast"):
        _check_mixed_precision(fp32_run, "fp32 control")
    # save_model: the whole fp32 model, from every rank's shards
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    trained = results[0]["recipe"]["params"]
    assert set(dict(loaded.named_parameters())) == set(trained)
    assert all(torch.equal(p, trained[n]) for n, p in loaded.named_parameters())


def test_program_under_autocast_is_keyed_and_exported_with_its_casts():
    """A call under autocast compiles a program of its own, exported under it (explicit casts,
    eager autocast's values) and run with autocast off; the call outside keeps the fp32 one."""
    import autosp
    model = _model()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fp32 = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(input_ids=ids).logits
        compiled = autosp.compile(model, sp_size=1)
        got32 = compiled(input_ids=ids)["logits"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got16 = compiled(input_ids=ids)["logits"]
    assert len(compiled.programs) == 2
    assert got32.dtype == torch.float32 and torch.equal(got32, fp32)
    assert got16.dtype == torch.bfloat16 and torch.equal(got16, bf16)
    assert not torch.equal(bf16.float(), fp32)  # control: autocast changes the values
    code = compiled.programs[1].graph_module.code
    assert "torch.bfloat16" in code and "torch.bfloat16" not in compiled.programs[0].graph_module.code


def _train_sft_recipe(rank, world, queue, root):
    with _torchrun_env(rank, world):
        import trl

        import autosp.hf
        queue.put((rank, _sft(autosp.hf.sequence_parallel(trl.SFTTrainer), root, "padding_free", overrides=dict(
            bf16=True, **FSDP), sp_size=2)))


def test_trl_sft_fsdp2_bf16_checkpointing(tmp_path):
    """TRL's SFTTrainer (padding-free, its loss from per-token log-probabilities: the gathered
    program) with FSDP2 + bf16 + checkpointing at SP 2, against one process's bf16 + checkpointing
    run: every logged loss and the final parameters within the mixed-precision criterion;
    per-rank state 1/world; save_model loadable by from_pretrained."""
    trl = pytest.importorskip("trl")
    pytest.importorskip("datasets")
    refs = {}
    for name, config in (("bf16", dict(bf16=True, gradient_checkpointing=True)), ("fp32", None)):
        _reset_accelerate()
        refs[name] = _sft(trl.SFTTrainer, tmp_path / f"ref-{name}", "padding_free", overrides=config)
    _reset_accelerate()
    root = tmp_path / "sp"
    results = run_ranks(_train_sft_recipe, world_size=2, args=(str(root),), timeout=300, collective_timeout=TIMEOUT)
    for rank, r in results.items():
        _check_free_running(r, refs["bf16"], refs["fp32"], f"SFT recipe rank {rank}")
        assert r["param_bytes"] <= 1.1 * r["model_bytes"] / 2 and r["opt_bytes"] <= 2.2 * r["model_bytes"] / 2
        assert r["programs"] == 1
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(root / "final"))
    assert all(torch.equal(p, results[0]["params"][n]) for n, p in loaded.named_parameters())


def _ram_efficient_body(rank, world, queue, root, efficient):
    """from_pretrained as under `accelerate launch` with FSDP and cpu_ram_efficient_loading, the
    weights of every rank but the first then overwritten (only the first rank's count: older
    transformers leave the others unread), then autosp.hf.Trainer's FSDP2: each rank's shards."""
    with _torchrun_env(rank, world):
        import autosp.hf
        config = {"fsdp_version": 2, "cpu_ram_efficient_loading": efficient}
        saved = {k: os.environ.get(k) for k in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")}
        try:
            args = _args(os.path.join(root, f"out{int(efficient)}"), **dict(FSDP, fsdp_config=config))
            os.environ["ACCELERATE_USE_FSDP"] = "true"  # what `accelerate launch --use_fsdp` sets
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"  # (both runs load the efficient way)
            model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(root, "saved"))
            os.environ.pop("ACCELERATE_USE_FSDP")
            if rank != 0:  # transformers 5.24 reads every rank's weights all the same: as if it had not
                with torch.no_grad():
                    for p in model.parameters():
                        p.normal_()
            trainer = autosp.hf.Trainer(model=model, args=args, train_dataset=_dataset(), sp_size=2)
            params = _full_params(trainer.model)
            buffers = {n: b.clone() for n, b in trainer.model.named_buffers()}
            trainer.train()
            queue.put((rank, {"params": params, "buffers": buffers, "losses": _losses(trainer)}))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def test_fsdp_cpu_ram_efficient_loading_fills_every_ranks_shards(reference, tmp_path):
    """fsdp_config cpu_ram_efficient_loading under autosp.hf.Trainer, as accelerate runs it: only
    rank 0's weights count (the others go to the meta device before sharding, freeing their
    copies); after the Trainer's FSDP2 every rank's shards hold the saved weights (the rotary
    buffers too) and training matches one process. Control: without the option, rank 1's
    shards keep its own (wrong) weights."""
    model = _model()
    model.save_pretrained(str(tmp_path / "saved"))
    expected = dict(model.named_parameters())
    for efficient in (True, False):
        results = run_ranks(_ram_efficient_body, world_size=2, args=(str(tmp_path), efficient), timeout=300,
                            collective_timeout=TIMEOUT)
        for rank, r in results.items():
            same = all(torch.equal(p, expected[n]) for n, p in r["params"].items())
            assert same == efficient, (efficient, rank)
            if efficient:
                assert all(torch.equal(b, dict(model.named_buffers())[n]) for n, b in r["buffers"].items())
                assert _rel(r["losses"], reference[2]["losses"]) <= LOSS_TOL, r["losses"]
