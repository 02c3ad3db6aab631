"""Gradient synchronisation across the sequence-parallel group, armed by the compiled call.

Each rank back-propagates its own share of the loss (see ``collectives``), so a
parameter's full gradient is the sum of the ranks' gradients. The sum belongs to the
compiled call, not to the parameters: nothing is hooked onto the user's ``Parameter``
objects, so a backward through the plain model (or through another compiled wrapper of
the same model) is untouched.

How one call is synchronised. The parameters are grouped into buckets of about
``bucket_bytes``, in reverse order of first use (the order backward completes them).
Every compiled call passes each bucket through two identity autograd Functions:

* ``_Wait`` is applied when the call starts. Its backward node is the oldest of the call,
  so the autograd engine (which runs the newest ready node first) reaches it only when the
  model's backward has nothing left to run. It waits for the bucket's all-reduce and hands
  the reduced gradients to the parameters' ``AccumulateGrad``: ``.grad`` accumulates the
  summed gradient of *this* call only (gradient accumulation over several backward calls
  stays right), and ``torch.autograd.grad``, DDP's hooks and anything else downstream see
  reduced gradients.
* ``_Issue`` sits in the emitted graph just before the bucket's first use
  (:func:`insert_sync_points`), so its backward runs as soon as the bucket's gradients are
  complete: it flattens this call's gradients (zeros where a parameter got none) into the
  bucket's buffer and starts the all-reduce asynchronously, overlapping the rest of the
  backward. It passes no gradient on (the buffer holds them), so a gradient is held once.

Where the emitted graph has no sync points (a whole-graph ``torch.compile`` backend: the
call applies ``_Issue`` right after ``_Wait``), or where they run early in forward (with
checkpointing, ``split_module`` schedules the parameter-only partitions first), the
result is the same but the all-reduces start only when the model's backward is done.

Example::

    sync = GradientSync(model.parameters(), group=pg)    # pg: a ProcessGroup (None: world)
    state = sync.arm(program_state, buckets)             # per compiled call, see CompiledProgram
    loss.backward()                                      # .grad is the global gradient here
"""
from __future__ import annotations

import operator
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from autosp.runtime.collectives import simulating

_TAG = "_autosp_grad_bucket"  # attribute on the tensors _Wait returns: (call, bucket index)


