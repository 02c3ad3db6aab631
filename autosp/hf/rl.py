"""TRL's online RL trainers (``GRPOTrainer``, ``RLOOTrainer``) under :func:`autosp.hf.sequence_parallel`.

Example (``torchrun --nproc-per-node 2``: one replica, its sequences split over 2 ranks)::

    from trl import GRPOConfig, GRPOTrainer
    trainer = autosp.hf.sequence_parallel(GRPOTrainer)(model=model, reward_funcs=reward, args=config,
                                                       train_dataset=prompts, processing_class=tok, sp_size=2)
    trainer.train()

These trainers make their own batches: every step samples completions, scores them, and
normalises the rewards per prompt group across processes. TRL seeds each process apart
(``set_seed(seed, device_specific=True)``), gathers over every process and slices by process
index. Under sequence parallelism the ranks of an SP group are one data-parallel replica, so
they must hold the same samples. The rules here:

- **One seed per replica**: after TRL's set-up each rank is re-seeded with ``seed + replica``,
  what ``device_specific=True`` gives the process of a data-parallel-only run with that
  index. So the ranks of a group draw the same samples, and replica ``r`` draws those of
  process ``r`` of a run without SP (one process: the single-process run's).
- **The group's first rank is the source of truth**: every rank generates, on the plain model
  (so that a model sharded with FSDP2, whose layers gather collectively, can), then the first rank's
  generation outputs (prompt and completion ids, decoded completions, tool results, ...)
  are broadcast over the group; the same for the rewards and, after scoring, for the random
  state that the shuffle of the generation batch draws from. Sampling or reward functions that
  are not deterministic (GPU kernels, a judge model, a remote call) cannot split the group.
- **An SP group counts as one process** (the rule of ``autosp.hf.trainer``'s data loaders):
  while TRL prepares a batch and computes its loss, the accelerator it sees has
  ``num_processes`` = replicas and ``process_index`` = replica, and its ``gather``,
  ``reduce`` and ``pad_across_processes`` (and the ``gather``/``gather_object`` that the
  trainer modules import from accelerate) run over the data-parallel group. Rewards,
  advantages, the loss normaliser and every logged metric are then one process's
  (replicas' together), not repeated ``sp_size`` times. ``generation_batch_size`` is
  recounted the same way (``per_device_train_batch_size x replicas x steps_per_generation``).
- **Log-probabilities sequence-parallel**: the per-token log-probability passes (the policy's
  in the loss, the old policy's and the reference model's when scoring) run through
  :class:`~autosp.hf.trainer.SequenceParallelModel`'s ``fused_lm_head`` path; the reference
  model gets its own wrapper. A PEFT model's scoring passes (the reference is the policy with
  its adapter switched off) stay eager on the plain model, as TRL runs them.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import random
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from autosp.ir.diagnostics import AutospError

# (module, class) of the trainers that generate their own batches.
_RL_TRAINERS = {("trl.trainer.grpo_trainer", "GRPOTrainer"), ("trl.trainer.rloo_trainer", "RLOOTrainer")}

# The accelerator view of the SP group being served, while TRL prepares a batch or computes a
# loss (None otherwise): the module-level gather/gather_object of TRL's modules consult it.
_VIEW: contextvars.ContextVar = contextvars.ContextVar("autosp_replica_view", default=None)


def is_rl_trainer(trainer_cls: type) -> bool:
    """Whether ``trainer_cls`` is (a subclass of) TRL's ``GRPOTrainer`` or ``RLOOTrainer``."""
    return any((c.__module__, c.__name__) in _RL_TRAINERS for c in trainer_cls.__mro__)


def rl_bases(trainer_cls: type) -> tuple:
    """The mixins :func:`autosp.hf.sequence_parallel` puts in front of ``trainer_cls`` for
    generation sharing: ``(SharedGenerationMixin,)`` for GRPO/RLOO, else ``()``."""
    if not is_rl_trainer(trainer_cls):
        return ()
    _route_module_collectives(trainer_cls)
    return (SharedGenerationMixin,)


# ---------------------------------------------------------------------------- collectives over the replicas
def _dispatch(name: str, original):
    """``original`` (accelerate's), or the active replica view's ``name`` while one is active."""
    def call(*args, **kwargs):
        view = _VIEW.get()
        return original(*args, **kwargs) if view is None else getattr(view, name)(*args, **kwargs)
    routed: Any = functools.wraps(original)(call)
    routed._autosp_original = original
    return routed


def _route_module_collectives(trainer_cls: type) -> None:
    """TRL's trainer modules call accelerate's ``gather`` / ``gather_object`` by the names they
    imported: route those names through the replica view (unchanged outside it)."""
    for cls in trainer_cls.__mro__:
        module = sys.modules.get(cls.__module__)
        if module is None or not cls.__module__.startswith("trl."):
            continue
        for name in ("gather", "gather_object"):
            fn = module.__dict__.get(name)
            if callable(fn) and not hasattr(fn, "_autosp_original") and \
                    str(getattr(fn, "__module__", "")).startswith("accelerate."):
                setattr(module, name, _dispatch(name, fn))


