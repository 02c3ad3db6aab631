"""Sequence-axis analysis: which dimension of which value is the sequence, and how long.

torch-mlir imports the symbolic sequence length S as one ``torch.symbolic_int`` and binds
the shape of (almost) every tensor to affine expressions of it
(``torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0 - 1, 64)>``). This
module turns those bindings into a per-value description, one entry per dimension:
``"_"`` for a dimension that does not depend on S, else its size as an expression of S
(``"S"``, ``"S - 1"``, ``"S * 2 - 2"``). Integer scalars that equal an expression of S
(``torch.aten.size.int`` of a sequence dimension and arithmetic on it) are described by
one expression. It also finds the attention ops the partitioner will work on.

Example::

    >>> info = analyze_sequence(module)
    >>> info.dims[value]            # a [B, S, D] activation
    ['_', 'S', '_']
    >>> info.scalars[size_value]     # %3 = torch.aten.size.int %ids, %int1
    'S'
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch_mlir import ir

from autosp.ir.builders import vtensor_shape
from autosp.ir.core import body_ops, main_func, op_name
from autosp.ir.diagnostics import DiagnosticError

NOT_SEQ = "_"
SOFTMAX_OPS = ("torch.aten.softmax.int", "torch.aten._softmax", "torch.aten._safe_softmax")
SDPA_OP = "torch.aten.scaled_dot_product_attention"
_SCALAR_ARITH = {"torch.aten.add.int": "+", "torch.aten.sub.int": "-", "torch.aten.mul.int": "*",
                 "torch.aten.floordiv.int": "floordiv"}


@dataclass
class SequenceInfo:
    """The result of :func:`analyze_sequence`."""

    symbol: ir.Value  # the torch.symbolic_int of S
    dims: dict = field(default_factory=dict)  # ir.Value -> ["_", "S", ...] for tensors touching S
    scalars: dict = field(default_factory=dict)  # ir.Value -> "S - 1" for !torch.int values
    attention: list = field(default_factory=list)  # (op, "sdpa" | "manual")

    def seq_dims(self, value) -> list[int]:
        """Indices of the dimensions of ``value`` whose size depends on S."""
        return [i for i, e in enumerate(self.dims.get(value, ())) if e != NOT_SEQ]


def const_int(value: ir.Value) -> int | None:
    """The integer of a ``torch.constant.int`` result, else None."""
    owner = value.owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.constant.int":
        return None
    return owner.attributes["value"].value


def _expr_text(expr: ir.AffineExpr, names: list[str]) -> str:
    text = str(expr)
    return re.sub(r"\bs(\d+)\b", lambda m: names[int(m.group(1))], text)


def _paren(text: str) -> str:
    return text if re.fullmatch(r"[\w]+", text) else f"({text})"


def _rank_and_dynamic(type_) -> list[bool] | None:
    """Per dimension of a ``!torch.vtensor`` type: is it dynamic? (None for other types)."""
    shape = vtensor_shape(type_)
    return None if shape is None else [d is None for d in shape[0]]


def find_sequence_symbol(func) -> ir.Value:
    """The ``torch.symbolic_int`` bound to the inputs' sequence dimension.

    Uses the ``autosp.seq_dim`` argument attributes the frontend writes; without them, the
    function must have exactly one symbolic integer.
    """
    block = func.regions[0].blocks[0]
    seq_dims = {}
    if "arg_attrs" in func.attributes:
        for i, attr in enumerate(func.attributes["arg_attrs"]):
            if "autosp.seq_dim" in attr:
                seq_dims[block.arguments[i]] = attr["autosp.seq_dim"].value
    symbols = [op for op in body_ops(func) if op_name(op) == "torch.symbolic_int"]
    for op in body_ops(func):
        if op_name(op) == "torch.bind_symbolic_shape" and op.operands[0] in seq_dims:
            expr = op.attributes["shape_expressions"].value.results[seq_dims[op.operands[0]]]
            m = re.fullmatch(r"s(\d+)", str(expr))
            if m:
                return op.operands[1 + int(m.group(1))]
    if not seq_dims and len(symbols) == 1:
        return symbols[0].results[0]
    if not symbols:
        raise DiagnosticError.at(func, "has no sequence axis: no input has a symbolic sequence dimension "
                                       "(import with a dynamic sequence length, e.g. autosp.import_model(..., "
                                       "seq_dim=1))")
    raise DiagnosticError.at(func, f"has {len(symbols)} symbolic sizes and no input marked with "
                                   "autosp.seq_dim: cannot tell which one is the sequence length")


def analyze_sequence(module, require_attention: bool = True) -> SequenceInfo:
    """Describe every value's sequence dimensions; find attention (see module docstring).

    Raises :class:`DiagnosticError` when there is no sequence axis, or (with
    ``require_attention``) no attention op that mixes the sequence.
    """
    func = main_func(module)
    info = SequenceInfo(symbol=find_sequence_symbol(func))
    block = func.regions[0].blocks[0]
    if "arg_attrs" in func.attributes:
        for i, attr in enumerate(func.attributes["arg_attrs"]):
            if "autosp.seq_dim" in attr:
                rank = _rank_and_dynamic(block.arguments[i].type)
                d = attr["autosp.seq_dim"].value
                if rank is not None:
                    info.dims[block.arguments[i]] = ["S" if j == d else NOT_SEQ for j in range(len(rank))]

    # Bindings first: torch-mlir sometimes places a binding after the value's first use.
    for op in body_ops(func):
        if op_name(op) == "torch.bind_symbolic_shape":
            names = [("S" if v == info.symbol else f"sym{k}") for k, v in enumerate(op.operands[1:])]
            entries = [_expr_text(e, names) for e in op.attributes["shape_expressions"].value.results]
            entries = [e if re.search(r"\bS\b", e) else NOT_SEQ for e in entries]
            if any(e != NOT_SEQ for e in entries):
                info.dims[op.operands[0]] = entries

    for op in body_ops(func):
        name = op_name(op)
        if name == "torch.bind_symbolic_shape":
            continue
        elif name == "torch.aten.size.int":
            d = const_int(op.operands[1])
            entries = info.dims.get(op.operands[0])
            if d is not None and entries is not None and entries[d] != NOT_SEQ:
                info.scalars[op.results[0]] = entries[d]
        elif name in _SCALAR_ARITH:
            texts = []
            for v in op.operands:
                if v in info.scalars:
                    texts.append(info.scalars[v])
                elif const_int(v) is not None:
                    texts.append(str(const_int(v)))
                else:
                    texts = None
                    break
            if texts and any(v in info.scalars for v in op.operands):
                info.scalars[op.results[0]] = f"{_paren(texts[0])} {_SCALAR_ARITH[name]} {_paren(texts[1])}"
        elif len(op.results) == 1 and op.results[0] not in info.dims:
            _propagate_unbound(op, info)

        if name == SDPA_OP:
            info.attention.append((op, "sdpa"))
        elif name in SOFTMAX_OPS and len(info.seq_dims(op.operands[0])) >= 2:
            info.attention.append((op, "manual"))

    if require_attention and not info.attention:
        raise DiagnosticError.at(func, "has no attention to partition: found no "
                                       "torch.aten.scaled_dot_product_attention and no softmax over a "
                                       "[..., S, S] score tensor (matmul -> softmax -> matmul)")
    return info


def _propagate_unbound(op, info: SequenceInfo) -> None:
    """A result without a binding inherits sequence dims from a same-rank operand (e.g. a
    keepdim reduction over features): only where the result's dim is dynamic too."""
    result = op.results[0]
    dyn = _rank_and_dynamic(result.type)
    if not dyn or not any(dyn):
        return
    for operand in op.operands:
        entries = info.dims.get(operand)
        if entries is not None and len(entries) == len(dyn):
            inherited = [e if (dyn[i] and e != NOT_SEQ) else NOT_SEQ for i, e in enumerate(entries)]
            if any(e != NOT_SEQ for e in inherited):
                info.dims[result] = inherited
            return


