"""Backend: a torch-dialect (+ autosp) ``func.func`` -> ``torch.fx.GraphModule``.

Every ``torch.aten.X.ovl`` op becomes a call of ``torch.ops.aten.X.ovl`` (``default``
when there is no overload), so the emitted graph runs on PyTorch's own kernels and
autograd differentiates it. Constants and lists become Python values; integers that
encode dtypes, layouts or memory formats are converted using the overload's schema;
``autosp.*`` ops become calls of :mod:`autosp.runtime.collectives`; an SDPA marked with a
proven mask structure (``autosp.documents``, ``autosp.window``, ``autosp.key_padding``,
``autosp.empty_rows``) calls the matching kernel of :mod:`autosp.runtime.attention`, and
every other SDPA calls :func:`autosp.runtime.attention.sdpa` (``F.scaled_dot_product_attention``
on CPU; on CUDA a kernel named explicitly, never the math one).

Example::

    >>> gm = emit_graph_module(module)        # placeholders: @main's arguments, in order
    >>> outputs = gm(*state, *inputs)          # a tuple, one entry per returned value
"""
from __future__ import annotations

import operator
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.fx
from torch_mlir import ir
from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_INT, TORCH_LAYOUT_TO_INT, TORCH_MEMORY_FORMAT_TO_INT

from autosp.frontend import checks  # noqa: F401 - registers autosp::check (a rank may only emit)
from autosp.ir import contract
from autosp.ir.builders import vtensor_shape
from autosp.ir.contract import (
    DOCUMENTS_ATTR,
    EMPTY_ROWS_ATTR,
    KEY_PADDING_ATTR,
    SCAN_GROUP_ATTR,
    SCAN_METHOD_ATTR,
    SINK_HEADS_ATTR,
    WINDOW_ATTR,
)
from autosp.ir.core import as_operation, body_ops, main_func, op_name
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.ops import KEY_BIAS_ATTENTION, RELATIVE_BIAS_ATTENTION, SDPA_OP, SINK_ATTENTION
from autosp.ir.stated import RECURRENCE, stated
from autosp.runtime import (
    attention,
    collectives,
    functions,  # noqa: F401 - registers autosp::autograd_function (a rank may only emit)
    recurrences,  # noqa: F401 - registers the recurrence ops (a rank may only emit)
    relative_bias,
    sequence_ops,
)

_INT_TO_DTYPE = {v: k for k, v in TORCH_DTYPE_TO_INT.items()}
_INT_TO_LAYOUT = {v: k for k, v in TORCH_LAYOUT_TO_INT.items()}
_INT_TO_MEMORY_FORMAT = {v: k for k, v in TORCH_MEMORY_FORMAT_TO_INT.items()}

# Scalar (!torch.int / !torch.float / !torch.bool) arithmetic: plain Python operators,
# which FX, autograd and Inductor all handle as symbolic sizes.
_SCALAR_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "remainder": operator.mod, "div": operator.truediv, "neg": operator.neg,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "__and__": operator.and_, "__or__": operator.or_,
}
_SCALAR_OVERLOADS = {"int", "float", "bool", "float_int", "int_float"}

# torch-dialect names whose PyTorch op differs.
_RENAMED = {
    "torch.aten.view": torch.ops.aten.reshape.default,  # views of non-contiguous results fail in eager
    "torch.aten.size.int": torch.ops.aten.sym_size.int,
}
# A max/min of sizes (the importer's reading of torch.sym_max/sym_min): back to those, which
# torch.compile traces (torch.ops.prim.max.int is an op Dynamo breaks the graph on).
_SYM_OPS = {"torch.prim.max.int": torch.sym_max, "torch.prim.min.int": torch.sym_min}

MLIR_TO_TORCH_DTYPE = {
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
    "si64": torch.int64, "si32": torch.int32, "si16": torch.int16, "si8": torch.int8, "ui8": torch.uint8,
    "i1": torch.bool,
}