class _ReplicaAccelerator:
    """The trainer's ``Accelerator`` as an SP group sees it: one process per data-parallel
    replica. ``num_processes``, ``process_index``, ``gather``, ``gather_object``, ``reduce``
    and ``pad_across_processes`` are over the replicas (the ``dp`` group); everything else is
    the accelerator's own (``is_main_process`` stays the world's first rank, which writes)."""

    def __init__(self, accelerator, replica: int, replicas: int, group):
        object.__setattr__(self, "_accelerator", accelerator)
        object.__setattr__(self, "_replica", replica)
        object.__setattr__(self, "_replicas", replicas)
        object.__setattr__(self, "_group", group)

    def __getattr__(self, name):
        return getattr(self._accelerator, name)

    def __setattr__(self, name, value):
        setattr(self._accelerator, name, value)

    @property
    def num_processes(self) -> int:
        return self._replicas

    @property
    def process_index(self) -> int:
        return self._replica

    def gather(self, tensor):
        """``accelerate.utils.gather`` over the replicas (one replica: unchanged, as one process)."""
        from autosp.hf.trainer import _all_gather_rows
        if self._replicas == 1:
            return tensor
        return pytree.tree_map(lambda t: _all_gather_rows(t, self._group, self._replicas), tensor)

    def gather_object(self, obj):
        if self._replicas == 1:
            return obj
        parts: list = [None] * self._replicas
        dist.all_gather_object(parts, obj, group=self._group)
        return [x for part in parts for x in part]

    def reduce(self, tensor, reduction: str = "sum", scale: float = 1.0):
        def one(t):
            t = t.clone()
            if self._replicas > 1:
                dist.all_reduce(t, dist.ReduceOp.MAX if reduction == "max" else dist.ReduceOp.SUM, group=self._group)
            if reduction == "mean":
                t /= self._replicas
            return t
        return pytree.tree_map(lambda t: one(t) if isinstance(t, torch.Tensor) else t, tensor)

    def pad_across_processes(self, tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False):
        def one(t):
            if self._replicas == 1 or not isinstance(t, torch.Tensor) or dim >= t.dim():
                return t
            size = torch.tensor([t.shape[dim]], device=t.device)
            sizes = [torch.zeros_like(size) for _ in range(self._replicas)]
            dist.all_gather(sizes, size, group=self._group)
            longest = int(max(s.item() for s in sizes))
            if longest == t.shape[dim]:
                return t
            shape = list(t.shape)
            shape[dim] = longest - t.shape[dim]
            pad = t.new_full(shape, pad_index)
            return torch.cat([pad, t] if pad_first else [t, pad], dim=dim)
        return pytree.tree_map(one, tensor)


# ---------------------------------------------------------------------------- random state
def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _recount_generation_batch(config, replicas: int) -> None:
    """``GRPOConfig``/``RLOOConfig`` counted every rank as a process (``generation_batch_size =
    per_device_train_batch_size x world x steps_per_generation``); an SP group is one. Each
    replica's data loader loads ``per_device_train_batch_size x steps_per_generation`` rows a
    round, so ``steps_per_generation`` is kept."""
    config.generation_batch_size = config.per_device_train_batch_size * replicas * config.steps_per_generation


if TYPE_CHECKING:  # the mixin always comes first in front of _SequenceParallelMixin and a TRL trainer
    from autosp.hf.trainer import _SequenceParallelMixin as _Base
else:
    _Base = object


