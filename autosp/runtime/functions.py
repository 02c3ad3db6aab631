"""A model's own ``torch.autograd.Function``, kept: one stated op that runs its forward and its backward.

torch.export keeps the ops of a Function's ``forward`` and drops its ``backward``: a
straight-through estimator (PhiMoE's router), a clipped gradient or a memory-saving
recomputation would then be differentiated through its forward instead. autosp keeps the
Function whole. While the model is exported, each call of a model's Function (not torch's,
not autosp's) whose **statement holds** becomes one op, ``autosp::autograd_function(inputs,
key)``; the emitted program calls :func:`autograd_function`, which applies the Function
itself, so autograd runs its own ``backward``.

**The statement** (what lets the layout rules treat the op as token-wise, like
``autosp::token_experts``): the call is row-wise over every dim but the last of its first
tensor input. :func:`statement_holds` checks it on random inputs shaped like the call's
(sizes above 6 cut to 6, except sizes that are some input's last dim): for each such dim,
the Function on two parts along it equals the Function on the whole, its output and, for
random output gradients, every input's gradient from its own backward (the parts'
gradients concatenated for the inputs that were split, summed for the others). A Function
whose statement fails, whose output is not one tensor, that takes anything but tensors and
constants, or that cannot be imported by its name, is left to the export, which keeps its
forward's ops: the importer then refuses it, naming it.

``key`` is JSON naming the Function (``module:qualname``) and its non-tensor arguments, so
any process resolves it (the ranks that did not export included) and the program cache
tells two calls apart.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import json
from collections.abc import Iterator

import torch

_TRUSTED = ("torch.", "autosp.")


def torch_apply():
    """torch's own ``Function.apply`` under any patches of it (each names what it wraps as
    ``__wrapped__``, as autosp's do): the statement's check applies Functions through it,
    seen by no recorder."""
    fn = torch.autograd.Function.__dict__["apply"].__func__
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn
_CHECKED: dict[tuple, str | None] = {}  # (class, key, shapes) -> None if the statement holds, else why not


# ----------------------------------------------------------------------------- the op
@functools.cache
def _resolve(key: str):
    """The Function and argument template of ``key`` (read once per key: the emitted
    program resolves it at every call)."""
    spec = json.loads(key)
    module, _, name = spec["fn"].partition(":")
    cls = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    return cls, tuple(spec["args"])


def _arguments(template, tensors: list) -> list:
    return [tensors[a["tensor"]] if isinstance(a, dict) else a for a in template]


class _Context:
    """What a Function's ``forward`` may call on its ``ctx``, doing nothing: the op runs the
    forward alone (its value), never through ``Function.apply`` (which the export patches)."""

    needs_input_grad: tuple = ()

    def save_for_backward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _forward(key: str, inputs: list) -> torch.Tensor:
    """The Function's forward on ``inputs``, outside autograd (the op's value)."""
    cls, template = _resolve(key)
    args = _arguments(template, list(inputs))
    with torch.no_grad():
        if cls.setup_context is not torch.autograd.function._SingleLevelFunction.setup_context:
            return cls.forward(*args)  # (forward without ctx, setup_context apart)
        return cls.forward(_Context(), *args)


@torch.library.custom_op("autosp::autograd_function", mutates_args=())
def autograd_function_op(inputs: list[torch.Tensor], key: str) -> torch.Tensor:
    """The stated op (export; the emitted program calls :func:`autograd_function`)."""
    return _forward(key, inputs).clone()


@autograd_function_op.register_fake
def _(inputs, key):
    return torch.empty_like(_forward(key, inputs))


def autograd_function(inputs: list[torch.Tensor], key: str) -> torch.Tensor:
    """``autosp::autograd_function`` in the emitted program: the Function applied to this
    rank's inputs, under autograd (its own ``backward`` runs in the program's backward)."""
    cls, template = _resolve(key)
    return cls.apply(*_arguments(template, list(inputs)))


# ----------------------------------------------------------------------------- export
def _key(cls, args) -> tuple[str, list] | None:
    """The op's key and tensor inputs for ``cls.apply(*args)``; None where it cannot be one
    (a nested class, an argument that is neither a tensor nor a JSON constant)."""
    if "<locals>" in cls.__qualname__:
        return None
    template: list = []
    tensors: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            template.append({"tensor": len(tensors)})
            tensors.append(a)
        elif a is None or isinstance(a, (bool, int, float, str)):
            template.append(a)
        else:
            return None
    if not tensors:
        return None
    return json.dumps({"fn": f"{cls.__module__}:{cls.__qualname__}", "args": template}), tensors


def _hint(size) -> int:
    """A size's example value, without a guard on a symbolic one."""
    return size.node.hint if isinstance(size, torch.SymInt) else int(size)


