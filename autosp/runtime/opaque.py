"""Runtime functions torch.compile cannot trace, as one opaque op each under ``backend=``.

The conv halo (:func:`autosp.runtime.collectives.halo`), the image-feature merge
(:func:`~autosp.runtime.collectives.masked_scatter`) and the stated recurrences
(:mod:`autosp.runtime.recurrences`) run Python over ranks and process groups inside autograd
functions (sends in sequence order, all-gathers, per-rank numbering). torch.compile cannot
trace those, so under tracing each call becomes ``autosp::opaque``: a custom op that runs
the eager function (forward) and ``autosp::opaque_backward``, which recomputes it with
autograd on and differentiates it. Exact, as the eager program; the cost, said plainly:
each such layer's forward (its messages too) runs again in backward.

A call is encoded as its tensors, its ints (SymInts under ``dynamic=True``: the sequence
length stays symbolic) and a JSON of the rest (constants and where each argument goes).

Example::

    if torch.compiler.is_compiling():
        return opaque.call("halo", x, seq_len, dim, width, lo, trim, group)
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import torch

_FUNCTIONS: dict[str, tuple[Callable, Callable]] = {}


def register(name: str, fn: Callable, fake: Callable) -> None:
    """``fn(*args, **kwargs)`` runs the call eagerly; ``fake(*args, **kwargs)`` gives an
    empty result of its shape and dtype (for tracing)."""
    _FUNCTIONS[name] = (fn, fake)


def _encode(args, kwargs) -> tuple[list, list, str]:
    tensors: list = []
    ints: list = []

    def one(a):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            return ("t", len(tensors) - 1)
        if isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool):
            ints.append(a)
            return ("i", len(ints) - 1)
        return ("c", a)
    spec = (tuple(one(a) for a in args), tuple((k, one(v)) for k, v in kwargs.items()))
    return tensors, ints, _spec_text(spec)


@torch.compiler.assume_constant_result
def _spec_text(spec) -> str:
    """The call's structure and constants as JSON (evaluated once, while tracing: a constant)."""
    return json.dumps({"args": [list(e) for e in spec[0]], "kwargs": {k: list(e) for k, e in spec[1]}})


def _decode(tensors, ints, config: str) -> tuple[list, dict]:
    spec = json.loads(config)

    def one(entry):
        kind, value = entry
        return tensors[value] if kind == "t" else ints[value] if kind == "i" else value
    return [one(e) for e in spec["args"]], {k: one(e) for k, e in spec["kwargs"].items()}


def call(name: str, *args, **kwargs) -> torch.Tensor:
    """``name``'s function on these arguments, as one opaque (traceable) op."""
    tensors, ints, config = _encode(args, kwargs)
    return torch.ops.autosp.opaque(tensors, ints, name, config)


@torch.library.custom_op("autosp::opaque", mutates_args=())
def opaque_op(tensors: list[torch.Tensor], ints: list[int], name: str, config: str) -> torch.Tensor:
    """The eager function, no autograd (the backward op differentiates it)."""
    args, kwargs = _decode(tensors, ints, config)
    with torch.no_grad():
        out = _FUNCTIONS[name][0](*args, **kwargs)
    return out.clone() if any(out.data_ptr() == t.data_ptr() for t in tensors) else out.contiguous()


@opaque_op.register_fake
def _(tensors, ints, name, config):
    args, kwargs = _decode(tensors, ints, config)
    return _FUNCTIONS[name][1](*args, **kwargs)


@contextlib.contextmanager
def _autograd_recorded():
    """A custom op's kernel runs with autograd's dispatch keys excluded (nothing it does is
    recorded); the functions here differentiate themselves inside their backward
    (recompute, then ``autograd.grad``), so put the keys back while they run."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in ("AutogradCPU", "AutogradCUDA", "AutogradOther", "AutogradNestedTensor"):
        exclude = exclude.remove(getattr(torch._C.DispatchKey, key))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude):
        yield


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


@torch.library.custom_op("autosp::opaque_backward", mutates_args=())
def opaque_backward_op(grad: torch.Tensor, tensors: list[torch.Tensor], ints: list[int], name: str,
                       config: str) -> list[torch.Tensor]:
    """The gradients of the floating tensors among ``tensors``: the function recomputed with
    autograd on (its forward messages again), then differentiated (its backward ones)."""
    leaves = [t.detach().requires_grad_(_differentiable(t)) for t in tensors]
    args, kwargs = _decode(leaves, ints, config)
    wrt = [t for t in leaves if t.requires_grad]
    with torch.enable_grad(), _autograd_recorded():
        out = _FUNCTIONS[name][0](*args, **kwargs)
        grads = torch.autograd.grad(out, wrt, grad, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g.contiguous() for t, g in zip(wrt, grads)]


@opaque_backward_op.register_fake
def _(grad, tensors, ints, name, config):
    return [torch.empty_like(t) for t in tensors if _differentiable(t)]


def _setup_context(ctx, inputs, output):
    tensors, ints, name, config = inputs
    ctx.save_for_backward(*tensors)
    ctx.args = (list(ints), name, config)


def _backward(ctx, grad):
    tensors = list(ctx.saved_tensors)
    ints, name, config = ctx.args
    grads = iter(opaque_backward_op(grad.contiguous(), tensors, ints, name, config))
    return [next(grads) if _differentiable(t) else None for t in tensors], None, None, None


opaque_op.register_autograd(_backward, setup_context=_setup_context)
