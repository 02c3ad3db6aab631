"""The module state a compiled program bakes in, as a hashable key: part of the program key.

torch.export runs the model's Python ``forward`` once and keeps only the tensor ops it
reached: every plain Python value that ``forward`` read on the way (an ``if
self.disable_adapters:``, a dropout's ``p``, ``config.output_hidden_states``, a LoRA
``scaling``) is a constant of the program. :func:`module_state_key` collects those values
so that a call after any of them changed compiles again (``autosp.api``) instead of running
the old program silently.

What the key holds, per module of ``model.modules()`` (pre-order, shared modules once):

* its class (a swapped class, e.g. a parametrization or ``fully_shard``, traces differently);
* every entry of ``vars(module)`` that is plain data, torch's own bookkeeping excepted
  (``_parameters``, ``_buffers``, ``_modules``, the hook and state-dict-hook dicts):
  ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``None``, a ``torch.dtype``,
  an ``enum.Enum`` (and subclasses: numpy floats, ``str`` enums), and ``tuple``/``list``/
  ``set``/``frozenset``/``dict`` (these exact types) made of those, nested up to
  :data:`MAX_DEPTH` levels, at most :data:`MAX_ITEMS` items each (sets sorted by ``repr``:
  every process writes them in one order). ``training`` is such a flag, so the key also
  tells train/eval programs apart. (A ``torch.device`` is not: it differs between ranks.)
* the qualified names of the functions among them (an instance-level ``forward = ...`` patch);
* which of its forward, forward-pre, backward and backward-pre hook dicts are non-empty, and
  the qualified names of their hooks (not the hooks' ids, which differ between processes;
  autosp's own hooks, marked :data:`INERT`, are left out);
* every configuration object it holds (any other attribute with ``to_dict``, e.g. a Hugging
  Face ``PretrainedConfig``; ``generation_config`` excepted: ``forward`` does not read it),
  once per object (by ``id``; a later holder gets a marker): its plain attributes by the same
  rule but for the bookkeeping that saving and loading write (``architectures``, ``dtype``,
  ``_name_or_path``, ...: :data:`_CONFIG_BOOKKEEPING`; ``save_pretrained`` sets them on the
  saving rank alone, and a key that differs between ranks is refused), and its nested
  configurations (``text_config``);

plus the global module hooks (``register_module_forward_hook`` and friends).

Why this covers PEFT and Hugging Face switches: PEFT keeps every switch that its layers'
``forward`` reads as a plain attribute of the layer: ``_disable_adapters`` (``with
disable_adapter():``, ``disable_adapter_layers()``), ``merged_adapters`` (a list of names:
``merge_adapter()``/``unmerge_adapter()``), ``_active_adapter`` (``set_adapter()``),
``scaling`` (a dict of floats: ``set_scale()``/``scale_layer()``), ``r``/``lora_alpha``/
``use_dora`` (dicts), and the tuner's ``active_adapter``. Hugging Face models read
``self.config.<flag>`` (``output_hidden_states``, ``use_return_dict``, ``_attn_implementation``
...) from the one config object the modules share, and flags copied onto modules
(``gradient_checkpointing``, ``is_causal``, ``layer_idx``). All are plain values in ``vars()``.

Not covered (not plain data, or too big to walk per call): tensors that are neither
parameters nor buffers (parameters and buffers are read at run time; a plain tensor
attribute is a constant of the trace), other objects (a dataclass that is not a config, a
tokenizer), containers holding any of those (PEFT's ``peft_config``, a dict of ``LoraConfig``
read when the layers are built; a LoRA layer's ``kwargs``), containers over the limits, and
the globals of any module other than ``torch.nn``'s hooks.

Cost: a per-model plan (the modules, and which attributes are plain data of which kind) is
kept between calls, and each call re-reads every value through it with a few C-level passes
(``map``, ``compress``, slices), comparing the types it finds with the plan's. The plan is
rebuilt whenever it might not describe the model any more, and that check is exact: the
modules' classes, their ``__dict__`` objects and sizes, each ``_modules`` dict's children (by
identity) and every tracked attribute's type are compared on every call. A ``__dict__`` that
kept its size and its tracked names kept its set of keys, because torch's own keys are never
deleted (``Module`` reads all of them). The key itself is a function of the state alone, not
of when the plan was built (two processes in the same state have equal keys).
``bench/program_key.py`` measures it against a compiled step: 0.2-0.3 ms a call for a
4-layer Llama with LoRA (341 modules) or a 32-layer Llama (423), 0.1-0.25 % of a CPU step;
2.7-3.1 ms (2,665 modules: 32 layers with LoRA on every projection), 1.1-1.4 % of that
tiny model's step (the ``training`` walk it replaces took 1.9 ms of it).

Example::

    >>> key = module_state_key(model)
    >>> model.config.output_hidden_states = True
    >>> module_state_key(model) == key
    False
    >>> describe_changes(model, key, module_state_key(model))
    ['config.output_hidden_states: False -> True']
"""
from __future__ import annotations

