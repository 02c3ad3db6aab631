"""The memory model: per-rank training memory of a compiled program, without the hardware.

:func:`estimate_memory` compiles the model exactly as :func:`autosp.compile` would (same
passes, same checkpoint plan), then runs one forward and backward on **meta tensors**
(shapes, no data) as one rank of a simulated group
(:class:`autosp.runtime.collectives.simulate`), counting with the same counters as the
measurements (:mod:`autosp.planning.memory`): bytes saved for backward, and peak live bytes. So a
Llama-3-8B at a million tokens is estimated in seconds on a laptop.

Attention is costed on the kernels of the target ``device``: ``"cpu"`` (the fused CPU flash
kernel) or ``"cuda"``, where every attention call runs the CUDA kernel the runtime names
for it (flash, varlen flash, memory-efficient; :mod:`autosp.runtime.kernels`) through that
kernel's meta implementation. Both keep their inputs, output and log-sum-exp, never the
S x S scores. Model
state is added analytically: parameters and gradients in the training dtype, and AdamW's
fp32 moments (plus an fp32 master copy when training in 16 bits), optionally sharded
ZeRO-style over ``state_shards`` ranks.

Example::

    >>> est = autosp.estimate_memory("8b", seq_len=131072, sp_size=8, dtype=torch.bfloat16,
    ...                              checkpointing="sac")
    >>> est.saved_bytes / 2**30, est.total_bytes(zero_stage=3, state_shards=8) / 2**30
    >>> autosp.max_context(80 * 2**30, "8b", sp_size=8, checkpointing="sac")
"""
from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autosp.driver import emit_program, module_layout, transform
from autosp.frontend.importer import autocast_off
from autosp.options import CHECKPOINTING, MeshOptions
from autosp.planning.memory import MiB, PeakTracker, SavedTensors
from autosp.runtime import collectives, kernels

GiB = 1 << 30
# The optimizers whose state the memory model counts on the device ("host-adamw": none,
# autosp.runtime.host_optimizer.HostAdamW keeps it in host memory).
OPTIMIZERS = ("adamw", "host-adamw", "sgd", "none")
DEVICES = ("cpu", "cuda")  # the kernels a program is costed on (autosp.runtime.kernels.target)


@dataclass
class MemoryEstimate:
    """Per-rank memory of one training step (bytes). ``peak_bytes`` is everything the
    step allocates (activations, temporaries, parameter gradients), as measured by
    :func:`autosp.planning.memory.measure_step`; ``activation_peak_bytes`` leaves the gradients out
    (they are counted in the model state instead)."""
    seq_len: int
    sp_size: int
    dtype: torch.dtype
    checkpointing: str
    saved_bytes: int
    peak_bytes: int
    activation_peak_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    seconds: float = 0.0
    fsdp: int = 1  # FSDP2 degree the step ran with (1: unsharded)

    def state_bytes(self, zero_stage: int | None = None, state_shards: int | None = None) -> int:
        """Parameters + gradients + optimizer state per rank; ZeRO stage 1 shards the
        optimizer state over ``state_shards`` ranks, 2 also the gradients, 3 also the
        parameters. Default: what the step ran with (FSDP over ``fsdp`` ranks is stage 3)."""
        if zero_stage is None:
            zero_stage = 3 if self.fsdp > 1 else 0
        state_shards = state_shards or self.fsdp

        def share(n, stage):
            return n // state_shards if zero_stage >= stage else n
        return share(self.param_bytes, 3) + share(self.grad_bytes, 2) + share(self.optimizer_bytes, 1)

    def total_bytes(self, zero_stage: int | None = None, state_shards: int | None = None) -> int:
        """Model state plus the activation peak: what a rank needs for one step."""
        return self.state_bytes(zero_stage, state_shards) + self.activation_peak_bytes

    def row(self) -> str:
        return (f"S={self.seq_len} P={self.sp_size} {self.checkpointing}: saved {self.saved_bytes / MiB:.1f} MiB, "
                f"peak {self.peak_bytes / MiB:.1f} MiB, activation peak {self.activation_peak_bytes / MiB:.1f} MiB")


