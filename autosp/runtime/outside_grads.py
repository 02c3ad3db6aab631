"""Gradients a compiled module's parameters get *outside* its compiled calls.

On the shard path (``gather_outputs=False``) every rank back-propagates its share of the
loss: the loss computed from this rank's positions. The compiled call sums its own
parameter gradients over the sequence-parallel group (:mod:`autosp.runtime.grad_sync`),
but a parameter the user's loss applies to a sharded output *outside* the call (a
``lm_head`` applied by a chunked loss, a tied embedding used inside and outside, a
second module reading the compiled module's weights) got only this rank's share:
its gradient was partial, and nothing said so.

:class:`OutsideGradients` closes that hole. While a call's sequence-sharded outputs
(``autosp.sharded_results`` of the IR) can still be back-propagated, a hook on each of the
module's dense parameters (those :class:`~autosp.runtime.grad_sync.GradientSync` sums)
sums, over the same group and with the same scale, the part of the incoming gradient that
did not come through a compiled call: the call's own (already summed) part is told apart
by identity, as ``_Wait`` hands it over, and only the rest is all-reduced. The rule is
structural (the same on every rank), so the collectives match.

What counts as a share: the hook cannot see where its gradient came from, so it sums
while any call's sharded outputs wait for their backward (the call is *armed*), also in a
backward that starts from a detached copy of them (torchtitan's chunked loss
back-propagates each chunk of ``lm_head`` + loss from detached hidden states, then the
hidden states themselves). A call is disarmed by the end of the first backward that
reaches its sharded outputs, by :meth:`~autosp.api.AutospModule.gather_sequence` of one of
them (the loss is then the whole loss, alike on every rank), by a call of the plain model
(its backward is one device's), or when its graph is freed. Where that guess would be
wrong the end of the backward says so: an outside gradient left unsummed in a backward
that reaches the sharded outputs of a call disarmed before (a second backward with
``retain_graph=True``, or the plain model called in between) raises
:class:`OutsideGradientError`.

Parameters sharded by FSDP2 need none of this: their reduce-scatter sums every rank's
gradient, whatever computed it.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist


class OutsideGradientError(RuntimeError):
    """A gradient outside a compiled call that autosp cannot assign to a share or a whole loss."""


class _CallWatch:
    """One compiled call's sharded outputs, while they can still be back-propagated."""

    __slots__ = ("armed", "gathered", "__weakref__")  # noqa: RUF023

    def __init__(self):
        self.armed = True      # a backward that reaches the outputs back-propagates a share
        self.gathered = False  # gather_sequence read an output: the loss is the whole loss