import enum
import functools
import types
import weakref
import zlib
from collections import OrderedDict
from itertools import chain, compress, repeat
from operator import getitem, is_
from typing import Any

import torch

MAX_DEPTH = 4
"""Nesting of plain containers kept in the key (deeper ones are skipped)."""
MAX_ITEMS = 256
"""Items of one plain container kept in the key (a longer one is data, not a switch: skipped)."""

_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None), torch.dtype})
_SCALAR_BASES = (enum.Enum, int, float, complex, str, bytes)  # enums, numpy floats, str subclasses
_DICTS = (dict, OrderedDict)
_SEQUENCES = (list, tuple)
_CONTAINERS = frozenset({tuple, list, set, frozenset, dict, OrderedDict})
_CALLABLES = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")
# Objects with ``to_dict`` that forward never reads: Hugging Face's ``generation_config`` (for
# ``generate()``; it also holds ``_original_object_hash``, a ``hash()`` that differs between processes).
_NOT_CONFIGS = frozenset({"generation_config"})
# A configuration's bookkeeping, which saving and loading write (``save_pretrained`` sets
# ``architectures`` and ``dtype``, on the rank that saves only) and forward does not read.
_CONFIG_BOOKKEEPING = frozenset({"architectures", "dtype", "torch_dtype", "auto_map", "transformers_version",
                                 "_name_or_path", "_commit_hash"})


class _Marker:
    """A placeholder whose ``repr`` is the same in every process (an ``object()``'s is its address)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


_SKIP = _Marker("<skipped>")  # a value the rule leaves out (its slot stays, the same everywhere)
_SAME_CONFIG = "<the config above>"

# The kinds of a tracked attribute: read from the values tuple by slices, in this order.
_SCALAR, _DICT, _SEQ, _CONTAINER, _CALLABLE, _CONFIG, _IGNORED = range(7)
# Module.__init__'s bookkeeping, and training: a key entry of its own (training_flags).
_UNTRACKED = frozenset(vars(torch.nn.Module()))
# torch's composable API (fully_shard, replicate, checkpoint) keeps its state under an
# attribute named with a fresh uuid per process: never plain data, and its name differs
# between ranks.
_COMPOSABLE_STATE = "__composable_api_state_key_"


class _Config(tuple):
    """A configuration's entries inside a key (a tuple: hashed and compared as one)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "config" + tuple.__repr__(self)


INERT = "__autosp_inert__"  # on a hook of autosp's own that changes nothing the model computes


def _hook_names(hooks: dict) -> tuple:
    """The qualified names of a hook dict's hooks, autosp's own (:data:`INERT`) left out."""
    return tuple(_callable_name(h) for h in hooks.values() if not hasattr(h, INERT))


