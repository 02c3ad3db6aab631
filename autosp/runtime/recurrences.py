"""Linear-recurrence layers as transformers ships them (Gated DeltaNet, Mamba2, Mamba-1, lightning attention, mLSTM): ops with stated semantics.

transformers' torch paths of these layers call module-level functions:

- ``torch_chunk_gated_delta_rule(q, k, v, g, beta, ...)`` (Qwen3-Next, Qwen3.5): the
  recurrent state is ``[B, H, dk, dv]``;
- ``mamba2_chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, ...)`` (Granite-4 hybrid,
  Nemotron-H, Mamba2): the SSD scan, state ``[B, H, head_dim, d_state]``;
- ``mamba_selective_scan(x, dt, A, B, C, D, z, delta_bias, ...)`` (Mamba, Falcon-Mamba,
  Jamba, Zamba): Mamba-1's scan on ``[B, d_inner, S]``, state ``[B, d_inner, d_state]``;
  its torch path is a Python loop over the positions;
- MiniMax's lightning attention, whose loop over blocks sits in the layer's ``forward``
  (no module-level function): the layer is stated instead (:func:`lightning_attention_as_op`),
  state ``[B, H, d_k, d_v]``;
- xLSTM's mLSTM, run by the backend module transformers builds from its configuration
  (:func:`mlstm_as_op`), state ``(C, n, m)``; not linear in it (a chain only).

Each pads the sequence to a multiple of its chunk size and loops over the chunks,
carrying the state from one to the next. Exported, the loop is unrolled for the example's
chunk count and the padding is ``S + (64 - S % 64) % 64``: no program of symbolic S.

autosp does not read those loops. It states what each function is: while the model is
exported, the function is replaced by one op (``autosp::gated_delta_rule``,
``autosp::mamba2_chunk_scan``), whose semantics are a **linear recurrence along dim 1**
of its sequence inputs (``[B, S, ...]``; the others, e.g. Mamba's ``A``, ``D`` and
``dt_bias``, hold no position): output t is the kernel's output at t from the state after
positions 0 .. t, and running the kernel on positions a .. b from the state the
positions 0 .. a left gives exactly the positions a .. b of the whole run (each kernel's
own initial-state / final-state contract). The layout rules shard it along the sequence
(``OpClass.RECURRENCE``), and the emitted program calls :func:`gated_delta_rule` /
:func:`mamba2_chunk_scan`: on one rank the kernel itself; on P ranks one of two methods
(``autosp.scan_method``, priced by :mod:`autosp.cost.recurrence`):

- **chain** (:class:`_Chained`): each rank runs its part from the state the previous rank
  sends (the ranks in sequence order); in backward the state's gradient travels back.
  P times one part's time per layer, each way; one state per rank boundary.
- **prefix** (:class:`_Prefixed`): each kernel is also linear in (initial state, values)
  together, each value column on its own (:class:`Stated`). So every rank runs its part
  at once from the identity appended to the state, which gives its output from zeros, its
  transition and final state (its summary) and the basis that maps an incoming state to
  its outputs; the ranks all-gather the summaries, compose those before them, and correct
  their outputs. One (widened) part's time; P - 1 summaries in, one all-gather each way.

``autosp::gated_delta_rule`` may also take ``starts`` ([B, S], true where a packed document
starts: torchtitan's Qwen3.5, :mod:`autosp.titan`): the state restarts from zero there,
each piece between starts is one kernel call, and such an op runs as a chain.

The tests check each statement on random inputs: the kernel run in parts, state passed,
equals the kernel run whole; and both methods on 2 and 4 ranks against an exact float64
recurrence. A call the statement does not cover (an initial state given, the final state
asked for: a cache) runs the kernel as exported.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import itertools
import json
import sys
import types
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autosp.ir.ops import (  # as they import (torch.operator)
    GATED_DELTA_RULE,
    LIGHTNING_ATTENTION,
    MAMBA2_CHUNK_SCAN,
    MLSTM,
    SELECTIVE_SCAN,
)
from autosp.runtime import opaque


# ----------------------------------------------------------------------------- the ops
@torch.library.custom_op("autosp::gated_delta_rule", mutates_args=())
def gated_delta_rule_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, l2norm: bool, chunk: int, kernel: str,
                        starts: torch.Tensor | None = None) -> torch.Tensor:
    """The stated Gated DeltaNet op (export; the emitted program calls :func:`gated_delta_rule`)."""
    return gated_delta_rule(query, key, value, g, beta, l2norm, chunk, kernel, starts).contiguous()


@gated_delta_rule_op.register_fake
def _(query, key, value, g, beta, l2norm, chunk, kernel, starts=None):
    return value.new_empty(value.shape)


@torch.library.custom_op("autosp::mamba2_chunk_scan", mutates_args=())
def mamba2_chunk_scan_op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                         D: torch.Tensor | None, dt_bias: torch.Tensor | None, chunk: int, dt_softplus: bool,
                         dt_min: float, dt_max: float, kernel: str) -> torch.Tensor:
    """The stated Mamba2 SSD op (export; the emitted program calls :func:`mamba2_chunk_scan`)."""
    return mamba2_chunk_scan(x, dt, A, B, C, D, dt_bias, chunk, dt_softplus, dt_min, dt_max, kernel).contiguous()


@mamba2_chunk_scan_op.register_fake
def _(x, dt, A, B, C, D, dt_bias, chunk, dt_softplus, dt_min, dt_max, kernel):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, torch.float32))


@torch.library.custom_op("autosp::selective_scan", mutates_args=())
def selective_scan_op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                      D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
                      delta_softplus: bool, kernel: str) -> torch.Tensor:
    """The stated Mamba-1 selective scan (export; the emitted program calls :func:`selective_scan`)."""
    return selective_scan(x, dt, A, B, C, D, z, delta_bias, delta_softplus, kernel).contiguous()


def _selective_dtype(x, D, z) -> torch.dtype:
    """The kernel's output dtype: ``(scan + x * D) * silu(z)`` promotes."""
    dtype = x.dtype
    for t in (D, z):
        dtype = torch.promote_types(dtype, t.dtype) if t is not None else dtype
    return dtype