class OutsideGradients:
    """Sums the outside part of the dense parameters' gradients over ``group`` (times ``scale``).

    ``named_params``: ``(qualified name, Parameter)`` pairs, those ``GradientSync`` sums;
    ``model``: the user's module (a forward pre-hook sees its plain calls). Hooks go on the
    parameters and the model at the first armed call and come off with this object.
    """

    def __init__(self, named_params, group, scale: float = 1.0, model: torch.nn.Module | None = None):
        self.model = model  # its plain calls disarm the waiting calls
        self._params = [(name, p) for name, p in named_params if p.requires_grad]
        self._index = {id(p): i for i, (_, p) in enumerate(self._params)}
        self.group = group
        self.scale = scale
        self._handles: list = []
        self._watches: weakref.WeakSet = weakref.WeakSet()
        self._inside: dict[int, list] = {}  # parameter index -> this backward's summed in-call gradients
        self._tasks: dict[int, dict] = {}   # graph task -> what its hooks did
        self.summed_last_backward: list[str] = []  # the parameters whose outside share was summed

    # ------------------------------------------------------------------ forward
    def watch(self, outputs) -> _CallWatch | None:
        """Arm a call whose sequence-sharded ``outputs`` require grad (hooks them); None if none does."""
        outs = [t for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs or not self._params:
            return None
        if not self._handles:
            self._install()
        w = _CallWatch()
        ref = weakref.ref(self)
        for t in outs:
            t.register_hook(_reached_hook(ref, w))
            t._autosp_watch = w  # type: ignore[attr-defined]  # gather_sequence disarms its call
        self._watches.add(w)
        return w

    def gathered(self, x: torch.Tensor) -> None:
        """``x`` (an output, or something computed from one) is being gathered whole: its call's
        loss is the whole loss, computed alike on every rank, and nothing outside is summed."""
        w = getattr(x, "_autosp_watch", None)
        for watch in [w] if w is not None else list(self._watches):
            watch.armed, watch.gathered = False, True

    def armed(self) -> bool:
        return any(w.armed for w in self._watches)

    def _install(self) -> None:
        ref = weakref.ref(self)
        for i, (_, p) in enumerate(self._params):
            self._handles.append(p.register_hook(_param_hook(ref, i)))
        if self.model is not None:
            self._handles.append(self.model.register_forward_pre_hook(_plain_call_hook(ref)))
        weakref.finalize(self, _remove, list(self._handles))

    def plain_call(self) -> None:
        """The plain model is called: its backward is one device's, not a share."""
        for w in list(self._watches):
            w.armed = False

    # ------------------------------------------------------------------ backward
    def stash_inside(self, param_id: int, grad) -> None:
        """``_Wait`` hands ``grad`` (a call's summed gradient of the parameter ``id(param) ==
        param_id``) to autograd; the parameter's hook will tell it from the rest."""
        i = self._index.get(param_id)
        if i is not None and grad is not None and self._handles:
            self._inside.setdefault(i, []).append(grad)

    def _task(self) -> dict:
        task = torch._C._current_graph_task_id()
        state = self._tasks.get(task)
        if state is None:
            state = self._tasks[task] = {"summed": [], "unsummed": [], "watches": []}
            ref = weakref.ref(self)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _end_of_backward(ref, task))
        return state

    def on_param_grad(self, i: int, grad: torch.Tensor):
        inside = self._inside.pop(i, None)
        if inside is not None and len(inside) == 1 and grad is inside[0]:
            return None  # all of it came through one compiled call, summed there
        state = self._task()
        name = self._params[i][0]
        if not self.armed():  # no share waits for its backward: a whole loss, as on one device
            state["unsummed"].append(name)
            return None
        whole_inside = None if inside is None else (inside[0] if len(inside) == 1 else torch.stack(inside).sum(0))
        outside = grad if whole_inside is None else grad - whole_inside
        outside = outside.contiguous().clone() if whole_inside is None else outside
        dist.all_reduce(outside, group=self.group)
        if self.scale != 1.0:
            outside.mul_(self.scale)
        state["summed"].append(name)
        return outside if whole_inside is None else outside + whole_inside

    def on_reached(self, watch: _CallWatch) -> None:
        self._task()["watches"].append(watch)

    def end_of_backward(self, task: int) -> None:
        state = self._tasks.pop(task, None)
        self._inside.clear()
        if state is None:
            return
        reached = state["watches"]
        stale = [w for w in reached if not w.armed and not w.gathered]  # back-propagated before
        for w in reached:
            w.armed = False  # its share was back-propagated
        self.summed_last_backward = sorted(set(state["summed"]))
        if state["unsummed"] and stale:
            names = ", ".join(sorted(set(state["unsummed"]))[:4])
            raise OutsideGradientError(
                f"autosp: parameter(s) {names} got a gradient outside the compiled call in a backward through "
                "sequence-sharded outputs of a call that was disarmed before (back-propagated already, with "
                "retain_graph=True, or the plain model was called since): this rank's share was not summed "
                "over the sequence-parallel group. Run the compiled call again before each backward, and "
                "the plain model before the compiled call or after its backward")


def _param_hook(ref, i):
    def hook(grad):
        self = ref()
        return None if self is None else self.on_param_grad(i, grad)
    return hook


def _reached_hook(ref, watch):
    def hook(grad):
        self = ref()
        if self is not None:
            self.on_reached(watch)
    return hook


def _end_of_backward(ref, task):
    self = ref()
    if self is not None:
        self.end_of_backward(task)


def _plain_call_hook(ref):
    def hook(module, args):
        self = ref()
        if self is not None and not torch.compiler.is_compiling():  # (autosp's own export traces it)
            self.plain_call()
    hook.__autosp_inert__ = True  # type: ignore[attr-defined]  # not part of a program's key (autosp.program_key.INERT)
    return hook


def _remove(handles) -> None:
    for h in handles:
        h.remove()
