"""Parameters sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``), used by a
compiled program.

FSDP2 keeps each parameter as a DTensor sharded on dim 0 over its mesh, and unshards it in
forward hooks on the modules. A compiled program never calls the user's modules, so it
gathers the shards itself: :class:`GatherShard` all-gathers a parameter's local shard
(padded to equal rows, as FSDP2 does) and its backward reduce-scatters the gradient. The
reduce-scatter sums over every rank of the FSDP mesh, which includes the sequence-parallel
ranks, so it also performs the SP gradient sum (these parameters get no separate
all-reduce); with data-parallel replicas in the mesh the sum is scaled to their mean.
Autograd hands the gradient of ``p.to_local()`` back as a DTensor with ``p``'s
placements, so ``p.grad``, the optimizer and ``torch.distributed.checkpoint`` see what
they see under plain FSDP2.

One layer at a time. :func:`param_groups` finds the parameters each ``fully_shard``-ed
module manages (FSDP2's unit); :func:`insert_unshard_points` puts one :func:`unshard` node
per group into the emitted graph, just before the group's first use. Per call, an
:class:`Unsharder` runs them:

* **forward**: the node waits for its group's all-gather (one collective for the whole
  group) and, before handing the parameters to the layer, issues the *next* group's
  all-gather asynchronously (prefetch: it runs while this layer computes). A layer's
  unsharded parameters are referenced only by the graph until their last use;
* what autograd would save of them (a weight for its matmul's backward) is saved as a
  token (``saved_tensors_hooks``), so they are freed after the layer's forward;
* **backward**: the first token of a group to be unpacked all-gathers the group again and
  issues the all-gather of the group before it (prefetch, in backward order); the group's
  gradients are reduce-scattered in one collective when autograd has all of them, and its
  re-gathered parameters are dropped there.

So per layer: one all-gather in forward, one in backward, one reduce-scatter; at most the
root's group and two layers' groups are unsharded at once. Scope: a 1-D FSDP mesh spanning
the whole world, ``Shard(0)`` placements. Under a whole-graph ``torch.compile`` backend
(no nodes of ours in the graph) every sharded parameter is gathered when the call starts
(:func:`gather`).

Mixed precision, as FSDP2's ``MixedPrecisionPolicy`` does it (per ``fully_shard``-ed
module; policies may differ between modules). The program is the one FSDP2 eager runs:
export traces each sharded parameter at its module's ``param_dtype`` (:func:`stand_ins`,
from :func:`precisions`), and each ``fully_shard``-ed module's forward casts its floating
inputs to ``param_dtype`` (``cast_forward_inputs``) and its floating outputs to
``output_dtype``, FSDP2's own hooks replaced while tracing by hooks that do only these casts
(:func:`hooks_detached`), so the casts are ops of the program. At run time the all-gather
casts each fp32 shard to ``param_dtype`` first (it moves ``param_dtype`` bytes), and the
backward casts the gradient to ``reduce_dtype`` (else it stays in ``param_dtype``, as
FSDP2's) before the reduce-scatter, and the reduced rows to the shard's dtype: ``p.grad``
is in the parameter's dtype (fp32 masters, fp32 gradients). Refused by name
(:func:`check_policies`): ``CPUOffloadPolicy``. The memory model's simulated FSDP2
(:class:`SimulatedUnsharder`) sees no policy: it gathers in the parameters' dtype.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from autosp.runtime.grad_sync import insert_before_first_use

try:
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # a torch without DTensor: nothing is ever sharded
    DTensor = ()  # type: ignore[assignment,misc]
    Shard = None  # type: ignore[assignment,misc]


def is_sharded(t: object) -> bool:
    """Whether ``t`` is a DTensor (an FSDP2 parameter)."""
    return isinstance(t, DTensor)


def check_supported(name: str, p) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``p`` is sharded as this module supports."""
    mesh = p.device_mesh
    if mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        raise ValueError(f"parameter '{name}' is a DTensor with placements {tuple(p.placements)} on a "
                         f"{mesh.ndim}-D mesh; autosp supports FSDP2's Shard(0) on a 1-D mesh")
    if mesh.size() != dist.get_world_size():
        raise ValueError(f"parameter '{name}' is sharded over {mesh.size()} of {dist.get_world_size()} ranks; "
                         "autosp supports FSDP over the whole world (the default of fully_shard)")