def annotate(module, info: SequenceInfo) -> None:
    """Write the analysis into the IR: ``autosp.seq`` on each op result it describes and
    ``autosp.attention`` on attention ops (readable, and checked by the lit tests)."""
    func = main_func(module)
    with func.context:
        for op in body_ops(func):
            if len(op.results) != 1 or op_name(op) == "torch.symbolic_int":
                continue
            r = op.results[0]
            if r in info.dims:
                op.attributes["autosp.seq"] = ir.ArrayAttr.get([ir.StringAttr.get(e) for e in info.dims[r]])
            elif r in info.scalars:
                op.attributes["autosp.seq"] = ir.StringAttr.get(info.scalars[r])
        for op, kind in info.attention:
            op.attributes["autosp.attention"] = ir.StringAttr.get(kind)


def sequence_length_value(module, info: SequenceInfo) -> ir.Value:
    """An ``!torch.int`` holding the full sequence length S, defined at the top of ``@main``
    (``torch.aten.size.int`` of the first input that carries the sequence)."""
    func = main_func(module)
    block = func.regions[0].blocks[0]
    for i, attr in enumerate(func.attributes["arg_attrs"] if "arg_attrs" in func.attributes else []):
        if "autosp.seq_dim" in attr:
            arg, dim = block.arguments[i], attr["autosp.seq_dim"].value
            break
    else:
        raise DiagnosticError.at(func, "has no input marked with autosp.seq_dim to take the sequence length from")
    # Reuse one a previous pass put at the top of the function.
    for op in block.operations:
        name = op_name(op)
        if name == "torch.aten.size.int" and op.operands[0] == arg and const_int(op.operands[1]) == dim:
            return op.results[0]
        if name not in ("torch.aten.size.int", "torch.constant.int"):
            break
    first = next(iter(block.operations))
    from autosp.ir import builders as b
    with ir.InsertionPoint(first), first.location:
        return b.torch_op("torch.aten.size.int", [arg, b.constant_int(dim)], b.int_type())
