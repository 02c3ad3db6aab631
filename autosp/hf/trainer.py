"""``transformers.Trainer`` (and its subclasses: TRL's ``SFTTrainer``, ``DPOTrainer``, ...) with
autosp's sequence parallelism.

Example (the script changes by one line; launch it with ``torchrun --nproc-per-node 4``)::

    trainer = autosp.hf.Trainer(model=model, args=args, train_dataset=ds, sp_size=2)  # DP 2 x SP 2
    trainer.train()
    trainer.save_model()          # the user's model: config.json + weights, no wrapper prefix

How the data contract is kept (docs/DESIGN.md §7, "Trainers are users too"):

- **Data**: the Accelerator's data loaders are sharded over the data-parallel replicas only
  (``num_processes = world / sp_size``, ``process_index = rank // sp_size``: accelerate's own
  rule for the ranks of a ``cp``/``tp`` dimension), so every rank of an SP group gets the same
  batch and a replica gets the batches a single device would, in the same order.
- **Gradients**: the model is never wrapped in DDP. The Trainer's ``model_wrapped`` is a small
  module (:class:`SequenceParallelModel`) that calls the compiled model; autosp sums the SP
  ranks' shares and averages the replicas in one all-reduce (``sync_data_parallel``).
- **Token counts**: SP ranks are counted as the Trainer counts tensor-parallel ranks (ranks
  that see replicated batches, ``get_tp_size``), so ``num_items_in_batch`` is the global count
  and the loss scale is the number of replicas. ``num_items_in_batch`` reaches the compiled
  model as a 0-d tensor (an input, not a constant: one program for every value), and the HF
  loss ``sum / num_items_in_batch`` is computed, exact, inside the program.
- **Outputs**: a training call with ``labels`` runs the sequence-sharded program (the loss is
  computed in the model, logits stay sharded). Calls whose outputs are used outside the model
  (evaluation and prediction, a call without ``labels`` as ``compute_loss_func`` or label
  smoothing make) run a second program with ``gather_outputs=True``: every rank holds the full
  outputs and computes the same loss from them, and the gather's backward hands each rank its
  own positions. TRL's ``fused_lm_head=True`` per-token log-probabilities run on each rank's
  hidden states through a tiled LM head, and only the per-token values are gathered
  (:mod:`autosp.hf.logprobs`).
- **Online RL** (TRL's ``GRPOTrainer``, ``RLOOTrainer``): the SP group shares its replica's
  generations, rewards and random state, and TRL's cross-process collectives count an SP
  group as one process (:mod:`autosp.hf.rl`).
- **Saving**: ``Trainer.model`` stays the user's model (its ``config``, ``loss_type``, forward
  signature for ``remove_unused_columns``), so ``save_model``, checkpoints and
  ``resume_from_checkpoint`` are the Trainer's own.
- **Mixed precision** (``bf16=True``, fp32 master weights): every call runs under the
  accelerator's autocast, outputs cast to fp32, as accelerate's ``prepare_model`` does; the
  programs are exported under that autocast and keyed by it (``autosp.frontend.importer.autocast_state``).
  ``fp16=True`` is refused (a GradScaler autosp has not been verified with).
- **Checkpointing** (``activation_checkpointing`` / ``gradient_checkpointing``): the Trainer
  switches it on on the model's layers; autosp.compile honours the switches as its own
  (``autosp.module_checkpointing``).
- **FSDP2** (``fsdp=True``, ``fsdp_config={"version": 2}``): applied here (``fully_shard`` on
  each layer class, then the root, over the whole world), not by accelerate's plugin, which is
  taken off the arguments; checkpoints and ``save_model`` hold the full state dicts, loaded
  back into each rank's shards on resume. DeepSpeed is refused with a pointer to it.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree
from transformers.utils import ModelOutput

from autosp.data import data_parallel_rank
from autosp.hf.logprobs import LogProbHead
from autosp.ir.diagnostics import AutospError

# Keyword arguments of varlen (flash) attention that TRL's padding-free collator adds. Models with
# SDPA or eager attention ignore them (their masks come from ``position_ids``); as inputs of the
# compiled program they would only cost a compilation per value of ``max_length_*``.
_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")

# Options that the integration owns: it compiles the model twice (sharded and gathered outputs)
# on the world's SP groups, and synchronises data parallelism through autosp.
_OWNED_OPTIONS = {
    "sp_size": "pass sp_size= to the Trainer itself",
    "group": "the Trainer lays SP groups out over consecutive ranks of the world",
    "gather_outputs": "the Trainer gathers outputs where they are used outside the model (evaluation, "
                      "losses computed from logits) and keeps them sharded where the model computes the loss",
}


@dataclass
class FusedLogProbsOutput(ModelOutput):
    """What TRL's fused LM head returns for ``model(..., labels=labels, fused_lm_head=True)``
    (``trl.trainer.utils.FusedCausalLMOutput``): per-token fields are zero where the label is
    ``-100``. Computed on each rank's own positions by a tiled LM head and gathered as
    ``[B, S]`` vectors (:mod:`autosp.hf.logprobs`); from the gathered logits only for a model
    that is not a causal LM with a linear head."""

    loss: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def _logits(outputs) -> torch.Tensor:
    if isinstance(outputs, dict):
        return outputs["logits"]
    return outputs.logits if hasattr(outputs, "logits") else outputs[0]


class SequenceParallelModel(torch.nn.Module):
    """The module the Trainer trains and evaluates (its ``model_wrapped``): calls the user's model
    compiled by autosp, sequence-sharded for training calls with ``labels`` and gathered
    (``gather_outputs=True``) for the rest. ``parameters()`` are the user's; attributes it lacks
    (``config``, ``generate``, ...) are the user's model's.

    Example::

        wrapped = SequenceParallelModel(model, sp_size=2)
        loss = wrapped(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(30.0)).loss
    """

    def __init__(self, model: torch.nn.Module, sp_size: int, options: dict | None = None,
                 temperature: float = 1.0, autocast=None):
        super().__init__()
        import autosp
        self.options = dict(options or {})
        self.sp_size = sp_size
        self.temperature = temperature
        # Mixed precision (bf16=True): the accelerator's autocast context (a callable), under which every call
        # runs, its outputs then cast to fp32, as accelerate's prepare_model does to a model it wraps. The compiled
        # programs export under it (their casts are ops of the program: autosp.frontend.importer.autocast_state).
        self.autocast = autocast
        self.sharded = autosp.compile(model, sp_size=sp_size, **self.options)
        self.gathered: torch.nn.Module | None = None
        if sp_size > 1:  # built now, on every rank together: creating its groups is collective
            self.gathered = autosp.compile(model, sp_size=sp_size, gather_outputs=True, **self.options)

    @property
    def model(self) -> torch.nn.Module:
        """The user's model."""
        return self.sharded.module

    def _get_name(self) -> str:
        # Trainer.compute_loss reads the class name to tell causal LMs (labels shifted) apart.
        return self.model._get_name()

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or "sharded" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self._modules["sharded"].module, name)

    def dp_group(self):
        """The process group of this rank's data-parallel peers (same SP rank), or None."""
        mesh = getattr(self.sharded, "mesh", None)
        return None if mesh is None else mesh["dp"].get_group()

    def _call_kwargs(self, kwargs: dict) -> dict:
        impl = str(getattr(getattr(self.model, "config", None), "_attn_implementation", "") or "")
        varlen = [k for k in _VARLEN_KWARGS if k in kwargs]
        if varlen:
            if "flash" in impl:
                raise AutospError(f"attn_implementation={impl!r} with {', '.join(varlen)}: autosp compiles SDPA or "
                                  "eager attention; load the model with attn_implementation='sdpa' (documents are "
                                  "then separated by their position_ids)")
            kwargs = {k: v for k, v in kwargs.items() if k not in _VARLEN_KWARGS}
        return kwargs

    def forward(self, *args, **kwargs):
        if self.autocast is None:
            return self._forward(*args, **kwargs)
        from accelerate.utils import convert_to_fp32
        with self.autocast():
            outputs = self._forward(*args, **kwargs)
        return convert_to_fp32(outputs)

    def _forward(self, *args, fused_lm_head: bool = False, num_items_in_batch=None, **kwargs):
        kwargs = self._call_kwargs(kwargs)
        if fused_lm_head:
            return self._fused_lm_head(args, kwargs, num_items_in_batch)
        has_labels = kwargs.get("labels") is not None or kwargs.get("shift_labels") is not None
        if has_labels and num_items_in_batch is not None:
            # A 0-d tensor: an input of the program (a Python number would be a constant, and
            # every value a new compilation). The model's loss is then sum / num_items_in_batch.
            kwargs["num_items_in_batch"] = torch.as_tensor(num_items_in_batch, dtype=torch.float32)
        module = self.sharded if (self.training and has_labels) or self.gathered is None else self.gathered
        return module(*args, **kwargs)

    def _fused_lm_head(self, args, kwargs, num_items_in_batch) -> FusedLogProbsOutput:
        """TRL's ``fused_lm_head=True`` protocol: per-token log-probabilities of the labels (and
        entropy, ``log sum p^2``, mean logit, top-1), every rank the same values. Each rank
        projects its own positions of the sequence-sharded hidden state through the LM head in
        chunks of rows and only the [B, S] vectors are gathered (:mod:`autosp.hf.logprobs`);
        a model without a causal-LM backbone and linear head is answered from the gathered
        logits instead. The head is compiled at the first call, on every rank together."""
        labels = kwargs.pop("labels", None)
        shift_labels = kwargs.pop("shift_labels", None)
        if labels is None and shift_labels is None:
            raise AutospError("fused_lm_head=True needs labels (or shift_labels)")
        if kwargs.get("output_router_logits"):
            raise AutospError("fused_lm_head=True with output_router_logits (an MoE load-balancing loss) is not "
                              "supported by autosp.hf yet")
        head = getattr(self, "_logprob_head", None)
        if head is None:  # False: not a causal LM with a linear head
            head = LogProbHead.for_model(self.model, self.sp_size, self.options) or False
            self._logprob_head = head  # a plain object (not a submodule): the parameters stay the model's
        if isinstance(head, LogProbHead):
            fields = head(args, kwargs, labels, shift_labels, self.temperature)
        else:
            fields = self._fused_from_gathered_logits(args, kwargs, labels, shift_labels)
        mask = fields["label_mask"]
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = -fields["log_probs"].sum() / count
        return FusedLogProbsOutput(loss=loss, **fields)

    def _fused_from_gathered_logits(self, args, kwargs, labels, shift_labels) -> dict:
        """The fused fields from the full logits (``gather_outputs=True``): for models the
        tiled head does not cover."""
        module = self.gathered if self.gathered is not None else self.sharded
        logits = _logits(module(*args, **kwargs))
        if shift_labels is None:
            logits, targets = logits[:, :-1], labels[:, 1:]
        else:
            targets = shift_labels
        logits = logits.float() / self.temperature
        mask = targets != -100
        log_softmax = torch.log_softmax(logits, dim=-1)
        safe = targets.clamp(min=0).unsqueeze(-1)
        log_probs = log_softmax.gather(-1, safe).squeeze(-1).masked_fill(~mask, 0.0)
        probs = log_softmax.exp()
        entropy = (-(probs * log_softmax).sum(-1)).masked_fill(~mask, 0.0)
        with torch.no_grad():
            log_sum_sq = torch.logsumexp(2 * log_softmax, dim=-1).masked_fill(~mask, 0.0)
            mean_logits = logits.mean(-1).masked_fill(~mask, 0.0)
            is_top1 = (logits.argmax(-1) == targets) & mask
        return dict(log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq, mean_logits=mean_logits,
                    is_top1=is_top1, label_mask=mask)