@selective_scan_op.register_fake
def _(x, dt, A, B, C, D, z, delta_bias, delta_softplus, kernel):
    return x.new_empty(x.shape, dtype=_selective_dtype(x, D, z))


@torch.library.custom_op("autosp::lightning_attention", mutates_args=())
def lightning_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slope: torch.Tensor,
                           block: int) -> torch.Tensor:
    """The stated lightning-attention op (export; the emitted program calls :func:`lightning_attention`)."""
    return lightning_attention(query, key, value, slope, block).contiguous()


@lightning_attention_op.register_fake
def _(query, key, value, slope, block):
    return value.new_empty(value.shape)


@torch.library.custom_op("autosp::mlstm", mutates_args=())
def mlstm_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, igate: torch.Tensor, fgate: torch.Tensor,
             backend: str) -> torch.Tensor:
    """The stated mLSTM op (export; the emitted program calls :func:`mlstm`)."""
    return mlstm(query, key, value, igate, fgate, backend).contiguous()


@mlstm_op.register_fake
def _(query, key, value, igate, fgate, backend):
    return value.new_empty(value.shape)


def _kernel(path: str):
    """The kernel function ``"module:name"`` (transformers' own, unpatched)."""
    module, _, name = path.partition(":")
    return _ORIGINALS.get(path) or getattr(importlib.import_module(module), name)


_ORIGINALS: dict[str, object] = {}


# ----------------------------------------------------------------------------- export
def _stated_gated_delta_rule(original, path):
    def stated(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs):
        # (the torch path ignores its other keywords, cu_seqlens included: so does the op)
        if initial_state is not None or output_final_state:
            return original(query, key, value, g, beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        out = torch.ops.autosp.gated_delta_rule(query, key, value, g, beta, bool(use_qk_l2norm_in_kernel),
                                                int(chunk_size), path)
        return out, None
    return stated


def _stated_mamba2_chunk_scan(original, path):
    def stated(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
               dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):
        if initial_states is not None or return_final_states or kwargs.get("z") is not None or \
                kwargs.get("seq_idx") is not None:
            return original(hidden_states, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias,
                            initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                            return_final_states=return_final_states, **kwargs)
        return torch.ops.autosp.mamba2_chunk_scan(hidden_states, dt, A, B, C, D, dt_bias, int(chunk_size),
                                                  bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]), path)
    return stated


def _stated_selective_scan(original, path):
    def stated(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
               return_last_state=False, **kwargs):
        # (use_mambapy / use_associative_scan choose how the torch path computes the same scan)
        if return_last_state:  # a cache wants the final state: the kernel as exported
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
                            delta_softplus=delta_softplus, return_last_state=return_last_state, **kwargs)
        t = lambda v: None if v is None else v.transpose(1, 2)  # noqa: E731  ([B, D, S] -> [B, S, D])
        return torch.ops.autosp.selective_scan(t(hidden_states), t(dt), A, t(B), t(C), D, t(z), delta_bias,
                                               bool(delta_softplus), path).transpose(1, 2)
    return stated


@contextlib.contextmanager
def _kernel_as_op(model: torch.nn.Module, kernel: str, make: Callable):
    """While exporting: every transformers modeling module ``model``'s layers come from
    that defines ``kernel`` calls its stated op instead (``make(original, path)``), for the
    calls the statement covers (no initial state, no final state wanted)."""
    patched = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        mod = sys.modules.get(name)
        original = getattr(mod, kernel, None) if mod is not None else None
        if original is None:
            continue
        path = f"{name}:{kernel}"
        _ORIGINALS[path] = original
        setattr(mod, kernel, make(original, path))
        patched.append((mod, original))
    try:
        yield len(patched)
    finally:
        for mod, original in patched:
            setattr(mod, kernel, original)


def gated_delta_rule_as_op(model: torch.nn.Module):
    """The export substitution of ``autosp::gated_delta_rule`` (its registry record):
    transformers' ``torch_chunk_gated_delta_rule``, by name in the model's modeling modules."""
    return _kernel_as_op(model, "torch_chunk_gated_delta_rule", _stated_gated_delta_rule)


def selective_scan_as_op(model: torch.nn.Module):
    """The export substitution of ``autosp::selective_scan`` (its registry record):
    transformers' ``mamba_selective_scan`` (Mamba, Falcon-Mamba, Jamba, Zamba), by name in
    the model's modeling modules."""
    return _kernel_as_op(model, "mamba_selective_scan", _stated_selective_scan)


def mamba2_chunk_scan_as_op(model: torch.nn.Module):
    """The export substitution of ``autosp::mamba2_chunk_scan`` (its registry record):
    transformers' ``mamba2_chunk_scan``, by name in the model's modeling modules."""
    return _kernel_as_op(model, "mamba2_chunk_scan", _stated_mamba2_chunk_scan)


# MiniMax's lightning attention is no module-level function: the loop over blocks sits in
# the layer's forward. Its substitution is a forward of the layer written from the statement
# (projections, padding mask, the op, norm, output gate, out projection), admitted per class
# only where it equals the layer's own forward on random inputs (_lightning_statement).
_LIGHTNING_PARTS = ("qkv_proj", "act_fn", "norm", "output_gate", "out_proj", "slope_rate", "block_size",
                    "num_attention_heads", "head_dim")
_LIGHTNING_CHECKED: dict[type, str | None] = {}  # layer class -> None if its statement holds, else why not


