"""The PyTorch-callable side of a compiled model.

:class:`CompiledProgram` is one emitted GraphModule plus how to call it: which of the
user's parameters/buffers feed which placeholder and how to rebuild the output
structure. It looks the state up by name on every call, so the user's own
``Parameter`` objects are what the graph reads and what autograd writes ``.grad`` to.

Gradient synchronisation is armed per call: given a ``GradientSync``, the call passes the
parameters through that sync's per-bucket identity functions (``grad_buckets``: argument
indices, in backward order), so only a backward through *this* call is summed over the
group; the plain model and other compiled wrappers are untouched. Parameters sharded by
FSDP2 (DTensors) are passed as their local shards and unsharded one layer at a time by
the graph's ``unshard`` nodes (``unshard_groups``), their gradients reduce-scattered
(:mod:`autosp.runtime.fsdp`); without such nodes they are all-gathered at the call.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from autosp.frontend.importer import ArgInfo
from autosp.runtime import fsdp


def state_tensors(model: torch.nn.Module, args: list[ArgInfo]) -> list[torch.Tensor]:
    """The model's current parameters and buffers, in the order of a program's ``args``."""
    table = dict(model.named_parameters())
    table.update(model.named_buffers())
    try:
        return [table[a.name] for a in args if a.kind != "input"]
    except KeyError as e:
        raise RuntimeError(f"autosp: the model no longer has parameter/buffer {e}; "
                           "recompile after changing its structure") from None


@dataclass
class CompiledProgram:
    graph_module: torch.fx.GraphModule
    args: list[ArgInfo]
    out_spec: object
    tensor_leaves: list[int]
    mlir: dict[str, str] = field(default_factory=dict)  # IR text per stage ("imported", "transformed")
    timings: dict[str, float] = field(default_factory=dict)
    runner: Callable | None = None  # what is called: the GraphModule, or a torch.compile'd version of it
    checkpointing: str = "off"  # "sac" / "full": the runner recomputes planned segments in backward
    grad_buckets: list[list[int]] = field(default_factory=list)  # parameter argument indices per bucket
    sync_points_in_graph: bool = False  # the graph starts each bucket's all-reduce (grad_sync.sync_point)
    shard_scale: float = 1.0  # FSDP2 parameters: factor on their reduce-scattered gradients (1/dp)
    precisions: dict = field(default_factory=dict)  # FSDP2 mixed precision: state index -> fsdp.Precision
    sharded_names: frozenset = frozenset()  # the parameters that were FSDP2 DTensors at compile time
    input_shapes: list | None = None  # each tensor input's compiled sizes, None at its dynamic dims
    unshard_groups: list[list[int]] = field(default_factory=list)  # state indices per unshard node, in call order
    prefetch: bool = True  # issue the next group's all-gather before the current layer runs
    unshard_order: list[int] = field(default_factory=list)  # the runner's order of calling the groups
    unsharder_factory: Callable | None = None  # (groups, order) -> an fsdp.Unsharder (default: the real one)
    simulated_shards: list = field(default_factory=list)  # a simulated FSDP2's local shards (the memory model)
    last_unsharder: object = None  # the last call's fsdp.Unsharder (its log), for tests and benchmarks
    dropped_outputs: list[int] = field(default_factory=list)  # output leaves removed by autosp-tile-loss (None)
    sharded_outputs: list[int] = field(default_factory=list)  # output leaves that are this rank's sequence shard
    buffer_writes: list[str] = field(default_factory=list)  # the leading results: new values of these buffers
    _constants_device: object = None  # where the graph's tensor literals are (_place_constants)

    def _check_sharded(self, state: list) -> None:
        for a, t in zip((a for a in self.args if a.kind != "input"), state):
            if a.name in self.sharded_names and not fsdp.is_sharded(t):
                raise RuntimeError(f"autosp: parameter '{a.name}' is no longer sharded (a plain forward of the "
                                   "FSDP2 model left it unsharded); call model.reshard() before the compiled call")

    def _gathered(self, state: list) -> list:
        """``state`` with each FSDP2 parameter all-gathered (reduce-scattered in backward)."""
        self._check_sharded(state)
        return [fsdp.gather(t, self.shard_scale, self.precisions.get(i)) if fsdp.is_sharded(t) else t
                for i, t in enumerate(state)]

    def _unsharder(self, state: list) -> tuple[list, fsdp.Unsharder]:
        """``state`` with each FSDP2 parameter's local shard, and the call's Unsharder
        (``unsharder_factory``'s, for the memory model's simulated one)."""
        groups = [[state[i] for i in g] for g in self.unshard_groups]
        if self.unsharder_factory is not None:
            unsharder = self.unsharder_factory(groups, self.unshard_order or None)
        else:
            self._check_sharded(state)
            unsharder = fsdp.Unsharder(groups, self.shard_scale, prefetch=self.prefetch,
                                       order=self.unshard_order or None,
                                       precisions=[self.precisions.get(g[0]) for g in self.unshard_groups])
        state = list(state)
        for g, shards in zip(self.unshard_groups, unsharder.locals):
            for i, t in zip(g, shards):
                state[i] = t
        return state, unsharder

    def state_tensors(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """The model's current parameters and buffers, in argument order."""
        return state_tensors(model, self.args)

    def _place_constants(self, device: torch.device) -> None:
        """Move the graph's tensor literals (``_const*`` buffers, made on the CPU when the IR
        was emitted) to ``device``, the call's: ``torch.zeros(batch)`` lifted into a literal
        (Llama 4's left padding) must sit with the activations, and so must a 0-d one for
        ops that take no CPU scalar (``polar`` of ``ones_like``, as exported). Every module that holds a copy (checkpointed segments, a compiled
        runner's original) is updated; once per device."""
        if self._constants_device == device:
            return
        from torch.utils._python_dispatch import _disable_current_modes
        holders = [self.graph_module] + ([self.runner] if isinstance(self.runner, torch.nn.Module) else [])
        with _disable_current_modes():  # program state, not the step's: no memory tracker sees the copies
            for holder in holders:
                for module in holder.modules():
                    for name, buf in list(module.named_buffers(recurse=False)):
                        if name.startswith("_const") and buf.device != device:
                            module.register_buffer(name, buf.to(device))
        self._constants_device = device

    def __call__(self, model: torch.nn.Module, leaves: list, grad_sync=None) -> object:
        inputs = [leaves[i] for i in self.tensor_leaves]
        if inputs and isinstance(inputs[0], torch.Tensor):
            self._place_constants(inputs[0].device)
        run = self.runner if self.runner is not None else self.graph_module
        state = self.state_tensors(model)
        tokens = None
        if self.unshard_groups:
            state, unsharder = self._unsharder(state)
            self.last_unsharder = unsharder
            tokens = unsharder.saving_tokens()
        elif self.sharded_names:
            state = self._gathered(state)
        if grad_sync is not None:
            state = grad_sync.arm(state, self.grad_buckets, issue_here=not self.sync_points_in_graph)
        with tokens if tokens is not None else contextlib.nullcontext():
            outputs = list(run(*state, *inputs))
        for i in self.dropped_outputs:  # the logits, with drop_logits: never computed
            outputs.insert(i, None)
        outside = grad_sync.outside if grad_sync is not None else None
        if outside is not None and self.sharded_outputs and grad_sync.active():
            outside.watch([outputs[i] for i in self.sharded_outputs])  # their loss is a share
        if self.buffer_writes:  # the forward's writes to its buffers (counters), the same on every rank
            with torch.no_grad():
                for name, value in zip(self.buffer_writes, outputs):
                    model.get_buffer(name).copy_(value)
            outputs = outputs[len(self.buffer_writes):]
        return pytree.tree_unflatten(outputs, self.out_spec)