def _check_options(options: dict) -> dict:
    for key, why in _OWNED_OPTIONS.items():
        if key in options:
            raise AutospError(f"autosp_options[{key!r}]: not an option of autosp.hf.Trainer ({why})")
    if options.get("sync_data_parallel", True) is False:
        raise AutospError("autosp_options['sync_data_parallel']=False: autosp.hf.Trainer never wraps the model in "
                          "DDP, so autosp must average the data-parallel replicas itself (drop the option)")
    return dict(options)


if TYPE_CHECKING:  # the mixin always comes first in front of a Trainer class
    from transformers import Trainer as _TrainerBase
else:
    _TrainerBase = object


class _SequenceParallelMixin(_TrainerBase):
    """The overrides :func:`sequence_parallel` puts in front of a Trainer class."""

    _autosp_sequence_parallel = True

    def __init__(self, *args, sp_size: int | None = None, autosp_options: dict | None = None, **kwargs):
        self._autosp_options = _check_options(autosp_options or {})
        self._autosp_requested_sp = sp_size
        self._autosp_wrapper: SequenceParallelModel | None = None
        self._autosp_local_count = False
        self._autosp_world = 1
        self._autosp_sp = 1
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        # FSDP2 (fsdp=..., fsdp_config={"version": 2}) is applied here, not by accelerate's plugin
        # (which CPU drops and which would wrap the model itself): the plugin is taken off the args.
        self._autosp_fsdp = _take_fsdp_request(training_args)
        super().__init__(*args, **kwargs)
        # Resolved after the Trainer's own set-up: under torchrun, it initialises torch.distributed.
        self._autosp_world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._autosp_sp = self._autosp_resolve_sp()
        self._autosp_check()
        if self._autosp_fsdp is not None:
            self._autosp_fully_shard(self._autosp_fsdp)
        # activation_checkpointing=True (alias gradient_checkpointing=True): the Trainer calls
        # activation_checkpointing_enable() on the model when training starts, with its kwargs
        # (every_n_layers, offload), and autosp.compile honours the modules' flags as its own
        # checkpointing (autosp.module_checkpointing: every layer -> "full", offload -> "+offload");
        # autosp_options["checkpointing"] wins over them.

    # ------------------------------------------------------------------ checks
    def _autosp_resolve_sp(self) -> int:
        world, sp = self._autosp_world, self._autosp_requested_sp
        sp = world if sp is None else sp
        if not isinstance(sp, int) or sp < 1:
            raise AutospError(f"sp_size must be a positive int, got {sp!r}")
        if sp > 1 and world == 1:
            raise AutospError(f"sp_size={sp} needs {sp} ranks: launch with torchrun --nproc-per-node {sp}")
        if world % sp:
            raise AutospError(f"sp_size={sp} does not divide the number of ranks ({world}): launch a multiple of "
                              f"{sp} processes")
        return sp

    def _autosp_check(self) -> None:
        """Trainer settings the integration cannot honour: an error, never a wrong answer."""
        args = self.args
        refuse = []
        if args.torch_compile:
            refuse.append("torch_compile=True (the compiled program is autosp's: pass "
                          "autosp_options={'backend': 'inductor'} to torch.compile it)")
        if getattr(self, "is_deepspeed_enabled", False) or args.deepspeed:
            refuse.append("DeepSpeed (autosp shards the sequence itself; for ZeRO-3's sharded model state pass "
                          "fsdp=True, fsdp_config={'version': 2} instead)")
        if getattr(self, "is_fsdp_enabled", False) or args.fsdp:
            refuse.append("accelerate's FSDP plugin (autosp.hf applies FSDP2 itself: fsdp_config={'version': 2})")
        if getattr(self.accelerator, "parallelism_config", None) is not None or args.parallelism_config is not None:
            refuse.append("accelerate's ParallelismConfig (autosp lays out the dp x sp mesh itself)")
        if args.fp16:
            refuse.append("fp16=True (fp16 needs a GradScaler whose inf check must agree over the ranks; accelerate "
                          "sets none up on CPU and autosp has not been verified with one: use bf16=True)")
        if args.bf16_full_eval or args.fp16_full_eval:
            refuse.append(f"{'bf16' if args.bf16_full_eval else 'fp16'}_full_eval=True (it casts the model's "
                          "parameters in place for evaluation; with bf16=True evaluation runs under autocast)")
        if args.n_gpu > 1:
            refuse.append(f"nn.DataParallel over {args.n_gpu} GPUs in one process (launch one process per GPU)")
        if refuse:
            raise AutospError(f"autosp.hf.Trainer cannot run with {refuse[0]}")
        if self._autosp_world > 1 and self.accelerator.num_processes != self._autosp_world:
            raise AutospError(f"the Trainer sees {self.accelerator.num_processes} process(es) but torch.distributed has "
                              f"{self._autosp_world} ranks: launch with torchrun (it sets RANK, WORLD_SIZE and "
                              "LOCAL_RANK)")
        if self.accelerator.dispatch_batches:
            raise AutospError("dispatch_batches=True splits one batch over every process; autosp.hf.Trainer gives "
                              "each SP group a whole batch (leave dispatch_batches unset)")

    # ------------------------------------------------------------------ FSDP2
    def _autosp_fully_shard(self, plugin: dict) -> None:
        """``fully_shard`` on each layer (``transformer_layer_cls_to_wrap``, else the model's
        ``_no_split_modules``), then on the root, over the whole world (1-D mesh): what
        accelerate's FSDP2 plugin does, composed with SP by autosp.compile as a user's
        ``fully_shard`` is (the compiled program gathers one layer at a time). With
        ``bf16=True`` the master weights stay fp32 and the program runs under autocast."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if self._autosp_world == 1:
            raise AutospError("fsdp: FSDP2 needs torch.distributed with several ranks (launch with torchrun)")
        model = self.model
        names = plugin.get("transformer_cls_names_to_wrap")
        names = set(names.split(",")) if names else set(getattr(model, "_no_split_modules", None) or ())
        if plugin.get("auto_wrap_policy") == "NO_WRAP":
            names = set()
        layers = [m for m in model.modules() if type(m).__name__ in names and m is not model]
        if names and not layers:
            raise AutospError(f"fsdp: no module of class {', '.join(sorted(names))} in {type(model).__name__} (set "
                              "fsdp_config['transformer_layer_cls_to_wrap'] to its layer class)")
        device = "cuda" if self.args.device.type == "cuda" else "cpu"
        mesh = init_device_mesh(device, (self._autosp_world,))
        efficient = bool(plugin.get("cpu_ram_efficient_loading"))
        if efficient:
            # accelerate's memory-efficient loading: only the first rank loaded the weights
            # (from_pretrained leaves the others unfilled); the others keep shapes only, and
            # each rank's shards are filled from the first rank's tensors, one at a time.
            non_persistent = {name: b.detach().clone() for name, b in _non_persistent_buffers(model)}
            full = model.state_dict() if dist.get_rank() == 0 else {}
            model.to(torch.device("meta"))
            if hasattr(model, "tie_weights"):
                model.tie_weights()
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if efficient:
            from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict
            fsdp2_load_full_state_dict(self.accelerator, model, full)
            for name, value in non_persistent.items():  # (not in a state dict: each rank's own values)
                owner, _, leaf = name.rpartition(".")
                model.get_submodule(owner).register_buffer(leaf, value.to(self.args.device), persistent=False)
            if hasattr(model, "tie_weights"):
                model.tie_weights()
            del full

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # FSDP2: the full state dict, gathered on every rank (a collective: save_model calls
        # _save on every rank), saved by the writer as the user's model (from_pretrained loads it).
        if state_dict is None and self._autosp_fsdp is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            state_dict = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))
        super()._save(output_dir, state_dict=state_dict)

    def _autosp_optimizer(self):
        return getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate's wrapper -> torch's

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        # FSDP2: the full optimizer state (a collective), so that a checkpoint resumes at any world size.
        if self._autosp_fsdp is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
        state = get_optimizer_state_dict(self.model, self._autosp_optimizer(),
                                         options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.args.should_save:
            torch.save(state, os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if self._autosp_fsdp is None or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
        path = os.path.join(checkpoint, OPTIMIZER_NAME)
        if not os.path.isfile(path):
            return
        # Read on the first rank only and broadcast one tensor at a time into each rank's
        # shards: no other rank ever holds the whole optimizer state (2x the model in fp32).
        state = torch.load(path, map_location="cpu", weights_only=True) if dist.get_rank() == 0 else {}
        set_optimizer_state_dict(self.model, self._autosp_optimizer(), optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        # FSDP2: the saved full weights into each rank's shards.
        if self._autosp_fsdp is None or (model is not None and model is not self.model):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        import json

        import safetensors.torch
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
        index = os.path.join(resume_from_checkpoint, SAFE_WEIGHTS_INDEX_NAME)
        if os.path.isfile(index):
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        else:
            names = [SAFE_WEIGHTS_NAME]
        files = [os.path.join(resume_from_checkpoint, name) for name in names]
        if not all(os.path.isfile(path) for path in files):
            raise AutospError(f"no safetensors weights in {resume_from_checkpoint} (autosp.hf's FSDP2 checkpoints "
                              "hold model.safetensors)")
        state = {}  # read on the first rank only, broadcast one tensor at a time into each rank's shards
        for path in files if dist.get_rank() == 0 else ():
            state.update(safetensors.torch.load_file(path))
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False,
                                                                          broadcast_from_rank0=True))

    # ------------------------------------------------------------------ the accelerator's data path
    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.prepare_data_loader = self._autosp_prepare_data_loader
        self.accelerator.gather_for_metrics = self._autosp_gather_for_metrics
        # Trainer.evaluation_loop resets gather_function to the accelerator's after each loop.
        self.gather_function = functools.partial(self._autosp_gather_for_metrics,
                                                 use_gather_object=self.args.eval_use_gather_object)

    def _autosp_data_parallel(self) -> tuple[int, int]:
        return data_parallel_rank(self._autosp_sp) if self._autosp_world > 1 else (0, 1)

    def _autosp_prepare_data_loader(self, data_loader, device_placement=None, slice_fn_for_dispatch=None):
        """``Accelerator.prepare_data_loader``, sharded over the data-parallel replicas only."""
        from accelerate.data_loader import prepare_data_loader
        acc = self.accelerator
        if getattr(data_loader, "_is_accelerate_prepared", False):
            if data_loader not in acc._dataloaders:
                acc._dataloaders.append(data_loader)
            return data_loader
        replica, replicas = self._autosp_data_parallel()
        prepared = prepare_data_loader(
            data_loader, acc.device, num_processes=replicas, process_index=replica, split_batches=acc.split_batches,
            put_on_device=acc.device_placement if device_placement is None else device_placement,
            rng_types=acc.rng_types.copy(), dispatch_batches=False, even_batches=acc.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch, use_seedable_sampler=acc.use_seedable_sampler,
            data_seed=acc.dataloader_config.data_seed, non_blocking=acc.non_blocking,
            use_stateful_dataloader=acc.use_stateful_dataloader)
        acc._dataloaders.append(prepared)
        return prepared

    def _autosp_gather_for_metrics(self, input_data, use_gather_object: bool = False):
        """``Accelerator.gather_for_metrics`` over the data-parallel replicas: the ranks of an SP
        group hold the same (gathered) values, so gathering over the world would repeat each
        replica's predictions ``sp_size`` times. The last batch's padding samples are dropped as
        accelerate drops them."""
        replica, replicas = self._autosp_data_parallel()
        group = self._autosp_model().dp_group() if replicas > 1 else None
        leaves = pytree.tree_leaves(input_data)
        all_tensors = bool(leaves) and all(isinstance(x, torch.Tensor) for x in leaves)
        if use_gather_object or not all_tensors:
            if replicas == 1:
                data = input_data
            else:
                objects: list = [None] * replicas
                dist.all_gather_object(objects, input_data, group=group)
                data = [x for part in objects for x in part]
        else:
            data = pytree.tree_map(lambda t: _all_gather_rows(t, group, replicas), input_data)
        gradient_state = self.accelerator.gradient_state
        if gradient_state.end_of_dataloader and gradient_state.remainder > 0:
            keep = gradient_state.remainder
            if isinstance(data, list) and (use_gather_object or not all_tensors):
                return data[:keep]
            return pytree.tree_map(lambda t: t[:keep] if isinstance(t, torch.Tensor) else t, data)
        return data

    # ------------------------------------------------------------------ the model
    def _autosp_model(self) -> SequenceParallelModel:
        """The wrapper of the current ``self.model`` (built once per model, on every rank)."""
        wrapper = self._autosp_wrapper
        if wrapper is None or wrapper.model is not self.model:
            acc = self.accelerator
            wrapper = SequenceParallelModel(self.model, self._autosp_sp, self._autosp_options,
                                            temperature=float(getattr(self.args, "temperature", 1.0) or 1.0),
                                            autocast=acc.autocast if acc.native_amp else None)
            self._autosp_wrapper = wrapper
        return wrapper

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        # Never DDP: autosp synchronises the gradients (SP sum and DP mean in one all-reduce).
        return self._autosp_model()

    # ------------------------------------------------------------------ counting
    def get_tp_size(self) -> int:
        # SP ranks see replicated batches, as tensor-parallel ranks do: the Trainer divides the
        # gathered token count and the loss scale by this.
        base = super().get_tp_size()
        return base if self._autosp_local_count else base * self._autosp_sp

    def _get_num_items_in_batch(self, batch_samples, device):
        if self.args.average_tokens_across_devices:
            return super()._get_num_items_in_batch(batch_samples, device)
        # Not gathered: the count is this replica's already (every SP rank holds the whole batch).
        self._autosp_local_count = True
        try:
            return super()._get_num_items_in_batch(batch_samples, device)
        finally:
            self._autosp_local_count = False

    def _track_num_input_tokens(self, inputs):
        before = self.state.num_input_tokens_seen
        super()._track_num_input_tokens(inputs)
        seen = self.state.num_input_tokens_seen - before
        self.state.num_input_tokens_seen = before + seen // self._autosp_sp

    def floating_point_ops(self, inputs) -> int:
        # Each rank of an SP group does 1/sp_size of its batch's work.
        return super().floating_point_ops(inputs) // self._autosp_sp


def _non_persistent_buffers(model: torch.nn.Module):
    """(name, buffer) of the buffers left out of ``model``'s state dict (``persistent=False``)."""
    for owner, module in model.named_modules():
        for leaf, buffer in module.named_buffers(recurse=False):
            if buffer is not None and leaf in module._non_persistent_buffers_set:
                yield (f"{owner}.{leaf}" if owner else leaf), buffer