def _lightning_forward(layer: torch.nn.Module, padding_mask: Callable):
    def forward(hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        bsz, seq, _ = hidden_states.shape
        heads, dim = layer.num_attention_heads, layer.head_dim
        qkv = padding_mask(layer.act_fn(layer.qkv_proj(hidden_states)), attention_mask)
        q, k, v = torch.split(qkv.reshape(bsz, seq, heads, 3 * dim), dim, dim=3)
        out = torch.ops.autosp.lightning_attention(q, k, v, layer.slope_rate.reshape(-1), int(layer.block_size))
        out = layer.norm(out.reshape(bsz, seq, heads * dim))
        return layer.out_proj(torch.sigmoid(layer.output_gate(hidden_states)) * out), None
    return forward


def _has_values(module: torch.nn.Module) -> bool:
    """Whether every parameter and buffer of ``module`` holds data (none on meta)."""
    return not any(t.is_meta for t in itertools.chain(module.parameters(), module.buffers()))


def _cpu_twin(layer: torch.nn.Module, config) -> torch.nn.Module | str:
    """A float32 CPU instance of ``layer``'s class built as transformers builds it
    (``cls(config, layer_idx)``), with random weights and the buffers its constructor
    computes: what a statement check runs on when the layer's own weights are on meta (a
    model built for planning). Else why it could not be built."""
    try:
        with torch.device("cpu"):
            twin = type(layer)(config, layer.layer_idx)
    except Exception as e:  # noqa: BLE001 - any failure: no twin
        return f"its weights are on meta and no CPU copy of it could be built ({type(e).__name__}: {e})"
    return twin.float()


def _lightning_statement(layer: torch.nn.Module, forward: Callable) -> str | None:
    """None if ``forward`` equals the layer's own forward (no cache) on random inputs of
    2 blocks and 3 positions, with a padding mask; else why not. (A layer on meta is
    checked through a CPU twin; see :func:`lightning_attention_as_op`.)"""
    own = type(layer).forward
    gen = torch.Generator().manual_seed(0)
    param = next(layer.parameters())
    x = torch.randn(2, 2 * int(layer.block_size) + 3, layer.qkv_proj.in_features, generator=gen).to(param)
    mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
    mask[1, :2] = 0  # left padding in the second row
    try:
        with torch.no_grad():
            expected = own(layer, x, None, mask, None)[0]
            got = forward(x, None, mask, None)[0]
    except Exception as e:  # noqa: BLE001 - any failure: not admitted
        return f"its forward could not be run on random inputs ({type(e).__name__}: {e})"
    scale = expected.abs().max().clamp_min(1e-30)
    err = float((got - expected).abs().max() / scale)
    return None if err <= 1e-4 else f"the stated forward differs from the layer's own by {err:.1e} (relative)"


@contextlib.contextmanager
def lightning_attention_as_op(model: torch.nn.Module):
    """The export substitution of ``autosp::lightning_attention`` (its registry record): each
    layer of a class named ``*LightningAttention`` that has MiniMax's parts
    (:data:`_LIGHTNING_PARTS`) runs :func:`_lightning_forward` while exporting, where the
    class's statement holds (checked once per class); a class where it fails is left to the
    export, which unrolls its loop for the example's length."""
    patched = []
    for layer in model.modules():
        cls = type(layer)
        if not cls.__name__.endswith("LightningAttention") or not all(hasattr(layer, a) for a in _LIGHTNING_PARTS):
            continue
        padding_mask = getattr(sys.modules.get(cls.__module__), "apply_mask_to_padding_states", None)
        if padding_mask is None:
            continue
        forward = _lightning_forward(layer, padding_mask)
        if cls not in _LIGHTNING_CHECKED:
            checked = layer
            if not _has_values(layer):  # meta weights (planning): the class is checked on a CPU twin
                checked = _cpu_twin(layer, getattr(model, "config", None))
                if isinstance(checked, str):  # not cached: a model with weights may still be checked
                    warnings.warn(f"{cls.__name__} is exported as written (its statement was not checked): "
                                  f"{checked}", stacklevel=2)
                    continue
            _LIGHTNING_CHECKED[cls] = _lightning_statement(checked, _lightning_forward(checked, padding_mask))
        if _LIGHTNING_CHECKED[cls] is not None:
            continue

        def stated(*args, _forward=forward, _layer=layer, **kwargs):
            if kwargs.get("cache") is not None:  # a cache wants the final state: the layer's own forward
                return type(_layer).forward(_layer, *args, **kwargs)
            return _forward(*args, **kwargs)
        patched.append((layer, stated))
    with _forwards_set(patched):
        yield len(patched)


@contextlib.contextmanager
def _forwards_set(patched: list):
    """Each ``(module, forward)``: the module's ``forward`` for the block (an instance
    attribute, so only that module), restored after."""
    saved = [(module, module.__dict__.get("forward")) for module, _ in patched]
    for module, forward in patched:
        module.forward = forward
    try:
        yield
    finally:
        for module, original in saved:
            if original is None:
                del module.forward
            else:
                module.forward = original


# xLSTM's mLSTM: its backend module (transformers' xLSTMBackend, configured by mode, chunk
# size and eps) runs the kernels and takes initial states (C, n, m) and returns the last
# ones. The stated op names the backend by its class and configuration (JSON), so any
# process builds the same backend; the substitution is checked per class on random inputs.
_MLSTM_CONFIG = ("mode", "chunk_size", "eps", "inference_state_dtype", "autocast_kernel_dtype", "return_last_states")
_MLSTM_CHECKED: dict[type, str | None] = {}


@functools.cache
def _mlstm_backend(key: str):
    """The backend module ``key`` names (built once per process)."""
    spec = json.loads(key)
    module, _, name = spec["cls"].partition(":")
    return getattr(importlib.import_module(module), name)(types.SimpleNamespace(**spec["config"]))


def _mlstm_key(backend: torch.nn.Module) -> str:
    cls = type(backend)
    return json.dumps({"cls": f"{cls.__module__}:{cls.__qualname__}",
                       "config": {n: getattr(backend.config, n) for n in _MLSTM_CONFIG}}, sort_keys=True)


def _mlstm_forward(backend: torch.nn.Module, key: str):
    def forward(query, key_, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                return_last_states=None, mode=None):
        h = torch.ops.autosp.mlstm(query.transpose(1, 2), key_.transpose(1, 2), value.transpose(1, 2),
                                   igate.transpose(1, 2), fgate.transpose(1, 2), key).transpose(1, 2)
        returns_states = "inference" in backend.config.mode or (
            return_last_states if return_last_states is not None else backend.config.return_last_states)
        return (h, None) if returns_states else h
    return forward


def _mlstm_statement(backend: torch.nn.Module, key: str) -> str | None:
    """None if the stated forward equals the backend's own on random inputs (2 chunks and 3
    positions, 2 heads); else why not."""
    gen = torch.Generator().manual_seed(0)
    chunk = int(backend.config.chunk_size)
    q, k, v = (torch.randn(2, 2, 2 * chunk + 3, 8, generator=gen) for _ in range(3))
    i, f = (3 * torch.randn(2, 2, 2 * chunk + 3, generator=gen) for _ in range(2))
    try:
        with torch.no_grad():
            own = backend(query=q, key=k, value=v, igate=i, fgate=f, return_last_states=True)
            got = mlstm(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), i.transpose(1, 2),
                        f.transpose(1, 2), key).transpose(1, 2)
    except Exception as e:  # noqa: BLE001 - any failure: not admitted
        return f"its backend could not be run on random inputs ({type(e).__name__}: {e})"
    expected = own[0] if isinstance(own, tuple) else own
    err = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
    return None if err <= 1e-4 else f"the stated op differs from the backend's own by {err:.1e} (relative)"