@dataclass(frozen=True)
class Precision:
    """How FSDP2's ``MixedPrecisionPolicy`` moves one sharded parameter: unsharded (and
    computed with) in ``param_dtype``, its gradient reduce-scattered in ``reduce_dtype``."""
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype


def _fsdp_states(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, Any]]:
    """(name, module, FSDP2 state) of each ``fully_shard``-ed module of ``model``."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:
        return
    for name, module in model.named_modules():
        state = _get_module_fsdp_state(module)
        if state is not None:
            yield name, module, state


def _param_groups_of(state) -> list:
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


def precisions(model: torch.nn.Module) -> dict[str, Precision]:
    """Each sharded parameter's :class:`Precision` under its ``fully_shard`` module's
    ``mp_policy``, by name: FSDP2's rule (``FSDPParam.init_dtype_attrs``). ``param_dtype``
    applies to floating parameters of another dtype; the gradient is reduced in
    ``reduce_dtype``, else in the dtype it is computed in. Parameters no policy changes
    are left out (gathered and reduced in their own dtype)."""
    by_id = {}
    for _, _, state in _fsdp_states(model):
        for group in _param_groups_of(state):
            policy = group.mp_policy
            for fp in group.fsdp_params:
                p = fp.sharded_param
                param = policy.param_dtype if policy.param_dtype is not None and p.dtype.is_floating_point \
                    else p.dtype
                reduce = policy.reduce_dtype if policy.reduce_dtype is not None and p.dtype.is_floating_point \
                    else param
                if (param, reduce) != (p.dtype, p.dtype):
                    by_id[id(p)] = Precision(param, reduce)
    return {name: by_id[id(p)] for name, p in model.named_parameters() if id(p) in by_id}


def check_policies(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming the module for an FSDP2 policy autosp does not honour:
    ``CPUOffloadPolicy`` (the shards and their gradients on the host, moved by FSDP2's
    hooks, which a compiled program never calls)."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy
    except ImportError:
        return
    for name, _, state in _fsdp_states(model):
        for group in _param_groups_of(state):
            if isinstance(group.offload_policy, CPUOffloadPolicy):
                raise ValueError(f"fully_shard(..., offload_policy=CPUOffloadPolicy()) on module '{name or '<root>'}': "
                                 "autosp does not offload FSDP2 shards to the host (the compiled program never "
                                 "runs FSDP2's hooks that move them); use fully_shard without offload_policy")


class OutsideCalls:
    """FSDP2's own divide factor while a compiled call's modules may be called outside it,
    and the user's again for the plain model.

    The compiled call gathers and reduces the shards itself; FSDP2's hooks still run where
    the user calls a sharded module outside it (torchtitan's chunked loss calls ``lm_head``).
    Each rank's gradient there is its share of its replica's batch, so the sum over the world
    must be divided by the number of ``replicas``, where FSDP2's default divides by the
    world size (every sequence rank counted as a replica). :meth:`compiled` sets that factor
    (a factor the user set, torchtitan's 1.0, is kept; the calls scale by it too:
    :attr:`scale`), at each compiled call; :meth:`plain` puts the user's back when the plain
    model is called, whose ranks then hold whole losses of one batch, as FSDP2 assumes.
    Groups whose user factors disagree are refused (ValueError). On gloo, which has no
    PREMUL_SUM, the factor's reduction is a sum divided after."""

    def __init__(self, model: torch.nn.Module, replicas: int):
        self.groups = [g for _, _, state in _fsdp_states(model) for g in _param_groups_of(state)]
        self.saved = [(g.gradient_divide_factor, g.force_sum_reduction_for_comms) for g in self.groups]
        user = {float(f) for f, _ in self.saved if f is not None}
        if len(user) > 1:
            raise ValueError(f"the fully_shard groups set different gradient divide factors {sorted(user)}; "
                             "autosp reduces every group alike (set_gradient_divide_factor on all of them)")
        self.factor = user.pop() if user else float(replicas)
        self.scale = 1.0 / self.factor
        self.gloo = dist.is_initialized() and dist.get_backend() == "gloo"

    def compiled(self) -> None:
        for g in self.groups:
            g.gradient_divide_factor = self.factor
            g.force_sum_reduction_for_comms = g.force_sum_reduction_for_comms or self.gloo

    def plain(self) -> None:
        for g, (factor, force_sum) in zip(self.groups, self.saved):
            g.gradient_divide_factor, g.force_sum_reduction_for_comms = factor, force_sum


def init_root(model: torch.nn.Module) -> None:
    """FSDP2's lazy initialisation from ``model``, the root (FSDP2 does it at the root's first
    forward, which the compiled call replaces; a group of several modules,
    ``fully_shard([norm, lm_head])``, called outside otherwise finds no single root):
    at the first compiled call, when a model built on the meta device has its weights."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state
    except ImportError:
        return
    for module in model.modules():  # the outermost fully_shard-ed module (autosp.titan wraps the model)
        root = _get_module_fsdp_state(module)
        if root is not None:
            root._lazy_init()
            return


def stand_ins(state: list, dtypes: list | None = None) -> list:
    """What export traces in place of ``state``: each sharded parameter becomes a fake
    tensor (``FakeTensorMode``: shape, dtype and device, no storage) of its global shape on
    its shard's device, in ``dtypes[i]`` where given (its ``param_dtype``: the program
    computes with the unsharded parameters FSDP2's mixed precision makes); other tensors are
    passed as they are (export fakifies its inputs itself, without copying them). So
    compiling allocates nothing that grows with the model: no rank ever holds a whole
    parameter at compile time (a 70B model's 140 GB in bf16 would not fit any GPU). The
    program only needs shapes and dtypes; values are never read."""
    if not any(is_sharded(t) for t in state):
        return list(state)
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    out = []
    for i, t in enumerate(state):
        if is_sharded(t):
            dtype = dtypes[i] if dtypes is not None and dtypes[i] is not None else t.dtype
            with mode:
                t = torch.empty(t.shape, dtype=dtype, device=t.to_local().device)
        out.append(t)
    return out


def compute_dtypes(model: torch.nn.Module, names: list[str]) -> list:
    """For :func:`stand_ins`: the ``param_dtype`` of each named parameter its policy casts
    (None for the others)."""
    table = precisions(model)
    return [table[n].param_dtype if n in table else None for n in names]


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def _wraps(fn, target) -> bool:
    """Whether hook ``fn`` is ``target`` (a bound method) or wraps it (``functools.wraps``)."""
    while fn is not None:
        if fn == target:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def _cast_floating(dtype: torch.dtype, tree):
    """``tree`` with each floating-point tensor cast to ``dtype`` (FSDP2's ``_cast_fp_tensor``)."""
    from torch.utils import _pytree as pytree
    return pytree.tree_map_only(torch.Tensor, lambda x: x.to(dtype) if x.is_floating_point() and x.dtype != dtype
                                else x, tree)


@contextlib.contextmanager
def hooks_detached(model: torch.nn.Module) -> Iterator[None]:
    """FSDP2's forward hooks taken off ``model``'s modules while it is traced (they would
    all-gather real shards inside torch.export), and put back as they were. What they do
    to the values is kept: a hook in the same place casts the module's floating inputs to
    its ``param_dtype`` (``cast_forward_inputs``) and its floating outputs to
    ``output_dtype``, as FSDP2's do, so those casts are traced into the program."""
    saved = []
    for _, module, state in _fsdp_states(model):
        for attr in _HOOK_DICTS:
            hooks = getattr(module, attr, None)
            if hooks is not None:
                saved.append((hooks, dict(hooks)))
        policy = state._mp_policy
        cast_in = policy.param_dtype if policy.cast_forward_inputs else None
        cast_out = policy.output_dtype

        def pre(module, args, kwargs, dtype=cast_in):
            return _cast_floating(dtype, (args, kwargs)) if dtype is not None else (args, kwargs)

        def post(module, args, output, dtype=cast_out):
            return _cast_floating(dtype, output) if dtype is not None else output

        for key, fn in list(module._forward_pre_hooks.items()):
            if _wraps(fn, state._pre_forward):
                if cast_in is not None:
                    module._forward_pre_hooks[key] = pre  # same place, with kwargs, as FSDP2's
                else:
                    module._forward_pre_hooks.pop(key)
                    module._forward_pre_hooks_with_kwargs.pop(key, None)
        for key, fn in list(module._forward_hooks.items()):
            if _wraps(fn, state._post_forward):
                module._forward_hooks_with_kwargs.pop(key, None)  # (FSDP2's take none; ours neither)
                if cast_out is not None:
                    module._forward_hooks[key] = post
                else:
                    module._forward_hooks.pop(key)
                    module._forward_hooks_always_called.pop(key, None)
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.clear()
            hooks.update(items)


class GatherShard(torch.autograd.Function):
    """``local`` (this rank's rows of a dim-0-sharded tensor of ``rows`` rows) -> the whole
    tensor in ``precision.param_dtype``, by one all-gather over ``group``; backward: one
    reduce-scatter (sum, in ``precision.reduce_dtype``) of the gradient, times ``scale``,
    and this rank's rows of it in ``local``'s dtype. ``precision`` None: ``local``'s dtype."""

    @staticmethod
    def forward(ctx, local, rows: int, group, scale: float, precision=None):
        n = dist.get_world_size(group)
        per = -(-rows // n)  # rows per rank, padded (torch.chunk's split, as FSDP2's)
        ctx.group, ctx.rows, ctx.per, ctx.local_rows, ctx.scale = group, rows, per, local.shape[0], scale
        ctx.dtype, ctx.reduce_dtype = local.dtype, precision.reduce_dtype if precision is not None else None
        padded = local.new_zeros((per, *local.shape[1:]), dtype=precision.param_dtype if precision else None)
        padded[: local.shape[0]] = local  # (cast to param_dtype before the all-gather, as FSDP2)
        full = padded.new_empty((per * n, *local.shape[1:]))
        dist.all_gather_single(full, padded, group=group)
        return full[:rows]

    @staticmethod
    def backward(ctx, grad):
        n = dist.get_world_size(ctx.group)
        padded = grad.new_zeros((ctx.per * n, *grad.shape[1:]), dtype=ctx.reduce_dtype)
        padded[: ctx.rows] = grad
        mine = padded.new_empty((ctx.per, *grad.shape[1:]))
        dist.reduce_scatter_single(mine, padded, group=ctx.group)
        if ctx.scale != 1.0:
            mine = mine * ctx.scale
        return mine[: ctx.local_rows].to(ctx.dtype), None, None, None, None


def gather(p, scale: float, precision: Precision | None = None) -> torch.Tensor:
    """The whole of sharded parameter ``p`` (in ``precision.param_dtype``) as a plain tensor
    whose gradient flows back to ``p`` (a DTensor gradient with ``p``'s placements and
    dtype) through a reduce-scatter (in ``precision.reduce_dtype``)."""
    return GatherShard.apply(p.to_local(), p.shape[0], p.device_mesh.get_group(), scale, precision)


# ---------------------------------------------------------------------------- per layer
def param_groups(model: torch.nn.Module) -> list[list[str]]:
    """The names of the sharded parameters each ``fully_shard``-ed module manages: a
    module's own parameters and those of its submodules that are not sharded on their own
    (FSDP2's rule). One group per module and dtype (a group is gathered in one
    collective); modules in ``model.modules()`` order."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return []
    owner: dict[str, str] = {}
    roots = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    for prefix in sorted(roots, key=lambda n: n.count(".") + (n != "")):  # shallow first: depth
        module = model.get_submodule(prefix) if prefix else model
        for name, p in module.named_parameters(prefix=prefix):
            if is_sharded(p):
                owner[name] = prefix  # deeper modules come later and take their own
    groups: dict[tuple[str, torch.dtype], list[str]] = {}
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    for name in (n for n, _ in model.named_parameters()):
        if name in owner:
            groups.setdefault((owner[name], dtypes[name]), []).append(name)
    order = {name: i for i, name in enumerate(roots)}
    return [names for (prefix, _), names in sorted(groups.items(), key=lambda kv: order[kv[0][0]])]


def recipe_groups(model: torch.nn.Module) -> list[list[str]]:
    """The groups :func:`param_groups` would find after the FSDP2 recipe (``fully_shard``
    on each layer, then on the root), for an unsharded model (the memory model): each
    element of the model's largest ``ModuleList`` is a layer."""
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return [[n for n, _ in model.named_parameters()]]
    prefix, layers = max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))
    owner = {}
    for i in range(len(layers)):
        for name, _ in layers[i].named_parameters(prefix=f"{prefix}.{i}"):
            owner[name] = i + 1
    groups: list[list[str]] = [[] for _ in range(len(layers) + 1)]
    for name, _ in model.named_parameters():
        groups[owner.get(name, 0)].append(name)
    return [g for g in groups if g]


_TAG = "_autosp_unshard"  # attribute on the local shards a call passes: (Unsharder, group index)


class _Layout:
    """Where each parameter of a group sits in the group's flat all-gather buffer: every
    rank contributes ``per`` rows of each parameter (its shard, zero-padded)."""

    def __init__(self, params: list, n: int, precision: Precision | None = None):
        self.rows = [p.shape[0] for p in params]
        self.rest = [tuple(p.shape[1:]) for p in params]
        self.per = [-(-r // n) for r in self.rows]  # torch.chunk's split, as FSDP2's
        self.sizes = [per * math.prod(rest) for per, rest in zip(self.per, self.rest)]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(params))]
        self.total = sum(self.sizes)
        self.dtype = precision.param_dtype if precision is not None else params[0].dtype  # the gather's
        self.reduce_dtype = precision.reduce_dtype if precision is not None else self.dtype
        self.bytes = self.total * n * self.dtype.itemsize


class _Token:
    """What autograd keeps instead of (a view of) an unsharded parameter."""
    __slots__ = ("k", "i", "size", "stride", "offset")

    def __init__(self, k: int, i: int, t: torch.Tensor):
        self.k, self.i = k, i
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()


class Unsharder:
    """One compiled call's FSDP2 parameter groups (``groups``: DTensors per group, in the
    order the program first uses them): the gathers, prefetches and reduce-scatters of
    the module docstring. ``locals`` (the local shards, tagged for :func:`unshard`) is what
    the call passes to the program in their place. ``precisions``: per group, its
    :class:`Precision` (FSDP2's mixed precision) or None. ``log`` records each collective
    (``("all_gather"|"reduce_scatter"|"use", "forward"|"backward", k)``, ``use``: the
    group handed to its layer), ``traffic`` each collective's dtype and the bytes of its
    whole buffer, every rank's rows (``(op, phase, k, dtype, bytes)``), and
    ``max_unsharded`` the most groups unsharded at once."""

    def __init__(self, groups: list[list], scale: float, prefetch: bool = True, order: list[int] | None = None,
                 precisions: list | None = None):
        self.group = groups[0][0].device_mesh.get_group()
        self._setup(groups, dist.get_world_size(self.group), [[p.to_local() for p in g] for g in groups],
                    scale, prefetch, order, precisions)

    def _setup(self, groups, n, shards, scale, prefetch, order, precisions=None) -> None:
        self.order = list(order) if order is not None else list(range(len(groups)))  # the program's call order
        self.taken: set[int] = set()
        self.n = n
        self.scale, self.prefetch = scale, prefetch
        self.locals = shards
        for k, shards in enumerate(self.locals):
            for t in shards:
                setattr(t, _TAG, (self, k))
        precisions = precisions or [None] * len(groups)
        self.layouts = [_Layout(g, self.n, pr) for g, pr in zip(groups, precisions)]
        self.pending: dict[tuple[str, int], tuple] = {}
        self.backward_roots: dict[int, list[torch.Tensor]] = {}
        self.forward_roots: dict[int, list] = {}  # weak references: alive while the graph holds them
        self.registry: dict[int, tuple] = {}  # storage address -> (weakref to the root, k, i)
        self.saved: dict[int, int] = {}  # tokens per group
        self.reduced: set[int] = set()
        self.log: list[tuple[str, str, int]] = []
        self.traffic: list[tuple[str, str, int, torch.dtype, int]] = []
        self.max_unsharded = 0

    # ---------------------------------------------------------------- collectives
    def _issue(self, k: int, phase: str) -> None:
        lay, shards = self.layouts[k], self.locals[k]
        device = shards[0].device
        send = torch.empty(lay.total, dtype=lay.dtype, device=device)
        for t, off, per, size in zip(shards, lay.offsets, lay.per, lay.sizes):
            mine = send[off:off + size].view(per, -1)
            mine[: t.shape[0]].copy_(t.detach().reshape(t.shape[0], -1))
            mine[t.shape[0]:].zero_()
        out = torch.empty(lay.total * self.n, dtype=lay.dtype, device=device)
        work = self._all_gather(out, send)
        self.pending[(phase, k)] = (work, out)
        self.log.append(("all_gather", phase, k))
        self.traffic.append(("all_gather", phase, k, out.dtype, out.numel() * out.element_size()))

    def _wait(self, k: int, phase: str) -> list[torch.Tensor]:
        """Group ``k``'s parameters, each as a whole padded tensor of its own (a root)."""
        if (phase, k) not in self.pending:
            self._issue(k, phase)
        work, out = self.pending.pop((phase, k))
        if work is not None:
            work.wait()
        lay = self.layouts[k]
        out = out.view(self.n, lay.total)
        roots = []
        for off, per, size, rest in zip(lay.offsets, lay.per, lay.sizes, lay.rest):
            root = out.new_empty((self.n * per, *rest))
            root.view(self.n, size).copy_(out[:, off:off + size])
            roots.append(root)
        return roots

    def _count_unsharded(self) -> None:
        alive = {k for k, refs in self.forward_roots.items() if any(r() is not None for r in refs)}
        self.max_unsharded = max(self.max_unsharded, len(alive | set(self.backward_roots)))

    def forward_gather(self, k: int) -> list[torch.Tensor]:
        """Group ``k`` unsharded for its layer's forward (after issuing group ``k + 1``'s)."""
        roots = self._wait(k, "forward")
        self.taken.add(k)
        later = [j for j in self.order[self.order.index(k) + 1:] if j not in self.taken]
        if self.prefetch and later and ("forward", later[0]) not in self.pending:
            self._issue(later[0], "forward")
        self.forward_roots[k] = [weakref.ref(r) for r in roots]
        for i, r in enumerate(roots):
            self.registry[_storage(r)] = (weakref.ref(r), k, i)
        self._count_unsharded()
        self.log.append(("use", "forward", k))
        return [r if r.shape[0] == rows else r[:rows] for r, rows in zip(roots, self.layouts[k].rows)]

    def _backward_roots(self, k: int) -> list[torch.Tensor]:
        roots = self.backward_roots.get(k)
        if roots is None:
            roots = self.backward_roots[k] = self._wait(k, "backward")
            self.log.append(("use", "backward", k))
            self._count_unsharded()
            before = [j for j in self.order[: self.order.index(k)] if self.saved.get(j) and j not in self.reduced
                      and j not in self.backward_roots and ("backward", j) not in self.pending]
            if self.prefetch and before:
                self._issue(before[-1], "backward")
        return roots

    def reduce_scatter(self, k: int, grads) -> list:
        """This rank's rows of the sum over the FSDP mesh of group ``k``'s gradients
        (times ``scale``), in one collective; group ``k`` is resharded."""
        self.reduced.add(k)
        self.backward_roots.pop(k, None)
        if ("backward", k) in self.pending:  # prefetched, then not needed
            work = self.pending.pop(("backward", k))[0]
            if work is not None:
                work.wait()
        lay, shards = self.layouts[k], self.locals[k]
        # Every rank joins (another rank may have gradients where this one has none), and
        # every shard gets its reduced rows: zeros here, the others' sum there.
        send = torch.zeros((self.n, lay.total), dtype=lay.reduce_dtype, device=shards[0].device)
        for g, off, per, size, rows in zip(grads, lay.offsets, lay.per, lay.sizes, lay.rows):
            if g is None:
                continue
            flat = g.reshape(-1)
            whole = rows // per if per else 0  # ranks whose rows are all real
            send[:whole, off:off + size].copy_(flat[: whole * size].view(whole, size))
            if whole < self.n and rows > whole * per:
                rem = flat[whole * size:]
                send[whole, off:off + rem.numel()].copy_(rem)
        mine = send.new_empty(lay.total)
        self._reduce_scatter(mine, send.view(-1))
        self.log.append(("reduce_scatter", "backward", k))
        self.traffic.append(("reduce_scatter", "backward", k, send.dtype, send.numel() * send.element_size()))
        if self.scale != 1.0:
            mine.mul_(self.scale)
        # In each shard's own dtype (fp32 masters get fp32 gradients), as FSDP2's.
        return [mine[off:off + size].view(per, *rest)[: t.shape[0]].to(t.dtype)
                for t, off, per, size, rest in zip(shards, lay.offsets, lay.per, lay.sizes, lay.rest)]

    def _all_gather(self, out: torch.Tensor, send: torch.Tensor):
        return dist.all_gather_single(out, send, group=self.group, async_op=True)

    def _reduce_scatter(self, out: torch.Tensor, send: torch.Tensor) -> None:
        dist.reduce_scatter_single(out, send, group=self.group)

    # ---------------------------------------------------------------- saved tensors
    @contextlib.contextmanager
    def saving_tokens(self) -> Iterator[None]:
        """Within: autograd saves an unsharded parameter (or a view of one) as a token and
        gathers it again when backward unpacks it. Other tensors go to the hooks that were
        active before (e.g. :class:`autosp.planning.memory.SavedTensors`), if any."""
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)

        def pack(t: torch.Tensor):
            entry = self.registry.get(_storage(t))
            if entry is not None:
                root = entry[0]()
                # A dead root never matches: its storage's address may since be another's.
                if root is not None and _storage(root) == _storage(t):
                    self.saved[entry[1]] = self.saved.get(entry[1], 0) + 1
                    return _Token(entry[1], entry[2], t)
            return ("outer", outer[0](t)) if outer is not None else t

        def unpack(x):
            if isinstance(x, _Token):
                return self._backward_roots(x.k)[x.i].as_strided(x.size, x.stride, x.offset)
            if outer is not None:
                return outer[1](x[1])
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield


class SimulatedUnsharder(Unsharder):
    """An :class:`Unsharder` without collectives, for the memory model: ``groups`` are the
    whole (meta) parameters and ``shards`` stand for one rank's local shards
    (:meth:`local_shards`, made once, outside the memory counters); every buffer the real
    one allocates is allocated, nothing is communicated."""

    def __init__(self, groups: list[list], n: int, shards: list[list], prefetch: bool = True,
                 order: list[int] | None = None):
        self.group = None
        self._setup(groups, n, shards, 1.0, prefetch, order)

    @staticmethod
    def local_shards(groups: list[list], n: int) -> list[list[torch.Tensor]]:
        """Tensors of the first rank's shard shapes (the largest), leaves like parameters."""
        return [[torch.empty((min(-(-p.shape[0] // n), p.shape[0]), *p.shape[1:]), dtype=p.dtype, device=p.device)
                 .requires_grad_(p.requires_grad) for p in g] for g in groups]

    def _all_gather(self, out, send):
        return None

    def _reduce_scatter(self, out, send) -> None:
        pass


def _storage(t: torch.Tensor) -> int:
    """An identity of ``t``'s storage (also for meta tensors, which have no addresses)."""
    return t.untyped_storage()._cdata


class _Unshard(torch.autograd.Function):
    """Group ``k``'s local shards -> its unsharded parameters; backward: one reduce-scatter."""

    @staticmethod
    def forward(ctx, unsharder: Unsharder, k: int, *shards):
        ctx.unsharder, ctx.k = unsharder, k
        return tuple(unsharder.forward_gather(k))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.unsharder.reduce_scatter(ctx.k, grads))


def unshard(k: int, *shards):
    """A node of the emitted graph: group ``k``'s parameters, unsharded for their layer.
    Identity on tensors a call did not tag (unsharded parameters, the memory model's meta
    tensors)."""
    tag = getattr(shards[0], _TAG, None)
    if tag is None:
        return tuple(shards)
    unsharder = tag[0]
    if torch.is_grad_enabled() and any(t.requires_grad for t in shards):
        return _Unshard.apply(unsharder, k, *shards)
    return tuple(unsharder.forward_gather(k))


def insert_unshard_points(gm: torch.fx.GraphModule, groups: list[list[int]]) -> list[list[int]]:
    """Put an :func:`unshard` node for each group of placeholders (indices) just before the
    group's first use in ``gm`` (in place); returns the groups in that order, without
    placeholders the graph never reads (and without groups left empty)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    used = [[i for i in g if placeholders[i].users] for g in groups]
    used = [g for g in used if g]
    first = {tuple(g): min(order[u] for i in g for u in placeholders[i].users) for g in used}
    used.sort(key=lambda g: first[tuple(g)])
    for k, g in enumerate(used):
        insert_before_first_use(gm, g, unshard, (k,), "autosp_unshard")
    gm.graph.lint()
    gm.recompile()
    return used


def call_order(module: torch.nn.Module) -> list[int]:
    """The groups in the order ``module`` (a GraphModule, or one split into submodules by
    checkpointing) calls their :func:`unshard` nodes."""
    graph = getattr(module, "graph", None)
    if graph is None:
        inner = getattr(module, "inner", None)  # a checkpointed segment
        return call_order(inner) if inner is not None else []
    order = []
    for node in graph.nodes:
        if node.op == "call_function" and node.target is unshard:
            order.append(node.args[0])
        elif node.op == "call_module":
            order += call_order(module.get_submodule(node.target))
    return order
