"""Frontend: an ``nn.Module`` plus one example call -> a torch-dialect MLIR module.

The recipe (../shared/TOOLCHAIN.md): the model's parameters and buffers are passed as
*user inputs* of a small wrapper that calls ``torch.func.functional_call``, so that
torch.export keeps them as function arguments *and* torch-mlir can import the
symbolic shape expressions (``torch.symbolic_int`` / ``torch.bind_symbolic_shape``).
SDPA and softmax are kept as single ops (their decompositions are dropped from the
table). The sequence dimension is exported as a dynamic ``Dim``, so one import serves
every sequence length.

Example::

    >>> imported = import_model(model, input_ids, labels=labels)
    >>> print(imported.module)            # func.func @main(%arg0: ... {autosp.state = "embed.weight"}, ...)
    >>> imported.state_names[:2]
    ['embed.weight', 'blocks.0.attn_norm.weight']
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import Dim
from torch.utils import _pytree as pytree
from torch_mlir import ir
from torch_mlir.compiler_utils import run_pipeline_with_repro_report
from torch_mlir.extras.fx_decomp_util import get_decomposition_table
from torch_mlir.extras.fx_importer import FxImporter

from autosp.frontend import cache, flex, symbolic
from autosp.frontend.decompose import DECOMPOSED_BY, decompose, writing_nodes
from autosp.ir import stated
from autosp.ir.contract import ARG_ATTRS, BUFFER_WRITES_ATTR, SEQ_DIM_ATTR, ArgKind
from autosp.ir.core import as_operation, main_func, make_context, op_name
from autosp.ir.diagnostics import AutospError
from autosp.runtime import fsdp

# Ops kept whole: attention is what autosp partitions, softmax is what it matches in
# manual attention; activations and layer norm, because their decompositions save more
# for backward (torch-mlir's layer norm computes its variance in f64 and keeps x - mean,
# its square and the f64 copy: 3.5x the input's bytes where the fused op keeps mean/rstd).
# logsumexp: autosp splits it over the sequence whole (autosp.logsumexp), not as its parts.
_KEEP_WHOLE = ("scaled_dot_product", "softmax", "silu", "gelu", "layer_norm", "logsumexp")


# torch-mlir's backend pipeline decomposes these unless told they are legal.
BACKEND_LEGAL_OPS = ("aten._softmax", "aten.softmax.int", "aten._safe_softmax", "aten.scaled_dot_product_attention",
                     # kept whole: their decompositions save more tensors for backward
                     "aten.silu", "aten.gelu", "aten.native_layer_norm",
                     # kept whole: its decomposition (arange, unsqueeze, eq) carries no shape binding
                     "aten.one_hot",
                     # kept whole: decomposed into uniform + log it draws other numbers than ATen does
                     "aten.exponential",
                     # kept whole: autosp splits them over the sequence as they are (autosp.softmax,
                     # autosp.logsumexp, autosp.amax), not as the max.dim / sum their decompositions write
                     "aten._log_softmax", "aten.log_softmax.int", "aten.logsumexp", "aten.amax")


def decomposition_table() -> dict:
    """torch-mlir's default decompositions, minus SDPA and softmax."""
    return {k: v for k, v in get_decomposition_table().items()
            if not any(key in str(k) for key in _KEEP_WHOLE)}


@dataclass
class ArgInfo:
    """What one function argument of ``@main`` is."""

    kind: str  # "parameter" | "buffer" | "input"
    name: str  # fully qualified state name, or the input's path ("args[0]", "kwargs['labels']")
    seq_dim: int | None = None  # for inputs: which dimension is the (symbolic) sequence


@dataclass
class ImportedModel:
    """A model imported into MLIR plus everything needed to call it again from PyTorch."""

    module: ir.Operation  # builtin.module holding func.func @main
    args: list[ArgInfo]
    in_spec: Any  # pytree spec of (args, kwargs) of the example call
    leaves: list[Any]  # the example call's leaves; tensor leaves are replaced per call
    tensor_leaves: list[int]  # indices into leaves of the tensor inputs (argument order)
    out_spec: Any  # pytree spec of the model's output
    seq_len: int | None  # the example's sequence length (None: nothing dynamic)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def context(self) -> ir.Context:
        return self.module.context

    @property
    def state_names(self) -> list[str]:
        return [a.name for a in self.args if a.kind != "input"]

    def __str__(self) -> str:
        return str(self.module)