@contextlib.contextmanager
def mlstm_as_op(model: torch.nn.Module):
    """The export substitution of ``autosp::mlstm`` (its registry record): each xLSTM backend
    module (a class named ``xLSTMBackend`` with the configuration :data:`_MLSTM_CONFIG`)
    calls the op while exporting, for calls without initial states (no cache), where the
    class's statement holds (checked once per class)."""
    patched = []
    for backend in model.modules():
        cls = type(backend)
        config = getattr(backend, "config", None)
        if cls.__name__ != "xLSTMBackend" or config is None or not all(hasattr(config, a) for a in _MLSTM_CONFIG):
            continue
        key = _mlstm_key(backend)
        if cls not in _MLSTM_CHECKED:
            _MLSTM_CHECKED[cls] = _mlstm_statement(backend, key)
        if _MLSTM_CHECKED[cls] is not None:
            continue
        stated_forward = _mlstm_forward(backend, key)

        def forward(*args, _stated=stated_forward, _backend=backend, **kwargs):
            if any(kwargs.get(n) is not None for n in ("c_initial", "n_initial", "m_initial")) or len(args) > 5:
                return type(_backend).forward(_backend, *args, **kwargs)  # a cache: the backend as exported
            names = ("query", "key", "value", "igate", "fgate")
            call = dict(zip(names, args), **kwargs)
            return _stated(call.pop("query"), call.pop("key"), call.pop("value"), call.pop("igate"),
                           call.pop("fgate"), **call)
        patched.append((backend, forward))
    with _forwards_set(patched):
        yield len(patched)


class _Chained(torch.autograd.Function):
    """This rank's part of a recurrence: ``run(inputs, state) -> (out, final state)``, the
    state from the previous rank in, the state to the next out. Backward: the final
    state's gradient from the next rank, the part recomputed and differentiated, the
    initial state's gradient to the previous rank."""

    @staticmethod
    def forward(ctx, run, state_shape, dtype, group, ranks, rank, *inputs):
        from autosp.runtime import collectives
        device = inputs[0].device
        state = torch.zeros(state_shape, dtype=dtype, device=device)
        pg = collectives.process_group(group)
        live = not collectives.simulating()  # the memory model: the same saved tensors, no messages
        if rank > 0 and live:
            dist.recv(state, src=dist.get_global_rank(pg, ranks[rank - 1]), group=pg)
        with torch.no_grad():
            out, final = _part(run, inputs, state)
        if rank < len(ranks) - 1:
            message = _message(final, dtype)
            collectives.record("state", group, message)
            if live:
                dist.send(message, dst=dist.get_global_rank(pg, ranks[rank + 1]), group=pg)
        ctx.save_for_backward(state, *[t if isinstance(t, torch.Tensor) else None for t in inputs])
        ctx.args = (run, group, ranks, rank)
        ctx.tensor_inputs = [isinstance(t, torch.Tensor) for t in inputs]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from autosp.runtime import collectives
        run, group, ranks, rank = ctx.args
        state, *saved = ctx.saved_tensors
        pg = collectives.process_group(group)
        grad_final = torch.zeros_like(state)
        live = not collectives.simulating()
        if rank < len(ranks) - 1 and live:
            dist.recv(grad_final, src=dist.get_global_rank(pg, ranks[rank + 1]), group=pg)
        inputs = [t.detach().requires_grad_(t.is_floating_point()) if t is not None else None for t in saved]
        start = state.detach().requires_grad_(rank > 0)
        with torch.enable_grad():
            out, final = _part(run, inputs, start)
            wrt = [t for t in inputs + [start] if t is not None and t.requires_grad]
            # (a rank holding no positions: its output is empty, its final state its start)
            outs = [(o, g) for o, g in ((out, grad_out), (final, grad_final.to(final.dtype))) if o.requires_grad]
            grads = torch.autograd.grad([o for o, _ in outs], wrt, [g for _, g in outs], allow_unused=True) \
                if outs and wrt else [None] * len(wrt)
        found = dict(zip([id(t) for t in wrt], grads))
        if rank > 0:
            grad_start = found.get(id(start))
            grad_start = torch.zeros_like(state) if grad_start is None else grad_start
            message = _message(grad_start, state.dtype)
            collectives.record("state", group, message, backward=True)
            if live:
                dist.send(message, dst=dist.get_global_rank(pg, ranks[rank - 1]), group=pg)
        return (None, None, None, None, None, None, *[found.get(id(t)) if t is not None else None for t in inputs])


