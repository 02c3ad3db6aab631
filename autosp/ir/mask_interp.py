"""The mask interpreter: a value's backward slice evaluated in the mask algebra.

:class:`MaskInterpreter` reads the ops that compute a value (an SDPA mask) as a value of
:mod:`autosp.ir.mask_algebra`: an integer scalar is a Lin over sizes (``size.int`` of an
input is a symbol, never the input's data); an integer tensor is a Lin over its own
indices (``arange``, arithmetic by constants, broadcasts, ``unsqueeze``, ``slice``,
``cat`` when the pieces join into one line, advanced indexing by such tensors,
``cumsum`` of a constant), or piecewise; a boolean tensor is a formula (comparisons,
and/or/not, ``tril``/``triu``); a float tensor is a few constants on formulas
(``where``, ``masked_fill``, ``full``, ``triu`` of ``full(-inf)``: an additive mask).

Each op class has its handler, chosen from a table by the op's name, else by its aten
name without the overload (``add`` of ``torch.aten.add.Tensor``); an op no handler
models raises :class:`~autosp.ir.mask_algebra.NotProven` naming it. A boolean or integer
tensor that cannot be computed (an input's data, an op not modelled) becomes data: its
elements are atoms ``pad[b, k]`` / variables ``pos[b, q]`` of unknown value. Sizes are
tracked beside the values (:meth:`MaskInterpreter.shape`): a broadcast of two dims not
proven equal (one might be 1 at run time and repeat index 0) is not proven either.

Example::

    >>> interp = MaskInterpreter()
    >>> format_formula(interp.value(mask).formula)   # mask = arange(S)[None, :] <= arange(S)[:, None]
    'i0 - i1 >= 0'
    >>> interp.shape(mask)
    (Lin(terms=(('s0', 1),), const=0), Lin(terms=(('s0', 1),), const=0))
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import is_none, op_name
from autosp.ir.mask_algebra import (
    COMPARE,
    FALSE,
    TENSORS,
    TRUE,
    BoolTensor,
    Const,
    Data,
    DataVar,
    FloatTensor,
    Formula,
    IntTensor,
    Lin,
    NotProven,
    Opaque,
    PiecewiseInt,
    as_float,
    eq,
    f_and,
    f_not,
    f_or,
    fadd,
    fcompare,
    float_pieces,
    floor_div_name,
    fmul,
    ge,
    int_pieces,
    make_int,
    remap,
)
from autosp.ir.sizes import dim_sizes

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
_SCALAR_INT = {"torch.aten.add.int": lambda x, y: x + y, "torch.aten.sub.int": lambda x, y: x - y}
_ARITH_OVERLOADS = (".Tensor", ".Scalar")


def tensor_kind(type_) -> tuple[str, list] | None:
    """``("int" | "bool" | "float", static shape)`` of a vtensor type; None for others."""
    shape = b.vtensor_shape(type_)
    if shape is None:
        return None
    dims, dtype = shape
    kind = "bool" if dtype == "i1" else "int" if dtype.startswith(("si", "ui")) else "float"
    return kind, dims


@dataclass(frozen=True)
class _At:
    """The op a handler interprets: its operands, and its result's kind and rank."""

    op: ir.Operation
    name: str
    short: str  # the aten name without its overload: "add" of torch.aten.add.Tensor
    ops: list
    kind: str | None  # "int" | "bool" | "float" for a tensor result, None for a scalar
    rank: int
    result: ir.Value