def _callable_name(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _plain(value, depth: int = 0):
    """``value`` as a hashable key if it is plain data (module docstring), else ``_SKIP``."""
    t = type(value)
    if t in _SCALARS:
        return value
    if t not in _CONTAINERS:
        return value if isinstance(value, _SCALAR_BASES) else _SKIP
    if depth >= MAX_DEPTH or len(value) > MAX_ITEMS:
        return _SKIP
    if t is dict or t is OrderedDict:
        out = []
        for k, v in value.items():
            k, v = _plain(k, depth + 1), _plain(v, depth + 1)
            if k is _SKIP or v is _SKIP:
                return _SKIP
            out.append((k, v))
        return ("<dict>", tuple(out))
    items = []
    for v in value:
        v = _plain(v, depth + 1)
        if v is _SKIP:
            return _SKIP
        items.append(v)
    if t is set or t is frozenset:
        items.sort(key=repr)  # str hashes differ between processes, so does a set's order
        return ("<set>", tuple(items))
    return tuple(items)


def _is_config(value) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "__dict__") and not isinstance(
        value, (torch.nn.Module, torch.Tensor, type))


def _kind(name: str, value) -> int:
    """How a tracked attribute enters the key, from its value (the plan keeps it per type)."""
    t = type(value)
    if t in _SCALARS or isinstance(value, _SCALAR_BASES):
        return _SCALAR
    if t in _DICTS and len(value) <= MAX_ITEMS and _SCALARS.issuperset(map(type, value)) and \
            _SCALARS.issuperset(map(type, value.values())):
        return _DICT
    if t in _SEQUENCES and len(value) <= MAX_ITEMS and _SCALARS.issuperset(map(type, value)):
        return _SEQ
    if t in _CONTAINERS:
        return _CONTAINER  # nested, a set, or holding something that is not plain
    if isinstance(value, _CALLABLES):
        return _CALLABLE
    if name not in _NOT_CONFIGS and _is_config(value):
        return _CONFIG
    return _IGNORED  # tensors, other objects


def _once(config, seen: set):
    """A configuration's entries the first time the walk meets it, then a marker."""
    if id(config) in seen:
        return _SAME_CONFIG
    seen.add(id(config))
    return _config(config, seen)


def _config(config, seen: set) -> _Config:
    items = []
    for k, v in vars(config).items():
        if k in _CONFIG_BOOKKEEPING:
            continue
        p = _plain(v)
        if p is _SKIP and type(v) not in _CONTAINERS and _is_config(v):  # a nested configuration
            if id(v) in seen:
                p = _SAME_CONFIG
            else:
                seen.add(id(v))
                p = _config(v, seen)
        if p is not _SKIP:
            items.append((k, p))
    return _Config(items)


def _walk(model: torch.nn.Module) -> list:
    """``model.modules()`` without building names (the same order, shared modules once)."""
    memo = {id(model)}
    out, stack = [], [model]
    while stack:
        m = stack.pop()
        out.append(m)
        children = [c for c in m._modules.values() if c is not None and id(c) not in memo]
        memo.update(map(id, children))
        stack.extend(reversed(children))
    return out