class _SyncCall:
    """The buckets of one compiled call: their pending all-reduces and timings."""

    def __init__(self, sync: GradientSync, n_buckets: int):
        self.sync = sync
        self.pending: list = [None] * n_buckets
        self.issued = 0

    def issue(self, k: int, metas, grads) -> None:
        start = time.perf_counter()
        parts = [g.reshape(-1) if g is not None else torch.zeros(shape.numel(), dtype=dtype, device=device)
                 for (shape, dtype, device), g in zip(metas, grads)]
        flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        work = dist.all_reduce(flat, group=self.sync.group, async_op=True)
        self.pending[k] = (flat, work)
        self.issued += 1
        self.sync._record_issue(start, time.perf_counter(), flat.numel() * flat.element_size())

    def finish(self, k: int, shapes) -> list:
        entry = self.pending[k]
        self.pending[k] = None
        if entry is None:  # nothing issued for this bucket in this backward
            return [None] * len(shapes)
        flat, work = entry
        self.sync._record_wait(time.perf_counter())
        work.wait()
        if self.sync.scale != 1.0:
            flat.mul_(self.sync.scale)
        self.sync.collectives_last_step = self.issued
        out, offset = [], 0
        for shape in shapes:
            out.append(flat[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()
        return out


def _bucket_identity(ctx, call, k, params):
    """The forward of :class:`_Wait` and :class:`_Issue`: the bucket's tensors, as views."""
    ctx.call, ctx.k = call, k
    ctx.params = [id(p) for p in params]
    ctx.metas = [(p.shape, p.dtype, p.device) for p in params]
    ctx.set_materialize_grads(False)
    return tuple(p.view_as(p) for p in params)


class _Wait(torch.autograd.Function):
    """Identity forward; backward: this call's gradients of the bucket, summed over the group."""

    @staticmethod
    def forward(ctx, call, k, *params):
        return _bucket_identity(ctx, call, k, params)

    @staticmethod
    def backward(ctx, *grads):
        if ctx.call.pending[ctx.k] is None and any(g is not None for g in grads):
            ctx.call.issue(ctx.k, ctx.metas, grads)  # no sync point ran: start it here
        reduced = ctx.call.finish(ctx.k, [shape for shape, _, _ in ctx.metas])
        outside = ctx.call.sync.outside
        if outside is not None:  # its hooks tell this call's part from a use outside the call
            for pid, g in zip(ctx.params, reduced):
                outside.stash_inside(pid, g)
        return (None, None, *reduced)


class _Issue(torch.autograd.Function):
    """Identity forward; backward: copy this call's gradients into the bucket's buffer and start its all-reduce."""

    @staticmethod
    def forward(ctx, call, k, *params):
        return _bucket_identity(ctx, call, k, params)

    @staticmethod
    def backward(ctx, *grads):
        ctx.call.issue(ctx.k, ctx.metas, grads)
        # The gradients now live in the bucket's buffer; _Wait still runs (the engine calls a
        # node whose inputs are all undefined) and returns the reduced ones.
        return (None, None, *[None] * len(grads))


def sync_point(*params):
    """Where a bucket's gradients are complete in backward (a node of the emitted graph).

    Identity unless the tensors were armed by :meth:`GradientSync.arm` for this call;
    then the bucket's all-reduce starts here during backward.
    """
    tags = [getattr(p, _TAG, None) for p in params]
    armed = [i for i, t in enumerate(tags) if t is not None]
    if not armed or not torch.is_grad_enabled():
        return tuple(params)
    tag = tags[armed[0]]
    assert tag is not None
    call, k = tag
    moved = _Issue.apply(call, k, *[params[i] for i in armed])
    out = list(params)
    for i, t in zip(armed, moved):
        out[i] = t
    return tuple(out)


def plan_buckets(gm: torch.fx.GraphModule, sizes: dict[int, int], bucket_bytes: int) -> list[list[int]]:
    """Group the placeholders ``sizes`` names (index -> bytes) into buckets of about
    ``bucket_bytes``, in reverse order of their first use in ``gm`` (backward's order).
    Placeholders the graph never reads get no bucket (they get no gradient)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    first = {}
    for i in sizes:
        users = list(placeholders[i].users)
        if users:
            first[i] = min(order[u] for u in users)
    buckets, current, size = [], [], 0
    for i in sorted(first, key=lambda i: -first[i]):
        current.append(i)
        size += sizes[i]
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def insert_before_first_use(gm: torch.fx.GraphModule, indices: list[int], target, lead: tuple,
                            meta_key: str) -> None:
    """Call ``target(*lead, *placeholders[indices])`` just before the first use of any of
    those placeholders in ``gm``; every use then reads the call's results (a tuple, one per
    placeholder) instead. The node is marked ``meta[meta_key]``. ``gm`` is not recompiled."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    nodes = [placeholders[i] for i in indices]
    uses = {n: list(n.users) for n in nodes}
    first_use = min((u for us in uses.values() for u in us), key=lambda u: order[u])
    with gm.graph.inserting_before(first_use):
        point = gm.graph.call_function(target, (*lead, *nodes))
        point.meta[meta_key] = True
        for j, n in enumerate(nodes):
            item = gm.graph.call_function(operator.getitem, (point, j))
            for u in uses[n]:
                u.replace_input_with(n, item)


def insert_sync_points(gm: torch.fx.GraphModule, buckets: list[list[int]]) -> None:
    """Put a :func:`sync_point` for each bucket just before its first use in ``gm`` (in place)."""
    for bucket in buckets:
        insert_before_first_use(gm, bucket, sync_point, (), "autosp_grad_sync")
    gm.graph.lint()
    gm.recompile()


def remove_sync_points(gm: torch.fx.GraphModule) -> None:
    """Undo :func:`insert_sync_points` (in place): each bucket's parameters read directly."""
    for point in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is sync_point]:
        for item in list(point.users):
            item.replace_all_uses_with(point.args[item.args[1]])
            gm.graph.erase_node(item)
        gm.graph.erase_node(point)
    gm.graph.lint()
    gm.recompile()