def _message(state: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A state as sent: contiguous (Mamba2's kernel returns its final state as a view of
    all the chunks' states; NCCL sends whole tensors), in the chain's dtype."""
    return state.to(dtype).contiguous()


def _part(run, inputs, state):
    """``run`` on this rank's positions; a rank that holds none passes the state on."""
    if inputs[0].shape[1] == 0:
        return inputs[0].new_zeros(inputs[0].shape), state
    return run(inputs, state)


def _one_piece(group: str) -> None:
    from autosp.runtime import collectives
    lay = collectives.layout(group)
    if lay.zigzag:
        raise RuntimeError(f"autosp: a recurrence along the sequence needs each rank's positions in one piece; the "
                           f"layout {lay.describe()} gives a rank two (zigzag): compile with sp_strategy='ulysses'")


def _by_documents(step: Callable, inputs: list, starts: torch.Tensor, state: torch.Tensor):
    """``step(*inputs, state) -> (out, final)`` over packed documents: each row of
    ``starts`` ([B, S], true where a document starts) cuts its row into pieces, and each
    piece after a cut runs from a zero state (a row that starts with a document drops
    ``state`` too). Returns the outputs and each row's state after its last position."""
    outs, finals = [], []
    for row in range(starts.shape[0]):
        pieces = [t[row:row + 1] for t in inputs]
        bounds = [0, *[int(i) for i in starts[row].nonzero().flatten().tolist() if i > 0], starts.shape[1]]
        s = state[row:row + 1]
        if bool(starts[row, 0]):
            s = torch.zeros_like(s)
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            o, s = step(*[t[:, lo:hi] for t in pieces], s if lo == 0 else torch.zeros_like(s))
            parts.append(o)
        outs.append(torch.cat(parts, 1))
        finals.append(s)
    return torch.cat(outs, 0), torch.cat(finals, 0)


def _sized(fn: Callable, chunk: int) -> dict:
    """``chunk_size=chunk`` where the kernel takes one (transformers'), else nothing (fla's
    kernels chunk by their own size)."""
    try:
        return {"chunk_size": chunk} if "chunk_size" in inspect.signature(fn).parameters else {}
    except (TypeError, ValueError):
        return {"chunk_size": chunk}


def _chain(run: Callable, inputs: list, state_shape, group: str | None, whole: Callable):
    """``whole()`` on one rank; else this rank's part of the chain over ``group``."""
    from autosp.runtime import collectives
    if group is None or collectives.group_size(group) == 1:
        return whole()
    _one_piece(group)
    p = collectives.group_size(group)  # without zigzag the ranks hold the sequence in rank order
    dtype = torch.promote_types(inputs[0].dtype, torch.float32)  # transformers' kernels keep the state in fp32
    return _Chained.apply(run, tuple(state_shape), dtype, group, list(range(p)), collectives.group_rank(group), *inputs)


# ----------------------------------------------------------------------------- the prefix
class Stated:
    """How a stated recurrence runs from an *identity* state: the kernel is linear in
    (initial state, value input) jointly, and each value column evolves on its own under
    one linear map of the state (Gated DeltaNet: the state's ``d_v`` columns under
    ``S -> M S``; Mamba2: the state's ``head_dim`` rows under ``h -> h M``). So one run with
    the identity appended to the state (and zeros appended to the values) gives, besides
    the zero-state output, the part's **transition** ``T`` (the identity's image) and, per
    position, the **basis** through which an incoming state reaches the output.

    ``summarise(inputs) -> (out0, basis, T, s)``: the part from a zero state (output,
    final state ``s``), the basis and ``T``; ``combine(T, S, s)``: the state after the
    part from ``S``; ``correct(out0, basis, S)``: the output from ``S``."""

    def __init__(self, summarise, combine, correct, out_dtype):
        self.summarise, self.combine, self.correct, self.out_dtype = summarise, combine, correct, out_dtype


def _gdn_stated(fn, chunk: int, l2norm: bool, out_dtype) -> Stated:
    def summarise(inputs):
        q, k, v, gate, b = inputs
        bsz, seq, heads, dv = v.shape
        dk, wide = q.shape[-1], torch.promote_types(v.dtype, torch.float32)
        start = torch.eye(dk, dk + dv, dtype=wide, device=v.device).expand(bsz, heads, dk, dk + dv)  # [I | 0]
        if seq == 0:
            out = v.new_zeros(bsz, 0, heads, dk + dv, dtype=wide)
            final = start
        else:  # (transformers' kernel computes in float32 whatever it is given: fed float32, its output stays)
            values = torch.cat([v.new_zeros(bsz, seq, heads, dk, dtype=wide), v.to(wide)], -1)
            out, final = fn(q.to(wide), k.to(wide), values, g=gate, beta=b, initial_state=start,
                            output_final_state=True, use_qk_l2norm_in_kernel=l2norm, **_sized(fn, chunk))
        return out[..., dk:], out[..., :dk], final[..., :dk], final[..., dk:]

    return Stated(summarise, lambda T, S, s: T @ S + s,
                  lambda out0, basis, S: out0 + torch.einsum("bshk,bhkv->bshv", basis, S), out_dtype)


def _mamba2_stated(fn, chunk: int, dt_softplus: bool, dt_limit, out_dtype) -> Stated:
    def summarise(inputs):
        x, dt, B, C, A, D, dt_bias = inputs
        bsz, seq, heads, hd = x.shape
        n, wide = B.shape[-1], out_dtype
        start = torch.cat([torch.zeros(hd, n, dtype=wide, device=x.device),
                           torch.eye(n, dtype=wide, device=x.device)]).expand(bsz, heads, hd + n, n)  # [0; I]
        if seq == 0:
            out = x.new_zeros(bsz, 0, heads, hd + n, dtype=wide)
            final = start
        else:
            rows = torch.cat([x.to(wide), x.new_zeros(bsz, seq, heads, n, dtype=wide)], -1)
            out, final = fn(rows, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, initial_states=start,
                            dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=True)
        return out[..., :hd], out[..., hd:], final[:, :, hd:], final[:, :, :hd]

    return Stated(summarise, lambda T, S, s: S @ T + s,
                  lambda out0, basis, S: out0 + torch.einsum("bshm,bhdm->bshd", basis, S), out_dtype)


def _selective_stated(call, decay, out_dtype) -> Stated:
    """Mamba-1's scan is diagonal: each state entry ``h[d, n]`` decays by ``exp(A[d, n] *
    dt[t, d])`` per position, so a part's transition is the product of its decays (``T``,
    ``[B, D, N]``, applied entry-wise) and an incoming state reaches output ``t`` through
    ``silu(z_t) * C[t, n] * decay(0..t)[d, n]`` (the basis). No identity run is needed."""
    def summarise(inputs):
        xs, dts, Bs, Cs, zs, As, Ds, dbs = inputs
        bsz, seq, channels = xs.shape
        wide = torch.promote_types(xs.dtype, torch.float32)
        if seq == 0:
            n = As.shape[-1]
            return (xs.new_zeros(bsz, 0, channels, dtype=out_dtype), xs.new_zeros(bsz, 0, channels, n, dtype=wide),
                    xs.new_ones(bsz, channels, n, dtype=wide), xs.new_zeros(bsz, channels, n, dtype=wide))
        out, final = call(xs, dts, Bs, Cs, zs, As, Ds, dbs, True)
        dec = decay(dts, As, dbs)
        basis = Cs.to(dec.dtype)[:, :, None, :] * dec
        if zs is not None:
            basis = basis * F.silu(zs.to(dec.dtype))[..., None]
        return out, basis, dec[:, -1], final

    return Stated(summarise, lambda T, S, s: T * S + s,
                  lambda out0, basis, S: out0 + torch.einsum("btdn,bdn->btd", basis, S.to(basis.dtype)).to(out0.dtype),
                  out_dtype)


def _lightning_stated(run, out_dtype) -> Stated:
    """Lightning attention's state decays by one scalar per head (``exp(-slope)`` per
    position): a part's transition is ``exp(-slope L)`` (``T``, ``[B, H, 1, 1]``) and an
    incoming state reaches output ``t`` through ``q_t exp(-slope (t + 1))`` (the basis)."""
    def summarise(inputs):
        q, k, v, slope = inputs
        bsz, seq, heads, dk = q.shape
        zero = q.new_zeros(bsz, heads, dk, v.shape[-1])
        out, final = run(inputs, zero)
        steps = torch.arange(1, seq + 1, device=q.device, dtype=q.dtype)
        basis = q * torch.exp(-slope.to(q.dtype)[None, :] * steps[:, None])[None, :, :, None]
        T = torch.exp(-slope.to(q.dtype) * seq).reshape(1, heads, 1, 1).expand(bsz, heads, 1, 1).contiguous()
        return out, basis, T, final

    return Stated(summarise, lambda T, S, s: T * S + s,
                  lambda out0, basis, S: out0 + torch.einsum("bthd,bhde->bthe", basis, S.to(basis.dtype)).to(out0.dtype),
                  out_dtype)


def _prefix(combine, Ts: list, ss: list) -> list:
    """The state each part starts from: zeros, then each part's summary applied in order."""
    starts = [torch.zeros_like(ss[0])]
    for T, s in zip(Ts[:-1], ss[:-1]):
        starts.append(combine(T, starts[-1], s))
    return starts


def _gather(parts: list, group: str, backward: bool = False) -> list:
    """Every rank's ``parts`` (same shapes on every rank), one all-gather: a list per rank."""
    from autosp.runtime import collectives
    flat = torch.cat([t.reshape(-1) for t in parts]).contiguous()
    collectives.record("state", group, flat, backward=backward)
    p = collectives.group_size(group)
    if collectives.simulating():  # the memory model: the same tensors, no messages
        every = [flat.clone() for _ in range(p)]
    else:
        every = [torch.empty_like(flat) for _ in range(p)]
        dist.all_gather(every, flat, group=collectives.process_group(group))
    sizes = [t.numel() for t in parts]
    return [[piece.view(t.shape) for piece, t in zip(whole.split(sizes), parts)] for whole in every]


class _Prefixed(torch.autograd.Function):
    """This rank's part of a recurrence, all parts at once: each rank runs its part from the
    identity (:class:`Stated`), the ranks all-gather their summaries ``(T, s)``, each
    composes the ones before it into its incoming state and corrects its output. Backward
    recomputes the part, all-gathers each rank's incoming-state gradient, and takes its
    own summary's gradient through the (small, replicated) composition."""

    @staticmethod
    def forward(ctx, stated, group, rank, *inputs):
        with torch.no_grad():
            out0, basis, T, s = stated.summarise(inputs)
            every = _gather([T, s], group)
            Ts, ss = [e[0] for e in every], [e[1] for e in every]
            out = stated.correct(out0, basis, _prefix(stated.combine, Ts, ss)[rank]).to(stated.out_dtype)
        ctx.save_for_backward(torch.stack(Ts), torch.stack(ss), *[t if isinstance(t, torch.Tensor) else None
                                                                for t in inputs])
        ctx.args = (stated, group, rank)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        stated, group, rank = ctx.args
        Ts, ss, *saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.is_floating_point()) if t is not None else None for t in saved]
        with torch.enable_grad():
            out0, basis, T, s = stated.summarise(inputs)
            Tl = [t.detach().requires_grad_() for t in Ts.unbind(0)]
            sl = [t.detach().requires_grad_() for t in ss.unbind(0)]
            starts = _prefix(stated.combine, Tl, sl)
            mine = starts[rank].detach().requires_grad_()
            out = stated.correct(out0, basis, mine).to(stated.out_dtype)
            (grad_mine,) = torch.autograd.grad(out, mine, grad_out, retain_graph=True)
        grads_in = [g for (g,) in _gather([grad_mine], group, backward=True)]
        with torch.enable_grad():
            used = [(start, g) for start, g in zip(starts, grads_in) if start.requires_grad]
            mine_T, mine_s = (torch.zeros_like(Tl[rank]), torch.zeros_like(sl[rank]))
            if used:
                found = torch.autograd.grad([u for u, _ in used], [Tl[rank], sl[rank]], [g for _, g in used],
                                            allow_unused=True)
                mine_T = found[0] if found[0] is not None else mine_T
                mine_s = found[1] if found[1] is not None else mine_s
            wrt = [t for t in inputs if t is not None and t.requires_grad]
            # (a rank holding no positions: its summary is the identity, constant)
            outs = [(o, g) for o, g in ((out, grad_out), (T, mine_T), (s, mine_s)) if o.requires_grad]
            grads = torch.autograd.grad([o for o, _ in outs], wrt, [g for _, g in outs], allow_unused=True) \
                if outs and wrt else [None] * len(wrt)
        by_id = dict(zip([id(t) for t in wrt], grads))
        return (None, None, None, *[by_id.get(id(t)) if t is not None else None for t in inputs])


