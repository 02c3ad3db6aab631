"""Apply a checkpoint plan (``autosp-checkpoint``) to an emitted GraphModule.

The plan marks each node with ``autosp_segment`` (recompute) or ``autosp_save`` (keep).
:func:`checkpointed_module` splits the graph into one submodule per segment and one per
kept op (``torch.fx.passes.split_module``), then wraps every segment in
:class:`Recompute`: its forward runs without building a graph and keeps only its
inputs; during backward it runs again with gradients and back-propagates through the
fresh graph (like ``torch.utils.checkpoint``'s reentrant mode, but also under
``torch.autograd.grad``). Kept ops (attention,
collectives) run as usual, so autograd saves what their backward needs and nothing
else is recomputed. Inputs go through ``ctx.save_for_backward``, so
``saved_tensors_hooks`` (and :mod:`autosp.planning.memory`) see exactly what is kept.

Example::

    >>> run = checkpointed_module(gm)        # same signature and results as gm
    >>> loss = run(*state, *inputs)[-1]; loss.backward()
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.passes.split_module import split_module
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from autosp.ir.contract import OFFLOAD_ATTR, REPLAY_ATTR, SEGMENT_ATTR, TILE_ATTR, TILES_ATTR, plan_key

# The plan's attributes, as the emitter copies them onto each op's nodes (node.meta).
_SEGMENT, _REPLAY, _OFFLOAD, _TILE, _TILES = map(plan_key, (SEGMENT_ATTR, REPLAY_ATTR, OFFLOAD_ATTR, TILE_ATTR,
                                                           TILES_ATTR))


# Fused attention kernels whose outputs a replaying segment keeps (CPU and CUDA variants).
_ATTENTION_KERNELS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
}


class _Record(TorchDispatchMode):
    """Collect the outputs of fused attention kernels, in call order."""

    def __init__(self):
        super().__init__()
        self.calls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.name in _ATTENTION_KERNELS:
            self.calls.append((func._schema.name, out))
        return out


class _Replay(TorchDispatchMode):
    """Return the recorded outputs instead of running the attention kernels again. Autograd
    (above this mode) still records each kernel's backward, with the recomputed q/k/v and
    the recorded output and log-sum-exp."""

    def __init__(self, calls):
        super().__init__()
        self.calls = list(calls)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in _ATTENTION_KERNELS and self.calls and self.calls[0][0] == func._schema.name:
            return self.calls.pop(0)[1]
        return func(*args, **(kwargs or {}))


def _differentiable_outputs(fn, requires: list[bool]) -> list[bool] | None:
    """Per output of the GraphModule ``fn``: whether it depends, through its graph (and its
    submodules' graphs), on an input that requires grad (``requires``, per placeholder) or
    on a parameter that does. An output that depends on neither (RoPE's tables, masks) is
    not differentiable: marked so, its consumers save nothing for its gradient and
    backward computes none. Sizes (``sym_size``) carry no gradient. None when ``fn`` is not
    a GraphModule."""
    inner = getattr(fn, "inner", None)  # Tiled / Recompute wrap a GraphModule
    if not isinstance(fn, torch.fx.GraphModule):
        if not isinstance(inner, torch.fx.GraphModule):
            return None
        found = _differentiable_outputs(inner, requires)
        if found is not None and any(p.requires_grad for p in fn.parameters()):
            found = [True] * len(found)
        return found
    key = tuple(requires)
    cache = fn.__dict__.setdefault("_autosp_differentiable", {})
    if key in cache:
        return cache[key]
    flags: dict[torch.fx.Node, object] = {}

    def flag(x) -> bool:
        value = flags.get(x, False) if isinstance(x, torch.fx.Node) else False
        return any(value) if isinstance(value, list) else bool(value)
    placeholders = iter(requires)
    result: list[bool] = []
    for node in fn.graph.nodes:
        if node.op == "placeholder":
            flags[node] = next(placeholders, True)
        elif node.op == "get_attr":
            value: object = fn
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            flags[node] = not isinstance(value, torch.Tensor) or value.requires_grad
        elif node.op == "call_module":
            module = fn.get_submodule(str(node.target))
            sub = _differentiable_outputs(module, [flag(a) for a in node.args])
            own = any(p.requires_grad for p in module.parameters())
            if sub is None:
                flags[node] = own or any(flag(n) for n in node.all_input_nodes)
            else:
                flags[node] = [own or d for d in sub] if _returns_tuple(module) else (own or any(sub))
        elif node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            result = [flag(o) for o in outs]
        elif node.target is operator.getitem and isinstance(flags.get(node.args[0]), list):
            flags[node] = flags[node.args[0]][node.args[1]]  # type: ignore[index]
        elif _is_size(node):
            flags[node] = False
        else:
            flags[node] = any(flag(n) for n in node.all_input_nodes)
    cache[key] = result
    return result


_SIZE_OPS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default, torch.ops.aten.sym_stride.int)


def _is_size(node: torch.fx.Node) -> bool:
    """A node whose value is a size (an int, a shape), never differentiable."""
    if node.op == "call_function":
        return node.target in _SIZE_OPS or (node.target is getattr and node.args[1:2] == ("shape",))
    return node.op == "call_method" and node.target in ("size", "dim", "numel", "stride")


def _returns_tuple(module) -> bool:
    gm = module if isinstance(module, torch.fx.GraphModule) else getattr(module, "inner", None)
    if not isinstance(gm, torch.fx.GraphModule):
        return False
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return isinstance(out.args[0], (tuple, list))


def _storage_key(t: torch.Tensor) -> int:
    """One key per storage (its implementation's address), on every device, meta included."""
    return t.untyped_storage()._cdata


class _SavedStorages:
    """While a recomputation runs: the storages autograd saves (saved-tensor hooks that
    only look). :meth:`release` then frees the data of recomputed outputs that nothing
    saved and that share no storage with the inputs: ``torch.autograd.grad`` needs an
    output's node and shape, never its values. So the recomputed layer output (as large
    as the layer input) is not held through the layer's whole backward. Where other
    saved-tensor hooks are active (a user's), or a saved tensor has no plain storage
    (a tensor subclass), nothing is released."""

    def __init__(self, inputs):
        self.keys: set[int] = {_storage_key(a) for a in inputs if isinstance(a, torch.Tensor)}
        self.unknown = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            self.keys.add(_storage_key(t))
        except (RuntimeError, NotImplementedError):  # no plain storage
            self.unknown = True
        return t

    def __enter__(self):
        self.entered = not self.unknown
        if self.entered:
            self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        if self.entered:
            self._hooks.__exit__(*exc)

    def release(self, outputs) -> None:
        if self.unknown:
            return
        for o in outputs:
            if type(o) is torch.Tensor and o.untyped_storage().nbytes() and _storage_key(o) not in self.keys:
                torch.ops.inductor.resize_storage_bytes_(o, 0)


class _RecomputeFunction(torch.autograd.Function):
    """Forward without a graph, keeping only the inputs; backward recomputes and
    differentiates. Uses ``torch.autograd.grad`` inside, so it works under both
    ``loss.backward()`` and ``torch.autograd.grad``; the RNG state is replayed."""

    @staticmethod
    def forward(ctx, fn, replay, *args):
        ctx.fn = fn
        ctx.set_materialize_grads(False)  # outputs nobody differentiates (logits) get no zeros
        ctx.is_tensor = [isinstance(a, torch.Tensor) for a in args]
        ctx.others = [None if t else a for a, t in zip(args, ctx.is_tensor)]
        ctx.requires = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
        ctx.devices = sorted({a.device.index or 0 for a in args if isinstance(a, torch.Tensor) and a.is_cuda})
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.devices]
        record = _Record() if replay else None
        if record is not None:
            with record:
                outputs = fn(*args)
        else:
            outputs = fn(*args)
        # Inputs, then what replay keeps (attention's outputs): all through save_for_backward.
        kept = [pytree.tree_flatten(out) for _, out in record.calls] if record is not None else []
        ctx.kept = [(name, spec, [None if isinstance(x, torch.Tensor) else x for x in leaves])
                    for (name, _), (leaves, spec) in zip(record.calls if record else [], kept)]
        ctx.n_inputs = sum(ctx.is_tensor)
        ctx.save_for_backward(*[a for a, t in zip(args, ctx.is_tensor) if t],
                              *[x for leaves, _ in kept for x in leaves if isinstance(x, torch.Tensor)])
        ctx.single = not isinstance(outputs, tuple)
        outputs = (outputs,) if ctx.single else outputs
        differentiable = _differentiable_outputs(fn, ctx.requires)
        if differentiable is None or len(differentiable) != len(outputs):
            differentiable = [True] * len(outputs)
        ctx.mark_non_differentiable(*[o for o, d in zip(outputs, differentiable) if isinstance(o, torch.Tensor)
                                      and not (d and (o.is_floating_point() or o.is_complex()))])
        return outputs[0] if ctx.single else outputs

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = []
        for is_tensor, other, requires in zip(ctx.is_tensor, ctx.others, ctx.requires):
            args.append(next(saved).detach().requires_grad_(requires) if is_tensor else other)
        calls = []
        for name, spec, leaves in ctx.kept:
            leaves = [next(saved) if x is None else x for x in leaves]
            calls.append((name, pytree.tree_unflatten(leaves, spec)))
        saved_storages = _SavedStorages(args + [x for _, out in calls for x in pytree.tree_leaves(out)])
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.cpu_rng)
            for d, state in zip(ctx.devices, ctx.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            with torch.enable_grad(), saved_storages:
                if calls:
                    with _Replay(calls):
                        outputs = ctx.fn(*args)
                else:
                    outputs = ctx.fn(*args)
        outputs = (outputs,) if ctx.single else outputs
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        del outputs  # recomputed outputs without a gradient (e.g. the logits) can go now
        saved_storages.release([o for o, _ in pairs])
        wanted = [a for a, r in zip(args, ctx.requires) if r]
        found_grads: tuple = (None,) * len(wanted)
        if pairs and wanted:
            found_grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        found = iter(found_grads)
        return (None, None, *[next(found) if r else None for r in ctx.requires])


class Recompute(torch.nn.Module):
    """Run ``inner`` keeping only its inputs for backward (recomputed then), when a
    gradient is needed; else just run it. With an ``offload``
    (:class:`autosp.runtime.offload.Offloader`) the kept inputs go to host memory."""

    def __init__(self, inner: torch.nn.Module, replay: bool = False, offload=None, activations=None):
        super().__init__()
        self.inner = inner
        self.replay = replay  # keep fused attention's outputs instead of recomputing attention
        self.offload = offload
        self.activations = activations  # per argument: offloaded (it has the sequence dim); None: all

    def forward(self, *args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            if self.offload is not None:
                only = None if self.activations is None else [
                    a for a, act in zip(args, self.activations) if act and isinstance(a, torch.Tensor)]
                with self.offload.hooks(only):
                    return _RecomputeFunction.apply(self.inner, self.replay, *args)
            return _RecomputeFunction.apply(self.inner, self.replay, *args)
        return self.inner(*args)


def tiled_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with each token-wise run (nodes marked ``autosp_tile`` by
    ``autosp-tile-tokens``) split into a submodule run in ``autosp_tiles`` sequence chunks
    (:class:`autosp.runtime.tiling.Tiled`); each input and output is cut along its
    ``autosp_seq_dim``. ``gm`` itself when nothing is marked."""
    from autosp.runtime.tiling import Tiled
    if not any(_TILE in n.meta for n in gm.graph.nodes):
        return gm
    keys: dict[torch.fx.Node, str] = {}
    seen: set = set()
    tiles: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        tile = node.meta.get(_TILE)
        if tile is not None:
            seen.add(tile)
            keys[node] = f"tile{tile}"
            tiles[f"submod_tile{tile}"] = node.meta[_TILES]
        else:
            keys[node] = f"rest{len(seen)}"
    split = split_module(gm, gm, lambda n: keys[n])
    for name, child in list(split.named_children()):
        if name in tiles:
            in_dims = [n.meta.get("autosp_seq_dim") for n in child.graph.nodes if n.op == "placeholder"]
            (out,) = [n for n in child.graph.nodes if n.op == "output"]
            results = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
            out_dims = [r.meta.get("autosp_seq_dim") if isinstance(r, torch.fx.Node) else None for r in results]
            setattr(split, name, Tiled(child, tiles[name], in_dims, out_dims))
    return split


def has_plan(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm``'s nodes carry a checkpoint plan."""
    return any(_SEGMENT in n.meta for n in gm.graph.nodes)


def _sync_points_before_first_use(split: torch.fx.GraphModule) -> None:
    """Move each gradient sync point's (and FSDP2 unshard point's) partition (and the ``getitem`` of its results) to
    just before its first user. split_module puts partitions that only read placeholders
    first; a sync point there would be the oldest node of the autograd graph, and the
    engine (newest ready node first) would run its backward, which starts the bucket's
    all-reduce, only when the whole backward is done."""
    # Moving a sync point (which reads only placeholders) keeps every other node's order.
    order = {n: i for i, n in enumerate(split.graph.nodes)}
    for node in list(split.graph.nodes):
        if not (node.op == "call_module" and str(node.target).startswith("submod_sync")):
            continue
        items = [u for u in node.users if u.op == "call_function" and u.target.__name__ == "getitem"]
        readers = {r for item in items for r in item.users} | {u for u in node.users if u not in items}
        if not readers:
            continue
        first = min(readers, key=lambda n: order[n])
        first.prepend(node)
        for item in items:
            first.prepend(item)
    split.graph.lint()
    split.recompile()


def checkpointed_module(gm: torch.fx.GraphModule, compile_segment=None) -> torch.fx.GraphModule:
    """``gm`` with every planned segment recomputed in backward (see the module docstring).

    ``compile_segment`` (optional) maps each segment's GraphModule to what is called
    instead (e.g. ``torch.compile``)."""
    kept: dict[torch.fx.Node, str] = {}

    def partition(node: torch.fx.Node) -> str:
        if _SEGMENT in node.meta:
            return f"segment{node.meta[_SEGMENT]}"
        # Kept ops, and anything unplanned (getitem of a kept op's tuple), run as is.
        source = node
        if node.op == "call_function" and node.target.__name__ == "getitem" and isinstance(node.args[0], torch.fx.Node):
            source = node.args[0]
            if _SEGMENT in source.meta:
                return f"segment{source.meta[_SEGMENT]}"
        if source.meta.get("autosp_grad_sync") or source.meta.get("autosp_unshard"):  # collectives on parameters
            return kept.setdefault(source, f"sync{len(kept)}")
        return kept.setdefault(source, f"keep{len(kept)}")

    split = split_module(gm, gm, partition)
    _sync_points_before_first_use(split)
    offloader = None
    for name, child in list(split.named_children()):
        if name.startswith("submod_segment"):
            # The segment's own ops decide (split_module's placeholders carry the meta of
            # the node that produced them, in another segment).
            own = [n for n in child.graph.nodes if n.op not in ("placeholder", "output")]
            replay = any(n.meta.get(_REPLAY) for n in own)
            offload = None
            if any(n.meta.get(_OFFLOAD) for n in own):
                from autosp.runtime.offload import Offloader
                offloader = offload = offloader or Offloader()
            inner = tiled_module(child)
            inner = compile_segment(inner) if compile_segment is not None else inner
            activations = [n.meta.get("autosp_seq_dim") is not None for n in child.graph.nodes
                           if n.op == "placeholder"]
            setattr(split, name, Recompute(inner, replay, offload, activations))
    split.meta["autosp_offloader"] = offloader
    split.meta["autosp_segments"] = sum(1 for n, _ in split.named_children() if n.startswith("submod_segment"))
    return split
