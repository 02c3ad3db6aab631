"""Sequence-axis analysis: which dimension of which value is the sequence, and how long.

torch-mlir imports the symbolic sequence length S as one ``torch.symbolic_int`` and binds
the shape of (almost) every tensor to affine expressions of it
(``torch.bind_symbolic_shape %x, [%s], affine_map<()[s0] -> (2, s0 - 1, 64)>``). This
module reads those expressions, and the ``!torch.int`` arithmetic on sizes
(``torch.aten.size.int``, ``add.int``, ``mul.int``...), into a typed form:

* :class:`Linear` ``a*S + b`` (a constant when ``a == 0``), read exactly from the IR's
  expression trees: ``s0 * 2 - 2`` is ``Linear(2, -2)``;
* :class:`NonLinear`, a size that depends on S but not as ``a*S + b``
  (``(s0 + 7) floordiv 8 * 8``), kept only as text for messages.

Nothing is decided by evaluating an expression at sample lengths. A tensor gets one
entry per dimension: None where the size does not depend on S, else its
:data:`SeqExpr`. It also finds the attention ops the partitioner will work on.

Example::

    >>> info = analyze_sequence(module)
    >>> info.dims[value]             # a [B, S, D] activation
    [None, Linear(a=1, b=0), None]
    >>> str(info.scalars[size_value])  # %3 = torch.aten.size.int %ids, %int1
    'S'
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir import ops
from autosp.ir.builders import vtensor_shape
from autosp.ir.contract import ATTENTION_ATTR, SEQ_ATTR, SEQ_DIM_ATTR, AttentionKind
from autosp.ir.core import body_ops, const_bool, const_int, main_func, op_name, producer
from autosp.ir.diagnostics import AutospError, DiagnosticError
from autosp.ir.sizes import fold_affine

NOT_SEQ = "_"  # how a dimension that does not depend on S is printed in ``autosp.seq``

__all__ = ["Linear", "NonLinear", "SeqExpr", "SequenceInfo", "analyze_sequence", "annotate", "const_int",
           "combine", "depends_on_s", "find_sequence_symbol", "sequence_length_value", "seq_expr_of_affine", "NOT_SEQ"]


@dataclass(frozen=True)
class Linear:
    """The integer ``a*S + b`` (a constant when ``a == 0``).

    Example::

        >>> str(Linear(2, -2)), str(Linear(1)), str(Linear(0, 7))
        ('2 * S - 2', 'S', '7')
        >>> Linear(1, -1) + Linear(0, 3)
        Linear(a=1, b=2)
    """

    a: int
    b: int = 0

    @property
    def is_constant(self) -> bool:
        return self.a == 0

    def __add__(self, other: Linear) -> Linear:
        return Linear(self.a + other.a, self.b + other.b)

    def __sub__(self, other: Linear) -> Linear:
        return Linear(self.a - other.a, self.b - other.b)

    def __neg__(self) -> Linear:
        return Linear(-self.a, -self.b)

    def times(self, k: int) -> Linear:
        return Linear(self.a * k, self.b * k)

    def __str__(self) -> str:
        if self.a == 0:
            return str(self.b)
        head = {1: "S", -1: "-S"}.get(self.a, f"{self.a} * S")
        if self.b == 0:
            return head
        return f"{head} {'+' if self.b > 0 else '-'} {abs(self.b)}"


@dataclass(frozen=True)
class NonLinear:
    """An integer that depends on S, but not as ``a*S + b`` (``(S + 7) floordiv 8 * 8``).

    Only its text is kept: autosp never computes with it, it names it in messages.
    """

    text: str

    def __str__(self) -> str:
        return self.text


SeqExpr = Linear | NonLinear


@dataclass(frozen=True)
class _Free:
    """An integer that does not depend on S but is not a constant either (another symbol)."""

    text: str

    def __str__(self) -> str:
        return self.text


def _paren(x) -> str:
    text = str(x)
    simple = isinstance(x, (_Free,)) or (isinstance(x, Linear) and (x.a == 0 or (x.b == 0 and x.a == 1)))
    return text if simple and not text.startswith("-") else f"({text})"


def combine(operator: str, lhs, rhs):
    """``lhs <operator> rhs`` for the integer operators of sizes (``+ - * floordiv ceildiv mod``).

    Exact: the result is :class:`Linear` only when it is ``a*S + b`` for every S (a product
    with a constant; a division of ``a*S + b`` by a positive constant that divides ``a``),
    else :class:`NonLinear` (or a constant / another symbol where S is not involved).

    Example::

        >>> combine("floordiv", Linear(2, 1), Linear(0, 2))
        Linear(a=1, b=0)
        >>> str(combine("floordiv", Linear(1, 7), Linear(0, 8)))
        '(S + 7) floordiv 8'
    """
    if isinstance(lhs, Linear) and isinstance(rhs, Linear):
        if operator == "+":
            return lhs + rhs
        if operator == "-":
            return lhs - rhs
        if operator == "*" and (lhs.is_constant or rhs.is_constant):
            return lhs.times(rhs.b) if rhs.is_constant else rhs.times(lhs.b)
        if operator in ("floordiv", "ceildiv", "mod") and rhs.is_constant and rhs.b > 0 and lhs.a % rhs.b == 0:
            c = rhs.b
            # (a*S + b) / c with c | a: the S part divides exactly, only b is rounded.
            if operator == "floordiv":
                return Linear(lhs.a // c, lhs.b // c)
            if operator == "ceildiv":
                return Linear(lhs.a // c, -((-lhs.b) // c))
            return Linear(0, lhs.b % c)
    text = f"{_paren(lhs)} {operator} {_paren(rhs)}"
    if any(isinstance(x, NonLinear) or (isinstance(x, Linear) and not x.is_constant) for x in (lhs, rhs)):
        return NonLinear(text)
    return _Free(text)


def seq_expr_of_affine(expr: ir.AffineExpr, symbols: list[bool]):
    """Read an affine expression of the bound symbols; ``symbols[k]`` says whether ``s<k>`` is S.

    Returns a :class:`Linear`, a :class:`NonLinear`, or, for an expression that does not
    involve S, a constant ``Linear(0, c)`` or an opaque value that is not a sequence size.

    Example::

        >>> seq_expr_of_affine(<s0 * 2 - 2>, [True])
        Linear(a=2, b=-2)
    """
    def symbol(k: int):
        return Linear(1) if symbols[k] else _Free(f"sym{k}")

    def unsupported(e: ir.AffineExpr):
        raise AutospError(f"unsupported affine expression {e}")
    return fold_affine(expr, lambda c: Linear(0, c), symbol, _combine_as_printed, unsupported)


def _combine_as_printed(operator: str, lhs, rhs):
    """:func:`combine`, with ``x + -c`` read as ``x - c`` (printed as MLIR prints it)."""
    if operator == "+" and isinstance(rhs, Linear) and rhs.is_constant and rhs.b < 0 and not isinstance(lhs, Linear):
        return combine("-", lhs, Linear(0, -rhs.b))
    return combine(operator, lhs, rhs)


def depends_on_s(x) -> bool:
    """Is ``x`` (from :func:`seq_expr_of_affine` or :func:`combine`) a size that depends on S?"""
    return isinstance(x, NonLinear) or (isinstance(x, Linear) and not x.is_constant)


@dataclass
class SequenceInfo:
    """The result of :func:`analyze_sequence`."""

    symbol: ir.Value  # the torch.symbolic_int of S
    dims: dict = field(default_factory=dict)  # ir.Value -> [None | SeqExpr per dim], for tensors touching S
    scalars: dict = field(default_factory=dict)  # ir.Value -> SeqExpr, for !torch.int values depending on S
    attention: list = field(default_factory=list)  # (op, AttentionKind)
    recurrences: list = field(default_factory=list)  # stated linear recurrences along the sequence

    def seq_dims(self, value) -> list[int]:
        """Indices of the dimensions of ``value`` whose size depends on S."""
        return [i for i, e in enumerate(self.dims.get(value, ())) if e is not None]

    def length(self, value, dim: int):
        """The :data:`SeqExpr` of dimension ``dim`` of ``value`` (None: not a sequence dim)."""
        entries = self.dims.get(value)
        return entries[dim % len(entries)] if entries else None


def _dynamic_dims(type_) -> list[bool] | None:
    """Per dimension of a ``!torch.vtensor`` type: is it dynamic? (None for other types)."""
    shape = vtensor_shape(type_)
    return None if shape is None else [d is None for d in shape[0]]


def _seq_dim_args(func) -> dict:
    """Function arguments marked ``autosp.seq_dim`` (by the frontend) -> that dim."""
    block = func.regions[0].blocks[0]
    marked = {}
    if "arg_attrs" in func.attributes:
        for i, attr in enumerate(func.attributes["arg_attrs"]):
            if SEQ_DIM_ATTR in attr:
                marked[block.arguments[i]] = attr[SEQ_DIM_ATTR].value
    return marked


def find_sequence_symbol(func) -> ir.Value:
    """The ``torch.symbolic_int`` bound to the inputs' sequence dimension.

    Uses the ``autosp.seq_dim`` argument attributes the frontend writes; without them, the
    function must have exactly one symbolic integer.
    """
    seq_dims = _seq_dim_args(func)
    symbols = [op for op in body_ops(func) if op_name(op) == ops.SYMBOLIC_INT]
    for op in body_ops(func):
        if op_name(op) == ops.BIND_SHAPE and op.operands[0] in seq_dims:
            expr = op.attributes["shape_expressions"].value.results[seq_dims[op.operands[0]]]
            if isinstance(expr, ir.AffineSymbolExpr):
                return op.operands[1 + expr.position]
    if not seq_dims and len(symbols) == 1:
        return symbols[0].results[0]
    if not symbols:
        raise DiagnosticError.at(func, "has no sequence axis: no input has a symbolic sequence dimension "
                                       "(import with a dynamic sequence length, e.g. autosp.import_model(..., "
                                       "seq_dim=1))")
    raise DiagnosticError.at(func, f"has {len(symbols)} symbolic sizes and no input marked with "
                                   "autosp.seq_dim: cannot tell which one is the sequence length")


def _scalar_of(value: ir.Value, info: SequenceInfo):
    """A ``!torch.int`` operand as an expression: known sizes, constants; else None."""
    if value in info.scalars:
        return info.scalars[value]
    c = const_int(value)
    return None if c is None else Linear(0, c)


def analyze_sequence(module, require_attention: bool = True) -> SequenceInfo:
    """Describe every value's sequence dimensions; find attention (see module docstring).

    Raises :class:`DiagnosticError` when there is no sequence axis, or (with
    ``require_attention``) no attention op that mixes the sequence.
    """
    func = main_func(module)
    info = SequenceInfo(symbol=find_sequence_symbol(func))
    for arg, d in _seq_dim_args(func).items():
        rank = _dynamic_dims(arg.type)
        if rank is not None:
            info.dims[arg] = [Linear(1) if j == d else None for j in range(len(rank))]

    # Bindings first: torch-mlir sometimes places a binding after the value's first use.
    for op in body_ops(func):
        if op_name(op) == ops.BIND_SHAPE:
            symbols = [v == info.symbol for v in op.operands[1:]]
            entries = [seq_expr_of_affine(e, symbols) for e in op.attributes["shape_expressions"].value.results]
            entries = [e if depends_on_s(e) else None for e in entries]
            if any(e is not None for e in entries):
                info.dims[op.operands[0]] = entries

    for op in body_ops(func):
        name = op_name(op)
        if name == ops.BIND_SHAPE:
            continue
        elif name == ops.SIZE_OP:
            d = const_int(op.operands[1])
            length = info.length(op.operands[0], d) if d is not None else None
            if length is not None:
                info.scalars[op.results[0]] = length
        elif name in ops.SCALAR_ARITH:
            lhs, rhs = (_scalar_of(v, info) for v in op.operands[:2])
            if lhs is not None and rhs is not None and any(v in info.scalars for v in op.operands):
                result = combine(ops.SCALAR_ARITH[name], lhs, rhs)
                if depends_on_s(result):
                    info.scalars[op.results[0]] = result
        elif any(r not in info.dims for r in op.results):
            _propagate_unbound(op, info)

        if ops.is_sdpa(op) and (info.seq_dims(op.operands[0]) or info.seq_dims(op.operands[1])):
            # (attention over another axis, a vision tower's patches, is replicated work)
            info.attention.append((op, AttentionKind.SDPA))
        elif name in ops.SOFTMAX_OPS and len(info.seq_dims(op.operands[0])) >= 2:
            info.attention.append((op, AttentionKind.MANUAL))
        elif ops.operator_name(op) in ops.RECURRENCE_OPERATORS and op.operands and info.seq_dims(op.operands[0]):
            info.recurrences.append(op)

    if require_attention and not info.attention and not info.recurrences:
        raise DiagnosticError.at(func, "has no attention or recurrence to partition: found no "
                                       "torch.aten.scaled_dot_product_attention, no softmax over a "
                                       "[..., S, S] score tensor (matmul -> softmax -> matmul) and no "
                                       "stated recurrence (autosp.ir.stated) over the sequence")
    return info


def _size_list_dims(op, info: SequenceInfo, rank: int) -> list | None:
    """The sequence dims of a result whose shape an S-dependent size list gives (a view,
    ``broadcast_to`` or ``expand`` of operand 0, as dropout's mask is built from a 0-d
    tensor): each entry of the list read as a size expression."""
    if op_name(op) not in ops.SIZE_LIST_OPS or len(op.operands) < 2:
        return None
    owner = producer(op.operands[1])
    if owner is None or op_name(owner) != ops.LIST_CONSTRUCT or len(owner.operands) != rank:
        return None
    entries = [info.scalars.get(v) for v in owner.operands]
    return entries if any(e is not None for e in entries) else None


def _propagate_unbound(op, info: SequenceInfo) -> None:
    """A result without a binding inherits sequence dims from a same-rank operand (e.g. a
    keepdim reduction over features, or a layer norm's mean and rstd): only where the
    result's dim is dynamic too. A view or broadcast's result takes them from its size
    list."""
    for result in op.results:
        if result in info.dims:
            continue
        dyn = _dynamic_dims(result.type)
        if not dyn or not any(dyn):
            continue
        listed = _size_list_dims(op, info, len(dyn))
        if listed is not None:
            info.dims[result] = [e if dyn[i] else None for i, e in enumerate(listed)]
            continue
        for operand in op.operands:
            entries = info.dims.get(operand)
            if entries is not None and len(entries) != len(dyn):
                # x.mean(-1) arrives as an unbound sum; repeat as unsqueeze + broadcast_to
                entries = _reduced_entries(op, entries) if op_name(op) != ops.UNSQUEEZE_OP else \
                    _unsqueezed_entries(op, entries)
            if entries is not None and len(entries) == len(dyn):
                inherited = [e if dyn[i] else None for i, e in enumerate(entries)]
                if any(e is not None for e in inherited):
                    info.dims[result] = inherited
                break


def _unsqueezed_entries(op, entries: list) -> list | None:
    """The entries of ``unsqueeze(x, d)``'s result (d a constant): ``x``'s with a dim of
    size 1 inserted at ``d``; None where ``d`` cannot be read."""
    d = const_int(op.operands[1])
    if d is None or not -len(entries) - 1 <= d <= len(entries):
        return None
    at = d % (len(entries) + 1)
    return entries[:at] + [None] + entries[at:]


def _reduced_entries(op, entries: list) -> list | None:
    """The entries of ``op``'s result when ``op`` is a reduction over constant dims with
    ``keepdim=False`` (read from its schema: ``sum.dim_IntList(self, dim, keepdim, dtype)``):
    the operand's entries without the reduced dims; None for anything else."""
    names = ops.argument_names(op_name(op))
    if "dim" not in names or "keepdim" not in names or len(op.operands) != len(names):
        return None
    if const_bool(op.operands[names.index("keepdim")]) is not False:
        return None
    dim = op.operands[names.index("dim")]
    owner = producer(dim)
    dims = [const_int(dim)] if const_int(dim) is not None else \
        [const_int(v) for v in owner.operands] if owner is not None and op_name(owner) == ops.LIST_CONSTRUCT else []
    if not dims or any(d is None or not -len(entries) <= d < len(entries) for d in dims):
        return None  # an empty list or None reduces every dim; a dim autosp cannot read
    reduced = {d % len(entries) for d in dims if d is not None}
    return [e for i, e in enumerate(entries) if i not in reduced]


def annotate(module, info: SequenceInfo) -> None:
    """Write the analysis into the IR: ``autosp.seq`` on each op result it describes and
    ``autosp.attention`` on attention ops (readable, and checked by the lit tests).

    A tensor gets one string per dimension (``"_"``: not a sequence dim), a size one string.
    """
    func = main_func(module)
    with func.context:
        for op in body_ops(func):
            if len(op.results) != 1 or op_name(op) == ops.SYMBOLIC_INT:
                continue
            r = op.results[0]
            if r in info.dims:
                op.attributes[SEQ_ATTR] = ir.ArrayAttr.get(
                    [ir.StringAttr.get(NOT_SEQ if e is None else str(e)) for e in info.dims[r]])
            elif r in info.scalars:
                op.attributes[SEQ_ATTR] = ir.StringAttr.get(str(info.scalars[r]))
        for op, kind in info.attention:
            op.attributes[ATTENTION_ATTR] = ir.StringAttr.get(kind.value)


def sequence_length_value(module, info: SequenceInfo) -> ir.Value:
    """An ``!torch.int`` holding the full sequence length S, defined at the top of ``@main``
    (``torch.aten.size.int`` of the first input that carries the sequence)."""
    func = main_func(module)
    block = func.regions[0].blocks[0]
    marked = _seq_dim_args(func)
    if not marked:
        raise DiagnosticError.at(func, "has no input marked with autosp.seq_dim to take the sequence length from")
    arg, dim = next(iter(marked.items()))
    # Reuse one a previous pass put at the top of the function.
    for op in block.operations:
        name = op_name(op)
        if name == ops.SIZE_OP and op.operands[0] == arg and const_int(op.operands[1]) == dim:
            return op.results[0]
        if name not in (ops.SIZE_OP, ops.CONSTANT_INT):
            break
    first = next(iter(block.operations))
    with ir.InsertionPoint(first), first.location:
        return b.torch_op(ops.SIZE_OP, [arg, b.constant_int(dim)], b.int_type())