def _random_like(shape: list[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    return torch.zeros(shape, dtype=dtype)  # (indices: 0 is valid for every axis)


def _apply(apply, template, tensors):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    return apply(*_arguments(template, leaves)), leaves


def _grads(out, leaves, grad_out):
    wrt = [t for t in leaves if t.requires_grad]
    if not wrt or not out.requires_grad:
        return [None] * len(leaves)
    found = dict(zip(map(id, wrt), torch.autograd.grad(out, wrt, grad_out, allow_unused=True)))
    return [found.get(id(t)) for t in leaves]


def _close(a, b) -> bool:
    if a is None or b is None:
        return (a is None or not a.any()) and (b is None or not b.any())
    tol = 1e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-5
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def statement_holds(cls, template: list, fakes: list, apply=None) -> str | None:
    """None if ``cls`` applied as ``template`` with tensors shaped like ``fakes`` is row-wise
    over every dim but the last of the first tensor (module docstring); else why not.
    ``apply``: how to apply it (default ``cls.apply``); run on real CPU tensors, outside any
    export's fake and tracing modes, with gradients on."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    with unset_fake_temporarily(), disable_proxy_modes_tracing(), torch.enable_grad():
        return _check(apply or cls.apply, template, fakes)


def _check(apply, template: list, fakes: list) -> str | None:
    shapes = [[_hint(s) for s in t.shape] for t in fakes]
    lasts = {s[-1] for s in shapes if s}
    cut = {v: (min(v, 6) if v not in lasts else v) for s in shapes for v in s[:-1]}
    small = [[cut[v] for v in s[:-1]] + s[-1:] for s in shapes]
    gen = torch.Generator().manual_seed(0)
    tensors = [_random_like(s, t.dtype, gen) for s, t in zip(small, fakes)]
    try:
        whole, leaves = _apply(apply, template, tensors)
        if not isinstance(whole, torch.Tensor):
            return f"it returns {type(whole).__name__}, not one tensor"
        grad_out = _random_like(list(whole.shape), whole.dtype, gen) if whole.is_floating_point() else None
        whole_grads = _grads(whole, leaves, grad_out) if grad_out is not None else [None] * len(leaves)
        first = small[0]
        for d in range(len(first) - 1):
            n = first[d]
            if n < 2:
                continue
            if whole.dim() <= d or whole.shape[d] != n:
                return f"its output does not keep dim {d} of its first input"
            split = [len(s) == len(first) and s[d] == n for s in small]
            k = n // 2
            outs, grads = [], []
            for lo, hi in ((0, k), (k, n)):
                part = [t.narrow(d, lo, hi - lo) if cut_here else t for t, cut_here in zip(tensors, split)]
                out, part_leaves = _apply(apply, template, part)
                outs.append(out)
                g = grad_out.narrow(d, lo, hi - lo) if grad_out is not None else None
                grads.append(_grads(out, part_leaves, g) if g is not None else [None] * len(part_leaves))
            if not _close(torch.cat(outs, d), whole):
                return f"its output along dim {d} of its first input mixes positions"
            for i, cut_here in enumerate(split):
                a, b = grads[0][i], grads[1][i]
                joined = (torch.cat([a, b], d) if a is not None and b is not None else None) if cut_here else \
                    (a + b if a is not None and b is not None else a if b is None else b)
                if not _close(joined, whole_grads[i]):
                    return f"its backward's gradient of input {i} along dim {d} of its first input mixes positions"
    except Exception as e:  # noqa: BLE001 - a Function that cannot run on CPU random inputs is not stated
        return f"it could not be checked on random inputs ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None


@contextlib.contextmanager
def functions_as_ops(model: torch.nn.Module) -> Iterator[None]:
    """While exporting: each call of a model's own ``autograd.Function`` whose statement
    holds calls ``autosp::autograd_function`` instead (the export then has one op, not its
    forward's ops); every other call runs as before."""
    original = torch.autograd.Function.apply.__func__  # type: ignore[attr-defined]

    def apply(cls, *args, **kwargs):
        if kwargs or cls.__module__.startswith(_TRUSTED):
            return original(cls, *args, **kwargs)
        keyed = _key(cls, args)
        if keyed is None:
            return original(cls, *args, **kwargs)
        key, tensors = keyed
        shapes = tuple((tuple(_hint(s) for s in t.shape), t.dtype) for t in tensors)
        if (cls, key, shapes) not in _CHECKED:
            _CHECKED[(cls, key, shapes)] = statement_holds(cls, json.loads(key)["args"], tensors,
                                                           lambda *a: torch_apply()(cls, *a))
        if _CHECKED[(cls, key, shapes)] is not None:
            return original(cls, *args, **kwargs)
        return torch.ops.autosp.autograd_function(tensors, key)
    apply.__wrapped__ = original  # type: ignore[attr-defined]
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.autograd.Function.apply = classmethod(original)  # type: ignore[method-assign, assignment]


def why_not_stated(cls) -> str | None:
    """Why the last export did not state ``cls`` (its first failed check), if it tried."""
    return next((why for (c, _, _), why in _CHECKED.items() if c is cls and why is not None), None)