# autosp op -> (runtime function, names of its operands); attributes become keywords.
_AUTOSP_OPS = {
    contract.ALL_TO_ALL: (collectives.all_to_all, ("x", "seq_len")),
    contract.ALL_GATHER: (collectives.all_gather, ("x", "seq_len")),
    contract.ALL_REDUCE: (collectives.all_reduce, ("x",)),
    contract.REDUCE_SCATTER: (collectives.reduce_scatter, ("x",)),
    contract.SHARD: (collectives.shard, ("x", "seq_len")),
    contract.REWINDOW: (collectives.rewindow, ("x", "seq_len")),
    contract.LOCAL_LEN: (collectives.local_len, ("seq_len",)),
    contract.HALO: (collectives.halo, ("x", "seq_len")),
    contract.LOCAL_HEADS: (collectives.local_heads, ("x",)),
    contract.GRAD_SHARE: (collectives.grad_share, ("x",)),
    contract.MASKED_SCATTER: (collectives.masked_scatter, ("x", "mask", "source", "seq_len")),
    contract.LOCAL_POSITIONS: (sequence_ops.local_positions, ("positions", "seq_len")),
    contract.SEQ_SOFTMAX: (sequence_ops.softmax, ("x",)),
    contract.SEQ_LOGSUMEXP: (sequence_ops.logsumexp, ("x",)),
    contract.SEQ_AMAX: (sequence_ops.amax, ("x",)),
    contract.SEQ_ARGMAX: (sequence_ops.argmax, ("x", "seq_len")),
}


def vocab_logprob(h, weight_t, index, *, chunk: int = 0, steps: str = "", softmax_dtype: str = ""):
    """``autosp.vocab_logprob`` (``autosp-tile-loss``): its attributes read into
    :func:`autosp.runtime.tiling.vocab_logprob`'s arguments (``"div(30.0) tanh"`` ->
    ``(("div", 30.0), ("tanh",))``, ``"f32"`` -> ``torch.float32``)."""
    from autosp.runtime import tiling
    parsed: list[tuple] = []
    for step in steps.split():
        kind, _, arg = step.partition("(")
        arg = arg.rstrip(")")
        parsed.append((kind,) if not arg else (kind, MLIR_TO_TORCH_DTYPE[arg] if kind == "cast" else float(arg)))
    return tiling.vocab_logprob(h, weight_t, index, steps=tuple(parsed),
                                softmax_dtype=MLIR_TO_TORCH_DTYPE[softmax_dtype] if softmax_dtype else None,
                                chunk=chunk or None)


_AUTOSP_OPS[contract.VOCAB_LOGPROB] = (vocab_logprob, ("h", "weight_t", "index"))


def ring_attention(q, k, v, seq_len, mask=None, sink_logits=None, key_bias=None, *, is_causal: int, window: int,
                   scale: float, group: str, key_padding: int = 0, heads_group: str | None = None):
    """``autosp.ring_attention``: :func:`autosp.runtime.ring.ring_attention` with the ring
    ranks' pieces of the sequence read from the group's layout (each ring rank attends
    with its ring group's frame), the [B, 1, 1, S] ``mask`` operand as [B, S] (document
    ids, or with ``key_padding = 1`` the boolean key padding), and the attributes' "none"
    spellings (``window`` 0, ``scale`` 0.0) as None. Under torch.compile (``backend=``):
    the same ring as the opaque op ``autosp::ring_attention``. ``sink_logits``: the [H]
    sinks (``heads_group``: the Ulysses group whose rank picks this rank's chunk).
    ``key_bias``: the whole [B|1, H|1, 1, S] key bias (ALiBi), already this rank's heads."""
    from autosp.runtime import ring
    if sink_logits is not None:
        sink_logits = attention.heads_chunk(sink_logits, q.shape[1], heads_group)
    rows = None if mask is None else mask.reshape(mask.shape[0], mask.shape[-1])
    ids, keep = (None, rows) if key_padding else (rows, None)
    if torch.compiler.is_compiling():
        return ring.ring_attention_op(q, k, v, ids, keep, seq_len, group, bool(is_causal), float(scale),
                                      int(window), sink_logits, key_bias)[0]
    return ring.ring_attention(q, k, v, pieces=ring.layout_pieces(group, seq_len), group=group,
                               is_causal=bool(is_causal), scale=scale or None, doc_ids=ids, window=window or None,
                               key_padding=keep, sinks=sink_logits, key_bias=key_bias)


_AUTOSP_OPS[contract.RING_ATTENTION] = (ring_attention, ("q", "k", "v", "seq_len", "mask", "sink_logits",
                                                         "key_bias"))


