"""Symbolic sizes: torch-mlir's affine shape bindings, read by one walker.

``torch.bind_symbolic_shape %x, [%s0], affine_map<()[s0] -> (2, s0 * 2 - 1, 8)>`` binds
each dim of ``%x`` to an ``ir.AffineExpr`` tree over the symbols. :func:`fold_affine`
walks such a tree bottom-up with the caller's meaning for constants, symbols and
operators; nothing reads the expressions' printed text. Its two readers:

- the sequence analysis, as ``a*S + b`` (:func:`autosp.ir.sequence.seq_expr_of_affine`);
- the mask proofs, as a :class:`~autosp.ir.mask_algebra.Lin` over the symbols' names
  (:func:`lin_of_affine`), and so every dim of a value (:func:`dim_sizes`).

Example::

    >>> dim_sizes(x)                     # x: !torch.vtensor<[2,?,8],f32>, bound as above, %s0 = "s0"
    (Lin(terms=(), const=2), Lin(terms=(('s0', 2),), const=-1), Lin(terms=(), const=8))
    >>> fold_affine(expr, constant=lambda c: c, symbol=lambda k: 5,
    ...             combine=lambda op, a, b: a + b if op == "+" else a * b)
    9                                    # s0 * 2 - 1 at s0 = 5
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch_mlir import ir

from autosp.ir.builders import vtensor_shape
from autosp.ir.core import op_name
from autosp.ir.mask_algebra import Lin, NotProven
from autosp.ir.ops import BIND_SHAPE, SYMBOLIC_INT

# The binary nodes of an affine expression and the operator each stands for.
AFFINE_OPERATORS = ((ir.AffineAddExpr, "+"), (ir.AffineMulExpr, "*"), (ir.AffineFloorDivExpr, "floordiv"),
                    (ir.AffineCeilDivExpr, "ceildiv"), (ir.AffineModExpr, "mod"))


def fold_affine(expr: ir.AffineExpr, constant: Callable[[int], Any], symbol: Callable[[int], Any],
                combine: Callable[[str, Any, Any], Any], other: Callable[[ir.AffineExpr], Any] | None = None):
    """``expr`` evaluated bottom-up: ``constant(value)`` at a constant, ``symbol(position)``
    at ``s<position>``, ``combine(operator, lhs, rhs)`` at each binary node (operators:
    :data:`AFFINE_OPERATORS`), ``other(expr)`` at anything else (a dim ``d0``); without
    ``other`` that raises ValueError."""
    if isinstance(expr, ir.AffineConstantExpr):
        return constant(expr.value)
    if isinstance(expr, ir.AffineSymbolExpr):
        return symbol(expr.position)
    for cls, operator in AFFINE_OPERATORS:
        if isinstance(expr, cls):
            return combine(operator, fold_affine(expr.lhs, constant, symbol, combine, other),
                           fold_affine(expr.rhs, constant, symbol, combine, other))
    if other is None:
        raise ValueError(f"unsupported affine expression {expr}")
    return other(expr)


def lin_of_affine(expr: ir.AffineExpr, names: list) -> Lin | None:
    """``expr`` as a Lin over the symbol names (``names[k]`` for ``s<k>``; None: a symbol
    that is not a ``torch.symbolic_int``); None where it is not linear (a product of two
    symbols, ``floordiv``, ``mod``...) or reads an unnamed symbol.

    Example::

        >>> lin_of_affine(<s0 * 2 + 1>, ["s5"])
        Lin(terms=(('s5', 2),), const=1)
    """
    def symbol(k: int) -> Lin | None:
        return Lin.var(names[k]) if k < len(names) and names[k] is not None else None

    def combine(operator: str, lhs: Lin | None, rhs: Lin | None) -> Lin | None:
        if lhs is None or rhs is None:
            return None
        if operator == "+":
            return lhs + rhs
        if operator == "*" and (lhs.is_const() or rhs.is_const()):
            return lhs.scale(rhs.const) if rhs.is_const() else rhs.scale(lhs.const)
        return None
    return fold_affine(expr, lambda c: Lin((), c), symbol, combine, lambda e: None)


def bound_sizes(bind) -> list[Lin | None]:
    """The dims of a ``torch.bind_symbolic_shape`` as Lins over its symbols' names (None
    where not linear)."""
    names = []
    for sym in list(bind.operands)[1:]:
        owner = sym.owner
        names.append(ir.StringAttr(owner.attributes["symbol_name"]).value
                     if not isinstance(owner, ir.Block) and op_name(owner) == SYMBOLIC_INT else None)
    return [lin_of_affine(expr, names) for expr in ir.AffineMapAttr(bind.attributes["shape_expressions"]).value.results]


def dim_sizes(value: ir.Value) -> tuple[Lin, ...]:
    """The sizes of a value's dims as Lins over size symbols: static ones from its type,
    dynamic ones from its ``torch.bind_symbolic_shape`` (symbols named by their
    ``torch.symbolic_int``), else a symbol of its own per dim (``arg3.d1``), equal to no
    other. Raises :class:`~autosp.ir.mask_algebra.NotProven` for a value that is not a tensor."""
    shape = vtensor_shape(value.type)
    if shape is None:
        raise NotProven(f"{value.get_name()} is not a tensor")
    dims = shape[0]
    bound = None
    for use in value.uses:
        user = use.owner
        if op_name(user) == BIND_SHAPE and use.operand_number == 0:
            bound = bound_sizes(user)
            break
    out = []
    for d, n in enumerate(dims):
        lin = bound[d] if bound is not None else None
        if n is not None:
            out.append(Lin((), n))
        elif lin is not None:
            out.append(lin)
        else:  # a size of its own, equal to no other (get_name prints: only when needed)
            where = f"arg{ir.BlockArgument(value).arg_number}" if isinstance(value.owner, ir.Block) else value.get_name()
            out.append(Lin.var(f"{where}.d{d}"))
    return tuple(out)


def _symbol_range(name: str, anchor: ir.Value) -> tuple[float, float] | None:
    """``(min, max)`` of the ``torch.symbolic_int`` named ``name`` in ``anchor``'s block."""
    owner = anchor.owner
    block = owner if isinstance(owner, ir.Block) else owner.operation.block
    for op in block.operations:
        if op_name(op) == SYMBOLIC_INT and ir.StringAttr(op.attributes["symbol_name"]).value == name:
            lo, hi = (ir.IntegerAttr(op.attributes[k]).value for k in ("min_val", "max_val"))
            return float(lo), float(hi)
    return None