def _take_fsdp_request(args) -> dict | None:
    """The FSDP2 plugin arguments that ``args`` asks for (None: no FSDP), after refusing what
    autosp's FSDP2 runtime cannot honour; ``args.fsdp`` is then switched off, so that accelerate
    neither drops the plugin (CPU) nor wraps the model itself (GPU)."""
    if args is None or not getattr(args, "fsdp", None) or getattr(args, "fsdp_plugin_args", None) is None:
        return None
    plugin = dict(args.fsdp_plugin_args)
    refuse = []
    if plugin.get("fsdp_version", 2) != 2:
        refuse.append(f"fsdp_version {plugin.get('fsdp_version')} (autosp composes with FSDP2: "
                      "fsdp_config={'version': 2})")
    if plugin.get("reshard_after_forward", True) is not True:
        refuse.append("reshard_after_forward=False / shard_grad_op (autosp's program reshards each layer after its "
                      "forward: full_shard)")
    if plugin.get("cpu_offload"):
        refuse.append("cpu_offload / offload (FSDP2's CPUOffloadPolicy is not supported by autosp's runtime)")
    if plugin.get("auto_wrap_policy") not in (None, "TRANSFORMER_BASED_WRAP", "NO_WRAP"):
        refuse.append(f"auto_wrap_policy={plugin.get('auto_wrap_policy')} (autosp.hf wraps the transformer layers: "
                      "TRANSFORMER_BASED_WRAP)")
    if plugin.get("state_dict_type", "FULL_STATE_DICT") != "FULL_STATE_DICT":
        refuse.append(f"state_dict_type={plugin.get('state_dict_type')} (autosp.hf saves the full state dict)")
    if plugin.get("activation_checkpointing"):
        refuse.append("fsdp_config['activation_checkpointing'] (pass activation_checkpointing=True: autosp's "
                      "checkpointing)")
    if refuse:
        raise AutospError(f"autosp.hf.Trainer cannot run FSDP with {refuse[0]}")
    args.fsdp = False
    args.fsdp_plugin_args = None
    return plugin


def _all_gather_rows(t, group, replicas: int):
    """Concatenate ``t`` over the group along dim 0 (0-d tensors become one row each), allowing
    each rank its own number of rows."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.dim() == 0:
        t = t[None]
    if group is None or replicas == 1:
        return t
    rows = torch.tensor([t.shape[0]], device=t.device)
    counts = [torch.zeros_like(rows) for _ in range(replicas)]
    dist.all_gather(counts, rows, group=group)
    longest = int(max(c.item() for c in counts))
    padded = t
    if t.shape[0] < longest:
        padded = torch.cat([t, t.new_zeros((longest - t.shape[0], *t.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in range(replicas)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[:int(c.item())] for p, c in zip(parts, counts)])
