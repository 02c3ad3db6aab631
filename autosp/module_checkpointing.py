"""Checkpointing switched on on the user's modules, read so that the compiled program honours it.

A compiled program never calls the user's modules, so a module's own checkpointing (Hugging
Face's ``activation_checkpointing_enable()``, formerly ``gradient_checkpointing_enable()``,
which sets ``gradient_checkpointing`` on the decoder layers and wraps their calls in
``torch.utils.checkpoint``) would do nothing: torch.export traces without gradients, where
checkpointing is inert, and the program saves for backward what an unchecked model saves.
So the request is read here and becomes autosp's own checkpointing:

* every flagged layer (``every_n_layers=1``, or a flag on a module that is not a layer:
  older models check one on the stack) -> ``checkpointing="full"`` (each layer keeps its
  input; the same recomputation);
* ``every_n_layers=k`` -> a per-region plan: ``full`` for the flagged layers, ``keep`` for
  the others (one region per attention layer: :mod:`autosp.cost.plan`);
* ``offload=True`` (HF keeps the saved inputs in pinned host memory) -> ``full+offload``.

Checkpointing autosp cannot honour is an error naming the module, never a silent no-op:
``CheckpointWrapper`` modules (``checkpoint_wrapper`` / ``apply_activation_checkpointing``),
the composable ``checkpoint(module)``, and a Hugging Face checkpoint function with a
selective policy (``context_fn``) or of unknown kind.

Reads attributes only (duck typing): no import of transformers.

Example::

    >>> model.activation_checkpointing_enable()
    >>> requested_checkpointing(model)
    CheckpointRequest(layers=('full', 'full'), offload=False, source='...')
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from autosp.ir.diagnostics import AutospError

# torch.utils.checkpoint keywords that change nothing autosp's recomputation would compute
# differently (autosp's checkpointing regenerates the same values; RNG state: a dropout
# replays its draws in autosp's recompute as it does in torch's).
_HARMLESS_KWARGS = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug")


@dataclass(frozen=True)
class CheckpointRequest:
    """What the model's modules ask for. ``layers``: per checkpointable layer, in
    ``model.modules()`` order, ``"full"`` or ``"keep"`` (empty: a whole-stack flag, every
    layer); ``offload``: the kept inputs go to host memory; ``source``: what set it."""
    layers: tuple[str, ...]
    offload: bool
    source: str

    @property
    def uniform(self) -> bool:
        """Every layer checkpointed alike."""
        return not self.layers or all(x == "full" for x in self.layers)

    def region_choices(self) -> tuple[str, ...]:
        """One :class:`~autosp.cost.plan.MemoryPlan` choice per region (per layer)."""
        suffix = "+offload" if self.offload else ""
        return tuple(x + suffix if x == "full" else x for x in self.layers)

    def describe(self) -> str:
        what = ("every layer" if self.uniform else
                f"{self.layers.count('full')} of {len(self.layers)} layers")
        return f"{self.source}: full recompute of {what}{' with offload' if self.offload else ''}"


def _is_layer(module: torch.nn.Module) -> bool:
    """A Hugging Face ``GradientCheckpointingLayer`` (a decoder layer), by its class tree."""
    return any(c.__name__ == "GradientCheckpointingLayer" for c in type(module).__mro__)


def _offload_of(name: str, func) -> bool:
    """Whether Hugging Face's checkpoint function ``func`` offloads; raises for one autosp
    cannot honour."""
    inner, kwargs = func, {}
    while isinstance(inner, functools.partial):
        kwargs.update(inner.keywords or {})
        inner = inner.func
    unknown = sorted(k for k in kwargs if k not in _HARMLESS_KWARGS)
    if unknown:
        raise AutospError(
            f"module '{name}' checkpoints with {', '.join(f'{k}=' for k in unknown)} "
            "(activation_checkpointing_kwargs): autosp recomputes with its own checkpointing and cannot "
            "honour that; drop it and pass autosp.compile(..., checkpointing='sac' or 'full') for a selective or "
            "full recompute")
    if inner is torch.utils.checkpoint.checkpoint:
        return False
    code = getattr(inner, "__code__", None)
    if getattr(inner, "__qualname__", "").endswith("checkpointing_enable.<locals>.checkpoint_func") and \
            code is not None and "save_on_cpu" in code.co_names:
        return True  # transformers' offload=True: checkpoint under save_on_cpu
    raise AutospError(
        f"module '{name}' checkpoints with {getattr(inner, '__qualname__', inner)!r}, a checkpoint function "
        "autosp does not know: it cannot be honoured in the compiled program. Switch it off "
        "(activation_checkpointing_disable()) and pass autosp.compile(..., checkpointing='full')")


def _refuse_wrappers(model: torch.nn.Module) -> None:
    """Module-level checkpointing other than Hugging Face's: an error naming the module."""
    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    except ImportError:  # pragma: no cover - a torch without it has none to refuse
        CheckpointWrapper = ()  # type: ignore[assignment,misc]
    try:
        from torch.distributed._composable.contract import _get_registry
    except ImportError:  # pragma: no cover
        _get_registry = None  # type: ignore[assignment]
    for name, module in model.named_modules():
        where = f"'{name}'" if name else "the model"
        if isinstance(module, CheckpointWrapper):
            raise AutospError(
                f"module {where} is a CheckpointWrapper (checkpoint_wrapper / apply_activation_checkpointing): "
                "a compiled program never calls the module, so it would not be checkpointed. Unwrap it and pass "
                "autosp.compile(..., checkpointing='full') (or 'sac', or a memory_budget)")
        registry = _get_registry(module) if _get_registry is not None else None
        if registry and "checkpoint" in registry:
            raise AutospError(
                f"module {where} has the composable checkpoint(module) applied: a compiled program never calls the "
                "module, so it would not be checkpointed. Remove it and pass autosp.compile(..., "
                "checkpointing='full') (or 'sac', or a memory_budget)")


def requested_checkpointing(model: torch.nn.Module) -> CheckpointRequest | None:
    """The checkpointing ``model``'s modules ask for (``None``: none); raises
    :class:`AutospError` for checkpointing autosp cannot honour (see the module docstring)."""
    _refuse_wrappers(model)
    flagged = [(name or type(model).__name__, m) for name, m in model.named_modules()
               if isinstance(getattr(m, "gradient_checkpointing", None), bool)]
    layered = [(name, m) for name, m in flagged if _is_layer(m)]
    # Models with decoder layers flag each layer (every_n_layers picks some); the stack's own
    # flag is then only a switch. Older models check one flag on the stack: every layer.
    deciding = layered or flagged
    on = [(name, m) for name, m in deciding if m.gradient_checkpointing]
    if not on:
        return None
    offload = {_offload_of(name, getattr(m, "_gradient_checkpointing_func", torch.utils.checkpoint.checkpoint))
               for name, m in on}
    layers = tuple("full" if m.gradient_checkpointing else "keep" for _, m in layered)
    return CheckpointRequest(layers=layers, offload=True in offload, source="activation_checkpointing_enable()")


def request_key(model: torch.nn.Module) -> tuple:
    """The part of a program's key that module-level checkpointing sets: every
    ``gradient_checkpointing`` flag (cheap: one walk of the modules, no checks)."""
    key = []
    for m in model.modules():
        flag = getattr(m, "gradient_checkpointing", None)
        if isinstance(flag, bool):
            func = getattr(m, "_gradient_checkpointing_func", None) if flag else None
            while isinstance(func, functools.partial):
                func = func.func
            key.append((flag, getattr(func, "__qualname__", None)))
    return tuple(key)