def int_range(value: ir.Value) -> tuple[float, float] | None:
    """An interval holding the ``!torch.int`` ``value`` at every sequence length the program
    admits, by interval arithmetic over the size symbols' declared ranges
    (``torch.symbolic_int {min_val, max_val}``): constants, sizes, ``+``, ``-``, ``*`` by a
    constant, and ``prim.max.int`` / ``prim.min.int`` (a symbolic max/min of sizes, as the
    importer writes ``sym_max``). None where it reads anything else.

    Example: ``max(1 - S, 0)`` with S >= 2 is ``(0, 0)``: the start of MPT's ALiBi slice.
    """
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation
    name = op_name(op)
    if name == "torch.constant.int":
        c = float(ir.IntegerAttr(op.attributes["value"]).value)
        return c, c
    if name == "torch.aten.size.int":
        dim = op.operands[1].owner
        if isinstance(dim, ir.Block) or op_name(dim) != "torch.constant.int":
            return None
        sizes = dim_sizes(op.operands[0])
        d = ir.IntegerAttr(dim.operation.attributes["value"]).value % len(sizes)
        lin = sizes[d]
        if lin.is_const():
            return float(lin.const), float(lin.const)
        if len(lin.terms) != 1:
            return None
        (symbol, coeff), = lin.terms
        found = _symbol_range(symbol, value)
        if found is None:
            return None
        ends = (coeff * found[0] + lin.const, coeff * found[1] + lin.const)
        return min(ends), max(ends)
    args = [int_range(x) for x in op.operands]
    if any(a is None for a in args) or len(args) != 2:
        return None
    (a_lo, a_hi), (b_lo, b_hi) = args  # type: ignore[misc]
    if name == "torch.aten.add.int":
        return a_lo + b_lo, a_hi + b_hi
    if name == "torch.aten.sub.int":
        return a_lo - b_hi, a_hi - b_lo
    if name == "torch.prim.max.int":
        return max(a_lo, b_lo), max(a_hi, b_hi)
    if name == "torch.prim.min.int":
        return min(a_lo, b_lo), min(a_hi, b_hi)
    if name == "torch.aten.mul.int" and (a_lo == a_hi or b_lo == b_hi):
        products = [a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi]
        return min(products), max(products)
    return None


def static_size(value: ir.Value, dim: int) -> int | None:
    """Dim ``dim`` of ``value`` where it is one number at every sequence length: from the
    type or the shape binding, or through ``aten.slice.Tensor`` (the other dims are the
    input's; the sliced one ``size - start`` where :func:`int_range` pins the start inside
    the input and the end is none or past it, step 1). None where not proven."""
    try:
        sizes = dim_sizes(value)
    except NotProven:
        return None
    dim %= len(sizes)
    if sizes[dim].is_const():
        return sizes[dim].const
    owner = value.owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.aten.slice.Tensor":
        return None
    op = owner.operation
    on = op.operands[1].owner
    if isinstance(on, ir.Block) or op_name(on) != "torch.constant.int":
        return None
    sliced = ir.IntegerAttr(on.operation.attributes["value"]).value % len(sizes)
    whole = static_size(op.operands[0], dim)
    if dim != sliced or whole is None:
        return whole
    start, end, step = (int_range(x) if op_name(x.owner) != "torch.constant.none" else None  # type: ignore[arg-type]
                        for x in op.operands[2:5])
    end_is_none = op_name(op.operands[3].owner) == "torch.constant.none"  # type: ignore[arg-type]
    if start is None or start[0] != start[1] or not 0 <= start[0] <= whole or step != (1.0, 1.0):
        return None
    if not end_is_none and (end is None or end[0] < whole):
        return None
    return whole - int(start[0])