def meta_model(model_or_config, dtype: torch.dtype | None) -> torch.nn.Module:
    """``model_or_config`` (a module, an autosp ``LlamaConfig``, a transformers config or a
    preset name) as a model whose parameters and buffers are meta tensors, in ``dtype``."""
    from autosp.models import LLAMA_PRESETS, LlamaConfig, LlamaLike
    if isinstance(model_or_config, str):
        if model_or_config not in LLAMA_PRESETS:
            raise ValueError(f"unknown model preset '{model_or_config}' (presets: {', '.join(LLAMA_PRESETS)})")
        # The presets' values mix ints and bools: mypy infers dict[str, int] for them.
        preset: dict[str, Any] = LLAMA_PRESETS[model_or_config]
        model_or_config = LlamaConfig(**preset)
    if dtype is None and not isinstance(model_or_config, torch.nn.Module):
        dtype = torch.bfloat16
    if isinstance(model_or_config, LlamaConfig):
        with torch.device("meta"):
            model = LlamaLike(model_or_config)
    elif isinstance(model_or_config, torch.nn.Module):
        model = model_or_config
        if any(p.device.type != "meta" for p in model.parameters()):
            # A copy whose parameters and buffers are meta tensors (no data is copied).
            memo: dict = {}
            for t in [*model.parameters(), *model.buffers()]:
                meta = torch.empty_like(t, device="meta")
                memo[id(t)] = torch.nn.Parameter(meta, t.requires_grad) if isinstance(t, torch.nn.Parameter) else meta
            model = copy.deepcopy(model, memo)
    elif hasattr(model_or_config, "to_dict") and hasattr(model_or_config, "model_type"):  # a transformers config
        from transformers import AutoModelForCausalLM
        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(model_or_config, attn_implementation="sdpa")
            except ValueError:  # a family without an SDPA implementation (gpt-oss): its eager attention
                model = AutoModelForCausalLM.from_config(model_or_config, attn_implementation="eager")
    else:
        raise TypeError("estimate_memory expects an nn.Module, an autosp LlamaConfig, a transformers config "
                        f"or a preset name, got {type(model_or_config).__name__}")
    return model.to(dtype) if dtype is not None else model


def _loss_of(out):
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    if hasattr(out, "loss") and out.loss is not None:
        return out.loss
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return leaves[0].float().sum()


def model_state(model: torch.nn.Module, dtype: torch.dtype, optimizer: str) -> tuple[int, int, int]:
    """``(parameter, gradient, optimizer state)`` bytes of ``model`` trained in ``dtype``
    with ``optimizer`` (one of :data:`OPTIMIZERS`), unsharded; shared parameters once."""
    params = {p.untyped_storage()._cdata: p for p in model.parameters()}.values()
    n = sum(p.numel() for p in params if p.requires_grad)
    size = torch.empty((), dtype=dtype).element_size()
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    grad_bytes = n * size
    if optimizer == "adamw":
        optimizer_bytes = n * 8 + (n * 4 if size < 4 else 0)  # fp32 moments (+ fp32 master weights)
    elif optimizer in ("none", "host-adamw"):  # host-adamw: autosp.runtime.host_optimizer.HostAdamW
        optimizer_bytes = 0  # (its fp32 masters and moments live in host memory)
    else:
        optimizer_bytes = n * 4 if size < 4 else 0
    return param_bytes, grad_bytes, optimizer_bytes


