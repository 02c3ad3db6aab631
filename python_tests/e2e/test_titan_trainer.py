"""torchtitan's own ``Trainer`` with autosp as its context parallelism (``autosp.titan.Trainer``).

torchtitan's llama3 ``debugmodel`` config (2 of its layers, S = 128, 2 rows, its AdamW,
warm-up schedule, gradient clipping, ``ChunkedLossWrapper``, FlexAttention with document
masks, FSDP2 through its ``parallelize_llama``) trains 3 steps through torchtitan's
``Trainer.train`` with ``context_parallel_degree = 2`` on 2 ranks, and the losses torchtitan
logs (summed over its loss mesh) equal those of the same Trainer without CP on one process,
to 1e-5, and every parameter's gradient (before torchtitan's clipping) to 1e-5 at the
first step (1e-3 after free-running AdamW steps: see the test). Parameters in float32 (``mixed_precision_param``; the config's bf16 would hold both
to bf16's rounding). One process computes FlexAttention as ops (``flex_as_dense``: CPU flex
has no backward).

torchtitan runs on CUDA (its device falls back to "cuda"); on this CPU machine the ranks
give it the CPU with torch.cuda's memory API answering zeros, and a loader of random
tokens in place of its dataset and tokenizer (the trainer's ``dataloader`` / ``tokenizer``
configs); after its first step it calls ``torch.distributed.set_timeout``, which torch
2.13 lacks, so that call is skipped. Control: the gradients given the other rank's labels.
"""
from __future__ import annotations

import contextlib
import types

import pytest
import torch

from autosp.testing.distributed import run_ranks
from autosp.testing.parity import relative_error

pytest.importorskip("triton", reason="torchtitan's model registry imports triton")
pytest.importorskip("torchtitan")
pytest.importorskip("torchdata", reason="torchtitan's trainer imports torchdata")
pytest.importorskip("tensorboard", reason="torchtitan's trainer imports tensorboard")

TOL = 1e-5
SEQ, ROWS, STEPS = 128, 2, 3