class _Plan:
    """Which attributes of which modules a model's key reads, and how (module docstring)."""

    def __init__(self, model: torch.nn.Module):
        mods = _walk(model)
        self.dicts = [m.__dict__ for m in mods]
        self.classes = tuple(map(type, mods))
        # The submodules, not the model: _PLANS holds the plan as long as the model lives,
        # and a plan holding the model would keep it alive for ever.
        self.mods, self.sub_dicts, self.sub_classes = mods[1:], self.dicts[1:], self.classes[1:]
        self.dict_lens = tuple(map(len, self.dicts))
        children = [d.get("_modules", {}) for d in self.dicts]
        self.child_lens = tuple(map(len, children))
        self.children = tuple(chain.from_iterable(map(dict.values, children)))
        tracked = []  # (kind, module index, name)
        for i, d in enumerate(self.dicts):
            for k, v in d.items():
                if k not in _UNTRACKED and not k.startswith(_COMPOSABLE_STATE):
                    tracked.append((_kind(k, v), i, k))
        tracked.sort(key=lambda e: e[0])  # stable: each kind in module order
        self.owners = [self.dicts[i] for _, i, _ in tracked]
        self.names = [k for _, _, k in tracked]
        kinds = [kind for kind, _, _ in tracked]
        self.bounds = [kinds.count(kind) for kind in range(_IGNORED)]  # where each kind ends
        for j in range(1, len(self.bounds)):
            self.bounds[j] += self.bounds[j - 1]
        values = tuple(map(getitem, self.owners, self.names))
        self.types = tuple(map(type, values))
        hooked = [(i, h) for i, d in enumerate(self.dicts) for h in _HOOKS if h in d]
        self.hook_owners = [self.dicts[i] for i, _ in hooked]
        self.hook_names = [h for _, h in hooked]
        self.hook_where = tuple(hooked)
        self.hook_index = tuple(range(len(hooked)))
        # What the values mean (kinds, module, name): part of the key, a function of the state.
        self.signature = (self.classes, tuple((kind, i, k) for kind, i, k in tracked if kind != _IGNORED))

    def key(self, model: torch.nn.Module) -> tuple | None:
        """The key from the model's current state, or None where this plan may not describe
        the model any more (then a new plan is built)."""
        mods, dicts = self.mods, self.dicts
        if type(model) is not self.classes[0] or model.__dict__ is not dicts[0] or \
                tuple(map(type, mods)) != self.sub_classes or not all(map(is_, map(vars, mods), self.sub_dicts)) or \
                tuple(map(len, dicts)) != self.dict_lens:
            return None
        try:
            training = tuple(map(getitem, dicts, repeat("training", len(dicts))))
            children = tuple(map(getitem, dicts, repeat("_modules", len(dicts))))
            values = tuple(map(getitem, self.owners, self.names))
            hooks = tuple(map(getitem, self.hook_owners, self.hook_names))
        except KeyError:
            return None
        if tuple(map(len, children)) != self.child_lens or \
                not all(map(is_, chain.from_iterable(map(dict.values, children)), self.children)) or \
                tuple(map(type, values)) != self.types or not _SCALARS.issuperset(map(type, training)):
            return None
        s, d, q, c, f, g = self.bounds
        dicts_: tuple[Any, ...] = values[s:d]
        seqs: tuple[Any, ...] = values[d:q]
        if dicts_ and (max(map(len, dicts_)) > MAX_ITEMS or
                       not _SCALARS.issuperset(map(type, chain.from_iterable(dicts_))) or
                       not _SCALARS.issuperset(map(type, chain.from_iterable(map(dict.values, dicts_))))):
            return None
        if seqs and (max(map(len, seqs)) > MAX_ITEMS or
                     not _SCALARS.issuperset(map(type, chain.from_iterable(seqs)))):
            return None
        seen: set = set()
        others = tuple(map(_plain, values[q:c])) + tuple(("<fn>", _callable_name(v)) for v in values[c:f]) + \
            tuple(_once(v, seen) for v in values[f:g])
        hooked = tuple(entry for entry in ((self.hook_where[j], _hook_names(hooks[j]))
                                           for j in compress(self.hook_index, hooks)) if entry[1])
        return (self.signature, training, values[:s], tuple(map(tuple, map(dict.items, dicts_))),
                tuple(map(tuple, seqs)), others, hooked)


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_state_key(model: torch.nn.Module) -> tuple:
    """Everything in ``model``'s tree that can change what torch.export traces (module
    docstring), as a hashable tuple. Equal states give equal keys, also on two processes,
    whose ``repr`` then agree too (:func:`key_fingerprint`)."""
    from torch.nn.modules import module as nn_module
    plan = _PLANS.get(model)
    key = plan.key(model) if plan is not None else None
    if key is None:
        plan = _PLANS[model] = _Plan(model)
        key = plan.key(model)
        assert key is not None, "a fresh plan describes the model"
    global_hooks = tuple((name, tuple(map(_callable_name, getattr(nn_module, name).values())))
                         for name in _GLOBAL_HOOKS if getattr(nn_module, name, None))
    return global_hooks, key


def training_flags(key: tuple) -> tuple:
    """Every module's ``training`` flag (in ``model.modules()`` order) from its key."""
    return key[1][1]


def key_fingerprint(key: tuple) -> int:
    """A key's checksum, the same on every process for the same state (``repr`` of plain
    values; ``hash`` of a ``str`` differs between processes)."""
    return zlib.crc32(repr(key).encode())