def _sharded(method: str, run: Callable, stated: Callable, inputs: list, state_shape, group: str | None,
             whole: Callable):
    """``whole()`` on one rank; else this rank's part, as a chain or as a prefix over ``group``."""
    if method == "prefix" and group is not None:
        from autosp.runtime import collectives
        if collectives.group_size(group) > 1:
            _one_piece(group)
            return _Prefixed.apply(stated(), group, collectives.group_rank(group), *inputs)
    if method not in ("chain", "prefix"):
        raise ValueError(f"autosp: a recurrence runs as 'chain' or 'prefix', not {method!r}")
    return _chain(run, inputs, state_shape, group, whole)


def gated_delta_rule(query, key, value, g, beta, l2norm: bool, chunk: int, kernel: str,
                     starts: torch.Tensor | None = None, *, group: str | None = None, method: str = "chain"):
    """``autosp::gated_delta_rule`` in the emitted program (see the module docstring).

    ``starts`` ([B, S], true where a packed document starts): the state restarts from zero
    there (torchtitan's per-document resets); such a call runs as a chain, whose parts
    restart where their documents do (the prefix's summaries assume no restart)."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call(GATED_DELTA_RULE, query, key, value, g, beta, l2norm, chunk, kernel, starts, group=group,
                           method=method)
    fn = _kernel(kernel)
    sized = _sized(fn, chunk)

    def step(q, k, v, gate, b, state):
        return fn(q, k, v, g=gate, beta=b, initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=l2norm, **sized)

    def run(inputs, state):
        q, k, v, gate, b = inputs[:5]
        return _by_documents(step, inputs[:5], inputs[5], state) if len(inputs) > 5 else step(q, k, v, gate, b, state)

    shape = (query.shape[0], value.shape[2], query.shape[3], value.shape[3])

    def whole():
        if starts is not None:
            state = query.new_zeros(shape, dtype=torch.promote_types(query.dtype, torch.float32))
            return _by_documents(step, [query, key, value, g, beta], starts, state)[0]
        return fn(query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=l2norm, **sized)[0]
    inputs = [query, key, value, g, beta] + ([starts] if starts is not None else [])
    return _sharded("chain" if starts is not None else method, run, lambda: _gdn_stated(fn, chunk, l2norm, value.dtype),
                    inputs, shape, group, whole)


def mamba2_chunk_scan(x, dt, A, B, C, D, dt_bias, chunk: int, dt_softplus: bool, dt_min: float, dt_max: float,
                      kernel: str, *, group: str | None = None, method: str = "chain"):
    """``autosp::mamba2_chunk_scan`` in the emitted program (see the module docstring)."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call(MAMBA2_CHUNK_SCAN, x, dt, A, B, C, D, dt_bias, chunk, dt_softplus, dt_min, dt_max, kernel,
                           group=group, method=method)
    fn = _kernel(kernel)

    def run(inputs, state):  # A, D and dt_bias too: their gradients come from every part
        xs, dts, Bs, Cs, As, Ds, dtbs = inputs
        return fn(xs, dts, As, Bs, Cs, chunk, D=Ds, dt_bias=dtbs, initial_states=state, dt_softplus=dt_softplus,
                  dt_limit=(dt_min, dt_max), return_final_states=True)

    def whole():
        return fn(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max))
    shape = (x.shape[0], x.shape[2], x.shape[3], B.shape[3])
    out_dtype = torch.promote_types(x.dtype, torch.float32)
    return _sharded(method, run, lambda: _mamba2_stated(fn, chunk, dt_softplus, (dt_min, dt_max), out_dtype),
                    [x, dt, B, C, A, D, dt_bias], shape, group, whole)


