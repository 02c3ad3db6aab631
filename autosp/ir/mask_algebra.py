"""The algebra of mask proofs: linear integer expressions, formulas, and tensor values.

``autosp-causal-mask`` reads an attention mask's computation as a predicate over the
mask's indices (:mod:`autosp.ir.mask_interp` interprets the ops). This module is what
that predicate is made of; it reads no IR.

- :class:`Lin`: ``const + sum(coeff * var)`` with integer coefficients. A variable is an
  index (an int ``d``: the index along dim ``d`` of the tensor the expression belongs
  to), a size symbol (a str: a ``torch.symbolic_int`` name, or ``"arg3.d1"``), both
  non-negative, or a :class:`DataVar`: an element of an integer tensor whose data the
  domain does not compute (``position_ids``, document ids), of any sign.
- Formulas: :class:`Const`, :class:`Ge` (``lin >= 0``), :class:`Eq` (``lin == 0``),
  :class:`Data` (an element of a boolean data tensor: ``pad[b, k]``), :class:`Not`,
  :class:`And`, :class:`Or`. Build them with :func:`ge`, :func:`eq`, :func:`f_not`,
  :func:`f_and`, :func:`f_or`: they simplify as they go (constants folded, gcd divided
  out, negation pushed to the atoms, ``x and not x`` is false), so equal predicates
  mostly meet as equal formulas.
- Tensor values: :class:`IntTensor` (element ``i`` is ``lin(i)``), :class:`PiecewiseInt`,
  :class:`BoolTensor` (element ``i`` is ``formula(i)``), :class:`FloatTensor` (a few
  constants, each on a formula: an additive mask), and the float arithmetic of their
  pieces (:func:`fadd`, :func:`fmul`, :func:`fcompare`), which refuses what rounding
  could change.

Example::

    >>> q, k = Lin.var(2), Lin.var(3)                # the query and key index of a [B, H, S, S] mask
    >>> causal = ge(q - k)
    >>> format_formula(f_and(causal, f_not(ge(q - k - Lin((), 8)))))
    'and(i2 - i3 >= 0, - i2 + i3 + 7 >= 0)'
    >>> f_and(causal, f_not(causal))
    Const(value=False)
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


class NotProven(Exception):
    """The slice leaves the model: the reason, naming the op."""


# ---------------------------------------------------------------- linear expressions

@dataclass(frozen=True)
class DataVar:
    """The element at ``idx`` (one Lin per dim) of the integer tensor ``name`` whose data
    the domain does not compute (of any sign)."""

    name: str
    idx: tuple


Var = int | str | DataVar


@dataclass(frozen=True)
class Lin:
    """``const + sum(coeff * var)`` with integer coefficients."""

    terms: tuple = ()  # sorted ((var, coeff), ...), no zero coeff
    const: int = 0

    @staticmethod
    def of(terms: dict, const: int = 0) -> Lin:
        """The Lin of ``{var: coeff}`` (zero coefficients dropped) plus ``const``."""
        return Lin(tuple(sorted(((v, c) for v, c in terms.items() if c), key=_var_key)), const)

    @staticmethod
    def var(v: Var) -> Lin:
        """The variable ``v`` alone."""
        return Lin(((v, 1),), 0)

    def coeffs(self) -> dict:
        """``{var: coeff}``."""
        return dict(self.terms)

    def __add__(self, other: Lin) -> Lin:
        t = self.coeffs()
        for v, c in other.terms:
            t[v] = t.get(v, 0) + c
        return Lin.of(t, self.const + other.const)

    def scale(self, k: int) -> Lin:
        """``k * self``."""
        return Lin.of({v: c * k for v, c in self.terms}, self.const * k)

    def __sub__(self, other: Lin) -> Lin:
        return self + other.scale(-1)

    def is_const(self) -> bool:
        """No variables."""
        return not self.terms

    def subst(self, mapping: dict) -> Lin:
        """Replace index variables: ``mapping[d]`` is a Lin (absent: kept); also inside the
        indices of data elements."""
        out = Lin((), self.const)
        for v, c in self.terms:
            if isinstance(v, DataVar):
                v = DataVar(v.name, tuple(lin.subst(mapping) for lin in v.idx))
            out = out + (mapping[v] if v in mapping else Lin.var(v)).scale(c)
        return out

    def nonnegative(self) -> bool:
        """Provably >= 0 for every value of the variables (indices and sizes are >= 0;
        data elements may have any sign)."""
        return self.const >= 0 and all(c >= 0 and not isinstance(v, DataVar) for v, c in self.terms)

    def data_vars(self) -> list[DataVar]:
        """The data elements it reads."""
        return [v for v, _ in self.terms if isinstance(v, DataVar)]


def _var_key(item):
    v = item[0]
    if isinstance(v, DataVar):
        return (2, 0, f"{v.name}{v.idx}")
    return (0, v, "") if isinstance(v, int) else (1, 0, v)


# ---------------------------------------------------------------- formulas

@dataclass(frozen=True)
class Const:
    """true or false."""

    value: bool


@dataclass(frozen=True)
class Ge:
    """``lin >= 0``."""

    lin: Lin


@dataclass(frozen=True)
class Eq:
    """``lin == 0``."""

    lin: Lin


@dataclass(frozen=True)
class Data:
    """The element at ``idx`` (one Lin per dim) of the boolean tensor ``name`` whose data
    the domain does not compute (a key padding mask)."""

    name: str
    idx: tuple


@dataclass(frozen=True)
class Not:
    """``not arg`` (only of an :class:`Eq` or a :class:`Data`: the rest is pushed inside)."""

    arg: Formula


@dataclass(frozen=True)
class And:
    """Every one of ``args`` (two or more)."""

    args: tuple
    word = "and"


@dataclass(frozen=True)
class Or:
    """Any one of ``args`` (two or more)."""

    args: tuple
    word = "or"


Formula = Const | Ge | Eq | Data | Not | And | Or
TRUE, FALSE = Const(True), Const(False)


def _canon(lin: Lin, kind: type) -> Formula:
    """Divide by the gcd of the coefficients (and make eq's sign canonical)."""
    g = 0
    for _, c in lin.terms:
        g = math.gcd(g, abs(c))
    if kind is Ge:
        return Ge(Lin(tuple((v, c // g) for v, c in lin.terms), lin.const // g))  # floor: integer vars
    if lin.const % g:
        return FALSE
    sign = -1 if lin.terms[0][1] < 0 else 1
    return Eq(Lin(tuple((v, sign * c // g) for v, c in lin.terms), sign * lin.const // g))


def _atom(kind: type, lin: Lin) -> Formula:
    if lin.is_const():
        return Const(lin.const >= 0 if kind is Ge else lin.const == 0)
    if kind is Ge:
        if lin.nonnegative():
            return TRUE
        if lin.scale(-1).const > 0 and all(c <= 0 and not isinstance(v, DataVar) for v, c in lin.terms):
            return FALSE  # -lin >= 1 > 0 everywhere
    return _canon(lin, kind)


def ge(lin: Lin) -> Formula:
    """``lin >= 0``, simplified (decided where the signs of indices and sizes decide it)."""
    return _atom(Ge, lin)


def eq(lin: Lin) -> Formula:
    """``lin == 0``, simplified."""
    return _atom(Eq, lin)


def f_not(f: Formula) -> Formula:
    """``not f``, in negation normal form."""
    if isinstance(f, Const):
        return Const(not f.value)
    if isinstance(f, Not):
        return f.arg
    if isinstance(f, Ge):  # not (L >= 0)  <=>  -L - 1 >= 0 over the integers
        return ge(f.lin.scale(-1) - Lin((), 1))
    if isinstance(f, (And, Or)):  # De Morgan keeps formulas in negation normal form
        return join(Or if isinstance(f, And) else And, [f_not(g) for g in f.args])
    return Not(f)


def join(kind: type[And] | type[Or], parts) -> Formula:
    """``And`` (``kind``) or ``Or`` of ``parts``, flattened and simplified."""
    unit, zero = (TRUE, FALSE) if kind is And else (FALSE, TRUE)
    flat: list = []
    for p in parts:
        for q in (p.args if isinstance(p, kind) else (p,)):
            if q == zero:
                return zero
            if q != unit and q not in flat:
                flat.append(q)
    if any(f_not(q) in flat for q in flat):
        return zero  # x and not x / x or not x
    # and(or(a, b), not a) = and(b, not a), and dually: drop a nested disjunct (conjunct)
    # whose negation sits beside it.
    other = Or if kind is And else And
    for n, q in enumerate(flat):
        if isinstance(q, other):
            kept = [g for g in q.args if f_not(g) not in flat]
            if len(kept) != len(q.args):
                flat[n] = join(other, kept)
                return join(kind, flat)
    if not flat:
        return unit
    return flat[0] if len(flat) == 1 else kind(tuple(flat))


def f_and(*parts: Formula) -> Formula:
    """The conjunction of ``parts``."""
    return join(And, parts)


def f_or(*parts: Formula) -> Formula:
    """The disjunction of ``parts``."""
    return join(Or, parts)


def f_subst(f: Formula, mapping: dict) -> Formula:
    """Substitute index variables in every constraint of ``f``."""
    if isinstance(f, Const):
        return f
    if isinstance(f, (Ge, Eq)):
        return _atom(type(f), f.lin.subst(mapping))
    if isinstance(f, Data):
        return Data(f.name, tuple(lin.subst(mapping) for lin in f.idx))
    if isinstance(f, Not):
        return f_not(f_subst(f.arg, mapping))
    return join(type(f), [f_subst(g, mapping) for g in f.args])


def restrict(f: Formula, var: int, lo: int) -> Formula:
    """``f`` simplified under ``i_var >= lo``: atoms over ``i_var`` alone decided."""
    if isinstance(f, (Ge, Eq)):
        lin = f.lin
        if set(lin.coeffs()) == {var}:
            a, c = lin.coeffs()[var], lin.const
            at_lo = a * lo + c
            if isinstance(f, Ge) and a > 0 and at_lo >= 0:
                return TRUE
            if isinstance(f, Ge) and a < 0 and at_lo < 0:
                return FALSE
            if isinstance(f, Eq) and (at_lo > 0 if a > 0 else at_lo < 0):
                return FALSE
        return f
    if isinstance(f, Not):
        return f_not(restrict(f.arg, var, lo))
    if isinstance(f, (And, Or)):
        return join(type(f), [restrict(g, var, lo) for g in f.args])
    return f


def lins(f: Formula) -> list[Lin]:
    """The Lins of every constraint of ``f``."""
    if isinstance(f, (Ge, Eq)):
        return [f.lin]
    if isinstance(f, Not):
        return lins(f.arg)
    if isinstance(f, (And, Or)):
        return [lin for g in f.args for lin in lins(g)]
    return []


def map_lins(f: Formula, fn: Callable[[Lin], Lin | None]) -> Formula | None:
    """``f`` with each constraint's Lin replaced by ``fn(lin)`` (None: give up)."""
    if isinstance(f, (Ge, Eq)):
        lin = fn(f.lin)
        return None if lin is None else _atom(type(f), lin)
    if isinstance(f, Not):
        g = map_lins(f.arg, fn)
        return None if g is None else f_not(g)
    if isinstance(f, (And, Or)):
        parts = [map_lins(g, fn) for g in f.args]
        return None if any(p is None for p in parts) else join(type(f), parts)
    return None if isinstance(f, Data) else f


def formula_data(f: Formula) -> list[str]:
    """Names of the data tensors a formula reads (in order, once each)."""
    out: list[str] = []

    def walk(g):
        if isinstance(g, Data):
            names = [g.name] + [v.name for lin in g.idx for v in lin.data_vars()]
        elif isinstance(g, (Ge, Eq)):
            names = [v.name for v in g.lin.data_vars()] + [w.name for v in g.lin.data_vars() for lin in v.idx
                                                           for w in lin.data_vars()]
        elif isinstance(g, Not):
            return walk(g.arg)
        elif isinstance(g, (And, Or)):
            for h in g.args:
                walk(h)
            return
        else:
            return
        out.extend(n for n in names if n not in out)
    walk(f)
    return out


def index_vars(lin: Lin) -> list[int]:
    """The index variables ``lin`` reads, also inside data elements' indices (sorted)."""
    found: set[int] = set()
    for v, _ in lin.terms:
        if isinstance(v, DataVar):
            for inner in v.idx:
                found.update(index_vars(inner))
        elif isinstance(v, int):
            found.add(v)
    return sorted(found)


def floor_div_name(lin: Lin, divisor: int) -> tuple[str, tuple[int, ...]]:
    """The name of the derived tensor ``t[j0, j1, ...] = floor(lin / divisor)`` over the
    index variables ``lin`` reads (``used``, in order, renamed ``j0, j1, ...``), and
    ``used``: equal names are the same function, wherever (and however broadcast) they
    were computed. ``floor(i3 / 4)`` and ``floor(i2 / 4)`` are both ``floordiv(i0, 4)``."""
    used = tuple(index_vars(lin))
    canonical = lin.subst({d: Lin.var(j) for j, d in enumerate(used)})
    return f"floordiv({format_lin(canonical)}, {divisor})", used


def format_lin(lin: Lin) -> str:
    """A readable form of a Lin (``i2 - i3 + 7``)."""
    return format_formula(Eq(lin))[:-5] or "0"


def _format_var(v: Var) -> str:
    if isinstance(v, DataVar):
        return f"{v.name}[{', '.join(format_lin(lin) for lin in v.idx)}]"
    return f"i{v}" if isinstance(v, int) else str(v)


def format_formula(f: Formula) -> str:
    """A readable form of a formula (``i2 - i3 >= 0``), for diagnostics."""
    if isinstance(f, Const):
        return "true" if f.value else "false"
    if isinstance(f, (Ge, Eq)):
        lin = f.lin
        text = " ".join(f"{'+' if c > 0 else '-'} {'' if abs(c) == 1 else abs(c)}{_format_var(v)}"
                        for v, c in lin.terms).lstrip("+ ")
        if lin.const:
            text += f" {'+' if lin.const > 0 else '-'} {abs(lin.const)}"
        return f"{text} {'>=' if isinstance(f, Ge) else '=='} 0"
    if isinstance(f, Data):
        return f"{f.name}[{', '.join(format_lin(lin) for lin in f.idx)}]"
    if isinstance(f, Not):
        return f"not({format_formula(f.arg)})"
    return f"{f.word}({', '.join(format_formula(g) for g in f.args)})"


# ---------------------------------------------------------------- tensor values

@dataclass(frozen=True)
class IntTensor:
    """An integer tensor whose element at index ``i`` is ``lin(i)``."""

    rank: int
    lin: Lin


@dataclass(frozen=True)
class BoolTensor:
    """A boolean tensor whose element at index ``i`` is ``formula(i)``."""

    rank: int
    formula: Formula


@dataclass(frozen=True)
class FloatTensor:
    """A float tensor of a few constants: ``pieces`` are ``(formula, value)``, the formulas
    disjoint and covering every index (an additive mask: 0 where allowed, -inf elsewhere).
    A value is a float, or a Lin: an integer-valued expression (see :func:`fadd`)."""

    rank: int
    pieces: tuple

    @staticmethod
    def of(rank: int, pieces) -> FloatTensor:
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


@dataclass(frozen=True)
class Opaque:
    """A value that is an argument of modelled ops (a dtype, a device, None), never a mask."""

    name: str


TENSORS = (IntTensor, BoolTensor, FloatTensor, PiecewiseInt)


def int_pieces(x) -> tuple:
    """The ``(formula, lin)`` pieces of an integer tensor value."""
    if isinstance(x, IntTensor):
        return ((TRUE, x.lin),)
    if isinstance(x, PiecewiseInt):
        return x.pieces
    raise NotProven("not an integer tensor")


def make_int(rank: int, pieces):
    """An IntTensor where the non-empty pieces agree, else a PiecewiseInt."""
    live = [(f, lin) for f, lin in pieces if f != FALSE]
    if not live:
        raise NotProven("an integer tensor with no region")
    if all(lin == live[0][1] for _, lin in live):
        return IntTensor(rank, live[0][1])
    return PiecewiseInt(rank, tuple(live))


def remap(x, mapping: dict, rank: int):
    """``x`` with its index variables replaced (``mapping``), as a tensor of ``rank``."""
    if isinstance(x, IntTensor):
        return IntTensor(rank, x.lin.subst(mapping))
    if isinstance(x, PiecewiseInt):
        return make_int(rank, [(f_subst(f, mapping), lin.subst(mapping)) for f, lin in x.pieces])
    if isinstance(x, BoolTensor):
        return BoolTensor(rank, f_subst(x.formula, mapping))
    if isinstance(x, FloatTensor):
        return FloatTensor.of(rank, [(f_subst(f, mapping), c) for f, c in x.pieces])
    raise NotProven("a shape op on a value that is not a tensor")


# ---------------------------------------------------------------- comparisons and float pieces
# Integer comparisons (aten's short names) as formulas of their two Lins.
COMPARE = {"le": lambda a, c: ge(c - a), "lt": lambda a, c: ge(c - a - Lin((), 1)),
           "ge": lambda a, c: ge(a - c), "gt": lambda a, c: ge(a - c - Lin((), 1)),
           "eq": lambda a, c: eq(a - c), "ne": lambda a, c: f_not(eq(a - c))}

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


def as_float(x) -> FloatTensor | None:
    """``x`` as a FloatTensor of constants (an integer constant converted), else None."""
    if isinstance(x, FloatTensor):
        return x
    if isinstance(x, IntTensor) and x.lin.is_const():
        return FloatTensor(x.rank, ((TRUE, float(x.lin.const)),))
    return None


def float_pieces(x) -> FloatTensor:
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


def fadd(a, c):
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


def fmul(a, c):
    """The product of two piece values (of constants, or a Lin by 0 or 1)."""
    if not isinstance(a, Lin) and not isinstance(c, Lin):
        if (a == 0.0 and math.isinf(c)) or (c == 0.0 and math.isinf(a)):
            raise NotProven("0 * inf in a mask")
        product = a * c
        return 0.0 if product == 0.0 else product  # -0.0 is 0 for a mask
    for k, other in ((a, c), (c, a)):
        if not isinstance(k, Lin) and k in (0.0, 1.0):
            return 0.0 if k == 0.0 else other
    raise NotProven("a product of data in a mask")


def fcompare(op: str, a, c) -> Formula:
    """A comparison (``op``: a key of :data:`COMPARE`) of two piece values as a formula."""
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
    return COMPARE[op](_as_lin(a), _as_lin(c))