class MaskInterpreter:
    """Evaluates the backward slice of a value in the mask algebra (memoised)."""

    def __init__(self):
        self.memo: dict = {}
        self.shapes: dict = {}
        self.data: dict = {}  # "%9" -> the tensor a Data / DataVar of that name reads
        self.opaque: dict = {}  # "%9" -> why the domain does not compute it
        self.derived: dict = {}  # a floor_div_name -> (a value computing it, the dims its formula uses)

    def value(self, v: ir.Value):
        """The abstract value of ``v``: a Lin, bool or float for a scalar, a tensor value of
        :mod:`autosp.ir.mask_algebra` for a tensor. Raises NotProven where it has none."""
        if v not in self.memo:
            try:
                self.memo[v] = self._eval(v)
            except NotProven as e:
                self.memo[v] = self._data_source(v, e)
        return self.memo[v]

    def constant(self, v: ir.Value) -> int:
        """A ``!torch.int`` operand that is a constant."""
        x = self._int(v)
        if not x.is_const():
            raise NotProven(f"operand {v.get_name()} is not a constant")
        return x.const

    def shape(self, v: ir.Value) -> tuple:
        """The sizes of a tensor value: a Lin over size symbols per dim (static ones from the
        type), None where unknown. Raises NotProven when the op broadcasts dims whose sizes
        are not proven equal or 1: the index formulas assume every dim is read at its own index,
        which a hidden size-1 broadcast would break."""
        if v not in self.shapes:
            self.shapes[v] = self._shape(v)
        return self.shapes[v]

    def _data_source(self, v: ir.Value, why: NotProven):
        """A boolean or integer tensor the domain cannot compute (it reads input data, or an
        op not modelled): its element at ``idx`` is the atom ``Data(name, idx)`` (boolean: a
        key padding mask) or the variable ``DataVar(name, idx)`` (integer: ``position_ids``,
        document ids). Floats stay not proven."""
        kind = tensor_kind(v.type)
        if kind is None or kind[0] == "float":
            raise why
        name = v.get_name()
        self.data[name] = v
        self.opaque[name] = str(why)
        rank = len(kind[1])
        idx = tuple(Lin.var(d) for d in range(rank))
        x = BoolTensor(rank, Data(name, idx)) if kind[0] == "bool" else IntTensor(rank, Lin.var(DataVar(name, idx)))
        return _normalise(x, v.type)

    # -- operands
    def _int(self, v: ir.Value) -> Lin:
        """A ``!torch.int`` operand as a linear expression over sizes."""
        x = self.value(v)
        if not isinstance(x, Lin):
            raise NotProven(f"operand {v.get_name()} is not an integer")
        return x

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
        if not isinstance(x, TENSORS):
            raise NotProven(f"operand {v.get_name()} is not a tensor or a number")
        shift = rank - x.rank
        return remap(x, {d: Lin.var(d + shift) for d in range(x.rank)}, rank)

    def _start(self, v: ir.Value) -> Lin:
        """A slice start: None is 0."""
        return Lin() if is_none(v) else self._int(v)

    def _list(self, v: ir.Value) -> list[ir.Value]:
        owner = v.owner
        if isinstance(owner, ir.Block) or op_name(owner) != "torch.prim.ListConstruct":
            raise NotProven(f"list {v.get_name()} is not a torch.prim.ListConstruct")
        return list(owner.operands)

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
        if isinstance(out, TENSORS):
            out = _normalise(out, v.type)
            self.shape(v)  # raises when a broadcast's sizes cannot be proven to match
        return out

    def _transfer(self, op, name: str, v: ir.Value):
        """The value of ``op``'s result ``v`` from its handler (None: not modelled)."""
        kind = tensor_kind(v.type)
        at = _At(op, name, name.removeprefix("torch.aten.").split(".")[0], list(op.operands),
                 kind[0] if kind else None, len(kind[1]) if kind else 0, v)
        handler = _SCALAR_HANDLERS.get(name)
        if handler is None and kind is not None:
            handler = _TENSOR_HANDLERS.get(name) or _SHORT_HANDLERS.get(at.short)
        return None if handler is None else handler(self, at)

    # -- extents
    def _shape(self, v: ir.Value) -> tuple:
        kind = tensor_kind(v.type)
        if kind is None:
            raise NotProven(f"{v.get_name()} is not a tensor")
        static = [None if d is None else Lin((), d) for d in kind[1]]  # the type's sizes win
        owner = v.owner
        if isinstance(owner, ir.Block):
            return dim_sizes(v)
        name, ops = op_name(owner), list(owner.operands)
        derived = self._derived_shape(name, ops, len(static))
        if derived is None:
            return tuple(static)
        if len(derived) != len(static):
            raise NotProven(f"'{name}': the derived rank does not match the result type")
        return tuple(s if s is not None else d for s, d in zip(static, derived))

    def _derived_shape(self, name: str, ops, rank: int):  # noqa: C901 - one table of cases
        short = name.removeprefix("torch.aten.").split(".")[0]
        tensors = [o for o in ops if tensor_kind(o.type) is not None]
        if name in _ARANGE:
            if name.endswith("start_step") and self.constant(ops[2]) != 1:
                return None
            return (self._int(ops[1]) - self._int(ops[0]),) if name != "torch.aten.arange" else (self._int(ops[0]),)
        if short in _FILLS and not short.endswith("_like"):
            sizes = ops[1] if short.startswith("new_") else ops[0]
            return tuple(self._int(x) for x in self._list(sizes))
        if name == "torch.aten.unsqueeze":
            src = list(self.shape(ops[0]))
            d = self.constant(ops[1])
            src.insert(d + rank if d < 0 else d, Lin((), 1))
            return tuple(src)
        if name == "torch.aten.squeeze.dim":
            src = list(self.shape(ops[0]))
            d = self.constant(ops[1])
            del src[d + len(src) if d < 0 else d]
            return tuple(src)
        if name == "torch.aten.transpose.int":
            src = list(self.shape(ops[0]))
            a, c = (d + rank if d < 0 else d for d in (self.constant(ops[1]), self.constant(ops[2])))
            src[a], src[c] = src[c], src[a]
            return tuple(src)
        if name == "torch.aten.permute":
            dims = self.shape(ops[0])
            return tuple(dims[d] for d in (self.constant(x) for x in self._list(ops[1])))
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
            d = self.constant(ops[1])
            d = d + rank if d < 0 else d
            start, size = self._start(ops[2]), src[d]
            end = self.value(ops[3])
            if self.constant(ops[4]) != 1 or size is None or not isinstance(end, Lin):
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
            d = self.constant(ops[1])
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

    # -- transfer functions: scalars
    def _constant(self, at: _At):
        if at.name == "torch.constant.int":
            return Lin((), ir.IntegerAttr(at.op.attributes["value"]).value)
        if at.name == "torch.constant.bool":
            return ir.BoolAttr(at.op.attributes["value"]).value
        if at.name == "torch.constant.float":
            return ir.FloatAttr(at.op.attributes["value"]).value
        return Opaque(at.name)  # arguments of modelled ops (dtype, device...), never a mask value

    def _size(self, at: _At):
        arg, dim = at.ops[0], self.constant(at.ops[1])
        shape = b.vtensor_shape(arg.type)
        if shape is None:
            raise NotProven("size.int of a non-tensor")
        dims = shape[0]
        dim = dim + len(dims) if dim < 0 else dim
        static_size = dims[dim]
        if static_size is not None:
            return Lin((), static_size)
        return dim_sizes(arg)[dim]  # the size only: the tensor's data is never read

    def _scalar_arith(self, at: _At):
        if at.name in _SCALAR_INT:
            return _SCALAR_INT[at.name](self._int(at.ops[0]), self._int(at.ops[1]))
        if at.name == "torch.aten.mul.int":
            x, y = self._int(at.ops[0]), self._int(at.ops[1])
            if not (x.is_const() or y.is_const()):
                raise NotProven("mul.int of two sizes is not linear")
            return x.scale(y.const) if y.is_const() else y.scale(x.const)
        return self._int(at.ops[0]).scale(-1)  # neg.int

    # -- tensors from nothing
    def _literal(self, at: _At):
        attr = at.op.attributes["value"]
        if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
            raise NotProven("a non-splat literal tensor (data, not a formula)")
        text = str(attr.get_splat_value())
        if at.kind == "bool":
            return BoolTensor(at.rank, TRUE if text.startswith("true") else FALSE)
        if at.kind == "int":
            return IntTensor(at.rank, Lin((), int(text.split(":")[0].strip())))
        return FloatTensor(at.rank, ((TRUE, ir.FloatAttr(attr.get_splat_value()).value),))

    def _arange(self, at: _At):
        if at.kind != "int":
            raise NotProven("arange of a non-integer dtype")
        start, step = Lin(), Lin((), 1)
        if at.name.endswith("start_step"):
            start, step = self._int(at.ops[0]), Lin((), self.constant(at.ops[2]))
        elif at.name.endswith("start"):
            start = self._int(at.ops[0])
        return IntTensor(1, start + Lin.var(0).scale(step.const))

    def _fill(self, at: _At):
        default = _FILLS[at.short]
        fill = self.value(at.ops[1]) if default is None else Lin((), default)
        if isinstance(fill, Lin) and fill.is_const():
            fill = fill.const
        if isinstance(fill, bool) or not isinstance(fill, (int, float)):
            fill = int(fill) if isinstance(fill, bool) else None
        if fill is None:
            raise NotProven(f"{at.name}: the fill value is not a constant")
        if at.kind == "bool":
            return BoolTensor(at.rank, TRUE if fill else FALSE)
        if at.kind == "float":
            return FloatTensor(at.rank, ((TRUE, float(fill)),))
        return IntTensor(at.rank, Lin((), fill)) if isinstance(fill, int) else None

    # -- casts, copies and shape ops
    def _identity(self, at: _At):
        x = self.value(at.ops[0])
        if isinstance(x, PiecewiseInt) and at.kind == "int":
            return x
        if isinstance(x, IntTensor) and at.kind == "bool":
            if x.lin.data_vars():  # e.g. attention_mask.bool(): the cast is the boolean data (key padding)
                source = x.lin.data_vars()[0].name
                raise NotProven(f"reads the data of {'block argument ' if source.startswith('%arg') else ''}"
                                f"{source} (through {at.name})")
            return BoolTensor(x.rank, f_not(eq(x.lin)))
        if isinstance(x, BoolTensor) and at.kind == "int":
            if not isinstance(x.formula, Const):
                raise NotProven(f"{at.name}: a boolean formula cast to integers")
            return IntTensor(x.rank, Lin((), int(x.formula.value)))
        if isinstance(x, BoolTensor) and at.kind == "float":
            return FloatTensor.of(x.rank, ((x.formula, 1.0), (f_not(x.formula), 0.0)))
        if isinstance(x, FloatTensor) and at.kind == "bool":  # (MPT: its additive mask .bool()): nonzero
            nonzero: Formula = FALSE
            for f, c in x.pieces:
                nonzero = f_or(nonzero, f_and(f, f_not(eq(c))) if isinstance(c, Lin) else f if c != 0 else FALSE)
            return BoolTensor(x.rank, nonzero)
        if isinstance(x, IntTensor) and at.kind == "float" and x.lin.is_const():
            return FloatTensor(x.rank, ((TRUE, float(x.lin.const)),))
        if isinstance(x, {"int": IntTensor, "bool": BoolTensor, "float": FloatTensor}[at.kind or ""]):
            return x
        return None

    def _unsqueeze(self, at: _At):
        d = self.constant(at.ops[1])
        d = d + at.rank if d < 0 else d
        x = self.value(at.ops[0])
        return remap(x, {j: Lin.var(j + (j >= d)) for j in range(x.rank)}, at.rank)

    def _squeeze(self, at: _At):
        x = self.value(at.ops[0])
        d = self.constant(at.ops[1])
        d = d + x.rank if d < 0 else d
        src_kind = tensor_kind(at.ops[0].type)
        if src_kind is None:
            raise NotProven(f"squeeze.dim of {at.ops[0].get_name()}, which is not a tensor")
        if src_kind[1][d] != 1:  # squeeze of another dim is a no-op: not modelled
            raise NotProven("squeeze.dim of a dim that is not of static size 1")
        return remap(x, {j: Lin.var(j - (j > d)) for j in range(x.rank) if j != d}, at.rank)

    def _transpose(self, at: _At):
        x = self.value(at.ops[0])
        a, c = (d + x.rank if d < 0 else d for d in (self.constant(at.ops[1]), self.constant(at.ops[2])))
        perm = {j: Lin.var(j) for j in range(x.rank)}
        perm[a], perm[c] = Lin.var(c), Lin.var(a)
        return remap(x, perm, at.rank)

    def _view(self, at: _At):
        x = self.value(at.ops[0])
        pairs, ones = self._view_dims(at.ops)
        return remap(x, {d: Lin.var(j) for d, j in pairs} | {d: Lin() for d in ones}, at.rank)

    def _permute(self, at: _At):
        x = self.value(at.ops[0])
        order = [self.constant(d) for d in self._list(at.ops[1])]
        order = [d + x.rank if d < 0 else d for d in order]
        return remap(x, {src: Lin.var(dst) for dst, src in enumerate(order)}, at.rank)

    def _broadcast_to(self, at: _At):
        return self._tensor(at.ops[0], at.rank)

    def _slice(self, at: _At):
        x = self.value(at.ops[0])
        d = self.constant(at.ops[1])
        d = d + x.rank if d < 0 else d
        start, stride = self._start(at.ops[2]), self.constant(at.ops[4])
        if not start.nonnegative() or stride < 1:
            raise NotProven("slice with a start counted from the end, or a step < 1")
        return remap(x, {j: Lin.var(j) for j in range(x.rank)} | {d: Lin.var(d).scale(stride) + start}, at.rank)

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

    def _cat(self, at: _At):
        """Concatenation, when the pieces lie on one line along ``dim`` (a piece of length 1
        that is the line's value at its position joins it); else piecewise."""
        listed = self._list(at.ops[0])
        parts = [self.value(t) for t in listed]
        shapes: list = [b.vtensor_shape(t.type) for t in listed]
        dim, rank = self.constant(at.ops[1]), at.rank
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
            upper = TRUE if n == len(pieces) - 1 else ge(Lin((), lo + size - 1) - index)
            regions.append((f_and(ge(index - Lin((), lo)), upper), lin))
        return make_int(rank, regions)

    def _index(self, at: _At):
        """``src[idx_0, ..., idx_{m-1}]`` with tensor indices (advanced indexing). A ``src``
        the domain cannot compute is data (:meth:`value`): its elements become atoms."""
        src = self.value(at.ops[0])
        if not isinstance(src, (IntTensor, BoolTensor)):
            raise NotProven("index of an unknown tensor")
        idx_values = self._list(at.ops[1])
        m = len(idx_values)
        bdims = at.rank - (src.rank - m)  # the broadcast indices' rank comes first in the result
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
        return remap(src, mapping, at.rank)

    # -- arithmetic and logic
    def _add(self, at: _At):
        """``add``/``sub`` (``.Tensor``, ``.Scalar``) of integer or float tensors."""
        if not at.name.endswith(_ARITH_OVERLOADS) or at.kind == "bool":
            return None
        sign = 1 if at.short == "add" else -1
        if at.kind == "int":
            x, y = self._tensor(at.ops[0], at.rank), self._tensor(at.ops[1], at.rank)
            alpha = self.constant(at.ops[2]) * sign
            return make_int(at.rank, [(f_and(f, g), a + c.scale(alpha)) for f, a in int_pieces(x)
                                      for g, c in int_pieces(y)])
        fx, fy = (float_pieces(self._tensor(o, at.rank)) for o in at.ops[:2])
        alpha = self.constant(at.ops[2]) * sign
        return FloatTensor.of(at.rank, [(f_and(f, g), fadd(a, fmul(float(alpha), c)))
                                        for f, a in fx.pieces for g, c in fy.pieces])

    def _mul(self, at: _At):
        """``mul`` of integer tensors (one constant), of booleans (and), of float pieces."""
        if at.kind == "int":
            x, y = self._tensor(at.ops[0], at.rank), self._tensor(at.ops[1], at.rank)
            if not (x.lin.is_const() or y.lin.is_const()):
                raise NotProven("product of two index-dependent tensors is not linear")
            return IntTensor(at.rank, x.lin.scale(y.lin.const) if y.lin.is_const() else y.lin.scale(x.lin.const))
        if at.kind == "bool":
            return self._logic(at)
        if not at.name.endswith(_ARITH_OVERLOADS):
            return None
        fx, fy = (float_pieces(self._tensor(o, at.rank)) for o in at.ops[:2])
        return FloatTensor.of(at.rank, [(f_and(f, g), fmul(a, c)) for f, a in fx.pieces for g, c in fy.pieces])

    def _floor_divide(self, at: _At):
        """``div(x, c, rounding_mode="floor")`` and ``floor_divide`` of an integer tensor by
        a positive constant (Llama 4's chunk ids ``q // chunk``). Exact when ``c`` divides
        every coefficient; else the elements ``floor(lin / c)`` are a variable of a derived
        tensor named by its formula (:func:`~autosp.ir.mask_algebra.floor_div_name`): two
        tensors with the same name are the same function of their indices, which is all a
        document proof needs. :meth:`materialise` builds it from ``v`` by its used dims."""
        if at.kind != "int":
            return None
        if at.short == "div":
            if len(at.ops) != 3 or is_none(at.ops[2]) or _string(at.ops[2]) != "floor":
                raise NotProven(f"{at.name}: only rounding_mode='floor' is modelled")
        elif at.short not in ("floor_divide",):
            return None
        x, c = self._tensor(at.ops[0], at.rank), self._tensor(at.ops[1], at.rank)
        if not isinstance(x, IntTensor) or not isinstance(c, IntTensor) or not c.lin.is_const() or c.lin.const <= 0:
            raise NotProven(f"{at.name}: the divisor is not a positive constant")
        divisor = c.lin.const
        if all(k % divisor == 0 for _, k in x.lin.terms) and x.lin.const % divisor == 0:
            return IntTensor(at.rank, Lin(tuple((v, k // divisor) for v, k in x.lin.terms), x.lin.const // divisor))
        name, used = floor_div_name(x.lin, divisor)
        self.data.setdefault(name, at.result)
        self.derived.setdefault(name, (at.result, used))
        return IntTensor(at.rank, Lin.var(DataVar(name, tuple(Lin.var(d) for d in used))))

    def materialise(self, name: str) -> ir.Value:
        """The IR value of data tensor ``name``: the tensor itself, or for a derived one
        (:meth:`_floor_divide`) its value read at index 0 of every dim its formula does not
        use (built before the op being rewritten: call inside its insertion point)."""
        if name not in self.derived:
            return self.data[name]
        value, used = self.derived[name]
        shape = b.vtensor_shape(value.type)
        assert shape is not None
        dims, dtype = shape
        for d in reversed(range(len(dims))):
            if d not in used:
                dims = dims[:d] + dims[d + 1:]
                value = ir.Operation.create("torch.aten.select.int", results=[b.vtensor_type(dims, dtype)],
                                            operands=[value, b.constant_int(d), b.constant_int(0)]).result
        return value

    def _neg(self, at: _At):
        if at.kind != "int":
            return None
        return IntTensor(at.rank, self._tensor(at.ops[0], at.rank).lin.scale(-1))

    def _compare(self, at: _At):
        """``le``/``lt``/``ge``/``gt``/``eq``/``ne`` of integer values or of float pieces."""
        if at.kind != "bool":
            return None
        rank = at.rank
        if any(isinstance(self._tensor(o, rank), FloatTensor) for o in at.ops[:2]):
            fx, fy = (float_pieces(self._tensor(o, rank)) for o in at.ops[:2])
            return BoolTensor(rank, f_or(*[f_and(f, g, fcompare(at.short, a, c))
                                           for f, a in fx.pieces for g, c in fy.pieces]))
        x, y = self._tensor(at.ops[0], rank), self._tensor(at.ops[1], rank)
        if not (isinstance(x, (IntTensor, PiecewiseInt)) and isinstance(y, (IntTensor, PiecewiseInt))):
            raise NotProven(f"{at.name}: comparison of non-integer values")
        return BoolTensor(rank, f_or(*[f_and(f, g, COMPARE[at.short](a, c))
                                       for f, a in int_pieces(x) for g, c in int_pieces(y)]))

    def _logic(self, at: _At):
        if at.kind != "bool" or len(at.ops) != 2:
            return None
        x, y = self._tensor(at.ops[0], at.rank), self._tensor(at.ops[1], at.rank)
        if not (isinstance(x, BoolTensor) and isinstance(y, BoolTensor)):
            raise NotProven(f"{at.name}: logic on non-boolean values")
        return BoolTensor(at.rank, _LOGIC[at.short](x.formula, y.formula))

    def _not(self, at: _At):
        if at.kind != "bool":
            return None
        x = self._tensor(at.ops[0], at.rank)
        if not isinstance(x, BoolTensor):
            raise NotProven(f"{at.name} of a non-boolean value")
        return BoolTensor(at.rank, f_not(x.formula))

    def _triangle(self, at: _At):
        """``tril``/``triu`` of a boolean or float tensor."""
        rank = at.rank
        x = self._tensor(at.ops[0], rank)
        if isinstance(x, IntTensor) or rank < 2:
            raise NotProven(f"{at.name} of an integer tensor")
        diag = Lin((), self.constant(at.ops[1]))
        row, col = Lin.var(rank - 2), Lin.var(rank - 1)
        keep = ge(row - col + diag) if at.short == "tril" else ge(col - row - diag)
        if isinstance(x, BoolTensor):
            return BoolTensor(rank, f_and(x.formula, keep))
        return FloatTensor.of(rank, [(f_and(f, keep), c) for f, c in x.pieces] + [(f_not(keep), 0.0)])

    def _select(self, at: _At):
        """``where(cond, a, b)`` and ``masked_fill(x, cond, value)`` on float constants."""
        if at.kind != "float":
            return None
        ops, rank = at.ops, at.rank
        if at.name.startswith("torch.aten.masked_fill"):
            cond, a, other = self._tensor(ops[1], rank), self._tensor(ops[2], rank), self._tensor(ops[0], rank)
        else:
            cond, a, other = (self._tensor(o, rank) for o in ops[:3])
        yes, no = (as_float(t) for t in (a, other))
        if not isinstance(cond, BoolTensor) or yes is None or no is None:
            raise NotProven(f"{at.name}: not a boolean condition choosing between float constants")
        return FloatTensor.of(rank, [(f_and(cond.formula, f), c) for f, c in yes.pieces]
                              + [(f_and(f_not(cond.formula), f), c) for f, c in no.pieces])

    def _slice_scatter(self, at: _At):
        """``base`` with ``src`` written into ``base[..., start:end, ...]`` (step 1): src
        (shifted by ``start``) inside the region, base outside."""
        ops, rank = at.ops, at.rank
        base, src = self._tensor(ops[0], rank), self.value(ops[1])
        d = self.constant(ops[2])
        d = d + rank if d < 0 else d
        if self.constant(ops[5]) != 1:
            raise NotProven("slice_scatter with a step")
        start = self._start(ops[3])
        size = self.shape(at.result)[d]
        end = None if is_none(ops[4]) else self.value(ops[4])
        i = Lin.var(d)
        lower = ge(i - start)
        upper = TRUE if end is None or (isinstance(end, Lin) and (end == size or (
            end.is_const() and end.const >= 2 ** 62))) else ge(self._int(ops[4]) - Lin((), 1) - i)
        region = f_and(lower, upper)
        moved = remap(src, {j: Lin.var(j) for j in range(rank)} | {d: i - start}, rank)
        if isinstance(base, FloatTensor) or isinstance(moved, FloatTensor):
            b_f, s_f = float_pieces(base), float_pieces(moved)
            return FloatTensor.of(rank, [(f_and(region, f), c) for f, c in s_f.pieces]
                                  + [(f_and(f_not(region), f), c) for f, c in b_f.pieces])
        if isinstance(base, BoolTensor) and isinstance(moved, BoolTensor):
            return BoolTensor(rank, f_or(f_and(region, moved.formula), f_and(f_not(region), base.formula)))
        return make_int(rank, [(f_and(region, f), lin) for f, lin in int_pieces(moved)]
                        + [(f_and(f_not(region), f), lin) for f, lin in int_pieces(base)])

    def _cumsum(self, at: _At):
        """``cumsum`` of a constant: ``(i_d + 1) * c``."""
        x = self.value(at.ops[0])
        d = self.constant(at.ops[1])
        d = d + x.rank if d < 0 else d
        c = (x.lin if isinstance(x, IntTensor) else
             Lin((), int(x.formula.value)) if isinstance(x, BoolTensor) and isinstance(x.formula, Const) else None)
        if c is None or not c.is_const():
            raise NotProven("cumsum of a value that is not constant")
        return IntTensor(x.rank, (Lin.var(d) + Lin((), 1)).scale(c.const))


_Handler = Callable[[MaskInterpreter, _At], object]
M = MaskInterpreter
# Ops with any result (scalars), by name.
_SCALAR_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(("torch.constant.int", "torch.constant.bool", "torch.constant.float", "torch.constant.none",
                     "torch.constant.device"), M._constant),
    "torch.aten.size.int": M._size,
    **dict.fromkeys((*_SCALAR_INT, "torch.aten.mul.int", "torch.aten.neg.int"), M._scalar_arith),
}
# Ops with a tensor result, by name ...
_TENSOR_HANDLERS: dict[str, _Handler] = {
    "torch.vtensor.literal": M._literal,
    **dict.fromkeys(_ARANGE, M._arange),
    **dict.fromkeys(_IDENTITY, M._identity),
    "torch.aten.unsqueeze": M._unsqueeze,
    "torch.aten.squeeze.dim": M._squeeze,
    "torch.aten.transpose.int": M._transpose,
    **dict.fromkeys(_VIEWS, M._view),
    "torch.aten.permute": M._permute,
    **dict.fromkeys(_BROADCAST, M._broadcast_to),
    "torch.aten.slice.Tensor": M._slice,
    "torch.aten.cat": M._cat,
    **dict.fromkeys(_INDEX, M._index),
    **dict.fromkeys(_SELECT, M._select),
    "torch.aten.slice_scatter": M._slice_scatter,
    "torch.aten.cumsum": M._cumsum,
}
# ... else by the aten name without its overload (every overload: the handler checks).
_SHORT_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(_FILLS, M._fill),
    "add": M._add, "sub": M._add, "mul": M._mul, "neg": M._neg, "div": M._floor_divide,
    "floor_divide": M._floor_divide,
    **dict.fromkeys(COMPARE, M._compare),
    **dict.fromkeys(set(_LOGIC) - {"mul"}, M._logic),
    "bitwise_not": M._not, "logical_not": M._not,
    "tril": M._triangle, "triu": M._triangle,
}
del M


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


def _string(v: ir.Value) -> str | None:
    """The text of a ``torch.constant.str`` result, else None."""
    owner = v.owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.constant.str":
        return None
    return ir.StringAttr(owner.attributes["value"]).value


def _normalise(x, type_):
    """Index 0 on every dim of static size 1 (broadcasting never reads another)."""
    kind = tensor_kind(type_)
    if kind is None:
        return x
    ones = {d: Lin() for d, n in enumerate(kind[1]) if n == 1}
    return remap(x, ones, x.rank) if ones else x
