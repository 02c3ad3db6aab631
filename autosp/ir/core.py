"""Contexts, parsing and small IR queries shared by the frontend, passes and backend.

Example::

    >>> ctx = make_context()
    >>> module = parse_module(open("model.mlir").read(), "model.mlir", ctx)
    >>> [op_name(op) for op in main_func(module).entry_block.operations][:2]
    ['torch.constant.int', 'torch.aten.size.int']
"""
from __future__ import annotations

from collections.abc import Iterator

from torch_mlir import ir
from torch_mlir.dialects import irdl
from torch_mlir.dialects import torch as torch_d

from autosp.dialect import IRDL_FILE
from autosp.ir.builders import vtensor_shape
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.ops import BIND_SHAPE, CONSTANT_NONE, LIST_CONSTRUCT

_IRDL_TEXT: str | None = None


def make_context(allow_unregistered_dialects: bool = False) -> ir.Context:
    """A context with the torch dialect and the IRDL-defined autosp dialect loaded."""
    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    ctx.allow_unregistered_dialects = allow_unregistered_dialects
    load_autosp_dialect(ctx)
    return ctx


def load_autosp_dialect(ctx: ir.Context) -> None:
    """Load the autosp dialect (idempotent per context)."""
    global _IRDL_TEXT
    if ctx.is_dialect_loaded("autosp"):
        return
    if _IRDL_TEXT is None:
        _IRDL_TEXT = IRDL_FILE.read_text()
    with ctx, ir.Location.unknown():
        ctx.dialects["torch"]  # load torch before IRDL resolves "!torch.vtensor"
        irdl.load_dialects(ir.Module.parse(_IRDL_TEXT))


def parse_module(text: str, source_name: str = "<stdin>", ctx: ir.Context | None = None) -> ir.Operation:
    """Parse and verify MLIR text; return the ``builtin.module`` operation.

    Errors come back as a :class:`DiagnosticError` located in ``source_name``.
    Top-level ops that are not a module are wrapped in one, as mlir-opt does.
    """
    ctx = ctx or make_context()
    with ctx:
        try:
            op = ir.Operation.parse(text, source_name=source_name)
        except ir.MLIRError as e:
            if "single top-level operation" not in str(e):
                raise DiagnosticError.from_mlir(e) from None
            # Several top-level ops: parse them inside a module opened on the first line, so
            # every line number stays (columns on line 1 shift by 8).
            wrapped = "module {" + text + "\n}"
            try:
                op = ir.Operation.parse(wrapped, source_name=source_name)
            except ir.MLIRError as e2:
                raise DiagnosticError.from_mlir(e2) from None
        return op if op.name == "builtin.module" else _wrap(op)


def _wrap(op: ir.Operation) -> ir.Operation:
    with op.context, ir.Location.unknown():
        module = ir.Module.create()
        module.body.append(op)
        return module.operation


def as_operation(module) -> ir.Operation:
    """Accept an ``ir.Module``, a ``ModuleOp`` view or an ``ir.Operation``."""
    if isinstance(module, ir.Module):
        return module.operation
    return module.operation if hasattr(module, "operation") else module


def verify(module) -> None:
    """Run MLIR's verifier (including the autosp dialect's); raise DiagnosticError."""
    op = as_operation(module)
    try:
        op.verify()
    except ir.MLIRError as e:
        raise DiagnosticError.from_mlir(e) from None


def op_name(op) -> str:
    """The registered name of an op (``torch.aten.mm``), also for func.func/torch.operator."""
    return op.operation.name


def funcs(module) -> list:
    """The ``func.func`` ops at the top level of a module."""
    body = as_operation(module).regions[0].blocks[0]
    return [op for op in body.operations if op_name(op) == "func.func"]


def main_func(module, name: str = "main"):
    """The function called ``name``, or the only function of the module."""
    fs = funcs(module)
    for f in fs:
        if ir.StringAttr(f.attributes["sym_name"]).value == name:
            return f
    if len(fs) == 1:
        return fs[0]
    raise DiagnosticError.at(as_operation(module), f"has no function @{name} (found {len(fs)} functions)")


def body_ops(func) -> Iterator[ir.Operation]:
    """The operations of a function's single block, in order."""
    return iter(func.regions[0].blocks[0].operations)


def users(value: ir.Value) -> list:
    """The ops that use ``value``, its ``torch.bind_symbolic_shape`` annotations aside (they
    only describe it), in use order (an op using it twice appears twice)."""
    return [u.owner.operation for u in value.uses if op_name(u.owner) != BIND_SHAPE]


def tensor_dims(value: ir.Value) -> list | None:
    """The sizes of a ``!torch.vtensor`` value's type (None: a dynamic dim); None when
    ``value`` is not a tensor of known rank.

    Example::

        >>> tensor_dims(x)                     # x: !torch.vtensor<[2,?,8],f32>
        [2, None, 8]
    """
    found = vtensor_shape(value.type)
    return None if found is None else found[0]


def const_int(value: ir.Value) -> int | None:
    """The integer of a ``torch.constant.int`` result, else None."""
    owner = value.owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.constant.int":
        return None
    return owner.attributes["value"].value


def const_float(value: ir.Value) -> float | None:
    """The number of a ``torch.constant.float`` (or ``.int``) result, else None."""
    op = producer(value)
    if op is None or op_name(op) not in ("torch.constant.float", "torch.constant.int"):
        return None
    attr = op.attributes["value"]
    return float(ir.FloatAttr(attr).value if op_name(op) == "torch.constant.float" else ir.IntegerAttr(attr).value)


def const_bool(value: ir.Value) -> bool | None:
    """The value of a ``torch.constant.bool`` result, else None."""
    op = producer(value)
    if op is None or op_name(op) != "torch.constant.bool":
        return None
    return ir.BoolAttr(op.attributes["value"]).value


def producer(value: ir.Value):
    """The op that defines ``value`` (None for a block argument)."""
    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def is_none(value: ir.Value) -> bool:
    """Is ``value`` the result of ``torch.constant.none``?"""
    op = producer(value)
    return op is not None and op_name(op) == CONSTANT_NONE


def list_items(value: ir.Value) -> list:
    """The items of a ``torch.prim.ListConstruct`` result (empty for anything else)."""
    op = producer(value)
    return list(op.operands) if op is not None and op_name(op) == LIST_CONSTRUCT else []


def const_ints(value: ir.Value) -> list[int] | None:
    """The ints of a ``torch.prim.ListConstruct`` of ``torch.constant.int`` s, else None.

    Example::

        >>> const_ints(perm)                   # %perm = torch.prim.ListConstruct %int2, %int0, %int1
        [2, 0, 1]
    """
    items = list_items(value)
    ints = [const_int(x) for x in items]
    return None if not items or None in ints else ints  # type: ignore[return-value]