class SharedGenerationMixin(_Base):
    """What :func:`autosp.hf.sequence_parallel` adds for ``GRPOTrainer`` / ``RLOOTrainer``:
    the SP group shares its replica's generations, rewards and random state, and TRL's
    cross-process collectives count an SP group as one process (module docstring)."""

    # Switches for tests (negative controls): each mechanism can be turned off on its own.
    _autosp_seed_by_replica = True
    _autosp_broadcast_generations = True

    def __init__(self, *args, **kwargs):
        self._autosp_ref_wrapper = None
        # Recounted before TRL's set-up too, which sizes the completions table by it.
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        sp = kwargs.get("sp_size") or world
        if config is not None and isinstance(sp, int) and 1 < sp and world % sp == 0:
            _recount_generation_batch(config, world // sp)
        super().__init__(*args, **kwargs)
        if not self._autosp_sharing():
            return
        from accelerate.utils import set_seed
        replica, replicas = self._autosp_data_parallel()
        _recount_generation_batch(self.args, replicas)
        self._autosp_check_generation_batch(replicas)
        if self._autosp_seed_by_replica:
            # TRL's set_seed(seed, device_specific=True) gave each rank seed + rank; a replica is one process.
            set_seed(self.args.seed + replica)

    def _autosp_sharing(self) -> bool:
        return self._autosp_world > 1 and self._autosp_sp > 1

    def _autosp_check_generation_batch(self, replicas: int) -> None:
        args = self.args
        if args.generation_batch_size % self.num_generations:
            raise AutospError(
                f"generation_batch_size {args.generation_batch_size} (per_device_train_batch_size "
                f"{args.per_device_train_batch_size} x {replicas} data-parallel replica(s) x steps_per_generation "
                f"{args.steps_per_generation}: the ranks of an SP group are one process) is not divisible by "
                f"num_generations {self.num_generations}: raise per_device_train_batch_size or steps_per_generation")
        generations_eval = getattr(self, "num_generations_eval", None) or self.num_generations
        if args.do_eval and args.eval_strategy != "no" and (args.per_device_eval_batch_size * replicas) % generations_eval:
            raise AutospError(
                f"the eval batch (per_device_eval_batch_size {args.per_device_eval_batch_size} x {replicas} "
                f"data-parallel replica(s)) is not divisible by the evaluation's num_generations {generations_eval}")

    # ------------------------------------------------------------------ the group, its leader
    def _autosp_sp_group(self):
        """(the SP group, the global rank of its first rank)."""
        group = self._autosp_model().sharded.sp_group
        return group, dist.get_global_rank(group, 0)

    def _autosp_broadcast_object(self, value):
        group, leader = self._autosp_sp_group()
        box = [value if dist.get_rank() == leader else None]
        dist.broadcast_object_list(box, src=leader, group=group)
        return box[0]

    @contextlib.contextmanager
    def _autosp_replica_view(self):
        """TRL's accelerator (and module-level gathers) over the data-parallel replicas."""
        if not self._autosp_sharing() or isinstance(self.accelerator, _ReplicaAccelerator):
            yield
            return
        replica, replicas = self._autosp_data_parallel()
        group = self._autosp_model().dp_group() if replicas > 1 else None
        trainer: Any = self  # (its accelerator becomes the view for the duration)
        real = trainer.accelerator
        view = _ReplicaAccelerator(real, replica, replicas, group)
        token = _VIEW.set(view)
        trainer.accelerator = view
        try:
            yield
        finally:
            trainer.accelerator = real
            _VIEW.reset(token)

    # ------------------------------------------------------------------ TRL's batch and loss, per replica
    def _prepare_inputs(self, generation_batch):
        with self._autosp_replica_view():
            return super()._prepare_inputs(generation_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self._autosp_replica_view():
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def _generate(self, prompts):
        result = super()._generate(prompts)
        if self._autosp_sharing() and self._autosp_broadcast_generations:
            # The leader's outputs, and what it logged of them (lengths, clipped ratio, tokens seen).
            mode = "train" if self.model.training else "eval"
            metrics = self._metrics[mode]
            result, logged, tokens = self._autosp_broadcast_object(
                (result, dict(metrics), self.state.num_input_tokens_seen))
            if logged is not None and dist.get_rank() != self._autosp_sp_group()[1]:
                metrics.clear()
                metrics.update(logged)
                self.state.num_input_tokens_seen = tokens
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._autosp_sharing() and self._autosp_broadcast_generations:
            group, leader = self._autosp_sp_group()
            dist.broadcast(rewards, src=leader, group=group)
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self._autosp_sharing() and self._autosp_broadcast_generations:
            # _prepare_inputs shuffles the batch next, from the global random state: the leader's.
            _set_rng_state(self._autosp_broadcast_object(_rng_state()))
        return output

    # ------------------------------------------------------------------ log-probabilities, sequence-parallel
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        return super()._get_per_token_logps_and_entropies(self._autosp_logps_model(model), *args, **kwargs)

    def _autosp_logps_model(self, model):
        """The module TRL's per-token log-probability pass calls: the policy's and the reference
        model's sequence-parallel wrappers, for the plain modules TRL passes when scoring."""
        if self._autosp_sp == 1:
            return model
        from accelerate.utils import is_peft_model
        if model is self.model and not is_peft_model(model):
            # (TRL passes a PEFT model for the old policy and, its adapter switched off, for the reference: both
            # stay eager, as TRL runs them, until the program key covers PEFT's switches, issue 39 part 3.)
            return self._autosp_model()
        ref = getattr(self, "ref_model", None)
        if ref is not None and model is ref:
            return self._autosp_ref_model()
        return model

    def _autosp_ref_model(self):
        from autosp.hf.trainer import SequenceParallelModel
        wrapper = self._autosp_ref_wrapper
        if wrapper is None or wrapper.model is not self.ref_model:
            acc = self.accelerator
            wrapper = SequenceParallelModel(self.ref_model, self._autosp_sp, self._autosp_options,
                                            temperature=float(getattr(self.args, "temperature", 1.0) or 1.0),
                                            autocast=acc.autocast if acc.native_amp else None)
            self._autosp_ref_wrapper = wrapper
        return wrapper