def resolve_torch_op(name: str):
    """``torch.aten.add.Tensor`` -> ``torch.ops.aten.add.Tensor`` (None if PyTorch has no such op)."""
    if name in _RENAMED:
        return _RENAMED[name]
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "torch":
        return None
    ns, op, overload = parts[1], parts[2], ".".join(parts[3:]) or "default"
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError):
        return None


def _attr_value(attr: ir.Attribute):
    """Python value of a builtin attribute (int, float, bool, str)."""
    if isinstance(attr, (ir.BoolAttr, ir.IntegerAttr, ir.FloatAttr, ir.StringAttr)):
        return attr.value
    raise TypeError(f"unsupported attribute {attr}")


def _vtensor_dtype(type_: ir.Type, op) -> torch.dtype:
    shape = vtensor_shape(type_)
    dtype = shape[1] if shape else str(type_)
    if dtype not in MLIR_TO_TORCH_DTYPE:
        raise DiagnosticError.at(op, f"result element type '{dtype}' is not supported by the emitter")
    return MLIR_TO_TORCH_DTYPE[dtype]


def _literal_tensor(op) -> torch.Tensor:
    attr = op.attributes["value"]
    result_type = op.results[0].type
    dtype = _vtensor_dtype(result_type, op)
    if not isinstance(attr, ir.DenseElementsAttr):
        raise DiagnosticError.at(op, "tensor literal is not dense elements (dense_resource blobs "
                                     "cannot be read back; import with weights as arguments)")
    dense = attr
    shape = ir.ShapedType(dense.type).shape
    if dense.is_splat:
        value = _attr_value(dense.get_splat_value())
        return torch.full(shape, value, dtype=dtype)
    array = np.array(dense)
    return torch.from_numpy(array.copy()).to(dtype).reshape(shape)