class MemoryModel:
    """One model compiled for the memory model; :meth:`estimate` at any sequence length
    (the program is symbolic in S, so it is compiled once). ``inputs``: a function of the
    meta input ids returning more keyword arguments of the call (position_ids, a mask);
    data-dependent kernels see no values there (documents run as one document, which
    keeps the same bytes)."""

    def __init__(self, model_or_config, sp_size: int = 1, dtype: torch.dtype | None = torch.bfloat16,
                 checkpointing: str = "off", batch: int = 1, rank: int | None = None, optimizer: str = "adamw",
                 fsdp: int = 1, inputs=None, plan=None, call=None, transformed=None, mesh: MeshOptions | Mapping | None = None,
                 device: str = "cpu"):
        if checkpointing not in CHECKPOINTING:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING}, got {checkpointing!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, got {optimizer!r}")
        if device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(map(repr, DEVICES))}, got {device!r}")
        self.device = device
        self.model = meta_model(model_or_config, dtype)
        self.dtype = dtype or next(self.model.parameters()).dtype
        self.sp_size, self.checkpointing, self.batch, self.rank = sp_size, checkpointing, batch, rank
        self.optimizer = optimizer
        self.inputs = inputs
        self.call = call  # seq_len -> (args, kwargs) on meta: the call to estimate (else ids + labels)
        example = torch.zeros(batch, max(16, 4 * sp_size), dtype=torch.long, device="meta")
        args, kwargs = call(max(16, 4 * sp_size)) if call is not None else ((example,), self._kwargs(example))
        start = time.perf_counter()
        with collectives.simulate(sp_size, rank or 0):
            if transformed is None:
                transformed = transform(self.model, args, kwargs, sp_size=sp_size, checkpointing=checkpointing,
                                        plan=plan, mesh=mesh)
            self.program = emit_program(self.model, transformed, checkpointing=checkpointing,
                                        simulated_fsdp=fsdp)
        # The mesh the compiler chose (ring attention's sub-groups are simulated with it).
        self.layout = module_layout(transformed.module) if sp_size > 1 else None
        self.fsdp = fsdp
        self.compile_seconds = time.perf_counter() - start

    def _kwargs(self, ids: torch.Tensor) -> dict:
        """The step's keyword arguments: labels (and, for a Hugging Face model whose config
        enables the key/value cache, ``use_cache=False``: training keeps no cache), then
        ``inputs(ids)`` if given (e.g. ``position_ids`` and an ``attention_mask`` on the
        meta device: the way a trainer calls the model)."""
        kwargs: dict = {"labels": ids}
        if getattr(getattr(self.model, "config", None), "use_cache", None) is not None:
            kwargs["use_cache"] = False
        if self.inputs is not None:
            kwargs.update(self.inputs(ids))
        return kwargs

    def _state(self) -> tuple[int, int, int]:
        return model_state(self.model, self.dtype, self.optimizer)

    def estimate(self, seq_len: int, watch=None, rank: int | None = None) -> MemoryEstimate:
        """Run one step on meta tensors at ``seq_len`` as the simulated rank (``rank``, else
        the model's ``rank``); without a rank, as the first and the last rank (the edges of
        the sequence: the last one also narrows the shifted logits), keeping each field's
        larger value. ``watch(rank)``, if given, returns a context manager entered around
        each rank's step, inside the memory counters (the fake-CUDA harness records ops and
        collectives with it)."""
        rank = self.rank if rank is None else rank
        ranks = [rank] if rank is not None else sorted({0, self.sp_size - 1})
        found = [self._estimate(seq_len, r, watch) for r in ranks]
        best = max(found, key=lambda e: e.peak_bytes)
        best.saved_bytes = max(e.saved_bytes for e in found)
        best.activation_peak_bytes = max(e.activation_peak_bytes for e in found)
        best.seconds = sum(e.seconds for e in found)
        return best

    def _estimate(self, seq_len: int, rank: int, watch=None) -> MemoryEstimate:
        import contextlib

        start = time.perf_counter()
        ids = torch.zeros(self.batch, seq_len, dtype=torch.long, device="meta")
        call = self.call(seq_len) if self.call is not None else ((ids,), self._kwargs(ids))
        leaves, _ = pytree.tree_flatten(call)
        params = list(self.model.parameters())
        if self.fsdp > 1:
            params = self.program.simulated_shards  # the gradients are the local shards' (the whole ones: transient)
        for p in params:
            p.grad = None
        tracker = PeakTracker()
        hooks = [p.register_post_accumulate_grad_hook(lambda p: tracker.set_aside_tensor(p.grad))
                 for p in params if p.requires_grad]
        try:
            # autocast off: the program's casts are its own ops, exported under the caller's
            # autocast (autosp.compile with memory_budget plans inside the user's call).
            with autocast_off(), collectives.simulate(self.sp_size, rank, self.layout), \
                    kernels.target(self.device), tracker, \
                    (watch(rank) if watch is not None else contextlib.nullcontext()):
                with SavedTensors(list(self.model.parameters())) as saved:
                    loss = _loss_of(self.program(self.model, leaves))
                loss.backward()
                del loss
                tracker._sweep()
        finally:
            for h in hooks:
                h.remove()
            for p in params:
                p.grad = None
        param_bytes, grad_bytes, optimizer_bytes = self._state()
        return MemoryEstimate(seq_len, self.sp_size, self.dtype, self.checkpointing, saved.bytes,
                              tracker.peak_bytes, tracker.peak_other_bytes, param_bytes, grad_bytes,
                              optimizer_bytes, time.perf_counter() - start, fsdp=self.fsdp)


