"""``autosp-causal-mask``: SDPA masks proven causal from the IR become ``is_causal``.

Traced Hugging Face models materialise a ``[B, 1, S, S]`` boolean mask that eager execution
skips (it calls SDPA with ``is_causal=True``); SDPA keeps the mask for backward (O(S^2) bytes
per layer) and takes the slower masked kernel. This pass removes such a mask when, and only
when, the ops that compute it prove that it is exactly ``k <= q``.

How: the mask's backward slice is read as a predicate over the mask's index space by a small
abstract interpreter (:class:`_MaskInterpreter`). Each value it understands is one of

- an integer scalar (``!torch.int``): a linear expression over sizes (``size.int`` of an
  input is a symbol, never the input's data);
- an integer tensor: ``c + sum_d a_d * i_d`` over its own indices ``i_d`` (``arange``,
  ``+``/``-``/``*`` by constants, broadcasts, ``unsqueeze``, ``slice``, ``cat`` when the
  pieces join into one line, advanced indexing by such tensors, ``cumsum`` of a constant);
- a boolean tensor: a formula of linear constraints over its indices (comparisons, and/or/not,
  ``tril``/``triu``);
- a float tensor of a few constants, each on a formula (``where``, ``masked_fill``, ``full``,
  ``triu`` of ``full(-inf)``): an additive mask.

Sizes are tracked beside the values (Lins over the ``torch.symbolic_int`` symbols of
``torch.bind_symbolic_shape``, or over ``size.int`` symbols): a broadcast of two dims not
proven equal (one might be 1 at run time and repeat index 0), or a mask not proven to span
the query and key lengths, is "not proven" too.

Data the domain cannot compute (an input's values, an op it does not model) is kept opaque:
an element of a boolean or integer tensor it reads becomes an atom ``pad[b, k]`` / a
variable ``pos[b, q]`` of unknown value; a cat of pieces not on one line (``torch.diff``'s
``prepend``) is a piecewise integer tensor. Floats it cannot compute, random ops and
non-splat literals make the mask "not proven" and it stays, correct at its memory cost. The fold happens only when the formula simplifies to the
single constraint ``i_q - i_k >= 0`` on the mask's last two dims (for an additive mask: 0
exactly there, and elsewhere -inf or a value below half the dtype's lowest), or to exactly
that and ``i_k - i_q + W - 1 >= 0`` for a constant W: a causal sliding window, which becomes
``is_causal`` plus ``autosp.window = W`` (without dropout; the backend's windowed kernel
never builds S x S). Two conjuncts over data are recognised beside that structure:

- key padding ``pad[b, k]`` (a [B, S] boolean, e.g. ``attention_mask``): the mask operand
  becomes ``pad`` as [B, 1, 1, S], with ``autosp.key_padding``;
- documents ``doc[b, q] == doc[b, k]`` (a [B, S] integer: a segment-id input, or ids
  computed in the model): the operand becomes ``doc`` as [B, 1, 1, S], with
  ``autosp.documents``. The rest may compare positions ``pos[b, k] <= pos[b, q]`` instead
  of indices (transformers' packed sequences) only when ``doc`` is proven to number the
  runs of consecutive positions: ``doc = cumsum(c)`` with ``c[i]`` exactly
  ``pos[i] - pos[i - 1] != 1`` for i >= 1. Then within a document ``pos[q] - pos[k] ==
  q - k`` and the comparison is rewritten to indices. Ids from ``cumsum(pos == 0)`` prove
  nothing about the steps between resets: kept.

An offset (``k <= q + 1``), padding read at the query, or any other conjunct leaves a
different formula and blocks the fold. Sampling the mask at a few lengths is not a proof: a
window of 48 looks causal at every length up to 48.

The input/output example is on :class:`CausalMask`.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import body_ops, const_bool, const_float, is_none, main_func, op_name
from autosp.ir.contract import DOCUMENTS_ATTR, EMPTY_ROWS_ATTR, KEPT_MASK_ATTR, KEY_PADDING_ATTR, WINDOW_ATTR, EmptyRows
from autosp.ir.ops import SDPA_OP
from autosp.ir.pass_base import ModulePass

_log = logging.getLogger(__name__)


# ---------------------------------------------------------------- linear expressions
# Variables: an int d is the index along dim d of the tensor the expression belongs to;
# a str is a size symbol ("arg3.d1"). Both are non-negative, which the simplifier uses.
# A tuple ("val", name, idx) is the element at ``idx`` (a tuple of Lins) of an integer
# tensor whose data the domain does not compute (``position_ids``, document ids): of any sign.

@dataclass(frozen=True)
class Lin:
    """``const + sum(coeff * var)`` with integer coefficients."""

    terms: tuple = ()  # sorted ((var, coeff), ...), no zero coeff
    const: int = 0

    @staticmethod
    def of(terms: dict, const: int = 0) -> "Lin":
        return Lin(tuple(sorted(((v, c) for v, c in terms.items() if c), key=_var_key)), const)

    @staticmethod
    def var(v) -> "Lin":
        return Lin(((v, 1),), 0)

    def coeffs(self) -> dict:
        return dict(self.terms)

    def __add__(self, other: "Lin") -> "Lin":
        t = self.coeffs()
        for v, c in other.terms:
            t[v] = t.get(v, 0) + c
        return Lin.of(t, self.const + other.const)

    def scale(self, k: int) -> "Lin":
        return Lin.of({v: c * k for v, c in self.terms}, self.const * k)

    def __sub__(self, other: "Lin") -> "Lin":
        return self + other.scale(-1)

    def is_const(self) -> bool:
        return not self.terms

    def subst(self, mapping: dict) -> "Lin":
        """Replace index variables: ``mapping[d]`` is a Lin (absent: kept); also inside the
        indices of data elements."""
        out = Lin((), self.const)
        for v, c in self.terms:
            if _is_data_var(v):
                v = ("val", v[1], tuple(lin.subst(mapping) for lin in v[2]))
            out = out + (mapping[v] if v in mapping else Lin.var(v)).scale(c)
        return out

    def nonnegative(self) -> bool:
        """Provably >= 0 for every value of the variables (indices and sizes are >= 0;
        data elements may have any sign)."""
        return self.const >= 0 and all(c >= 0 and not _is_data_var(v) for v, c in self.terms)

    def data_vars(self) -> list:
        return [v for v, _ in self.terms if _is_data_var(v)]


def _is_data_var(v) -> bool:
    return isinstance(v, tuple)


def _var_key(item):
    v = item[0]
    if _is_data_var(v):
        return (2, 0, f"{v[1]}{v[2]}")
    return (0, v, "") if isinstance(v, int) else (1, 0, v)


# ---------------------------------------------------------------- formulas
# ("const", bool) | ("ge", Lin) [Lin >= 0] | ("eq", Lin) [Lin == 0] | ("not", f) | ("and", fs) | ("or", fs)
TRUE, FALSE = ("const", True), ("const", False)


def _canon(lin: Lin, kind: str):
    """Divide by the gcd of the coefficients (and make eq's sign canonical)."""
    g = 0
    for _, c in lin.terms:
        g = math.gcd(g, abs(c))
    if kind == "ge":
        return ("ge", Lin(tuple((v, c // g) for v, c in lin.terms), lin.const // g))  # floor: integer vars
    if lin.const % g:
        return FALSE
    sign = -1 if lin.terms[0][1] < 0 else 1
    return ("eq", Lin(tuple((v, sign * c // g) for v, c in lin.terms), sign * lin.const // g))


def _atom(kind: str, lin: Lin):
    if lin.is_const():
        return ("const", lin.const >= 0 if kind == "ge" else lin.const == 0)
    if kind == "ge":
        if lin.nonnegative():
            return TRUE
        if lin.scale(-1).const > 0 and all(c <= 0 and not _is_data_var(v) for v, c in lin.terms):
            return FALSE  # -lin >= 1 > 0 everywhere
    return _canon(lin, kind)


def f_not(f):
    if f[0] == "const":
        return ("const", not f[1])
    if f[0] == "not":
        return f[1]
    if f[0] == "ge":  # not (L >= 0)  <=>  -L - 1 >= 0 over the integers
        return _atom("ge", f[1].scale(-1) - Lin((), 1))
    if f[0] in ("and", "or"):  # De Morgan keeps formulas in negation normal form
        return _join("or" if f[0] == "and" else "and", [f_not(g) for g in f[1]])
    return ("not", f)


def _join(kind: str, parts):
    unit, zero = (TRUE, FALSE) if kind == "and" else (FALSE, TRUE)
    flat = []
    for p in parts:
        for q in (p[1] if p[0] == kind else (p,)):
            if q == zero:
                return zero
            if q != unit and q not in flat:
                flat.append(q)
    if any(f_not(q) in flat for q in flat):
        return zero  # x and not x / x or not x
    # and(or(a, b), not a) = and(b, not a), and dually: drop a nested disjunct (conjunct)
    # whose negation sits beside it.
    other = "or" if kind == "and" else "and"
    for n, q in enumerate(flat):
        if q[0] == other:
            kept = [g for g in q[1] if f_not(g) not in flat]
            if len(kept) != len(q[1]):
                flat[n] = _join(other, kept)
                return _join(kind, flat)
    if not flat:
        return unit
    return flat[0] if len(flat) == 1 else (kind, tuple(flat))


def f_and(*parts):
    return _join("and", parts)


def f_or(*parts):
    return _join("or", parts)


def f_subst(f, mapping: dict):
    """Substitute index variables in every constraint of ``f``."""
    if f[0] == "const":
        return f
    if f[0] in ("ge", "eq"):
        return _atom(f[0], f[1].subst(mapping))
    if f[0] == "data":
        return ("data", f[1], tuple(lin.subst(mapping) for lin in f[2]))
    if f[0] == "not":
        return f_not(f_subst(f[1], mapping))
    return _join(f[0], [f_subst(g, mapping) for g in f[1]])


# ---------------------------------------------------------------- abstract values

@dataclass(frozen=True)
class IntTensor:
    """An integer tensor whose element at index ``i`` is ``lin(i)``."""

    rank: int
    lin: Lin


@dataclass(frozen=True)
class BoolTensor:
    """A boolean tensor whose element at index ``i`` is ``formula(i)``."""

    rank: int
    formula: tuple


@dataclass(frozen=True)
class FloatTensor:
    """A float tensor of a few constants: ``pieces`` are ``(formula, value)``, the formulas
    disjoint and covering every index (an additive mask: 0 where allowed, -inf elsewhere)."""

    rank: int
    pieces: tuple

    @staticmethod
    def of(rank: int, pieces) -> "FloatTensor":
        """Merge pieces of one value and drop empty ones."""
        by_value: dict = {}
        for f, c in pieces:
            by_value[c] = f_or(by_value[c], f) if c in by_value else f
        return FloatTensor(rank, tuple((f, c) for c, f in by_value.items() if f != FALSE))


@dataclass(frozen=True)
class PiecewiseInt:
    """An integer tensor that is ``lin`` where ``formula`` holds, one piece per region:
    ``pieces`` are ``(formula, lin)``, the formulas disjoint and covering every index (a
    ``cat`` of pieces not on one line, e.g. ``torch.diff``'s ``prepend``)."""

    rank: int
    pieces: tuple


def _int_pieces(x) -> tuple:
    """The ``(formula, lin)`` pieces of an integer tensor value."""
    if isinstance(x, IntTensor):
        return ((TRUE, x.lin),)
    if isinstance(x, PiecewiseInt):
        return x.pieces
    raise NotProven("not an integer tensor")


def _make_int(rank: int, pieces):
    """An IntTensor where the non-empty pieces agree, else a PiecewiseInt."""
    live = [(f, lin) for f, lin in pieces if f != FALSE]
    if not live:
        raise NotProven("an integer tensor with no region")
    if all(lin == live[0][1] for _, lin in live):
        return IntTensor(rank, live[0][1])
    return PiecewiseInt(rank, tuple(live))


_TENSORS = (IntTensor, BoolTensor, FloatTensor, PiecewiseInt)


class NotProven(Exception):
    """The slice leaves the model: the reason, naming the op."""


# ---------------------------------------------------------------- op tables
_COMPARE = {"le": lambda a, c: _atom("ge", c - a), "lt": lambda a, c: _atom("ge", c - a - Lin((), 1)),
            "ge": lambda a, c: _atom("ge", a - c), "gt": lambda a, c: _atom("ge", a - c - Lin((), 1)),
            "eq": lambda a, c: _atom("eq", a - c), "ne": lambda a, c: f_not(_atom("eq", a - c))}
_LOGIC = {"bitwise_and": f_and, "logical_and": f_and, "bitwise_or": f_or, "logical_or": f_or,
          "mul": f_and, "__and__": f_and, "__or__": f_or}
_IDENTITY = ("torch.aten.clone", "torch.aten.contiguous", "torch.aten.alias", "torch.aten.detach",
             "torch.aten.lift_fresh_copy", "torch.aten.to.dtype", "torch.aten._to_copy", "torch.aten.to.device",
             "torch.aten.to.dtype_layout", "torch.aten.type_as", "torch.aten._assert_tensor_metadata")
_ARANGE = ("torch.aten.arange", "torch.aten.arange.start", "torch.aten.arange.start_step")
_BROADCAST = ("torch.aten.broadcast_to", "torch.aten.expand")
_INDEX = ("torch.aten.index.Tensor", "torch.aten.index.Tensor_hacked_twin")
_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")
# Tensors of one value: name (without "torch.aten.") -> the value, None: operand 1.
_FILLS = {"ones": 1, "zeros": 0, "full": None, "ones_like": 1, "zeros_like": 0, "full_like": None,
          "new_ones": 1, "new_zeros": 0}
_SELECT = ("torch.aten.where.self", "torch.aten.where.ScalarOther", "torch.aten.where.ScalarSelf",
           "torch.aten.where.Scalar", "torch.aten.masked_fill.Scalar", "torch.aten.masked_fill.Tensor")
# An additive mask entry at most this (half the dtype's lowest value, or -inf) adds a
# probability of exactly 0 after softmax, as masking does.
_MASKED_BELOW = {"f32": -1.7e38, "f64": -8.9e307, "f16": -32752.0, "bf16": -1.69e38}
_SCALAR_INT = {"torch.aten.add.int": lambda x, y: x + y, "torch.aten.sub.int": lambda x, y: x - y}


def _kind(type_) -> tuple[str, list] | None:
    """("int" | "bool" | "float", static shape) of a vtensor type."""
    shape = b.vtensor_shape(type_)
    if shape is None:
        return None
    dims, dtype = shape
    kind = "bool" if dtype == "i1" else "int" if dtype.startswith(("si", "ui")) else "float"
    return kind, dims


class _MaskInterpreter:
    """Evaluates the backward slice of a value in the abstract domain above (memoised)."""

    def __init__(self):
        self.memo: dict = {}
        self.shapes: dict = {}
        self.data: dict = {}  # "%9" -> the tensor a ("data", "%9", idx) atom / ("val", ...) variable reads
        self.opaque: dict = {}  # "%9" -> why the domain does not compute it

    def _data_source(self, v: ir.Value, why: NotProven):
        """A boolean or integer tensor the domain cannot compute (it reads input data, or an
        op not modelled): its element at ``idx`` is the atom ``("data", name, idx)``
        (boolean: a key padding mask) or the variable ``("val", name, idx)`` (integer:
        ``position_ids``, document ids). Floats stay not proven."""
        kind = _kind(v.type)
        if kind is None or kind[0] == "float":
            raise why
        name = v.get_name()
        self.data[name] = v
        self.opaque[name] = str(why)
        rank = len(kind[1])
        idx = tuple(Lin.var(d) for d in range(rank))
        x = BoolTensor(rank, ("data", name, idx)) if kind[0] == "bool" else IntTensor(rank, Lin.var(("val", name, idx)))
        return _normalise(x, v.type)

    def value(self, v: ir.Value):
        if v not in self.memo:
            try:
                self.memo[v] = self._eval(v)
            except NotProven as e:
                self.memo[v] = self._data_source(v, e)
        return self.memo[v]

    # -- helpers
    def _int(self, v: ir.Value) -> Lin:
        """A ``!torch.int`` operand as a linear expression over sizes."""
        x = self.value(v)
        if not isinstance(x, Lin):
            raise NotProven(f"operand {v.get_name()} is not an integer")
        return x

    def _const(self, v: ir.Value) -> int:
        x = self._int(v)
        if not x.is_const():
            raise NotProven(f"operand {v.get_name()} is not a constant")
        return x.const

    def _tensor(self, v: ir.Value, rank: int):
        """A tensor operand, its index variables moved right-aligned into a result of ``rank``
        (broadcasting); a Python scalar becomes a rank-0 tensor."""
        x = self.value(v)
        if isinstance(x, Lin):
            if x.data_vars():
                raise NotProven(f"operand {v.get_name()} is a data-dependent number")
            x = IntTensor(0, x)
        elif isinstance(x, bool):
            x = BoolTensor(0, TRUE if x else FALSE)
        elif isinstance(x, float):
            x = FloatTensor(0, ((TRUE, x),))
        if not isinstance(x, _TENSORS):
            raise NotProven(f"operand {v.get_name()} is not a tensor or a number")
        shift = rank - x.rank
        return _remap(x, {d: Lin.var(d + shift) for d in range(x.rank)}, rank)

    def _start(self, v: ir.Value) -> Lin:
        """A slice start: None is 0."""
        return Lin() if is_none(v) else self._int(v)

    def _list(self, v: ir.Value) -> list[ir.Value]:
        owner = v.owner
        if isinstance(owner, ir.Block) or op_name(owner) != "torch.prim.ListConstruct":
            raise NotProven(f"list {v.get_name()} is not a torch.prim.ListConstruct")
        return list(owner.operands)

    # -- the transfer functions
    def _eval(self, v: ir.Value):
        owner = v.owner
        if isinstance(owner, ir.Block):
            raise NotProven(f"reads the data of block argument {v.get_name()}")
        op = owner.operation
        name = op_name(op)
        if len(op.results) != 1:
            raise NotProven(f"'{name}' is not modelled (several results)")
        try:
            out = self._transfer(op, name, v)
        except NotProven:
            raise
        except (ValueError, KeyError, IndexError, ZeroDivisionError, AttributeError, TypeError) as e:
            # An operand of an unexpected kind (a boolean where an integer was expected...).
            raise NotProven(f"{name}: {type(e).__name__}: {e}") from None
        if out is None:
            raise NotProven(f"'{name}' is not modelled")
        if isinstance(out, _TENSORS):
            out = _normalise(out, v.type)
            self.shape(v)  # raises when a broadcast's sizes cannot be proven to match
        return out

    # -- extents
    def shape(self, v: ir.Value) -> tuple:
        """The sizes of a tensor value: a Lin over size symbols per dim (static ones from the
        type), None where unknown. Raises NotProven when the op broadcasts dims whose sizes
        are not proven equal or 1: the index formulas assume every dim is read at its own index,
        which a hidden size-1 broadcast would break."""
        if v not in self.shapes:
            self.shapes[v] = self._shape(v)
        return self.shapes[v]

    def _shape(self, v: ir.Value) -> tuple:
        kind = _kind(v.type)
        if kind is None:
            raise NotProven(f"{v.get_name()} is not a tensor")
        static = [None if d is None else Lin((), d) for d in kind[1]]  # the type's sizes win
        owner = v.owner
        if isinstance(owner, ir.Block):
            return _dim_sizes(v)
        name, ops = op_name(owner), list(owner.operands)
        derived = self._derived_shape(name, ops, len(static))
        if derived is None:
            return tuple(static)
        if len(derived) != len(static):
            raise NotProven(f"'{name}': the derived rank does not match the result type")
        return tuple(s if s is not None else d for s, d in zip(static, derived))

    def _derived_shape(self, name: str, ops, rank: int):  # noqa: C901 - one table of cases
        short = name.removeprefix("torch.aten.").split(".")[0]
        tensors = [o for o in ops if _kind(o.type) is not None]
        if name in _ARANGE:
            if name.endswith("start_step") and self._const(ops[2]) != 1:
                return None
            return (self._int(ops[1]) - self._int(ops[0]),) if name != "torch.aten.arange" else (self._int(ops[0]),)
        if short in _FILLS and not short.endswith("_like"):
            sizes = ops[1] if short.startswith("new_") else ops[0]
            return tuple(self._int(x) for x in self._list(sizes))
        if name == "torch.aten.unsqueeze":
            src = list(self.shape(ops[0]))
            d = self._const(ops[1])
            src.insert(d + rank if d < 0 else d, Lin((), 1))
            return tuple(src)
        if name == "torch.aten.squeeze.dim":
            src = list(self.shape(ops[0]))
            d = self._const(ops[1])
            del src[d + len(src) if d < 0 else d]
            return tuple(src)
        if name == "torch.aten.transpose.int":
            src = list(self.shape(ops[0]))
            a, c = (d + rank if d < 0 else d for d in (self._const(ops[1]), self._const(ops[2])))
            src[a], src[c] = src[c], src[a]
            return tuple(src)
        if name == "torch.aten.permute":
            dims = self.shape(ops[0])
            return tuple(dims[d] for d in (self._const(x) for x in self._list(ops[1])))
        if name in _VIEWS:
            pairs, _ = self._view_dims(ops)
            from_sizes = self.shape(ops[0])
            viewed = [Lin((), 1)] * rank
            for d, j in pairs:
                viewed[j] = from_sizes[d]
            return tuple(viewed)
        if name in _BROADCAST:
            dims = self.shape(ops[0])
            target = [self._int(x) for x in self._list(ops[1])]
            shift = len(target) - len(dims)
            out = []
            for d, t in enumerate(target):
                old = dims[d - shift] if d >= shift else None
                size = old if t == Lin((), -1) else t
                if d >= shift and old != Lin((), 1) and (old is None or old != size):
                    raise NotProven(f"{name}: cannot prove dim {d} keeps its size (a hidden broadcast)")
                out.append(size)
            return tuple(out)
        if name == "torch.aten.slice.Tensor":
            src = list(self.shape(ops[0]))
            d = self._const(ops[1])
            d = d + rank if d < 0 else d
            start, size = self._start(ops[2]), src[d]
            end = self.value(ops[3])
            if self._const(ops[4]) != 1 or size is None or not isinstance(end, Lin):
                src[d] = None
            elif (end - size).nonnegative() or (end.is_const() and end.const >= 2**62):  # clamped to the size
                src[d] = size - start
            elif (size - end).nonnegative():
                src[d] = end - start
            else:
                src[d] = None
            return tuple(src)
        if name == "torch.aten.cat":
            parts = [self.shape(t) for t in self._list(ops[0])]
            d = self._const(ops[1])
            d = d + rank if d < 0 else d
            out = list(parts[0])
            total: Lin | None = Lin()
            for p in parts:
                total = None if total is None or p[d] is None else total + p[d]
            out[d] = total
            return tuple(out)
        if name in _INDEX:
            dims = self.shape(ops[0])
            idx = self._list(ops[1])
            return _broadcast([self.shape(i) for i in idx], name) + tuple(dims[len(idx):])
        if name in _IDENTITY or short in ("cumsum", "tril", "triu") or short.endswith("_like"):
            return self.shape(ops[0])
        if tensors:  # elementwise: the operands broadcast together
            return _broadcast([self.shape(t) for t in tensors], name)
        return None

    def _transfer(self, op, name: str, v: ir.Value):  # noqa: C901 - one table of cases
        ops = list(op.operands)
        kind = _kind(v.type)
        rank = len(kind[1]) if kind else 0
        short = name.removeprefix("torch.aten.").split(".")[0]

        # scalars
        if name == "torch.constant.int":
            return Lin((), ir.IntegerAttr(op.attributes["value"]).value)
        if name == "torch.constant.bool":
            return ir.BoolAttr(op.attributes["value"]).value
        if name == "torch.constant.float":
            return ir.FloatAttr(op.attributes["value"]).value
        if name in ("torch.constant.none", "torch.constant.device"):
            return ("opaque", name)  # arguments of modelled ops (dtype, device...), never a mask value
        if name == "torch.aten.size.int":
            arg, dim = ops[0], self._const(ops[1])
            shape = b.vtensor_shape(arg.type)
            if shape is None:
                raise NotProven("size.int of a non-tensor")
            dims = shape[0]
            dim = dim + len(dims) if dim < 0 else dim
            static_size = dims[dim]
            if static_size is not None:
                return Lin((), static_size)
            return _dim_sizes(arg)[dim]  # the size only: the tensor's data is never read
        if name in _SCALAR_INT:
            return _SCALAR_INT[name](self._int(ops[0]), self._int(ops[1]))
        if name == "torch.aten.mul.int":
            x, y = self._int(ops[0]), self._int(ops[1])
            if not (x.is_const() or y.is_const()):
                raise NotProven("mul.int of two sizes is not linear")
            return x.scale(y.const) if y.is_const() else y.scale(x.const)
        if name == "torch.aten.neg.int":
            return self._int(ops[0]).scale(-1)
        if kind is None:
            return None

        # tensors from nothing
        if name == "torch.vtensor.literal":
            attr = op.attributes["value"]
            if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
                raise NotProven("a non-splat literal tensor (data, not a formula)")
            text = str(attr.get_splat_value())
            if kind[0] == "bool":
                return BoolTensor(rank, TRUE if text.startswith("true") else FALSE)
            if kind[0] == "int":
                return IntTensor(rank, Lin((), int(text.split(":")[0].strip())))
            return FloatTensor(rank, ((TRUE, ir.FloatAttr(attr.get_splat_value()).value),))
        if name in _ARANGE:
            if kind[0] != "int":
                raise NotProven("arange of a non-integer dtype")
            start, step = Lin(), Lin((), 1)
            if name.endswith("start_step"):
                start, step = self._int(ops[0]), Lin((), self._const(ops[2]))
            elif name.endswith("start"):
                start = self._int(ops[0])
            return IntTensor(1, start + Lin.var(0).scale(step.const))
        if short in _FILLS:
            default = _FILLS[short]
            fill = self.value(ops[1]) if default is None else Lin((), default)
            if isinstance(fill, Lin) and fill.is_const():
                fill = fill.const
            if isinstance(fill, bool) or not isinstance(fill, (int, float)):
                fill = int(fill) if isinstance(fill, bool) else None
            if fill is None:
                raise NotProven(f"{name}: the fill value is not a constant")
            if kind[0] == "bool":
                return BoolTensor(rank, TRUE if fill else FALSE)
            if kind[0] == "float":
                return FloatTensor(rank, ((TRUE, float(fill)),))
            return IntTensor(rank, Lin((), fill)) if isinstance(fill, int) else None

        # shape ops
        if name in _IDENTITY:
            x = self.value(ops[0])
            if isinstance(x, PiecewiseInt) and kind[0] == "int":
                return x
            if isinstance(x, IntTensor) and kind[0] == "bool":
                if x.lin.data_vars():  # e.g. attention_mask.bool(): the cast is the boolean data (key padding)
                    source = x.lin.data_vars()[0][1]
                    raise NotProven(f"reads the data of {'block argument ' if source.startswith('%arg') else ''}"
                                    f"{source} (through {name})")
                return BoolTensor(x.rank, f_not(_atom("eq", x.lin)))
            if isinstance(x, BoolTensor) and kind[0] == "int":
                if x.formula[0] != "const":
                    raise NotProven(f"{name}: a boolean formula cast to integers")
                return IntTensor(x.rank, Lin((), int(x.formula[1])))
            if isinstance(x, BoolTensor) and kind[0] == "float":
                return FloatTensor.of(x.rank, ((x.formula, 1.0), (f_not(x.formula), 0.0)))
            if isinstance(x, IntTensor) and kind[0] == "float" and x.lin.is_const():
                return FloatTensor(x.rank, ((TRUE, float(x.lin.const)),))
            if isinstance(x, {"int": IntTensor, "bool": BoolTensor, "float": FloatTensor}[kind[0]]):
                return x
            return None
        if name == "torch.aten.unsqueeze":
            d = self._const(ops[1])
            d = d + rank if d < 0 else d
            x = self.value(ops[0])
            return _remap(x, {j: Lin.var(j + (j >= d)) for j in range(x.rank)}, rank)
        if name == "torch.aten.squeeze.dim":
            x = self.value(ops[0])
            d = self._const(ops[1])
            d = d + x.rank if d < 0 else d
            src_kind = _kind(ops[0].type)
            if src_kind is None:
                raise NotProven(f"squeeze.dim of {ops[0].get_name()}, which is not a tensor")
            if src_kind[1][d] != 1:  # squeeze of another dim is a no-op: not modelled
                raise NotProven("squeeze.dim of a dim that is not of static size 1")
            return _remap(x, {j: Lin.var(j - (j > d)) for j in range(x.rank) if j != d}, rank)
        if name == "torch.aten.transpose.int":
            x = self.value(ops[0])
            a, c = (d + x.rank if d < 0 else d for d in (self._const(ops[1]), self._const(ops[2])))
            perm = {j: Lin.var(j) for j in range(x.rank)}
            perm[a], perm[c] = Lin.var(c), Lin.var(a)
            return _remap(x, perm, rank)
        if name in _VIEWS:
            x = self.value(ops[0])
            pairs, ones = self._view_dims(ops)
            return _remap(x, {d: Lin.var(j) for d, j in pairs} | {d: Lin() for d in ones}, rank)
        if name == "torch.aten.permute":
            x = self.value(ops[0])
            order = [self._const(d) for d in self._list(ops[1])]
            order = [d + x.rank if d < 0 else d for d in order]
            return _remap(x, {src: Lin.var(dst) for dst, src in enumerate(order)}, rank)
        if name in _BROADCAST:
            return self._tensor(ops[0], rank)
        if name == "torch.aten.slice.Tensor":
            x = self.value(ops[0])
            d = self._const(ops[1])
            d = d + x.rank if d < 0 else d
            start, stride = self._start(ops[2]), self._const(ops[4])
            if not start.nonnegative() or stride < 1:
                raise NotProven("slice with a start counted from the end, or a step < 1")
            return _remap(x, {j: Lin.var(j) for j in range(x.rank)} | {d: Lin.var(d).scale(stride) + start}, rank)
        if name == "torch.aten.cat":
            return self._cat([self.value(t) for t in self._list(ops[0])],
                             [b.vtensor_shape(t.type) for t in self._list(ops[0])], self._const(ops[1]), rank)
        if name in _INDEX:
            return self._index(ops, rank)

        # arithmetic and logic
        if short in ("add", "sub") and name.endswith((".Tensor", ".Scalar")) and kind[0] == "int":
            x, y = self._tensor(ops[0], rank), self._tensor(ops[1], rank)
            alpha = self._const(ops[2]) * (1 if short == "add" else -1)
            return _make_int(rank, [(f_and(f, g), a + c.scale(alpha))
                                    for f, a in _int_pieces(x) for g, c in _int_pieces(y)])
        if short == "mul" and kind[0] == "int":
            x, y = self._tensor(ops[0], rank), self._tensor(ops[1], rank)
            if not (x.lin.is_const() or y.lin.is_const()):
                raise NotProven("product of two index-dependent tensors is not linear")
            return IntTensor(rank, x.lin.scale(y.lin.const) if y.lin.is_const() else y.lin.scale(x.lin.const))
        if short == "neg" and kind[0] == "int":
            return IntTensor(rank, self._tensor(ops[0], rank).lin.scale(-1))
        if short in _COMPARE and kind[0] == "bool" and any(isinstance(self._tensor(o, rank), FloatTensor)
                                                            for o in ops[:2]):
            fx, fy = (_float_pieces(self._tensor(o, rank)) for o in ops[:2])
            return BoolTensor(rank, f_or(*[f_and(f, g, _fcompare(short, a, c))
                                           for f, a in fx.pieces for g, c in fy.pieces]))
        if short in _COMPARE and kind[0] == "bool":
            x, y = self._tensor(ops[0], rank), self._tensor(ops[1], rank)
            if not (isinstance(x, (IntTensor, PiecewiseInt)) and isinstance(y, (IntTensor, PiecewiseInt))):
                raise NotProven(f"{name}: comparison of non-integer values")
            return BoolTensor(rank, f_or(*[f_and(f, g, _COMPARE[short](a, c))
                                           for f, a in _int_pieces(x) for g, c in _int_pieces(y)]))
        if short in _LOGIC and kind[0] == "bool" and len(ops) == 2:
            x, y = self._tensor(ops[0], rank), self._tensor(ops[1], rank)
            if not (isinstance(x, BoolTensor) and isinstance(y, BoolTensor)):
                raise NotProven(f"{name}: logic on non-boolean values")
            return BoolTensor(rank, _LOGIC[short](x.formula, y.formula))
        if short in ("bitwise_not", "logical_not") and kind[0] == "bool":
            x = self._tensor(ops[0], rank)
            if not isinstance(x, BoolTensor):
                raise NotProven(f"{name} of a non-boolean value")
            return BoolTensor(rank, f_not(x.formula))
        if short in ("tril", "triu"):
            x = self._tensor(ops[0], rank)
            if isinstance(x, IntTensor) or rank < 2:
                raise NotProven(f"{name} of an integer tensor")
            diag = Lin((), self._const(ops[1]))
            row, col = Lin.var(rank - 2), Lin.var(rank - 1)
            keep = _atom("ge", row - col + diag) if short == "tril" else _atom("ge", col - row - diag)
            if isinstance(x, BoolTensor):
                return BoolTensor(rank, f_and(x.formula, keep))
            return FloatTensor.of(rank, [(f_and(f, keep), c) for f, c in x.pieces] + [(f_not(keep), 0.0)])
        if kind[0] == "float" and name in _SELECT:
            return self._select(name, ops, rank)
        if kind[0] == "float" and short in ("add", "sub") and name.endswith((".Tensor", ".Scalar")):
            fx, fy = (_float_pieces(self._tensor(o, rank)) for o in ops[:2])
            alpha = self._const(ops[2]) * (1 if short == "add" else -1)
            return FloatTensor.of(rank, [(f_and(f, g), _fadd(a, _fmul(float(alpha), c)))
                                         for f, a in fx.pieces for g, c in fy.pieces])
        if kind[0] == "float" and short == "mul" and name.endswith((".Tensor", ".Scalar")):
            fx, fy = (_float_pieces(self._tensor(o, rank)) for o in ops[:2])
            return FloatTensor.of(rank, [(f_and(f, g), _fmul(a, c)) for f, a in fx.pieces for g, c in fy.pieces])
        if name == "torch.aten.slice_scatter":
            return self._slice_scatter(v, ops, rank)
        if name == "torch.aten.cumsum":
            x = self.value(ops[0])
            d = self._const(ops[1])
            d = d + x.rank if d < 0 else d
            c = (x.lin if isinstance(x, IntTensor) else
                 Lin((), int(x.formula[1])) if isinstance(x, BoolTensor) and x.formula[0] == "const" else None)
            if c is None or not c.is_const():
                raise NotProven("cumsum of a value that is not constant")
            return IntTensor(x.rank, (Lin.var(d) + Lin((), 1)).scale(c.const))
        return None

    def _select(self, name: str, ops, rank: int):
        """``where(cond, a, b)`` and ``masked_fill(x, cond, value)`` on float constants."""
        if name.startswith("torch.aten.masked_fill"):
            cond, a, other = self._tensor(ops[1], rank), self._tensor(ops[2], rank), self._tensor(ops[0], rank)
        else:
            cond, a, other = (self._tensor(o, rank) for o in ops[:3])
        yes, no = (_as_float(t) for t in (a, other))
        if not isinstance(cond, BoolTensor) or yes is None or no is None:
            raise NotProven(f"{name}: not a boolean condition choosing between float constants")
        return FloatTensor.of(rank, [(f_and(cond.formula, f), c) for f, c in yes.pieces]
                              + [(f_and(f_not(cond.formula), f), c) for f, c in no.pieces])

    def _view_dims(self, ops) -> tuple[list, list]:
        """A view/reshape that only inserts or removes dims of size 1: ``(pairs, ones)``,
        each kept source dim d with its result dim j, and the source's size-1 dims."""
        src = self.shape(ops[0])
        sizes = [self._int(x) for x in self._list(ops[1])]
        kept = [d for d, n in enumerate(src) if n != Lin((), 1)]
        targets = [j for j, n in enumerate(sizes) if n != Lin((), 1)]
        if len(kept) != len(targets) or sum(sizes[j] == Lin((), -1) for j in targets) > 1:
            raise NotProven("a view that does more than insert or remove dims of size 1")
        for d, j in zip(kept, targets):
            if sizes[j] != Lin((), -1) and sizes[j] != src[d]:
                raise NotProven("a view that does more than insert or remove dims of size 1")
        return list(zip(kept, targets)), [d for d in range(len(src)) if d not in kept]

    def _slice_scatter(self, v: ir.Value, ops, rank: int):
        """``base`` with ``src`` written into ``base[..., start:end, ...]`` (step 1): src
        (shifted by ``start``) inside the region, base outside."""
        base, src = self._tensor(ops[0], rank), self.value(ops[1])
        d = self._const(ops[2])
        d = d + rank if d < 0 else d
        if self._const(ops[5]) != 1:
            raise NotProven("slice_scatter with a step")
        start = self._start(ops[3])
        size = self.shape(v)[d]
        end = None if is_none(ops[4]) else self.value(ops[4])
        i = Lin.var(d)
        lower = _atom("ge", i - start)
        upper = TRUE if end is None or (isinstance(end, Lin) and (end == size or (
            end.is_const() and end.const >= 2 ** 62))) else _atom("ge", self._int(ops[4]) - Lin((), 1) - i)
        region = f_and(lower, upper)
        moved = _remap(src, {j: Lin.var(j) for j in range(rank)} | {d: i - start}, rank)
        if isinstance(base, FloatTensor) or isinstance(moved, FloatTensor):
            b_f, s_f = _float_pieces(base), _float_pieces(moved)
            return FloatTensor.of(rank, [(f_and(region, f), c) for f, c in s_f.pieces]
                                  + [(f_and(f_not(region), f), c) for f, c in b_f.pieces])
        if isinstance(base, BoolTensor) and isinstance(moved, BoolTensor):
            return BoolTensor(rank, f_or(f_and(region, moved.formula), f_and(f_not(region), base.formula)))
        return _make_int(rank, [(f_and(region, f), lin) for f, lin in _int_pieces(moved)]
                         + [(f_and(f_not(region), f), lin) for f, lin in _int_pieces(base)])

    def _cat(self, parts, shapes, dim: int, rank: int):
        """Concatenation, when the pieces lie on one line along ``dim`` (a piece of length 1
        that is the line's value at its position joins it)."""
        if not parts or not all(isinstance(p, IntTensor) for p in parts):
            raise NotProven("cat of values that are not integer tensors (or of piecewise ones)")
        dim = dim + rank if dim < 0 else dim
        pieces, offset = [], 0
        for i, (p, shape) in enumerate(zip(parts, shapes)):
            # In the cat's coordinates piece i covers [offset, offset + size): its own index is i_dim - offset.
            pieces.append((offset, p.lin.subst({dim: Lin.var(dim) - Lin((), offset)}), shape[0][dim]))
            if i + 1 < len(parts):
                if shape[0][dim] is None:
                    raise NotProven("cat after a piece of dynamic length")
                offset += shape[0][dim]
        line = None
        for _lo, lin, size in pieces:  # choose the line from a piece longer than 1
            if size != 1:
                if line is not None and lin != line:
                    line = None
                    break
                line = lin
        line = line if line is not None else pieces[0][1]
        if all(lin == line or (size == 1 and lin.subst({dim: Lin((), lo)}) == line.subst({dim: Lin((), lo)}))
               for lo, lin, size in pieces):
            return IntTensor(rank, line)
        # Not one line: piece p holds on lo_p <= i_dim < lo_p + size_p (the last one up to the end).
        index = Lin.var(dim)
        regions = []
        for n, (lo, lin, size) in enumerate(pieces):
            upper = TRUE if n == len(pieces) - 1 else _atom("ge", Lin((), lo + size - 1) - index)
            regions.append((f_and(_atom("ge", index - Lin((), lo)), upper), lin))
        return _make_int(rank, regions)

    def _index(self, ops, rank: int):
        """``src[idx_0, ..., idx_{m-1}]`` with tensor indices (advanced indexing). A ``src``
        the domain cannot compute is data (:meth:`value`): its elements become atoms."""
        src = self.value(ops[0])
        if not isinstance(src, (IntTensor, BoolTensor)):
            raise NotProven("index of an unknown tensor")
        idx_values = self._list(ops[1])
        m = len(idx_values)
        bdims = rank - (src.rank - m)  # the broadcast indices' rank comes first in the result
        mapping = {}
        for t, iv in enumerate(idx_values):
            x = self.value(iv)
            if not isinstance(x, IntTensor):
                raise NotProven("index by a None or non-integer index")
            lin = x.lin.subst({d: Lin.var(d + bdims - x.rank) for d in range(x.rank)})
            if not lin.nonnegative():
                raise NotProven("an index that may be negative (it would wrap around)")
            mapping[t] = lin
        for j in range(m, src.rank):
            mapping[j] = Lin.var(bdims + j - m)
        return _remap(src, mapping, rank)


def _dim_sizes(v: ir.Value) -> tuple:
    """The sizes of a value's dims as Lins over size symbols: static ones from its type,
    dynamic ones from its ``torch.bind_symbolic_shape`` (symbols named by their
    ``torch.symbolic_int``), else a symbol of its own per dim (``arg3.d1``)."""
    shape = b.vtensor_shape(v.type)
    if shape is None:
        raise NotProven(f"{v.get_name()} is not a tensor")
    dims = shape[0]
    bound = None
    for use in v.uses:
        user = use.owner
        if op_name(user) == "torch.bind_symbolic_shape" and use.operand_number == 0:
            bound = _bound_sizes(user)
            break
    out = []
    for d, n in enumerate(dims):
        if n is not None:
            out.append(Lin((), n))
        elif bound is not None and bound[d] is not None:
            out.append(bound[d])
        else:  # a size of its own, equal to no other (get_name prints: only when needed)
            where = f"arg{ir.BlockArgument(v).arg_number}" if isinstance(v.owner, ir.Block) else v.get_name()
            out.append(Lin.var(f"{where}.d{d}"))
    return tuple(out)


def _bound_sizes(bind) -> list:
    """The dims of a ``torch.bind_symbolic_shape`` as Lins (None where not linear)."""
    names = []
    for sym in list(bind.operands)[1:]:
        owner = sym.owner
        names.append(ir.StringAttr(owner.attributes["symbol_name"]).value
                     if not isinstance(owner, ir.Block) and op_name(owner) == "torch.symbolic_int" else None)
    out = []
    for expr in ir.AffineMapAttr(bind.attributes["shape_expressions"]).value.results:
        out.append(_affine_to_lin(str(expr), names))
    return out


def _affine_to_lin(text: str, names: list) -> Lin | None:
    """``"s0 * 2 + 1"`` -> Lin over the symbol names; None for anything else (floordiv...)."""
    total = Lin()
    for term in text.replace(" - ", " + -").split(" + "):
        sign, term = (-1, term[1:]) if term.startswith("-") else (1, term)
        factors = [f.strip() for f in term.split("*")]
        coeff, sym = sign, None
        for f in factors:
            if f.isdigit():
                coeff *= int(f)
            elif f.startswith("s") and f[1:].isdigit() and sym is None and int(f[1:]) < len(names) \
                    and names[int(f[1:])] is not None:
                sym = names[int(f[1:])]
            else:
                return None
        total = total + (Lin.var(sym).scale(coeff) if sym is not None else Lin((), coeff))
    return total


def _broadcast(shapes, name: str) -> tuple:
    """Right-aligned broadcast of ``shapes``; raises unless every dim pair is provably equal or 1."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        size = Lin((), 1)
        for s in shapes:
            x = s[d - rank + len(s)] if d - rank + len(s) >= 0 else Lin((), 1)
            if x == Lin((), 1):
                continue
            if size != Lin((), 1) and (x is None or x != size):
                raise NotProven(f"{name}: cannot prove the broadcast sizes of dim {d} match")
            size = x
        out.append(size)
    return tuple(out)


def _as_float(x) -> FloatTensor | None:
    if isinstance(x, FloatTensor):
        return x
    if isinstance(x, IntTensor) and x.lin.is_const():
        return FloatTensor(x.rank, ((TRUE, float(x.lin.const)),))
    return None


# A float piece's value is a float constant, or a Lin: an integer-valued expression (an
# integer tensor, e.g. attention_mask, promoted to float by arithmetic). Float arithmetic
# rounds, so a Lin is only kept where rounding cannot change the answer:
# - |c| >= _HUGE absorbs any int64 added to it in f32, bf16 and f64 (half an ulp of 1e38 is
#   2^73 in f64, 2^102 in f32, above 2^63), and orders before or after any of them;
# - a Lin plus an integer constant below _EXACT, then compared == or != with such a constant:
#   fl(x + c) == 0 exactly when x + c == 0, and an integer converts to a float equal to k
#   (|k| < 2^24) only when it is k. Ordered comparisons and sums of two Lins are not modelled.
_HUGE = 1e38
_EXACT = 2 ** 24


def _float_pieces(x) -> FloatTensor:
    """An int, bool or float tensor value as float pieces (for float arithmetic)."""
    if isinstance(x, FloatTensor):
        return x
    if isinstance(x, IntTensor):
        return FloatTensor(x.rank, ((TRUE, float(x.lin.const) if x.lin.is_const() else x.lin),))
    if isinstance(x, PiecewiseInt):
        return FloatTensor.of(x.rank, [(f, float(lin.const) if lin.is_const() else lin) for f, lin in x.pieces])
    if isinstance(x, BoolTensor):
        return FloatTensor.of(x.rank, ((x.formula, 1.0), (f_not(x.formula), 0.0)))
    raise NotProven("float arithmetic on a value that is not a tensor")


def _as_lin(c) -> Lin:
    if isinstance(c, Lin):
        return c
    if float(c).is_integer() and abs(c) < _EXACT:
        return Lin((), int(c))
    raise NotProven(f"{c} in float arithmetic with integer data (rounding)")


def _fadd(a, c):
    """The sum of two piece values (absorbed by a masking constant, or a Lin plus a small
    integer constant; see _HUGE)."""
    if not isinstance(a, Lin) and not isinstance(c, Lin):
        return a + c
    for huge, other in ((a, c), (c, a)):
        if not isinstance(huge, Lin) and abs(huge) >= _HUGE and isinstance(other, Lin):
            return huge
    if isinstance(a, Lin) and isinstance(c, Lin):
        raise NotProven("a float sum of two data values (rounding)")
    return _as_lin(a) + _as_lin(c)


def _fmul(a, c):
    if not isinstance(a, Lin) and not isinstance(c, Lin):
        if (a == 0.0 and math.isinf(c)) or (c == 0.0 and math.isinf(a)):
            raise NotProven("0 * inf in a mask")
        product = a * c
        return 0.0 if product == 0.0 else product  # -0.0 is 0 for a mask
    for k, other in ((a, c), (c, a)):
        if not isinstance(k, Lin) and k in (0.0, 1.0):
            return 0.0 if k == 0.0 else other
    raise NotProven("a product of data in a mask")


def _fcompare(op: str, a, c):
    """A comparison of two piece values as a formula."""
    if not isinstance(a, Lin) and not isinstance(c, Lin):
        return TRUE if {"le": a <= c, "lt": a < c, "ge": a >= c, "gt": a > c, "eq": a == c, "ne": a != c}[op] else FALSE
    for huge, flip in ((a, False), (c, True)):
        if not isinstance(huge, Lin) and abs(huge) >= _HUGE:  # int64 data never reaches it
            below = huge < 0  # huge < every int
            less = below != flip  # is a < c ?
            return TRUE if {"le": less, "lt": less, "ge": not less, "gt": not less, "eq": False,
                            "ne": True}[op] else FALSE
    if op not in ("eq", "ne"):
        raise NotProven(f"an ordered float comparison of data ({op}: rounding)")
    return _COMPARE[op](_as_lin(a), _as_lin(c))


def _remap(x, mapping: dict, rank: int):
    """``x`` with its index variables replaced (``mapping``), as a tensor of ``rank``."""
    if isinstance(x, IntTensor):
        return IntTensor(rank, x.lin.subst(mapping))
    if isinstance(x, PiecewiseInt):
        return _make_int(rank, [(f_subst(f, mapping), lin.subst(mapping)) for f, lin in x.pieces])
    if isinstance(x, BoolTensor):
        return BoolTensor(rank, f_subst(x.formula, mapping))
    if isinstance(x, FloatTensor):
        return FloatTensor.of(rank, [(f_subst(f, mapping), c) for f, c in x.pieces])
    raise NotProven("a shape op on a value that is not a tensor")


def _normalise(x, type_):
    """Index 0 on every dim of static size 1 (broadcasting never reads another)."""
    kind = _kind(type_)
    if kind is None:
        return x
    ones = {d: Lin() for d, n in enumerate(kind[1]) if n == 1}
    return _remap(x, ones, x.rank) if ones else x


# ---------------------------------------------------------------- the proof

@dataclass(frozen=True)
class MaskProof:
    """The verdict on one SDPA mask: ``causal`` when its formula is exactly ``k <= q``;
    ``window`` = W when it is exactly ``q - W < k <= q`` (a causal sliding window);
    ``reason`` says why neither (the op that left the model, or the formula found)."""

    causal: bool
    reason: str
    window: int | None = None
    # (a [B, S] ir.Value, nonzero): key j of batch b is visible iff it is true (nonzero: != 0)
    key_padding: tuple | None = None
    documents: object = None  # a [B, S] integer ir.Value: query i sees key j only if doc[b, i] == doc[b, j]
    # "uniform": the mask is additive with a finite masking constant, so a query row whose
    # keys are all padded gets the same score everywhere: softmax is uniform over every key
    # (eager attention's answer), not the zeros a boolean mask gives.
    empty_rows: EmptyRows | None = None


def _window_of(allowed, q: int, k: int) -> int | None:
    """W when ``allowed`` is exactly ``and(q - k >= 0, k - q + W - 1 >= 0)`` with W >= 1."""
    if allowed[0] != "and" or len(allowed[1]) != 2:
        return None
    causal = ("ge", Lin.of({q: 1, k: -1}))
    if causal not in allowed[1]:
        return None
    other = next(f for f in allowed[1] if f != causal)
    if other[0] != "ge" or other[1].coeffs() != {q: -1, k: 1} or other[1].const < 0:
        return None
    return other[1].const + 1


def prove_causal(sdpa) -> MaskProof:
    """Decide from the IR whether the mask of ``sdpa`` (a scaled_dot_product_attention op)
    is exactly ``k <= q`` over the query and key positions.

    Example (transformers' MistralForCausalLM, sliding_window=8)::

        >>> prove_causal(sdpa)
        MaskProof(causal=False, reason='formula is not k <= q: and(- i2 + i3 + 7 >= 0, i2 - i3 >= 0)')
    """
    mask, query, key = sdpa.operands[3], sdpa.operands[0], sdpa.operands[1]
    interpreter = _MaskInterpreter()
    try:
        value = interpreter.value(mask)
        if not isinstance(value, (BoolTensor, FloatTensor)) or value.rank < 2:
            return MaskProof(False, "not a boolean or float mask of rank >= 2")
        # SDPA broadcasts the mask: a mask dim of runtime size 1 would repeat row (or
        # column) 0, so the mask must provably span the query and key lengths.
        mask_q, mask_k = interpreter.shape(mask)[-2:]
        if mask_q != _dim_sizes(query)[-2] or mask_k != _dim_sizes(key)[-2]:
            return MaskProof(False, "cannot prove the mask spans the query and key lengths")
    except NotProven as e:
        return MaskProof(False, str(e))
    except RecursionError:
        return MaskProof(False, "mask computation too deep")
    q, k = value.rank - 2, value.rank - 1
    causal = ("ge", Lin.of({q: 1, k: -1}))
    finite: bool | None = False
    if isinstance(value, BoolTensor):
        allowed = value.formula
    else:  # additive: 0 where allowed, a value that underflows softmax to 0 elsewhere
        mask_type = b.vtensor_shape(mask.type)
        assert mask_type is not None  # interpreter.shape(mask) above proved it a vtensor
        low = _MASKED_BELOW.get(mask_type[1])
        bad = [c for _, c in value.pieces if isinstance(c, Lin) or (c != 0.0 and (low is None or not c <= low))]
        if bad:
            return MaskProof(False, f"additive mask with values other than 0 and a masking constant: {bad}")
        allowed = f_or(*[f for f, c in value.pieces if c == 0.0])
        masked = {c for _, c in value.pieces if c != 0.0}
        finite = len(masked) == 1 and math.isfinite(next(iter(masked)))
        if finite and abs(next(iter(masked))) < 1e30:
            finite = None  # score + c need not round to c (fp16): an empty row is not uniform
    if allowed == causal:
        return MaskProof(True, "k <= q")
    # Key padding: a conjunct pad[b, k] with pad a [B, S] boolean tensor read at the mask's
    # batch index and key index (transformers' padding_mask_function).
    padding = None
    if allowed[0] == "and" and value.rank == 4:
        def batch_1(name: str) -> bool:  # both the mask and pad have one row: pad[0, k] is pad[b, k]
            return (_kind(interpreter.data[name].type) or ("", [None]))[1][0] == 1 == (_kind(mask.type) or ("", [None]))[1][0]
        def element(f):  # (name, idx, nonzero) of pad[b, k] or of int_pad[b, k] != 0
            if f[0] == "data":
                return f[1], f[2], False
            if f[0] == "not" and f[1][0] == "eq" and f[1][1].const == 0 and f[1][1].terms and \
                    len(f[1][1].terms) == 1 and _is_data_var(f[1][1].terms[0][0]):
                var = f[1][1].terms[0][0]
                return var[1], var[2], True
            return None
        key_pad = [(f, el) for f in allowed[1] if (el := element(f)) is not None and len(el[1]) == 2
                   and el[1][1] == Lin.var(k) and (el[1][0] == Lin.var(0) or (el[1][0] == Lin((), 0) and batch_1(el[0])))
                   and len((_kind(interpreter.data[el[0]].type) or ("", []))[1]) == 2]
        if len(key_pad) == 1:
            (conjunct, (name, _, nonzero)), = key_pad
            padding = (interpreter.data[name], nonzero)
            rest = [f for f in allowed[1] if f != conjunct]
            allowed = rest[0] if len(rest) == 1 else ("and", tuple(rest))
    # Documents: a conjunct doc[b, q] == doc[b, k] with doc a [B, S] integer tensor; the rest
    # may compare positions within a document (transformers' packed sequences).
    documents = None
    if allowed[0] == "and" and value.rank == 4:
        def batch_1_int(name: str) -> bool:
            return (_kind(interpreter.data[name].type) or ("", [None]))[1][0] == 1 == (_kind(mask.type) or ("", [None]))[1][0]
        found = [(f, d) for f in allowed[1] if (d := _document_ids(f, q, k, interpreter, batch_1_int)) is not None]
        if len(found) == 1:
            conjunct, (name, batch) = found[0]
            rest = [f for f in allowed[1] if f != conjunct]
            rest_f = rest[0] if len(rest) == 1 else ("and", tuple(rest))
            if _formula_data(rest_f):
                rest_f = _positions_within_documents(rest_f, name, batch, q, k, interpreter)
            if rest_f is not None:
                documents, allowed = interpreter.data[name], rest_f
    structure = "k <= q" if allowed == causal else None
    window = _window_of(allowed, q, k)
    if window is not None:
        structure = f"q - {window} < k <= q"
    if structure is not None and padding is not None and documents is not None:
        return MaskProof(False, f"{structure} with documents and key padding together (not supported)")
    if structure is not None and documents is not None:
        return MaskProof(False, f"{structure} within documents {documents.get_name()}[b, q] == "
                         f"{documents.get_name()}[b, k]", window=window, documents=documents)
    if structure is not None and padding is not None:
        # Causal, windows and documents always allow the diagonal; key padding may leave a row
        # empty (left padding), where an additive mask's answer differs from a boolean one.
        if finite is None:
            return MaskProof(False, f"{structure} and key padding with an additive mask whose masking constant "
                                    "is too small for an all-padded row's softmax to be uniform")
        empty = EmptyRows.UNIFORM if isinstance(value, FloatTensor) and finite else None
        return MaskProof(False, f"{structure} and key padding {padding[0].get_name()}[b, k]"
                         f"{' != 0' if padding[1] else ''}", window=window, key_padding=padding, empty_rows=empty)
    if window is not None:
        return MaskProof(False, f"q - {window} < k <= q", window=window)
    reason = f"formula is not k <= q: {format_formula(allowed)}"
    read = [f"{n}: {interpreter.opaque[n]}" for n in _formula_data(allowed) if n in interpreter.opaque]
    return MaskProof(False, reason + (f"; data read: {'; '.join(read)}" if read else ""))


def _formula_data(f) -> list[str]:
    """Names of the data tensors a formula reads (in order, once each)."""
    out: list[str] = []
    def walk(g):
        if g[0] == "data":
            names = [g[1]] + [v[1] for lin in g[2] for v in lin.data_vars()]
        elif g[0] in ("ge", "eq"):
            names = [v[1] for v in g[1].data_vars()] + [w[1] for v in g[1].data_vars() for lin in v[2]
                                                          for w in lin.data_vars()]
        elif g[0] == "not":
            return walk(g[1])
        elif g[0] in ("and", "or"):
            for h in g[1]:
                walk(h)
            return
        else:
            return
        out.extend(n for n in names if n not in out)
    walk(f)
    return out


def _document_ids(f, q: int, k: int, interpreter, batch_1) -> tuple[str, Lin] | None:
    """(doc, b) when ``f`` is exactly ``doc[b, q] == doc[b, k]`` for an integer [B, S] data
    tensor ``doc``, ``b`` the mask's batch index (or 0 where both have one row)."""
    if f[0] != "eq" or f[1].const != 0 or len(f[1].terms) != 2:
        return None
    (u, cu), (w, cw) = f[1].terms
    if not (_is_data_var(u) and _is_data_var(w)) or u[1] != w[1] or cu + cw != 0 or abs(cu) != 1:
        return None
    name = u[1]
    if len(u[2]) != 2 or u[2][0] != w[2][0] or {u[2][1], w[2][1]} != {Lin.var(q), Lin.var(k)}:
        return None
    batch = u[2][0]
    if batch != Lin.var(0) and not (batch == Lin() and batch_1(name)):
        return None
    return name, batch


def _restrict(f, var: int, lo: int):
    """``f`` simplified under ``i_var >= lo``: atoms over ``i_var`` alone decided."""
    if f[0] in ("ge", "eq"):
        lin = f[1]
        if set(lin.coeffs()) == {var}:
            a, c = lin.coeffs()[var], lin.const
            at_lo = a * lo + c
            if f[0] == "ge" and a > 0 and at_lo >= 0:
                return TRUE
            if f[0] == "ge" and a < 0 and at_lo < 0:
                return FALSE
            if f[0] == "eq" and (at_lo > 0 if a > 0 else at_lo < 0):
                return FALSE
        return f
    if f[0] == "not":
        return f_not(_restrict(f[1], var, lo))
    if f[0] in ("and", "or"):
        return _join(f[0], [_restrict(g, var, lo) for g in f[1]])
    return f


def _positions_within_documents(rest, doc: str, batch: Lin, q: int, k: int, interpreter):
    """``rest`` with ``pos[x, q] - pos[x, k]`` replaced by ``q - k``, when ``doc`` provably
    numbers the runs of consecutive positions of ``pos``: ``doc = cumsum(c, dim=1)`` with
    ``c[b, i]`` exactly ``pos[x, i] - pos[x, i - 1] != 1`` for every ``i >= 1``
    (transformers' ``find_packed_sequence_indices``). Then ``doc[b, q] == doc[b, k]`` means
    every step between k and q is +1, so ``pos[x, q] - pos[x, k] == q - k``. None when that
    cannot be proven or other data remains."""
    owner = interpreter.data[doc].owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.aten.cumsum":
        return None
    source = owner.operands[0]
    try:
        dim = interpreter._const(owner.operands[1])
        step = interpreter.value(source)
    except NotProven:
        return None
    if dim not in (1, -1) or not isinstance(step, BoolTensor) or step.rank != 2:
        return None
    step_f = f_subst(_restrict(step.formula, 1, 1), {0: batch})
    i = Lin.var(1)
    for var in (v for lin_ in _lins(step_f) for v in lin_.data_vars()):
        if len(var[2]) != 2 or var[2][1] != i:
            continue
        pos, x = var[1], var[2][0]
        at = lambda j, pos=pos, x=x: Lin.var(("val", pos, (x, j)))  # noqa: E731
        if step_f != f_not(_atom("eq", at(i) - at(i - Lin((), 1)) - Lin((), 1))):
            continue
        pq, pk = ("val", pos, (x, Lin.var(q))), ("val", pos, (x, Lin.var(k)))

        def within(lin: Lin, pq=pq, pk=pk):
            co = lin.coeffs()
            c = co.get(pq, 0)
            if co.get(pk, 0) != -c:
                return None
            rest_terms = {v: a for v, a in co.items() if v not in (pq, pk)}
            if any(_is_data_var(v) for v in rest_terms):
                return None
            return Lin.of(rest_terms, lin.const) + (Lin.var(q) - Lin.var(k)).scale(c)
        out = _map_lins(rest, within)
        if out is not None and not _formula_data(out):
            return out
    return None


def _lins(f) -> list:
    if f[0] in ("ge", "eq"):
        return [f[1]]
    if f[0] == "not":
        return _lins(f[1])
    if f[0] in ("and", "or"):
        return [lin for g in f[1] for lin in _lins(g)]
    return []


def _map_lins(f, fn):
    """``f`` with each constraint's Lin replaced by ``fn(lin)`` (None: give up)."""
    if f[0] in ("ge", "eq"):
        lin = fn(f[1])
        return None if lin is None else _atom(f[0], lin)
    if f[0] == "not":
        g = _map_lins(f[1], fn)
        return None if g is None else f_not(g)
    if f[0] in ("and", "or"):
        parts = [_map_lins(g, fn) for g in f[1]]
        return None if any(p is None for p in parts) else _join(f[0], parts)
    return None if f[0] == "data" else f


def _format_lin(lin: Lin) -> str:
    return format_formula(("eq", lin))[:-5] or "0"


def _format_var(v) -> str:
    if _is_data_var(v):
        return f"{v[1]}[{', '.join(_format_lin(lin) for lin in v[2])}]"
    return f"i{v}" if isinstance(v, int) else str(v)


def format_formula(f) -> str:
    """A readable form of a formula (``i2 - i3 >= 0``), for diagnostics."""
    if f[0] == "const":
        return "true" if f[1] else "false"
    if f[0] in ("ge", "eq"):
        lin = f[1]
        text = " ".join(f"{'+' if c > 0 else '-'} {'' if abs(c) == 1 else abs(c)}{_format_var(v)}"
                        for v, c in lin.terms).lstrip("+ ")
        if lin.const:
            text += f" {'+' if lin.const > 0 else '-'} {abs(lin.const)}"
        return f"{text} {'>=' if f[0] == 'ge' else '=='} 0"
    if f[0] == "data":
        return f"{f[1]}[{', '.join(_format_lin(lin) for lin in f[2])}]"
    if f[0] == "not":
        return f"not({format_formula(f[1])})"
    return f"{f[0]}({', '.join(format_formula(g) for g in f[1])})"


def fold_causal_masks(module) -> int:
    """Replace SDPA masks proven to be exactly ``k <= q`` by ``is_causal``, and those proven
    to be exactly a causal sliding window ``q - W < k <= q`` by ``is_causal`` plus
    ``autosp.window = W`` (the backend runs windowed attention without an S x S mask;
    only without dropout); return how many.

    Masks not proven stay, marked ``autosp.mask_kept = "<reason>"`` (they cost O(S^2)
    memory; :func:`autosp.api.warn_kept_masks` tells the user at compile time).
    """
    func = main_func(module)
    folded = 0
    for op in [o for o in body_ops(func) if op_name(o) == SDPA_OP]:
        mask = op.operands[3]
        if is_none(mask) or const_bool(op.operands[5]) is not False:
            continue
        proof = prove_causal(op)
        structured = proof.window is not None or proof.key_padding is not None or proof.documents is not None
        if structured and const_float(op.operands[4]) != 0.0:
            proof, structured = MaskProof(False, f"{proof.reason}, with dropout"), False
        if not proof.causal and not structured:
            _log.info("SDPA mask %s kept (an S x S mask per layer, saved for backward): %s",
                      mask.get_name(), proof.reason)
            op.attributes[KEPT_MASK_ATTR] = ir.StringAttr.get(proof.reason)  # the compile warns with its cost
            continue
        with ir.InsertionPoint(op), op.location:
            none = b.constant_none()
            true = ir.Operation.create("torch.constant.bool", results=[ir.Type.parse("!torch.bool")],
                                       attributes={"value": ir.BoolAttr.get(True)}).result
        if proof.documents is not None:
            op.operands[3] = _key_mask(op, proof.documents)
        elif proof.key_padding is not None:
            padding, nonzero = proof.key_padding
            op.operands[3] = _key_mask(op, padding, nonzero)
        else:
            op.operands[3] = none
        op.operands[5] = true
        if proof.key_padding is not None:
            op.attributes[KEY_PADDING_ATTR] = ir.UnitAttr.get()
        if proof.key_padding is None:  # causal, windows and documents always allow the diagonal
            if EMPTY_ROWS_ATTR in op.attributes:
                del op.attributes[EMPTY_ROWS_ATTR]
        elif proof.empty_rows is not None and EMPTY_ROWS_ATTR not in op.attributes:  # (fused masked_fill: kept)
            op.attributes[EMPTY_ROWS_ATTR] = ir.StringAttr.get(proof.empty_rows.value)
        if proof.documents is not None:
            op.attributes[DOCUMENTS_ATTR] = ir.UnitAttr.get()
        if proof.window is not None:
            op.attributes[WINDOW_ATTR] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), proof.window)
        folded += 1
    return folded


def _key_mask(op, padding: ir.Value, nonzero: bool = False) -> ir.Value:
    """``padding`` ([B, S] boolean key padding, or integer document ids) as [B, 1, 1, S],
    built just before ``op`` (``nonzero``: an integer padding mask, compared != 0 first)."""
    shape = b.vtensor_shape(padding.type)
    assert shape is not None  # the proof read it as a boolean vtensor
    dims, dtype = shape
    x = padding
    with ir.InsertionPoint(op), op.location:
        if nonzero:
            x = ir.Operation.create("torch.aten.ne.Scalar", results=[b.vtensor_type(dims, "i1")],
                                    operands=[x, b.constant_int(0)]).result
            dtype = "i1"
        for d in (1, 2):
            dims = dims[:d] + [1] + dims[d:]
            x = ir.Operation.create("torch.aten.unsqueeze", results=[b.vtensor_type(dims, dtype)],
                                    operands=[x, b.constant_int(d)]).result
    return x


@dataclass(frozen=True)
class CausalMask(ModulePass):
    """Replace an SDPA mask proven from the IR to be exactly k <= q by is_causal, and one
    proven to be exactly q - W < k <= q by is_causal + ``autosp.window = W``.

    The mask's computation is read as a formula over query and key positions (module
    docstring: what is modelled); an offset, padding, input data, or a window with dropout
    keeps the mask. The dead mask computation is left to ``autosp-dce``.

    Input::

        %s = torch.aten.size.int %q, %int2 : !torch.vtensor<[1,2,?,8],f32>, !torch.int -> !torch.int
        %pos = torch.aten.arange.start_step %int0, %s, %int1, ... -> !torch.vtensor<[?],si64>
        %rows = torch.aten.unsqueeze %pos, %int1 : ... -> !torch.vtensor<[?,1],si64>
        %cols = torch.aten.unsqueeze %pos, %int0 : ... -> !torch.vtensor<[1,?],si64>
        %m = torch.aten.le.Tensor %cols, %rows : ... -> !torch.vtensor<[?,?],i1>
        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %m, %float0, %false, %none, %false

    Output::

        %none_0 = torch.constant.none
        %true = torch.constant.bool true
        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %none_0, %float0, %true, %none, %false
    """

    name: ClassVar[str] = "autosp-causal-mask"

    def apply(self, module) -> None:
        fold_causal_masks(module)