class _CPUDevice(types.SimpleNamespace):
    """torch.cuda's API as torchtitan's trainer calls it, on CPU: no device memory."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def get_device_name(self, device=None):
        return "cpu"

    def get_device_properties(self, device=None):
        return types.SimpleNamespace(total_memory=1, name="cpu")

    def reset_peak_memory_stats(self, device=None):
        pass

    def empty_cache(self):
        pass

    def memory_stats(self, device=None):
        return {}

    def current_device(self):
        return 0


class _Loader:
    """Random tokens, the same on every rank of a step (torchtitan's loader gives the CP
    ranks the same batch); two packed documents in the first row."""

    def __init__(self, seed, rows, seq):
        self.seed, self.rows, self.seq = seed, rows, seq

    def __iter__(self):
        for step in range(1000):
            gen = torch.Generator().manual_seed(self.seed + step)
            tokens = torch.randint(0, 2048, (self.rows, self.seq + 1), generator=gen)
            positions = torch.arange(self.seq).repeat(self.rows, 1)
            cut = int(torch.randint(20, self.seq - 20, (1,), generator=gen))
            positions[0, cut:] -= cut
            yield {"input": tokens[:, :-1], "positions": positions}, tokens[:, 1:]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class _LoaderConfig:
    def __init__(self, seed):
        self.seed = seed

    def build(self, **kwargs):
        return _Loader(self.seed, kwargs["local_batch_size"], kwargs["seq_len"])


class _NoTokenizer:
    def build(self, **kwargs):
        return None


def _body(rank, world, queue, seed, cp, folder, wrong_shard=False):
    import torchtitan.tools.utils as utils  # (before anything imports its device by name)
    utils.device_type, utils.device_module = "cpu", _CPUDevice()
    utils.get_local_device = lambda: torch.device("cpu")
    import torchtitan.distributed.utils as dist_utils
    dist_utils.set_pg_timeouts = lambda **kwargs: None  # (calls torch.distributed.set_timeout: not in torch 2.13)
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    from torchtitan.trainer import Trainer

    import autosp.titan
    from autosp.frontend.flex import flex_as_dense
    config = llama3_debugmodel()
    config.model_spec.model.layers = config.model_spec.model.layers[:2]
    config.training.seq_len, config.training.local_batch_size, config.training.steps = SEQ, ROWS, STEPS
    config.training.mixed_precision_param = "float32"
    config.parallelism.context_parallel_degree = cp
    config.dataloader, config.tokenizer = _LoaderConfig(seed), _NoTokenizer()
    config.validator.enable = False
    config.checkpoint.enable = False
    config.dump_folder = folder
    trainer = (autosp.titan.Trainer if cp > 1 else Trainer)(config)
    torch.manual_seed(seed)  # the same weights in both runs
    weights = trainer.model_config.build()
    weights.init_weights()
    model = trainer.model_parts[0]
    with torch.no_grad():
        for p, q in zip(model.parameters(), weights.parameters()):
            p.copy_(distribute_tensor(q, p.device_mesh, p.placements) if isinstance(p, DTensor) else q)
    if wrong_shard:  # the control: the loss given the other rank's labels
        sp = model.autosp
        shard = sp.shard_sequence
        object.__setattr__(sp, "shard_sequence", lambda t: shard(t.roll(SEQ // 2, dims=1)))
    losses, grads = [], []
    clip = dist_utils.clip_grad_norm_

    def clip_and_keep(parameters, *args, **kwargs):  # each step's gradients, whole, before clipping
        parameters = list(parameters)
        grads.append([(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone() for p in parameters])
        return clip(parameters, *args, **kwargs)
    dist_utils.clip_grad_norm_ = clip_and_keep
    trainer.metrics_processor.log = lambda step, loss, max_loss, grad_norm, **kw: losses.append((loss, grad_norm))
    with flex_as_dense() if cp == 1 else contextlib.nullcontext():
        trainer.train()
    names = [n.replace("_checkpoint_wrapped_module.", "") for n, _ in model.named_parameters()]
    queue.put((rank, dict(losses=losses, compiled="autosp" in model.__dict__, step=trainer.step, grads=grads,
                          names=names)))


def test_torchtitan_trainer_with_autosp_as_context_parallelism(tmp_path, _fresh_seed):
    seed = _fresh_seed % 10000
    one = run_ranks(_body, 1, args=(seed, 1, str(tmp_path / "one")), timeout=900, fresh=True)[0]
    results = run_ranks(_body, 2, args=(seed, 2, str(tmp_path / "cp")), timeout=900, fresh=True)
    assert len(one["losses"]) == STEPS and not one["compiled"], one
    for rank, r in results.items():
        assert r["compiled"] and r["step"] == STEPS and r["names"] == one["names"], f"rank {rank}"
        for step in range(STEPS):
            (loss, norm), (ref_loss, ref_norm) = r["losses"][step], one["losses"][step]
            assert abs(loss - ref_loss) <= TOL * abs(ref_loss), f"rank {rank}, step {step}: {loss} vs {ref_loss}"
            grads = {n: relative_error(g, h) for n, g, h in zip(one["names"], r["grads"][step], one["grads"][step])}
            # After an AdamW step the free-running runs' weights differ by up to 2 lr per element
            # where a gradient element is rounding-sized (its sign decides the step): later
            # gradients are held to 1e-3 (measured up to 8e-6 here; 1.4e-4 for muse_glimmer in
            # test_titan, which judges every step at the same weights instead).
            assert max(grads.values()) <= (TOL if step == 0 else 1e-3), f"rank {rank}, step {step}: {grads}"
            # torchtitan's logged norm: torch's float32 CPU norm of a large tensor is off by up
            # to 2e-4 and differs when taken shard by shard (FSDP2's DTensor norm)
            assert abs(norm - ref_norm) <= 1e-3 * abs(ref_norm), f"rank {rank}, step {step}: {norm} vs {ref_norm}"


    # Control (against the same one-process run): the loss given the other rank's labels.
    # Judged on the first step's gradients, not the loss: an untrained model's predictions
    # are near-uniform, so the other rank's labels move the loss by as little as 1e-4 of it
    # (a CI seed), while the head's gradient rows follow the labels.
    control = run_ranks(_body, 2, args=(seed, 2, str(tmp_path / "control"), True), timeout=900, fresh=True)
    for rank, r in control.items():
        grads = [relative_error(g, h) for g, h in zip(r["grads"][0], one["grads"][0])]
        assert max(grads) > 1e-2, f"control, rank {rank}: {grads}"