class _Emitter:
    def __init__(self, func):
        self.func = func
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        self.values: dict[ir.Value, object] = {}
        self.n_consts = 0

    def get(self, value: ir.Value, user):
        try:
            return self.values[value]
        except KeyError:
            raise DiagnosticError.at(user, "uses a value the emitter has not produced") from None

    def emit(self) -> torch.fx.GraphModule:
        block = self.func.regions[0].blocks[0]
        for i, arg in enumerate(block.arguments):
            self.values[arg] = self.graph.placeholder(f"arg{i}")
        for op in body_ops(self.func):
            last = self.graph._root.prev
            self.emit_op(op)
            self._copy_plan(op, last)
            self._mark_source(op, last)
        # Each tensor's sequence dim (its one dynamic dim), read by the tiled runs' backend.
        for value in [*block.arguments, *[r for op in body_ops(self.func) for r in op.results]]:
            node, shape = self.values.get(value), vtensor_shape(value.type)
            if isinstance(node, torch.fx.Node) and shape is not None:
                dynamic = [i for i, d in enumerate(shape[0]) if d is None]
                node.meta["autosp_seq_dim"] = dynamic[0] if len(dynamic) == 1 else None
        gm = torch.fx.GraphModule(self.root, self.graph)
        gm.graph.lint()
        return gm

    def _mark_source(self, op, last) -> None:
        """The op (``autosp_op``) and its location (``autosp_loc``: the model's source line,
        as torch-mlir imported it) on each of its new nodes, for errors that name them
        (:mod:`autosp.backend.shape_check`)."""
        node = last.next
        while node is not self.graph._root:
            node.meta["autosp_op"] = op_name(op)
            node.meta["autosp_loc"] = str(op.location)
            node = node.next

    def _copy_plan(self, op, last) -> None:
        """Checkpoint plan attributes (``autosp-checkpoint``) onto the op's new nodes."""
        plan = {contract.plan_key(name): True if contract.ATTRIBUTES[name].value == "unit" else op.attributes[name].value
                for name in contract.PLAN_ATTRS if name in op.attributes}
        if not plan:
            return
        node = last.next
        while node is not self.graph._root:
            node.meta.update(plan)
            node = node.next

    def emit_op(self, op) -> None:
        name = op_name(op)
        if name.startswith("torch.constant."):
            kind = name.split(".")[2]
            if kind == "none":
                value = None
            elif kind == "device":
                value = torch.device(_attr_value(op.attributes["value"]))
            else:
                value = _attr_value(op.attributes["value"])
            self.values[op.results[0]] = value
        elif name == "torch.vtensor.literal":
            tensor = _literal_tensor(op)
            attr = f"_const{self.n_consts}"
            self.n_consts += 1
            self.root.register_buffer(attr, tensor)
            self.values[op.results[0]] = self.graph.get_attr(attr)
        elif name in ("torch.prim.ListConstruct", "torch.prim.TupleConstruct"):
            items = [self.get(v, op) for v in op.operands]
            self.values[op.results[0]] = items if name.endswith("ListConstruct") else tuple(items)
        elif name == "torch.prim.ListUnpack":
            seq = self.get(op.operands[0], op)
            for i, r in enumerate(op.results):
                self.values[r] = seq[i] if isinstance(seq, (list, tuple)) else self.graph.call_function(
                    operator.getitem, (seq, i))
        elif name in ("torch.symbolic_int", "torch.bind_symbolic_shape"):
            for r in op.results:  # sizes are recomputed from the data; these are annotations
                self.values[r] = None
        elif name == "func.return":
            outs = tuple(self.get(v, op) for v in op.operands)
            self.graph.output(outs)
        elif name in _AUTOSP_OPS:
            fn, operand_names = _AUTOSP_OPS[name]
            kwargs = {n: self.get(v, op) for n, v in zip(_present(op, operand_names), op.operands)}
            kwargs.update({n: _attr_value(op.attributes[n]) for n in op.attributes
                           if not n.startswith(contract.PREFIX) and n != _SEGMENTS})  # autosp.*: plan annotations
            if SINK_HEADS_ATTR in op.attributes:  # (ring attention with sinks inside Ulysses)
                kwargs["heads_group"] = _attr_value(op.attributes[SINK_HEADS_ATTR])
            self.values[op.results[0]] = self.graph.call_function(fn, (), kwargs)
        elif name.startswith("torch."):
            self.emit_torch_op(op, name)
        else:
            raise DiagnosticError.at(op, "has no PyTorch equivalent in the FX emitter")

    def emit_torch_op(self, op, name: str) -> None:
        if name == "torch.operator":
            name = _attr_value(op.attributes["name"])
            name = name if name.startswith("torch.") else "torch." + name
        parts = name.split(".")
        operands = [self.get(v, op) for v in op.operands]
        if parts[1] == "aten" and len(parts) == 4 and parts[3] in _SCALAR_OVERLOADS and parts[2] in _SCALAR_OPS:
            node = self.graph.call_function(_SCALAR_OPS[parts[2]], tuple(operands))
            self._bind_results(op, node)
            return
        if name in (SINK_ATTENTION, KEY_BIAS_ATTENTION):  # SDPA's operands and one more; its proven mask
            attrs = op.attributes                              # in attributes
            kwargs = {"documents": DOCUMENTS_ATTR in attrs, "key_padding": KEY_PADDING_ATTR in attrs,
                      "window": _attr_value(attrs[WINDOW_ATTR]) if WINDOW_ATTR in attrs else None}
            runtime: Callable
            if name == SINK_ATTENTION:
                runtime = attention.sink_attention
                kwargs["heads_group"] = _attr_value(attrs[SINK_HEADS_ATTR]) if SINK_HEADS_ATTR in attrs else None
            else:
                runtime = attention.key_bias_attention
                kwargs["empty_rows"] = _attr_value(attrs[EMPTY_ROWS_ATTR]) if EMPTY_ROWS_ATTR in attrs else None
            self._bind_results(op, self.graph.call_function(runtime, tuple(operands), kwargs))
            return
        if name == RELATIVE_BIAS_ATTENTION:  # SDPA's operands, the table, the buckets, the masking constant
            self._bind_results(op, self.graph.call_function(relative_bias.relative_bias_attention, tuple(operands)))
            return
        if name in _SYM_OPS:
            self._bind_results(op, self.graph.call_function(_SYM_OPS[name], tuple(operands)))
            return
        record = stated(name)
        if record is not None and record.layout == RECURRENCE:  # a chain or a prefix over the group when sharded
            attrs = op.attributes
            group = _attr_value(attrs[SCAN_GROUP_ATTR]) if SCAN_GROUP_ATTR in attrs else None
            method = _attr_value(attrs[SCAN_METHOD_ATTR]) if SCAN_METHOD_ATTR in attrs else "chain"
            self._bind_results(op, self.graph.call_function(record.runtime_function(), tuple(operands),
                                                            {"group": group, "method": method}))
            return
        target = resolve_torch_op(name)
        if target is None:
            raise DiagnosticError.at(op, f"has no PyTorch operator torch.ops.{'.'.join(parts[1:])} "
                                         f"(torch {torch.__version__})")
        args, kwargs = _place_arguments(op, target, operands)
        if record is not None:  # a token-wise stated op: its runtime function (the op itself, or autograd's)
            runtime = record.runtime_function()
            target = target if isinstance(runtime, torch._library.custom_ops.CustomOpDef) else runtime
        if name == SDPA_OP and DOCUMENTS_ATTR in op.attributes:  # proven causal (or window) within documents
            target = attention.document_attention  # (its mask operand: the document ids)
            if WINDOW_ATTR in op.attributes:
                kwargs["window"] = _attr_value(op.attributes[WINDOW_ATTR])
        elif name == SDPA_OP and WINDOW_ATTR in op.attributes:  # a proven causal sliding window
            target = attention.sliding_window_attention  # (its mask operand: key padding, or none)
            kwargs["window"] = _attr_value(op.attributes[WINDOW_ATTR])
        elif name == SDPA_OP and KEY_PADDING_ATTR in op.attributes:  # proven key padding (causal or not)
            target = attention.key_padded_attention
        elif name == SDPA_OP and EMPTY_ROWS_ATTR in op.attributes:  # a kept mask from fused eager attention
            target = attention.masked_attention
        elif name == SDPA_OP:  # the kernel named per device (CUDA: never the math kernel)
            target = attention.sdpa
        if name == SDPA_OP and EMPTY_ROWS_ATTR in op.attributes and DOCUMENTS_ATTR not in op.attributes:
            kwargs["empty_rows"] = _attr_value(op.attributes[EMPTY_ROWS_ATTR])
        node = self.graph.call_function(target, tuple(args), kwargs)
        self._bind_results(op, node)

    def _bind_results(self, op, node) -> None:
        results = list(op.results)
        if len(results) == 1:
            self.values[results[0]] = node
        else:
            for i, r in enumerate(results):
                self.values[r] = self.graph.call_function(operator.getitem, (node, i))