def selective_scan(x, dt, A, B, C, D, z, delta_bias, delta_softplus: bool, kernel: str, *, group: str | None = None,
                   method: str = "chain"):
    """``autosp::selective_scan`` in the emitted program: Mamba-1's scan on ``[B, S, D]``
    inputs (``B``, ``C``: ``[B, S, N]``; ``A``: ``[D, N]``), the kernel called in its own
    ``[B, D, S]`` layout. The kernel takes no initial state, so a part that starts from a
    state ``h`` adds what ``h`` contributes, read from the scan's statement (``h_t =
    exp(A dt_t) h_(t-1) + dt_t B_t x_t``, ``y_t = (C_t h_t + D x_t) silu(z_t)``): ``silu(z_t)
    C_t . (exp(A cumsum(dt)_t) h)``, and ``exp(A cumsum(dt)) h`` to its final state."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call(SELECTIVE_SCAN, x, dt, A, B, C, D, z, delta_bias, delta_softplus, kernel, group=group,
                           method=method)
    fn = _kernel(kernel)

    def call(xs, dts, Bs, Cs, zs, As, Ds, dbs, last: bool):
        t = lambda v: None if v is None else v.transpose(1, 2)  # noqa: E731
        result = fn(t(xs), t(dts), As, t(Bs), t(Cs), D=Ds, z=t(zs), delta_bias=dbs, delta_softplus=delta_softplus,
                    return_last_state=last)
        return (result[0].transpose(1, 2), result[1]) if last else result.transpose(1, 2)

    def decay(dts, As, dbs):  # [B, s, D, N]: the part's decays from its start, as the kernel discretises
        steps = dts if dbs is None else dts + dbs.to(dts.dtype)[None, None]
        steps = F.softplus(steps) if delta_softplus else steps
        return torch.exp(As[None, None] * steps.cumsum(1)[..., None])

    def run(inputs, state):
        xs, dts, Bs, Cs, zs, As, Ds, dbs = inputs
        out, final = call(xs, dts, Bs, Cs, zs, As, Ds, dbs, True)
        dec = decay(dts, As, dbs)
        incoming = torch.einsum("btn,btdn,bdn->btd", Cs.to(dec.dtype), dec, state.to(dec.dtype))
        if zs is not None:
            incoming = incoming * F.silu(zs.to(incoming.dtype))
        return out + incoming.to(out.dtype), final + dec[:, -1] * state.to(dec.dtype)

    out_dtype = _selective_dtype(x, D, z)
    shape = (x.shape[0], x.shape[2], A.shape[-1])
    return _sharded(method, run, lambda: _selective_stated(call, decay, out_dtype), [x, dt, B, C, z, A, D, delta_bias],
                    shape, group, lambda: call(x, dt, B, C, z, A, D, delta_bias, False))


def _lightning(q, k, v, slope, block: int, state):
    """Lightning attention on ``[B, S, H, D]`` from ``state`` (``[B, H, Dk, Dv]``, the
    decayed sum of ``k_s^T v_s`` over the positions before), block by block: ``o_t = q_t
    S_t`` with ``S_t = exp(-slope) S_(t-1) + k_t^T v_t`` per head. Returns the outputs and
    the state after the last position. Each block keeps its ``[L, L]`` scores, never
    ``[S, S]``."""
    lam = slope.to(q.dtype)
    outs = []
    for a in range(0, q.shape[1], block):
        qb, kb, vb = q[:, a:a + block], k[:, a:a + block], v[:, a:a + block]
        i = torch.arange(qb.shape[1], device=q.device, dtype=q.dtype)
        span = i[:, None] - i[None, :]
        within = torch.where(span >= 0, torch.exp(-lam[:, None, None] * span.clamp_min(0)), 0.0)  # [H, L, L]
        scores = torch.einsum("bihd,bjhd->bhij", qb, kb) * within
        into = torch.exp(-lam[None, :] * (i[:, None] + 1))[None, :, :, None]  # state -> position i
        outs.append(torch.einsum("bhij,bjhe->bihe", scores, vb) +
                    torch.einsum("bihd,bhde->bihe", qb * into, state.to(q.dtype)))
        out_of = torch.exp(-lam[None, :] * (qb.shape[1] - 1 - i)[:, None])[None, :, :, None]  # position -> block end
        state = state.to(q.dtype) * torch.exp(-lam * qb.shape[1])[None, :, None, None] + \
            torch.einsum("bjhd,bjhe->bhde", kb * out_of, vb)
    return (torch.cat(outs, 1) if outs else v.new_zeros(v.shape)), state


def lightning_attention(query, key, value, slope, block: int, *, group: str | None = None, method: str = "chain"):
    """``autosp::lightning_attention`` in the emitted program: MiniMax's lightning attention
    (a linear attention whose state decays by ``exp(-slope)`` per position and head) on
    ``[B, S, H, D]`` inputs, ``slope`` ``[H]``. Its statement is :func:`_lightning`'s
    recurrence, with no normalisation and no restart (as transformers' layer)."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call(LIGHTNING_ATTENTION, query, key, value, slope, block, group=group, method=method)

    def run(inputs, state):
        q, k, v, s = inputs
        return _lightning(q, k, v, s, block, state)

    shape = (query.shape[0], query.shape[2], query.shape[3], value.shape[3])

    def whole():
        return _lightning(query, key, value, slope, block, query.new_zeros(shape))[0]
    return _sharded(method, run, lambda: _lightning_stated(run, value.dtype), [query, key, value, slope], shape,
                    group, whole)


def mlstm(query, key, value, igate, fgate, backend: str, *, group: str | None = None, method: str = "chain"):
    """``autosp::mlstm`` in the emitted program: xLSTM's mLSTM on ``[B, S, H, D]`` inputs
    (gates ``[B, S, H]``), the backend called in its own ``[B, H, S, D]`` layout with the
    state ``(C, n, m)`` in and out (packed into one ``[B, H, d_k d_v + d_k + 1]`` tensor
    along the chain). Not linear in its state (the max stabilizer ``m``): a chain only."""
    if torch.compiler.is_compiling():  # (backend=: one opaque op, see autosp.runtime.opaque)
        return opaque.call(MLSTM, query, key, value, igate, fgate, backend, group=group, method=method)
    fn = _mlstm_backend(backend)
    bsz, _, heads, dk = query.shape
    dv = value.shape[-1]
    t = lambda x: x.transpose(1, 2)  # noqa: E731

    def run(inputs, state):
        q, k, v, i, f = inputs
        c0, n0, m0 = torch.split(state.float(), (dk * dv, dk, 1), dim=-1)
        h, (c, n, m) = fn(query=t(q), key=t(k), value=t(v), igate=t(i), fgate=t(f), c_initial=c0.reshape(bsz, heads, dk, dv),
                          n_initial=n0.contiguous(), m_initial=m0.contiguous(), return_last_states=True)
        return t(h), torch.cat([c.reshape(bsz, heads, dk * dv), n, m], -1)

    def whole():
        out = fn(query=t(query), key=t(key), value=t(value), igate=t(igate), fgate=t(fgate), return_last_states=True)
        return t(out[0] if isinstance(out, tuple) else out)
    if method == "prefix" and group is not None:
        raise ValueError("autosp: xLSTM's mLSTM is not linear in its state (its max stabilizer): it runs as a chain; "
                         "compile with sp_recurrence='chain' or 'auto'")
    return _sharded("chain", run, lambda: None, [query, key, value, igate, fgate], (bsz, heads, dk * dv + dk + 1),
                    group, whole)


opaque.register(GATED_DELTA_RULE, gated_delta_rule, lambda q, k, v, *rest, **kw: v.new_empty(v.shape))
opaque.register(MAMBA2_CHUNK_SCAN, mamba2_chunk_scan,
                lambda x, *rest, **kw: x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, torch.float32)))
opaque.register(SELECTIVE_SCAN, selective_scan,
                lambda x, dt, A, B, C, D, z, *rest, **kw: x.new_empty(x.shape, dtype=_selective_dtype(x, D, z)))
opaque.register(LIGHTNING_ATTENTION, lightning_attention, lambda q, k, v, *rest, **kw: v.new_empty(v.shape))
opaque.register(MLSTM, mlstm, lambda q, k, v, *rest, **kw: v.new_empty(v.shape))