def estimate_memory(model_or_config, seq_len: int, sp_size: int = 1, dtype: torch.dtype = torch.bfloat16,
                    checkpointing: str = "off", batch: int = 1, rank: int | None = None,
                    fsdp: int = 1, sp_strategy: str = "ulysses", ulysses_degree: int | None = None,
                    ring_degree: int | None = None, device: str = "cpu") -> MemoryEstimate:
    """Per-rank memory of one training step of ``autosp.compile(model, checkpointing=...)``
    over ``sp_size`` ranks at ``seq_len`` tokens (see the module docstring).

    ``model_or_config``: an ``nn.Module`` (copied to meta if it has data), an autosp
    ``LlamaConfig``, a Hugging Face config, or a preset name (``"tiny"``, ``"small"``,
    ``"1b"``, ``"8b"``). ``rank`` picks one simulated rank; by default the larger of the
    first and last rank's numbers is reported. ``fsdp``: the model state sharded by FSDP2
    over that many ranks (the recipe: ``fully_shard`` on each layer, then the root), as
    the runtime executes it: one layer unsharded at a time plus the next one's prefetch,
    each layer's whole gradient until its reduce-scatter, and parameters, gradients and
    optimizer state divided by ``fsdp`` in :meth:`MemoryEstimate.state_bytes`.
    ``sp_strategy``, ``ulysses_degree``, ``ring_degree``: the mesh, as for
    :func:`autosp.compile` (default Ulysses; ``"auto"`` chooses as the compiler does).
    ``device``: the kernels to cost, ``"cpu"`` or ``"cuda"`` (the target GPU's; no GPU needed).
    """
    mesh = dict(strategy=sp_strategy, ulysses_degree=ulysses_degree, ring_degree=ring_degree)
    return MemoryModel(model_or_config, sp_size, dtype, checkpointing, batch, rank, fsdp=fsdp,
                       mesh=mesh, device=device).estimate(seq_len)


def max_context(budget_bytes: int, model_or_config, sp_size: int = 1, dtype: torch.dtype = torch.bfloat16,
                checkpointing: str = "off", zero_stage: int = 3, state_shards: int | None = None,
                granularity: int = 1024, limit: int = 1 << 24, verbose: bool = False, fsdp: int = 1,
                device: str = "cpu", mesh: MeshOptions | Mapping | None = None, inputs=None) -> int:
    """The longest sequence (a multiple of ``granularity``) whose step fits in
    ``budget_bytes`` per rank: model state plus the activation peak. With ``fsdp`` > 1
    the step is the one the runtime executes with FSDP2 over ``fsdp`` ranks (see
    :func:`estimate_memory`); otherwise the state is counted as ZeRO ``zero_stage`` over
    ``state_shards`` ranks (default ``sp_size``) on top of an unsharded step. Binary search
    over :meth:`MemoryModel.estimate`; 0 when not even ``granularity`` tokens fit.
    ``device``, ``mesh``, ``inputs``: as for :class:`MemoryModel`."""
    model = MemoryModel(model_or_config, sp_size, dtype, checkpointing, fsdp=fsdp, device=device, mesh=mesh,
                        inputs=inputs)
    shards = state_shards or sp_size
    if fsdp > 1:
        zero_stage, shards = 3, fsdp

    def fits(n: int) -> bool:
        est = model.estimate(n * granularity)
        if verbose:
            print(f"[autosp] max_context: {est.row()}, total "
                  f"{est.total_bytes(zero_stage, shards) / GiB:.1f} GiB", flush=True)
        return est.total_bytes(zero_stage, shards) <= budget_bytes

    return longest_fit(fits, granularity, limit)


def longest_fit(fits, granularity: int, limit: int = 1 << 26, start: int = 1) -> int:
    """The largest ``n * granularity`` <= ``limit`` with ``fits(n)`` (``fits`` monotone:
    true up to some n, false after): doubling from ``start``, then bisection; 0 if none."""
    lo, hi = 0, start
    while hi * granularity <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit // granularity + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo * granularity
