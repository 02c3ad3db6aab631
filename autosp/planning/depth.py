"""Layers with one signature, estimated once: a deep model's memory from shallow copies.

A decoder's layers are one module repeated (same class, parameter shapes, settings). The
memory model's step is then linear in how many layers make each choice of a plan: each
layer adds what it keeps for backward (its input, its offload buffers, its gradient
shards) and the transients (the layer being recomputed, the loss, the unsharded layer)
are the same for every layer of one choice. So the planner estimates copies of the
model with a few layers (4 to 8: see LEAD and TAIL), and puts a plan of ``n`` layers
together from them:

    peak(plan) = peak(base) + sum over runs r of (len_r - base_r) * (peak(base, r one longer) - peak(base))

where ``base`` is the plan with each run shortened to LEAD layers (the last run, which
holds the head and loss, to TAIL): the first layers differ (the prefetch of FSDP2 and of
offload fills up over them), later ones repeat. The planner's candidates of one rung
share their shallow plans, so a rung costs three shallow estimates. Shallow programs
compile and run in a fraction of the time; the model state is counted on the whole
model.

:func:`repeated_layers` finds the repeated layers (or says why a model has none: then the
planner estimates the whole model), :func:`with_depth` makes the shallow copy (on meta:
no data), :func:`compose` puts a plan together (:func:`compose_counts`: every additive
figure of a step at once, as ``autosp-plan``'s report does). ``python_tests/e2e/test_memory_budget.py``
holds the composed estimate within 2% of the whole model's.

Example::

    >>> found = repeated_layers(model)          # ("model.layers", 32), or why not (a str)
    >>> shallow = with_depth(model, found[0], 3)
"""
from __future__ import annotations

import copy

import torch

# The shallow plans: each run of a plan shortened to LEAD layers, the last (with the head
# and loss) to TAIL.
LEAD, TAIL = 3, 4

# Attributes that differ between repeated layers without changing what they compute.
_POSITION_ATTRS = frozenset({"layer_idx", "layer_id", "idx", "index", "training"})


def _signature(module: torch.nn.Module) -> tuple:
    """What a layer computes, as far as its structure tells: every submodule's class and
    simple settings (ints, floats, strings, bools, None), every parameter's and buffer's
    shape and dtype."""
    parts: list[tuple] = []
    for name, sub in module.named_modules():
        settings = tuple(sorted((k, v) for k, v in vars(sub).items()
                                if not k.startswith("_") and k not in _POSITION_ATTRS
                                and isinstance(v, (int, float, str, bool, type(None)))))
        parts.append((name, type(sub).__qualname__, settings))
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        parts.append((name, tuple(t.shape), t.dtype))
    return tuple(parts)


def repeated_layers(model: torch.nn.Module) -> tuple[str, int] | str:
    """``(path, n)``: the model's ``nn.ModuleList`` of ``n`` >= 4 layers of one signature
    holding most of its parameters; or why there is none (a string)."""
    total = sum(p.numel() for p in model.parameters())
    best: tuple[str, int] | None = None
    for path, sub in model.named_modules():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) >= 2:
            n = sum(p.numel() for p in sub.parameters())
            if best is None or n > best[1]:
                best = (path, n)
    if best is None:
        return "no nn.ModuleList of layers"
    path, n_params = best
    layers = model.get_submodule(path)
    if n_params * 2 < total:
        return f"'{path}' holds under half of the parameters"
    if len(layers) < 4:
        return f"'{path}' has {len(layers)} layers (a shallow copy saves nothing)"
    first = _signature(layers[0])
    for i, layer in enumerate(layers):
        if _signature(layer) != first:
            return f"'{path}' layer {i} differs from layer 0"
    types = getattr(getattr(model, "config", None), "layer_types", None)
    if isinstance(types, (list, tuple)) and len(set(types)) > 1:
        return f"config.layer_types mixes {sorted(set(types))}"
    return path, len(layers)


def with_depth(model: torch.nn.Module, path: str, depth: int) -> torch.nn.Module:
    """A copy of ``model`` whose ``path`` ModuleList keeps its first ``depth`` layers. The
    modules on the way to it are copied (shallowly); everything else, parameters included,
    is shared with ``model`` (meant for meta models: nothing is trained through it)."""
    root = copy.copy(model)
    root._modules = dict(model._modules)
    parent = root
    names = path.split(".")
    for name in names[:-1]:
        child = copy.copy(parent._modules[name])
        child._modules = dict(child._modules)
        parent._modules[name] = child
        parent = child
    layers = parent._modules[names[-1]]
    parent._modules[names[-1]] = torch.nn.ModuleList(list(layers)[:depth])
    return root


def shallow_plan(layers: tuple[str, ...], longer: int | None = None) -> tuple[tuple[str, ...], list]:
    """A per-layer plan -> the shallow plan it is put together from (each run of equal
    choices shortened to :data:`LEAD` layers, the last, with the head and loss, to
    :data:`TAIL`; run ``longer`` one layer longer), and its runs as ``(choice, length,
    length in the shallow plan)``."""
    runs: list[list] = []
    for choice in layers:
        if runs and runs[-1][0] == choice:
            runs[-1][1] += 1
        else:
            runs.append([choice, 1])
    out = [(c, n, min(n, TAIL if i == len(runs) - 1 else LEAD) + (i == longer)) for i, (c, n) in enumerate(runs)]
    return tuple(c for c, _, k in out for _ in range(k)), out


def compose(layers: tuple[str, ...], peak) -> int:
    """The step peak of the plan ``layers`` from ``peak(shallow layers)``: the shallow
    plan's, plus each run's extra layers times the step of one more layer of that run in
    that plan (so the slope of an offloaded layer is priced where the peak of this plan
    is, not where a uniform plan's is)."""
    base, runs = shallow_plan(layers)
    value = peak(base)
    for i, (_, n, k) in enumerate(runs):
        if n > k:
            value += (n - k) * (peak(shallow_plan(layers, longer=i)[0]) - peak(base))
    return value


def compose_counts(layers: tuple[str, ...], counts) -> dict:
    """:func:`compose` for every additive figure at once: ``counts(shallow layers)`` returns
    a dict of numbers (bytes, kernel calls, collective bytes); each key is put together as
    :func:`compose` puts the peak together (a key missing from a dict counts 0). Each
    shallow plan is counted once."""
    cache: dict = {}

    def get(shallow):
        if shallow not in cache:
            cache[shallow] = counts(shallow)
        return cache[shallow]
    base, runs = shallow_plan(layers)
    first = get(base)
    out = dict(first)
    for i, (_, n, k) in enumerate(runs):
        if n > k:
            longer = get(shallow_plan(layers, longer=i)[0])
            for key in set(first) | set(longer):
                out[key] = out.get(key, 0) + (n - k) * (longer.get(key, 0) - first.get(key, 0))
    return out