_SEGMENTS = "operandSegmentSizes"  # (an op with several optional operands: how many of each it has)


def _present(op, names: tuple) -> list:
    """The names of ``op``'s operands in order: ``names``, less the optional ones absent
    by its ``operandSegmentSizes`` (where it has them)."""
    if _SEGMENTS not in op.attributes:
        return list(names)
    sizes = ir.DenseI32ArrayAttr(op.attributes[_SEGMENTS])
    return [n for n, size in zip(names, sizes) for _ in range(size)]


def _convert(arg_type: str, value):
    """An enum operand as its torch value: ``arg_type`` is the schema's ``real_type`` (its
    ``type`` prints ``int``). torch-mlir numbers dtypes its own way (complex64 is 10, which
    is torch's ComplexDouble), so a raw int would change the dtype."""
    if value is None or isinstance(value, torch.fx.Node):
        return value
    if "ScalarType" in arg_type and isinstance(value, int):
        if value not in _INT_TO_DTYPE:
            raise ValueError(f"dtype number {value} has no torch dtype in torch-mlir's table")
        return _INT_TO_DTYPE[value]
    if "Layout" in arg_type and isinstance(value, int):
        return _INT_TO_LAYOUT[value]
    if "MemoryFormat" in arg_type and isinstance(value, int):
        return _INT_TO_MEMORY_FORMAT[value]
    return value


def _place_arguments(op, target, operands):
    schema = target._schema
    if len(operands) > len(schema.arguments):
        raise DiagnosticError.at(op, f"has {len(operands)} operands but {schema.name} takes "
                                     f"{len(schema.arguments)}")
    args, kwargs = [], {}
    for arg, value in zip(schema.arguments, operands):
        try:
            value = _convert(str(arg.real_type), value)
        except ValueError as err:
            raise DiagnosticError.at(op, f"operand {arg.name!r} of {schema.name}: {err}") from None
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return args, kwargs


def emit_graph_module(module, func_name: str = "main") -> torch.fx.GraphModule:
    """Emit ``@func_name`` of ``module`` as a GraphModule (placeholders = arguments in order).

    Raises :class:`DiagnosticError` located at the first op the emitter cannot translate.
    """
    start = time.perf_counter()
    func = main_func(as_operation(module), func_name)
    gm = _Emitter(func).emit()
    gm.meta["autosp_emit_s"] = time.perf_counter() - start
    return gm