class GradientSync:
    """Sums (times ``scale``) this call's parameter gradients over ``group`` in backward.

    ``group`` is a ``ProcessGroup`` (None: the default group). ``scale`` is e.g. ``1/dp``
    when the group is the whole (dp x sp) mesh: sum over sequence ranks, average over
    data-parallel replicas. ``enabled=False`` turns the synchronisation off for the calls
    that follow (``.grad`` is then this rank's share; :meth:`synchronize` sums it by hand).
    ``collectives_last_step`` is the number of all-reduces (buckets) of the last backward;
    ``last_step`` holds its timings (see :meth:`overlap`).
    """

    def __init__(self, params, group=None, bucket_bytes: int = 25 << 20, scale: float = 1.0):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.scale = scale
        self.bucket_bytes = bucket_bytes
        self.enabled = True
        self.outside: Any = None  # an OutsideGradients: the parameters' gradients from outside the calls
        self.collectives_last_step = 0
        self.last_step: dict = {"issues": [], "first_wait": None}

    def active(self) -> bool:
        """Whether a call made now would be synchronised."""
        return (self.enabled and not simulating() and torch.is_grad_enabled() and dist.is_available()
                and dist.is_initialized() and dist.get_world_size(self.group) > 1)

    def arm(self, state: list, buckets: list[list[int]], issue_here: bool = False) -> list:
        """``state`` (a compiled call's parameters and buffers, in argument order) with each
        bucket's parameters passed through ``_Wait`` and tagged for the graph's sync points
        (``issue_here``: the graph has none; the all-reduces then start when the model's
        backward is done). Unchanged when the synchronisation is off (disabled, simulated,
        one rank, no grad)."""
        if not buckets or not self.active():
            return state
        state = list(state)
        call = _SyncCall(self, len(buckets))
        for k, bucket in enumerate(buckets):
            idx = [i for i in bucket if state[i].requires_grad]
            if not idx:
                continue
            waited = _Wait.apply(call, k, *[state[i] for i in idx])
            for t in waited:
                setattr(t, _TAG, (call, k))
            if issue_here:
                waited = sync_point(*waited)
            for i, t in zip(idx, waited):
                state[i] = t
        return state

    # ------------------------------------------------------------------ timings
    def _record_issue(self, start: float, end: float, nbytes: int) -> None:
        if self.last_step.get("first_wait") is not None:  # a new backward
            self.last_step = {"issues": [], "first_wait": None}
        self.last_step["issues"].append((start, end, nbytes))

    def _record_wait(self, now: float) -> None:
        if self.last_step.get("first_wait") is None:
            self.last_step["first_wait"] = now

    # ------------------------------------------------------------------ by hand
    def synchronize(self) -> None:
        """Sum every parameter's whole ``.grad`` over the group now, by hand (missing
        gradients count as zero). For use with ``enabled=False``; the compiled calls
        already synchronise their own contributions when enabled."""
        count = 0
        bucket: list[torch.Tensor] = []
        size = 0
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            bucket.append(p)
            size += p.grad.numel() * p.grad.element_size()
            if size >= self.bucket_bytes:
                self._reduce(bucket)
                count += 1
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)
            count += 1
        self.collectives_last_step = count

    def _reduce(self, params) -> None:
        by_dtype: dict = {}
        for p in params:
            by_dtype.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        for group_params in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group_params])
            dist.all_reduce(flat, group=self.group)
            if self.scale != 1.0:
                flat.mul_(self.scale)
            offset = 0
            for p in group_params:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