# ----------------------------------------------------------------------------- messages
def _entries(key: tuple) -> tuple[int, dict]:
    """``(number of modules, {(module index, attribute path): value})`` of a key."""
    (classes, tracked), training, scalars, dicts_, seqs, others, hooked = key[1]
    out: dict = {(i, "<class>"): cls.__qualname__ for i, cls in enumerate(classes)}
    out.update(((i, "training"), flag) for i, flag in enumerate(training))
    values = list(scalars) + [("<dict>", v) for v in dicts_] + list(seqs) + list(others)
    for (_, i, name), value in zip(tracked, values):
        if isinstance(value, _Config):
            out.update(_flat_config(value, i, name + "."))
        elif value is not _SKIP:
            out[(i, name)] = value
    for (i, hook), names in hooked:
        out[(i, hook)] = ("<hooks>",) + names
    return len(classes), out


def _flat_config(config: _Config, i: int, prefix: str) -> dict:
    out = {}
    for k, v in config:
        if isinstance(v, _Config):
            out.update(_flat_config(v, i, f"{prefix}{k}."))
        else:
            out[(i, prefix + k)] = v
    return out


def _show(value) -> str:
    if isinstance(value, tuple) and value and value[0] in ("<dict>", "<set>", "<hooks>", "<fn>"):
        kind = value[0]
        if kind == "<hooks>":
            return f"{len(value) - 1} hook(s) ({', '.join(value[1:])})"
        if kind == "<fn>":
            return f"function {value[1]}"
        if kind == "<dict>":
            return "{" + ", ".join(f"{_show(k)}: {_show(v)}" for k, v in value[1]) + "}"
        return "{" + ", ".join(map(_show, value[1])) + "}" if value[1] else "set()"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_show, value)) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def describe_changes(model: torch.nn.Module, old: tuple, new: tuple, limit: int = 8) -> list[str]:
    """What differs between two keys of ``model`` (``new`` its current state), one line per
    attribute path, e.g. ``base_model.model.layers.0.self_attn.q_proj._disable_adapters:
    False -> True`` (absent: ``-``). For messages only (it names every module): on a miss."""
    lines: list[str] = []
    if old[0] != new[0]:
        lines.append(f"global module hooks: {_show(old[0])} -> {_show(new[0])}")
    (n_old, a), (n_new, b) = _entries(old), _entries(new)
    if n_old != n_new:
        lines.append(f"the module tree: {n_old} -> {n_new} modules")
        return lines
    names = [name for name, _ in model.named_modules()]
    for where in list(a) + [w for w in b if w not in a]:
        x, y = a.get(where, _SKIP), b.get(where, _SKIP)
        if x is _SKIP or y is _SKIP or x != y or type(x) is not type(y):
            i, attr = where
            path = names[i] + "." + attr if names[i] else attr
            if attr == "<class>":
                path = f"{names[i] or 'the model'}: class"
            lines.append(f"{path}: {'-' if x is _SKIP else _show(x)} -> {'-' if y is _SKIP else _show(y)}")
    if len(lines) > limit:
        lines[limit:] = [f"... and {len(lines) - limit} more"]
    return lines


def state_table(model: torch.nn.Module, key: tuple) -> dict[str, str]:
    """``{attribute path: value as written in messages}`` of ``model``'s key (a plain dict, to
    send to the other ranks when their keys differ)."""
    n, entries = _entries(key)
    names = [name for name, _ in model.named_modules()][:n]
    table = {"<global module hooks>": _show(key[0]), "<modules>": str(n)}
    for (i, attr), value in entries.items():
        name = names[i] if i < len(names) else f"<module {i}>"
        table[f"{name or 'the model'}: class" if attr == "<class>" else
              f"{name}.{attr}" if name else attr] = _show(value)
    return table


def describe_rank_differences(tables: list[dict], ranks: list[int], limit: int = 4) -> list[str]:
    """The attributes whose values differ between ranks' :func:`state_table`, one line each."""
    lines = []
    for path in dict.fromkeys(p for t in tables for p in t):
        values = [t.get(path, "-") for t in tables]
        if len(set(values)) > 1:
            lines.append(f"{path} ({', '.join(f'rank {r}: {v}' for r, v in zip(ranks, values))})")
    if len(lines) > limit:
        lines[limit:] = [f"... and {len(lines) - limit} more"]
    return lines