def input_paths(in_spec, leaves) -> list[str]:
    """Each leaf's path as the user wrote it: ``args[0]``, ``kwargs['labels']``."""
    flat = pytree.tree_flatten_with_path(pytree.tree_unflatten(leaves, in_spec))[0]
    out = []
    for path, _ in flat:
        text = pytree.keystr(path)  # "[0][0]" / "[1]['labels']"
        if text.startswith("[0]"):
            text = "args" + text[3:]
        elif text.startswith("[1]"):
            text = "kwargs" + text[3:]
        out.append(text)
    return out


class _StateAsInputs(torch.nn.Module):
    """``forward(state, inputs)`` calls the model with ``state`` as its parameters/buffers."""

    def __init__(self, model, names, leaves, tensor_leaves, in_spec, autocast: tuple = ()):
        super().__init__()
        self.autocast = autocast  # autocast_state() of the call: entered inside the traced forward
        # Not a submodule: export must not lift the model's own parameters a second time.
        self.model_ref = [model]
        self.names = names
        self.leaves = leaves
        self.tensor_leaves = tensor_leaves
        self.in_spec = in_spec

    def forward(self, state, inputs):
        leaves = list(self.leaves)
        for i, t in zip(self.tensor_leaves, inputs):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.in_spec)
        with contextlib.ExitStack() as stack:
            for device, dtype in self.autocast:  # exported as a wrap_with_autocast region
                stack.enter_context(torch.autocast(device, dtype=dtype))
            return torch.func.functional_call(self.model_ref[0], dict(zip(self.names, state)), args, kwargs,
                                              tie_weights=True, strict=False)


