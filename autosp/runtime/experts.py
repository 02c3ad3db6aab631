"""Mixture-of-experts layers as Hugging Face transformers ships them: one op with stated semantics.

transformers (5.x) runs a MoE layer's experts through an *experts implementation*
(``grouped_mm`` by default, ``batched_mm``, ``eager``; ``config._experts_implementation``),
called as ``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``.
Each implementation sorts the tokens by expert, counts them (``histc``), runs grouped
matmuls and scatters the rows back, or loops over the experts hit: steps that, read op
by op, mix the tokens (a sort over them) although the whole computes each token's output
from that token's row alone.

autosp does not guess that from the ops. It states it: while the model is exported, each
experts module is called through one op, ``autosp::token_experts(inputs, weights, path)``,
whose semantics are **row-wise over the leading (token) dim of its inputs**: output row t
is a function of row t of every input and of the weights only. The layout rules shard it
like any token-wise op (no dim argument, the length kept), so each rank runs the experts
on its own tokens. In the emitted program the op calls the module's own implementation
again (:func:`bind_token_ops`), through ``functional_call`` with the program's parameter
values, so autograd and the gradient synchronisation see the weights as every other
parameter. ``python_tests/e2e/test_moe.py`` checks the stated semantics against every
implementation on random inputs (rows computed in any split equal the rows computed
whole).

Which modules: those transformers' ``use_experts_implementation`` built (they have
``_is_expert_parallel`` and a ``config._experts_implementation``), called with tensors
only, expert parallelism off. Anything else is exported as it is, and the layout rules
judge its ops.
"""
from __future__ import annotations

import contextlib
import functools
import sys

import torch

OP_NAME = "torch.autosp.token_experts"  # as it imports (a torch.operator), see the frontend


@torch.library.custom_op("autosp::token_experts", mutates_args=())
def token_experts(inputs: list[torch.Tensor], weights: list[torch.Tensor], path: str) -> torch.Tensor:
    """Stand-in for the experts module at ``path`` during export; the emitted program binds
    it to the module (:func:`bind_token_ops`). Called directly, it has no module to run."""
    raise RuntimeError(f"autosp::token_experts ('{path}') runs only inside a program autosp emitted")


@token_experts.register_fake
def _(inputs, weights, path):
    return inputs[0].new_empty(inputs[0].shape)


def is_experts_module(module: torch.nn.Module) -> bool:
    """A transformers experts module (built by ``use_experts_implementation``), not under
    expert parallelism, or torchtitan's routed experts (:func:`is_titan_routed_experts`)."""
    config = getattr(module, "config", None)
    return (hasattr(module, "_is_expert_parallel") and not module._is_expert_parallel
            and getattr(config, "_experts_implementation", None) is not None) or is_titan_routed_experts(module)


def is_titan_routed_experts(module: torch.nn.Module) -> bool:
    """torchtitan's ``RoutedExperts`` with a local token dispatcher (no expert-parallel mesh):
    ``forward(x [B, L, D], scores [B, L, K], expert ids [B, L, K], tokens per expert [E])``
    sorts the tokens by expert (``sort.stable``), runs grouped matmuls and scatters the rows
    back: output row t depends on row t of x, scores and ids only. The tokens-per-expert
    counts only group the sorted rows; the stated op recomputes them from the ids it gets
    (:class:`TokenExperts`), so each rank's call counts its own tokens."""
    moe = sys.modules.get("torchtitan.models.common.moe")
    dispatch = sys.modules.get("torchtitan.models.common.token_dispatcher")
    if moe is None or dispatch is None or not isinstance(module, moe.RoutedExperts):
        return False
    dispatcher = module.token_dispatcher
    return isinstance(dispatcher, dispatch.LocalTokenDispatcher) and getattr(dispatcher, "ep_mesh", None) is None


@contextlib.contextmanager
def experts_as_token_ops(model: torch.nn.Module):
    """While exporting: each experts module of ``model`` calls :func:`token_experts` (its
    instance ``forward`` replaced, the class untouched; restored on exit)."""
    patched = []
    for path, module in model.named_modules():
        if not is_experts_module(module):
            continue
        names = [n for n, _ in module.named_parameters()]
        original = module.forward

        def forward(*args, _names=names, _module=module, _path=path, _original=original, **kwargs):
            if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
                return _original(*args, **kwargs)
            # (by attribute: inside FSDP2's forward its unsharded weights are plain tensors, not Parameters)
            weights = [functools.reduce(getattr, n.split("."), _module) for n in _names]
            if is_titan_routed_experts(_module):  # [B, L, ...] rows as tokens; the counts recomputed
                x, scores, ids = args[:3]
                b, length, d = x.shape
                rows = [x.reshape(b * length, d), scores.reshape(b * length, -1), ids.reshape(b * length, -1)]
                return torch.ops.autosp.token_experts(rows, weights, _path).view(b, length, d)
            return torch.ops.autosp.token_experts(list(args), weights, _path)
        module.forward = forward
        patched.append(module)
    try:
        yield len(patched)
    finally:
        for module in patched:
            del module.forward  # the class's forward again


class TokenExperts(torch.nn.Module):
    """The emitted program's call of one experts module: its own implementation on the
    rank's tokens, with the weights the program passes (``functional_call``)."""

    def __init__(self, module: torch.nn.Module, path: str):
        super().__init__()
        self.module_ref = [module]  # not a submodule: its parameters are the model's
        self.path = path
        self.names = [n for n, _ in module.named_parameters()]

    def forward(self, inputs, weights):
        from autosp.ir.diagnostics import AutospError
        module = self.module_ref[0]
        args = tuple(inputs)
        if is_titan_routed_experts(module):  # torchtitan's call: [1, T, ...] and this rank's counts
            x, scores, ids = inputs
            counts = torch.bincount(ids.reshape(-1), minlength=module.inner_experts.num_experts)
            args = (x.unsqueeze(0), scores.unsqueeze(0), ids.unsqueeze(0), counts)
        out = torch.func.functional_call(module, dict(zip(self.names, weights)), args, strict=True)
        if is_titan_routed_experts(module) and isinstance(out, torch.Tensor):
            out = out.reshape(inputs[0].shape)
        if not isinstance(out, torch.Tensor) or out.shape != inputs[0].shape:
            raise AutospError(f"the experts module '{self.path}' returned {type(out).__name__} "
                              f"{tuple(getattr(out, 'shape', ()))}, not a tensor shaped like its input "
                              f"{tuple(inputs[0].shape)}: autosp's token_experts op cannot stand for it")
        return out


def bind_token_ops(gm: torch.fx.GraphModule, model: torch.nn.Module) -> int:
    """Rewrite each ``autosp::token_experts`` call of ``gm`` into a call of a
    :class:`TokenExperts` bound to ``model``'s module at its path. Returns how many."""
    target = torch.ops.autosp.token_experts.default
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not target:
            continue
        inputs, weights, path = node.args
        name = f"_autosp_experts{count}"
        gm.add_submodule(name, TokenExperts(model.get_submodule(path), path))
        with gm.graph.inserting_before(node):
            call = gm.graph.call_module(name, (inputs, weights))
        call.meta.update(node.meta)
        node.replace_all_uses_with(call)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.recompile()
    return count