# ---------------------------------------------------------------------------- autocast
_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple:
    """``(device type, dtype)`` of each device type autocast is on for. torch.export ignores an
    ambient autocast (its pre-dispatch trace sits above the autocast key), so
    :func:`import_model` enters this state inside the traced forward: export keeps it as a
    ``wrap_with_autocast`` region, which the decomposition inlines as explicit casts. A
    compiled program is keyed by it (``autosp.api``) and runs with autocast off
    (:func:`autocast_off`): nothing is cast twice."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d))


def autocast_off() -> contextlib.ExitStack:
    """Autocast off for every device type it is on for (a no-op context when it is off)."""
    stack = contextlib.ExitStack()
    for device, _ in autocast_state():
        stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def prepare_input(x):
    """An input as export and the compiled program take it: a tensor that is not dense (a
    slice such as ``tokens[:, 1:]``, an ``expand``-ed tensor) becomes a contiguous copy, so
    the program sees the same layout at every call (strides are not part of a
    compilation's signature); anything else is returned as is.

    Example::

        >>> prepare_input(torch.arange(8).expand(2, 8)).stride()
        (8, 1)
    """
    if isinstance(x, torch.Tensor) and not x.is_contiguous():
        return x.contiguous()
    return x


@contextlib.contextmanager
def _state_kept(model: torch.nn.Module):
    """Every module's own parameters and buffers as they were, whatever the trace left.

    ``functional_call`` swaps the export's fake tensors in by name and back out; a module
    registered under two names (``self.lm_head = self.inner.lm_head``) is swapped twice,
    and the second swap saves the first one's fake as the "original": the model kept a
    fake weight after the export (on the exporting rank only)."""
    kept = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        yield
    finally:
        for m, params, buffers in kept:
            m._parameters.update(params)
            m._buffers.update(buffers)


def model_state(model: torch.nn.Module) -> tuple[list[str], list[str], list[torch.Tensor]]:
    """(names, kinds, tensors) of the model's parameters (tied ones once) then buffers."""
    entries = [(n, "parameter", p) for n, p in model.named_parameters()]
    entries += [(n, "buffer", b) for n, b in model.named_buffers()]
    return [e[0] for e in entries], [e[1] for e in entries], [e[2] for e in entries]


def input_sequence_dims(inputs: list, seq_dim: int | None) -> tuple[list, set]:
    """Each tensor input's sequence dimension (None: none) and which were inferred.

    The first tensor input with a ``seq_dim`` fixes the length S; an input whose
    ``seq_dim`` has size S has it there. An input whose ``seq_dim`` does not, but whose
    dims after it hold S exactly once, has it there (*inferred*): mrope's ``[3, B, S]``
    position ids. :func:`import_model` keeps an inferred one only where the export ties
    it to the sequence (one symbol with S); a size that merely equals S stays static."""
    if seq_dim is None:
        return [None] * len(inputs), set()
    seq_len = next((t.shape[seq_dim] for t in inputs if t.dim() > seq_dim), None)
    dims: list = []
    inferred = set()
    for i, t in enumerate(inputs):
        if seq_len is None or t.dim() <= seq_dim:
            dims.append(None)
        elif t.shape[seq_dim] == seq_len:
            dims.append(seq_dim)
        else:
            later = [d for d in range(seq_dim + 1, t.dim()) if t.shape[d] == seq_len]
            dims.append(later[0] if len(later) == 1 else None)
            if len(later) == 1:
                inferred.add(i)
    return dims, inferred


def _not_the_sequence(program, n_state: int, dims: list, inferred: set) -> list:
    """The inferred inputs whose dynamic dim the export did not tie to the sequence's symbol."""
    if not inferred:
        return []
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    user = [n for n, spec in zip(placeholders, program.graph_signature.input_specs)
            if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT][n_state:]
    def symbol(i):
        val = user[i].meta.get("val") if i < len(user) else None
        return str(val.shape[dims[i]]) if val is not None else None
    first = next((i for i, d in enumerate(dims) if d is not None and i not in inferred), None)
    if first is None:
        return sorted(inferred)
    return [i for i in sorted(inferred) if symbol(i) != symbol(first)]


def import_model(model: torch.nn.Module, *args, seq_dim: int | None = 1, context: ir.Context | None = None,
                 **kwargs) -> ImportedModel:
    """Export ``model(*args, **kwargs)`` and import it as torch-dialect MLIR.

    ``seq_dim``: the dimension of the inputs that is the sequence. The first tensor
    input that has it fixes the length S; every tensor input whose ``seq_dim`` has
    size S gets a dynamic dimension, so the import serves any sequence length.
    ``seq_dim=None`` imports with static shapes.

    Raises :class:`AutospError` with the reason when the model cannot be exported.
    """
    timings = {}
    start = time.perf_counter()
    names, kinds, state = model_state(model)
    # FSDP2 shards: fakes of their global shape (no storage), at their mixed precision's param_dtype
    state = fsdp.stand_ins(state, fsdp.compute_dtypes(model, names))
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    try:
        flex.check_inputs(pytree.tree_leaves((args, kwargs), is_leaf=flex.is_block_mask))
    except ValueError as e:
        raise AutospError(str(e)) from None
    # torch.export's guards fail on some views (an internal AttributeError): export dense copies.
    leaves = [prepare_input(x) for x in leaves]
    tensor_leaves = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    inputs = [leaves[i] for i in tensor_leaves]
    paths = input_paths(in_spec, leaves)

    input_seq_dims, inferred = input_sequence_dims(inputs, seq_dim)
    seq_len = next((t.shape[d] for t, d in zip(inputs, input_seq_dims) if d is not None), None)
    autocast = autocast_state()  # traced inside the program, and off around export and decomposition
    wrapper = _StateAsInputs(model, names, leaves, tensor_leaves, in_spec, autocast)
    while True:
        dynamic_shapes = ([None] * len(state), [{d: Dim.DYNAMIC} if d is not None else None for d in input_seq_dims])
        try:
            with _exporting(model) as functions:
                program = torch.export.export(wrapper, (state, inputs), dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as e:  # torch.export raises many types; keep its message, drop the noise
            site = None
            if "specialized it to be a constant" in str(e):  # where the model's code fixed S: export once more
                site = _specialization_site(wrapper, state, inputs, dynamic_shapes, model)
            raise _export_error(e, model, site) from None
        apart = _not_the_sequence(program, len(state), input_seq_dims, inferred)
        if not apart:
            break
        for i in apart:  # a size that only equals S: static after all, and exported again
            input_seq_dims[i] = None
            inferred.discard(i)
    _refuse_custom_backwards(functions)
    _check_no_input_mutation(program, names, kinds)

    timings["export_s"] = time.perf_counter() - start

    start = time.perf_counter()
    table = decomposition_table()
    key = cache.program_key(program, table, BACKEND_LEGAL_OPS)
    hit = cache.lookup(key, context)
    timings["import_cached"] = float(hit is not None)
    if hit is None:
        with autocast_off():
            module = _import_or_explain(program, table, context or make_context(), timings)
        if any(d is not None for d in input_seq_dims):
            _check_sequence_kept(module, seq_len, model)
        cache.store(key, module)
    else:
        module = hit[0]
    timings["import_s"] = time.perf_counter() - start

    arg_infos = [ArgInfo(k, n) for n, k in zip(names, kinds)]
    # One record per tensor input (a non-tensor leaf, e.g. use_cache=False, is no argument).
    arg_infos += [ArgInfo("input", paths[i], d) for i, d in zip(tensor_leaves, input_seq_dims)]
    _annotate_arguments(module, arg_infos)
    return ImportedModel(module=module, args=arg_infos, in_spec=in_spec, leaves=leaves,
                         tensor_leaves=tensor_leaves, out_spec=program.call_spec.out_spec,
                         seq_len=seq_len, timings=timings)


def _import_or_explain(program: torch.export.ExportedProgram, table: dict, ctx: ir.Context,
                       timings: dict | None = None) -> ir.Operation:
    """:func:`_decompose_and_import`, with a failure turned into one :class:`AutospError`:
    the op torch-mlir could not import or lower, where the model computes it (the source
    line its location names), the original message, and what to do. The whole trace goes
    to a file the message names."""
    diagnostics: list[str] = []

    def collect(d) -> bool:
        diagnostics.append(f"{d.location}: {d.message}")
        return True  # handled: not also printed to stderr
    handler = ctx.attach_diagnostic_handler(collect)
    try:
        return _decompose_and_import(program, table, ctx, timings)
    except Exception as e:  # the importer and the pipeline raise several types
        raise frontend_error(e, diagnostics) from None
    finally:
        handler.detach()


_SOURCE = re.compile(r'"([^"]+)":(\d+):\d+')
_OP_QUOTED = re.compile(r"'(torch\.[\w.]+)'|name = \\?\"(torch\.[\w.]+)\\?\"|target=([\w.<> ]+?),")


def _user_line(text: str) -> str | None:
    """The first source position in ``text`` outside PyTorch, torch-mlir and autosp (the
    model's line), else the first one."""
    found = _SOURCE.findall(text) or re.findall(r'File "([^"]+)", line (\d+)', text)
    if not found:
        return None
    inside = ("/torch/", "/torch_mlir/", "/autosp/")
    mine = [f for f in found if not any(k in f[0] for k in inside)]
    path, line = (mine or found)[0]
    return f"{path}:{line}"


def frontend_error(e: Exception, diagnostics: list[str]) -> AutospError:
    """One readable error for a failed torch-mlir import or lowering (see
    :func:`_import_or_explain`)."""
    text = "\n".join(diagnostics) or str(e)
    op = next((next(g for g in m.groups() if g) for m in _OP_QUOTED.finditer(text)), None)
    if op == "torch.operator":  # name the operator inside
        inner = re.search(r'name = \\?"(torch\.[\w.]+)', text)
        op = inner.group(1) if inner else op
    function = re.search(r"Unimplemented call_function: target=<function (\w+)", text)
    if function:  # a Python function on sizes the FX importer has no handler for (sym_max, sym_ite...)
        op = f"torch.{function.group(1)} (a function of sizes)"
        text = text.split(", {")[0] + "\n" + text  # its message without the node's metadata first
    where = _user_line(text)
    fd, path = tempfile.mkstemp(prefix="autosp-import-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n\n")
        traceback.print_exception(e, file=f)
    hint = ("rewrite that line with ops torch-mlir lowers, or call it through a custom op "
            "(torch.library.custom_op) so it stays one opaque op")
    if function:
        hint = ("compute that size with +, -, *, //, % or an integer max/min of other sizes (the importer has "
                "no max or min of float sizes and no condition on sizes), or make it a constant")
    first = next((d for d in diagnostics if "error" in d.lower()), None) or text.splitlines()[0]
    return AutospError(f"torch-mlir could not import the model's {op or 'program'}"
                       f"{f' (at {where})' if where else ''}: {type(e).__name__}: {_first_lines(first, 3)}\n"
                       f"what to do: {hint}\n(the whole message and trace: {path})")


def _decompose_and_import(program: torch.export.ExportedProgram, table: dict, ctx: ir.Context,
                          timings: dict | None = None) -> ir.Operation:
    """Decompose ``program`` with ``table`` (:func:`autosp.frontend.decompose.decompose`),
    import it into ``ctx`` and lower it to torch-mlir's backend contract (the ops of
    ``BACKEND_LEGAL_OPS`` kept). ``timings["import_fallback"]``: 1.0 where the
    decomposition took torch's ``run_decompositions``."""
    with warnings.catch_warnings():  # torch's own deep copy of pytree specs, not the user's code
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        program = decompose(program, table)
    if timings is not None:
        timings["import_fallback"] = float(program.graph_module.meta[DECOMPOSED_BY] != "retrace")
    writes = _writes_as_results(program)
    symbolic.install()
    symbolic.rewrite_sym_float(program.graph_module.graph)
    symbolic.rewrite_tensor_checks(program.graph_module.graph, program.graph_signature)
    importer = FxImporter(context=ctx, hooks=symbolic.DenseLiterals())
    importer.import_program(program, func_name="main", import_symbolic_shape_expressions=True)
    module = as_operation(importer.module)
    opaque = outline_opaque_ops(module)
    run_pipeline_with_repro_report(
        importer.module,
        "builtin.module(func.func(torch-match-quantized-custom-ops), "
        f"torchdynamo-export-to-torch-backend-pipeline{{backend-legal-ops={','.join(BACKEND_LEGAL_OPS)} "
        "extra-library=})",
        "Lowering TorchFX IR -> Torch Backend IR")
    restore_opaque_ops(module, opaque)
    if writes:
        with module.context:
            main_func(module).attributes[BUFFER_WRITES_ATTR] = ir.ArrayAttr.get(
                [ir.IntegerAttr.get(ir.IntegerType.get_signless(64), i) for i in writes])
    return module


def _writes_as_results(program: torch.export.ExportedProgram) -> list[int]:
    """The buffers the program writes (their new values returned first by the functional
    graph, ``USER_INPUT_MUTATION``), made plain results: the argument index each of the
    leading results is written to. The compiled call writes them back
    (``CompiledProgram.buffer_writes``); :func:`_check_no_input_mutation` let only buffers
    through."""
    from torch.export.graph_signature import InputKind, OutputKind
    inputs = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    writes = []
    for spec in program.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            writes.append(inputs.index(spec.target))
            spec.kind, spec.target = OutputKind.USER_OUTPUT, None
    return writes


_OPAQUE_PREFIX = "autosp_opaque_"


def outline_opaque_ops(module: ir.Operation) -> int:
    """Each ``torch.operator`` (an ATen op torch-mlir has no op of its own for, such as
    ``aten.histc`` or ``aten.argsort`` in Mixtral's grouped experts, or a custom op)
    becomes a ``func.call`` of a private declaration with the same operand and result
    types, named ``autosp_opaque_<k>`` and carrying the op's name. torch-mlir's
    ReduceOpVariants marks every ``torch.operator`` illegal (``backend-legal-ops`` does not
    reach it); a call is legal and opaque to its passes. :func:`restore_opaque_ops` puts
    the operators back after the pipeline; the FX emitter then calls each by its name
    (``torch.ops.aten.histc.default``), and the layout rules treat it as any op they do not
    know. Returns how many were outlined."""
    found = []

    def visit(op):
        if op.operation.name == "torch.operator":
            found.append(op.operation)
        return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
    if not found:
        return 0
    body = module.regions[0].blocks[0]
    with module.context:
        for k, op in enumerate(found):
            callee = f"{_OPAQUE_PREFIX}{k}"
            signature = ir.FunctionType.get([v.type for v in op.operands], [r.type for r in op.results])
            with ir.InsertionPoint.at_block_begin(body), ir.Location.unknown():
                ir.Operation.create("func.func", regions=1, attributes={
                    "sym_name": ir.StringAttr.get(callee), "function_type": ir.TypeAttr.get(signature),
                    "sym_visibility": ir.StringAttr.get("private"), "autosp.operator": op.attributes["name"]})
            with ir.InsertionPoint(op), op.location:
                call = ir.Operation.create("func.call", results=[r.type for r in op.results],
                                           operands=list(op.operands),
                                           attributes={"callee": ir.FlatSymbolRefAttr.get(callee)})
            for old, new in zip(op.results, call.results):
                old.replace_all_uses_with(new)
            op.erase()
    return len(found)


def restore_opaque_ops(module: ir.Operation, count: int) -> None:
    """Undo :func:`outline_opaque_ops` (after torch-mlir's pipeline): each call of an
    ``autosp_opaque_<k>`` declaration becomes the ``torch.operator`` it was (with the result
    types the pipeline may have refined at the call), and the declarations go."""
    if not count:
        return
    body = module.regions[0].blocks[0]
    decls = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in body.operations
             if op.operation.name == "func.func" and "autosp.operator" in op.attributes}
    calls = []

    def visit(op):
        if op.operation.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value in decls:
            calls.append(op.operation)
        return ir.WalkResult.ADVANCE
    module.operation.walk(visit)
    with module.context:
        for call in calls:
            decl = decls[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
            with ir.InsertionPoint(call), call.location:
                op = ir.Operation.create("torch.operator", results=[r.type for r in call.results],
                                         operands=list(call.operands),
                                         attributes={"name": decl.attributes["autosp.operator"]})
            for old, new in zip(call.results, op.results):
                old.replace_all_uses_with(new)
            call.erase()
        for decl in decls.values():
            decl.operation.erase()


TRUST_FUNCTIONS_ENV = "AUTOSP_TRUST_AUTOGRAD_FUNCTIONS"


@contextlib.contextmanager
def _exporting(model: torch.nn.Module):
    """What every export of ``model`` runs inside: autocast and gradients off, FSDP2's hooks
    detached, the model's own autograd Functions recorded (yielded), the stated ops'
    substitutions, buffers kept, FlexAttention as dense ops."""
    with autocast_off(), torch.no_grad(), fsdp.hooks_detached(model), _custom_backwards() as functions, \
            stated.substitutions(model), _state_kept(model), flex.flex_as_dense():
        yield functions


@contextlib.contextmanager
def _custom_backwards():
    """While exporting: the ``torch.autograd.Function`` subclasses the model applies (the
    export keeps their forward's ops; their ``backward`` is lost)."""
    seen: dict[type, None] = {}
    original = torch.autograd.Function.apply.__func__

    def apply(cls, *args, **kwargs):
        seen[cls] = None
        return original(cls, *args, **kwargs)
    apply.__wrapped__ = original  # type: ignore[attr-defined] # (see autosp.runtime.functions.torch_apply)
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign, assignment]
    try:
        yield seen
    finally:
        torch.autograd.Function.apply = classmethod(original)  # type: ignore[method-assign, assignment]


def _refuse_custom_backwards(functions) -> None:
    """A model's own ``autograd.Function`` would be differentiated through its forward's
    ops, not by its ``backward`` (PhiMoE's ``PhimoeMultiplier`` is a straight-through
    estimator): the gradient could differ from one device's without a word. Refused,
    naming them; ``AUTOSP_TRUST_AUTOGRAD_FUNCTIONS=1`` accepts them (for backwards that are
    the derivative of their forward, e.g. memory-saving rewrites). PyTorch's and autosp's
    own functions are trusted."""
    mine = [f for f in functions if not f.__module__.startswith(("torch.", "autosp."))]
    if mine and os.environ.get(TRUST_FUNCTIONS_ENV) != "1":
        from autosp.runtime.functions import why_not_stated
        names = "; ".join(f"{f.__module__}.{f.__qualname__}" + (f" ({why})" if (why := why_not_stated(f)) else "")
                          for f in mine)
        raise AutospError(f"the model applies custom autograd functions autosp cannot keep whole ({names}). "
                          "autosp keeps a Function with its own backward where it is row-wise over the tokens "
                          "(checked on random inputs); otherwise it would differentiate the ops of its forward, "
                          "so a backward that is not their derivative (a straight-through estimator, a clipped or "
                          "rescaled gradient) would be lost and training would differ from one device. If each "
                          f"backward is the derivative of its forward, set {TRUST_FUNCTIONS_ENV}=1")


def _check_sequence_kept(module: ir.Operation, seq_len, model: torch.nn.Module) -> None:
    """Raise where the import lost the sequence's symbol although the export kept it: the
    decomposition's retrace pinned the length to this call's value (a decomposed op compares
    it to a constant the model uses that equals it here: MPT called at exactly its
    ``max_seq_len``), so the program would serve this length only. Names the model's config
    fields of that value and what to do, rather than the pipeline's "no sequence axis"."""
    from autosp.ir.ops import SYMBOLIC_INT
    if any(op_name(op) == SYMBOLIC_INT for op in main_func(module).entry_block.operations):
        return
    config = getattr(model, "config", None)
    fields = sorted(k for k, v in (vars(config).items() if config is not None else ())
                    if isinstance(v, int) and not isinstance(v, bool) and v == seq_len)
    named = f" (the model's config has {', '.join(f'{k} = {seq_len}' for k in fields)})" if fields else ""
    raise AutospError(f"the sequence length became the constant {seq_len} while torch decomposed the exported "
                      f"program: the model compares it to a constant that equals this call's length{named}, so one "
                      f"program would serve this length only. Call the first compiled step at another length (e.g. "
                      f"{seq_len - 1 if seq_len else 1}), or raise the model's maximum length")


def _specialization_site(wrapper, state, inputs, dynamic_shapes, model) -> str | None:
    """The model's source line (``file:line: code``) where tracing fixed a dynamic size to
    its example's value (a Python loop ``for t in range(x.shape[1])``, a branch on the
    length): the export once more, each size specialization's stack read at the moment
    it is made (``ShapeEnv._set_replacement`` to a number), the innermost frame outside
    torch and autosp named. None where none is found."""
    import traceback as tb

    import sympy
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    original = ShapeEnv._set_replacement
    found: list[str] = []

    def record(self, a, tgt, msg):
        if not found and isinstance(tgt, sympy.Integer):
            for frame in reversed(tb.extract_stack()[:-1]):
                if not any(part in frame.filename for part in ("/torch/", "/autosp/", "<frozen", "/sympy/",
                                                                "/contextlib.py")):
                    found.append(f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}")
                    break
        return original(self, a, tgt, msg)
    ShapeEnv._set_replacement = record  # type: ignore[method-assign]
    try:
        with _exporting(model):
            torch.export.export(wrapper, (state, inputs), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception:  # noqa: BLE001 - the same failure, expected: only the site is wanted
        pass
    finally:
        ShapeEnv._set_replacement = original  # type: ignore[method-assign]
    return found[0] if found else None


def _export_error(e: Exception, model: torch.nn.Module, site: str | None = None) -> AutospError:
    """One readable error for a failed torch.export: the hint first (when autosp knows the
    cause), then torch.export's first lines; the whole trace goes to a file the message
    names, not to the user's terminal. ``site``: the model's line that fixed the sequence
    length to its example's value (:func:`_specialization_site`)."""
    hint = ""
    if site is not None:
        hint = (f"the model's code fixes the sequence length to the example's value at {site} (a Python loop or "
                "branch over the length: one program cannot serve every length). Write it with tensor ops over "
                "the whole sequence, or state it as an op autosp knows (docs/adding_a_model_family.md)\n")
    if "Cache" in str(e) and getattr(getattr(model, "config", None), "use_cache", False):
        hint = ("the model returns a key/value cache, which training does not use: call it with "
                "use_cache=False (or set model.config.use_cache = False)\n")
    fd, path = tempfile.mkstemp(prefix="autosp-export-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(e, file=f)
    return AutospError(f"{hint}torch.export could not trace the model: {type(e).__name__}: "
                       f"{_first_lines(str(e))}\n(torch.export's whole trace: {path})")


def _first_lines(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[:n])


def _check_no_input_mutation(program, names, kinds) -> None:
    """Refuse models that write to their parameters or inputs in forward. A buffer may be
    written (a counter: torchtitan's MoE ``tokens_per_expert``, BatchNorm's running
    statistics): its new value becomes a result of the program, which the layout rules must
    find replicated, and the call writes it back."""
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    what = {node: (names[i] if i < len(names) else f"input {i - len(names)}", kinds[i] if i < len(kinds) else "input")
            for i, node in enumerate(placeholders)}
    for node in writing_nodes(program.graph):  # (exported under no_grad: the user's no_grad regions are inline)
        for arg_schema, arg in zip(node.target._schema.arguments, node.args):
            if arg_schema.alias_info is not None and arg_schema.alias_info.is_write and arg in what and \
                    what[arg][1] != "buffer":
                raise AutospError(
                    f"the model writes to {what[arg][1]} '{what[arg][0]}' during forward ({node.target}); "
                    "autosp compiles forwards that write buffers only (their new values are written back "
                    "after the call), not parameters or inputs")


def _annotate_arguments(module: ir.Operation, infos: list[ArgInfo]) -> None:
    """Record on ``@main``'s arguments which parameter, buffer or input each one is."""
    func = main_func(module)
    n_args = len(func.regions[0].blocks[0].arguments)
    if n_args != len(infos):
        raise AutospError(f"imported @main has {n_args} arguments, expected {len(infos)} "
                          "(parameters, buffers and tensor inputs)")
    with module.context:
        dicts = []
        for info in infos:
            entries = {ARG_ATTRS[ArgKind(info.kind)]: ir.StringAttr.get(info.name)}
            if info.seq_dim is not None:
                entries[SEQ_DIM_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), info.seq_dim)
            dicts.append(ir.DictAttr.get(entries))
        func.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)


def read_arguments(module) -> list[ArgInfo]:
    """The :class:`ArgInfo` records stored on ``@main`` (e.g. of a module read from a file)."""
    func = main_func(module)
    n_args = len(func.regions[0].blocks[0].arguments)
    if "arg_attrs" not in func.attributes:
        return [ArgInfo("input", f"arg{i}") for i in range(n_args)]
    out = []
    for i, attr in enumerate(ir.ArrayAttr(func.attributes["arg_attrs"])):
        d = ir.DictAttr(attr)
        info = ArgInfo("input", f"arg{i}")
        for kind, attr in ARG_ATTRS.items():
            if attr in d:
                info = ArgInfo(kind.value, ir.StringAttr(d[attr]).value)
        if SEQ_DIM_ATTR in d:
            info.seq_dim = ir.IntegerAttr(d[SEQ_DIM_ATTR]).value
        out.append(info)
    return out
