"""Layout propagation and materialisation: which values are sequence-sharded, and the
IR that makes each rank compute only its shard.

Every tensor value gets one layout:

* **R**, replicated: every rank computes all of it (inputs, positions, masks, anything
  that depends on no parameter);
* **S(dim, window)**, sequence-sharded along ``dim``: rank r holds its chunk of the
  sequence (``runtime.collectives.chunk``) intersected with the value's *window*
  ``[lo, S - trim)``, which a slice along the sequence narrows (``logits[:, :-1]`` is the
  window ``(0, 1)``);
* **H**, head-sharded over the full sequence: between the all-to-alls that
  ``autosp-partition-attention`` put around attention.

Rules, applied in program order:

1. An op with a sequence-sharded operand and a sequence dimension in its result is
   sequence-sharded. Replicated operands that have a sequence dimension are sliced to
   the rank's part of the same window (``autosp.shard``: positions, RoPE tables and
   labels become correct on every rank without communication). Sizes computed from S
   that shape the result are rewritten to the local length (``autosp.local_len``).
2. An op whose result has a sequence dimension and that reads a parameter (directly or
   through other ops) is where sharding starts: its replicated operands are sliced.
   Parameter-free work stays replicated and is sliced where it meets sharded values.
3. A sum over the sequence of a sharded value becomes a local sum and an
   ``autosp.all_reduce``; the result is replicated (a global loss on every rank).
4. A slice along the sequence of a sharded value narrows its window (``autosp.rewindow``).
5. Any other op that would need the whole sequence (a matmul contracting it, a softmax,
   cumsum or sort over it) is diagnosed, naming the op.

Returned sequence-sharded values stay local, or are gathered (``gather_outputs``).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from autosp.ir import builders as b
from autosp.ir.core import body_ops, main_func, op_name
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.sequence import NOT_SEQ, SequenceInfo, const_int

_BIG = 1 << 62  # slice ends at or beyond this mean "to the end"
_CONTRACTIONS = ("torch.aten.mm", "torch.aten.bmm", "torch.aten.matmul")
_MIXING_ALONG_DIM = ("torch.aten.cumsum", "torch.aten.cumprod", "torch.aten.softmax.int", "torch.aten._softmax",
                     "torch.aten.log_softmax.int", "torch.aten._log_softmax", "torch.aten.sort",
                     "torch.aten.logcumsumexp", "torch.aten.flip", "torch.aten.roll")
_SUM_OPS = ("torch.aten.sum.dim_IntList", "torch.aten.sum")
_SIZE_LIST_OPS = ("torch.aten.view", "torch.aten.reshape", "torch.aten.broadcast_to", "torch.aten.expand",
                  "torch.aten._unsafe_view")
# Ops that read values but do not compute tensors of the layout problem.
_PASS_THROUGH = ("torch.constant.", "torch.prim.ListConstruct", "torch.symbolic_int", "torch.bind_symbolic_shape",
                 "torch.vtensor.literal", "func.return", "autosp.local_len")


@dataclass(frozen=True)
class Seq:
    """Sequence-sharded along ``dim``, on the window ``[lo, S - trim)`` of the sequence."""

    dim: int
    lo: int = 0
    trim: int = 0


HEADS = "H"


def _linear_in_s(expr: str) -> tuple[int, int] | None:
    """``"S * 2 - 2"`` -> (2, -2): the expression as a*S + b, or None if not linear in S."""
    try:
        f = lambda s: eval(expr.replace("floordiv", "//"), {"__builtins__": {}}, {"S": s})  # noqa: E731
        f0, f1, f2 = f(1000), f(2000), f(3000)
    except Exception:
        return None
    a = (f1 - f0) // 1000
    if f2 - f1 != f1 - f0 or a * 1000 != f1 - f0:
        return None
    return a, f0 - a * 1000


def _list_items(value) -> list:
    """The items of a ``torch.prim.ListConstruct`` result (empty for anything else)."""
    owner = value.owner
    if isinstance(owner, ir.Block) or op_name(owner) != "torch.prim.ListConstruct":
        return []
    return list(owner.operands)


class _Materializer:
    def __init__(self, module, info: SequenceInfo, group: str, seq_len: ir.Value, params: set):
        self.module, self.info, self.group, self.seq_len = module, info, group, seq_len
        self.layout: dict = {}
        self.param_derived: set = set(params)
        self.local_lens: dict = {}  # (lo, trim) -> the one autosp.local_len of that window
        self.local_scalars: set = set()  # sizes read from sharded values: local lengths

    # ---------------------------------------------------------------- queries
    def seq_entries(self, value):
        return self.info.dims.get(value)

    def seq_dims(self, value) -> list[int]:
        return self.info.seq_dims(value)

    def window_of_replicated(self, value, dim) -> Seq:
        """The window a replicated value of length ``S - c`` spans when it starts sharding."""
        lin = _linear_in_s(self.seq_entries(value)[dim])
        if lin is None or lin[0] != 1 or lin[1] > 0:
            return None
        return Seq(dim, 0, -lin[1])

    # ---------------------------------------------------------------- rewriting helpers
    def shard(self, op, value, dim: int, window: Seq) -> ir.Value:
        """Slice a replicated operand to this rank's part of ``window``. Its sequence dim has
        the window's length, or a multiple a of it (batch x sequence flattened, sequence inner)."""
        entries = self.seq_entries(value)
        lin = _linear_in_s(entries[dim]) if entries else None
        if lin is None or lin[0] < 1 or lin[1] != -lin[0] * (window.lo + window.trim):
            raise DiagnosticError.at(op, f"needs operand {value.type} sliced along its sequence dim {dim} "
                                         f"(size {entries[dim] if entries else '?'}), which does not match the "
                                         f"window S - {window.lo + window.trim} of the sharded operands")
        with ir.InsertionPoint(op), op.location:
            return b.autosp_op("shard", [value, self.seq_len], value.type, dim=dim, lo=window.lo,
                               trim=window.trim, group=self.group)

    def local_size(self, op, size: ir.Value, expr: str, window: Seq) -> ir.Value:
        """The local version of a size ``expr`` (a*len(window)) for a sharded result."""
        lin = _linear_in_s(expr)
        length = 1000 - window.lo - window.trim
        if lin is None or lin[0] * length != lin[0] * 1000 + lin[1]:
            raise DiagnosticError.at(op, f"has a size '{expr}' that is not a multiple of its sequence window "
                                         f"(S - {window.lo + window.trim}): cannot compute the local size")
        key = (window.lo, window.trim)
        if key not in self.local_lens:
            with ir.InsertionPoint.after(self.seq_len.owner), op.location:
                self.local_lens[key] = b.autosp_op("local_len", [self.seq_len], b.int_type(), lo=window.lo,
                                                   trim=window.trim, group=self.group)
        local = self.local_lens[key]
        with ir.InsertionPoint(op), op.location:
            if lin[0] != 1:
                local = b.torch_op("torch.aten.mul.int", [local, b.constant_int(lin[0])], b.int_type())
        return local

    def fix_size_list(self, op, window: Seq) -> None:
        """Rewrite the S-dependent entries of a view/broadcast size list to local sizes."""
        lst = op.operands[1]
        owner = lst.owner
        if isinstance(owner, ir.Block) or op_name(owner) != "torch.prim.ListConstruct":
            raise DiagnosticError.at(op, "has a size list autosp cannot read")
        result_entries = self.seq_entries(op.results[0])
        new_items, changed = [], False
        for i, item in enumerate(owner.operands):
            expr = self.info.scalars.get(item)
            if expr is not None and result_entries and result_entries[i] != NOT_SEQ:
                new_items.append(self.local_size(op, item, result_entries[i], window))
                changed = True
            elif expr is not None:
                raise DiagnosticError.at(op, f"uses the sequence length ('{expr}') for dimension {i}, which is "
                                             "not a sequence dimension of its result")
            else:
                new_items.append(item)
        if changed:
            with ir.InsertionPoint(op), op.location:
                new_list = ir.Operation.create("torch.prim.ListConstruct", results=[lst.type],
                                               operands=new_items).result
            op.operands[1] = new_list

    # ---------------------------------------------------------------- the walk
    def run(self) -> None:
        func = main_func(self.module)
        for op in list(body_ops(func)):
            name = op_name(op)
            if name.startswith(_PASS_THROUGH) or not op.results:
                if name == "func.return":
                    self.returned = op
                continue
            if all("vtensor" not in str(r.type) for r in op.results):
                self.check_scalar_op(op)
                continue
            self.visit(op, name)

    def check_scalar_op(self, op) -> None:
        if op_name(op) == "torch.aten.size.int":
            lay = self.layout.get(op.operands[0])
            if lay == HEADS:
                return  # inside attention sizes are the partitioned program's own: full S, H/P
            if isinstance(lay, Seq):
                d = const_int(op.operands[1])
                entries = self.seq_entries(op.operands[0]) or []
                if d is not None and entries and d % len(entries) == lay.dim:
                    # The local length (e.g. the shape of a dropout mask): fine for sharded
                    # values, wrong for replicated ones (checked where it is used).
                    self.local_scalars.add(op.results[0])
                    self.info.scalars.pop(op.results[0], None)
                return
        if any(v in self.local_scalars for v in op.operands):
            self.local_scalars.update(op.results)
        for v in op.operands:
            lay = self.layout.get(v)
            if lay is not None:
                raise DiagnosticError.at(op, "reads a sharded tensor into a scalar; autosp cannot tell whether "
                                             "it wants the local or the global value")

    def visit(self, op, name: str) -> None:
        operands = list(op.operands)
        tensor_ops = [v for v in operands if "vtensor" in str(v.type)]
        tensor_ops += [item for v in operands for item in _list_items(v) if "vtensor" in str(item.type)]
        layouts = [self.layout.get(v) for v in tensor_ops]
        if any(v in self.param_derived for v in operands + tensor_ops):
            for r in op.results:
                self.param_derived.add(r)
        result = op.results[0]
        res_dims = self.seq_dims(result) if len(op.results) == 1 else []

        if name == "autosp.all_to_all":
            seq_dim = op.attributes["seq_dim"].value
            if op.attributes["concat_dim"].value == seq_dim:  # to heads
                lay = layouts[0]
                if not isinstance(lay, Seq) or (lay.lo, lay.trim) != (0, 0) or lay.dim != seq_dim:
                    raise DiagnosticError.at(op, "attention inputs must be sequence-sharded on the whole sequence "
                                                 f"along dim {seq_dim}")
                self.layout[result] = HEADS
            else:
                if layouts[0] != HEADS:
                    raise DiagnosticError.at(op, "expects a head-sharded operand")
                self.layout[result] = Seq(seq_dim)
            return
        if HEADS in layouts:
            # Inside attention: queries and keys are whole, so replicated masks stay whole.
            if any(isinstance(x, Seq) for x in layouts):
                raise DiagnosticError.at(op, "mixes head-sharded attention values with sequence-sharded ones")
            self.layout[result] = HEADS
            return

        sharded = [(v, lay) for v, lay in zip(tensor_ops, layouts) if isinstance(lay, Seq)]
        if sharded:
            if self.visit_sharded(op, name, tensor_ops, sharded, res_dims) == "erased":
                return
        elif res_dims and result in self.param_derived and len(res_dims) == 1:
            # Rule 2: sharding starts here.
            window = None
            for v in tensor_ops:
                dims = self.seq_dims(v)
                if len(dims) == 1 and v not in self.param_derived:
                    window = self.window_of_replicated(v, dims[0])
                    break
            if window is None:
                raise DiagnosticError.at(op, "starts sequence-sharded work from an operand whose sequence size "
                                             "autosp cannot split")
            self.materialize(op, name, tensor_ops, Seq(res_dims[0], window.lo, window.trim))
        self.check_local_scalars(op)

    def check_local_scalars(self, op) -> None:
        """A local length may only shape sequence-sharded results."""
        if isinstance(self.layout.get(op.results[0]), Seq):
            return
        scalars = list(op.operands) + [i for v in op.operands for i in _list_items(v)]
        if any(v in self.local_scalars for v in scalars):
            raise DiagnosticError.at(op, "uses the local length of a sharded tensor to build a replicated one; "
                                         "compute it from the input's size instead")

    def visit_sharded(self, op, name, tensor_ops, sharded, res_dims) -> None:
        windows = {(lay.lo, lay.trim) for _, lay in sharded}
        if len(windows) > 1:
            raise DiagnosticError.at(op, f"combines sequence-sharded values on different windows {sorted(windows)} "
                                         "(e.g. tokens shifted against each other); autosp cannot align them "
                                         "without communication")
        lo, trim = windows.pop()
        result = op.results[0]
        if not res_dims:
            if name in _SUM_OPS:
                self.layout[result] = None
                with ir.InsertionPoint.after(op), op.location:
                    reduced = b.autosp_op("all_reduce", [result], result.type, reduce_op="sum", group=self.group)
                for use in list(result.uses):
                    if use.owner != reduced.owner:
                        use.owner.operands[use.operand_number] = reduced
                self.info.dims.pop(reduced, None)
                return
            self.check_sequence_mixing(op, name)
            raise DiagnosticError.at(op, "reduces over the sequence, which autosp can only split for sums")
        if len(res_dims) > 1:
            raise DiagnosticError.at(op, "produces a [.., S, S] tensor outside recognised attention; autosp "
                                         "cannot shard it")
        if name == "torch.aten.slice.Tensor" and self.is_seq_slice(op, sharded[0][1]):
            return "erased"
        self.materialize(op, name, tensor_ops, Seq(res_dims[0], lo, trim))

    def materialize(self, op, name, tensor_ops, seq: Seq) -> None:
        self.check_sequence_mixing(op, name)
        for i, v in enumerate(list(op.operands)):
            items = _list_items(v)
            if items:  # a list of tensors (torch.aten.cat): shard its replicated items
                new_items = [self.sharded_operand(op, item, seq) for item in items]
                if any(a != b for a, b in zip(new_items, items)):
                    with ir.InsertionPoint(op), op.location:
                        op.operands[i] = ir.Operation.create("torch.prim.ListConstruct", results=[v.type],
                                                             operands=new_items).result
            elif "vtensor" in str(v.type):
                op.operands[i] = self.sharded_operand(op, v, seq)
        if op_name(op) in _SIZE_LIST_OPS:
            self.fix_size_list(op, seq)
        self.layout[op.results[0]] = seq

    def check_sequence_mixing(self, op, name: str) -> None:
        """Diagnose ops that would combine positions of the sequence (Rule 5)."""
        if name in _CONTRACTIONS:
            a, b_ = op.operands[0], op.operands[1]
            ra = self.seq_entries(a)
            rb = self.seq_entries(b_)
            if (ra and ra[-1] != NOT_SEQ) or (rb and rb[-2 if len(rb) > 1 else 0] != NOT_SEQ):
                raise DiagnosticError.at(op, "contracts the sequence dimension (a matmul over positions) outside "
                                             "recognised attention; autosp cannot shard it")
        elif name in _MIXING_ALONG_DIM:
            entries = self.seq_entries(op.operands[0]) or []
            d = const_int(op.operands[1]) if len(op.operands) > 1 else None
            if d is not None and entries and entries[d % len(entries)] != NOT_SEQ:
                raise DiagnosticError.at(op, f"works along the sequence dimension ({d}); each rank holds only "
                                             "part of it, so autosp cannot shard this op")

    def sharded_operand(self, op, v, seq: Seq):
        """``v`` itself if it is sharded or has no sequence dim, else its shard on ``seq``."""
        if "vtensor" not in str(v.type) or isinstance(self.layout.get(v), Seq):
            return v
        dims = self.seq_dims(v)
        if not dims:
            return v
        if len(dims) > 1:
            raise DiagnosticError.at(op, "has a replicated operand with two sequence dims")
        return self.shard(op, v, dims[0], seq)

    def is_seq_slice(self, op, lay: Seq) -> bool:
        dim = const_int(op.operands[1])
        src_entries = self.seq_entries(op.operands[0])
        if dim is None:
            raise DiagnosticError.at(op, "slices along a dimension that is not a constant")
        dim %= len(src_entries)
        if dim != lay.dim:
            return False
        start, end, step = (self.bound(op, v, d) for v, d in zip(op.operands[2:5], (0, _BIG, 1)))
        if step != 1:
            raise DiagnosticError.at(op, "slices the sequence with a step; autosp supports step 1")
        length = 1000 - lay.lo - lay.trim  # evaluated at S = 1000
        start = start if start >= 0 else start + length
        end = length if end >= _BIG else (end if end >= 0 else end + length)
        if not (0 <= start <= end <= length):
            raise DiagnosticError.at(op, "slices the sequence with bounds autosp cannot express")
        new = Seq(lay.dim, lay.lo + start, lay.trim + (length - end))
        if end > length - 200 and start < 200:  # both bounds relative to the window's ends
            with ir.InsertionPoint(op), op.location:
                narrowed = b.autosp_op("rewindow", [op.operands[0], self.seq_len], op.results[0].type, dim=lay.dim,
                                       lo=lay.lo, trim=lay.trim, new_lo=new.lo, new_trim=new.trim,
                                       group=self.group)
            op.results[0].replace_all_uses_with(narrowed)
            self.layout[narrowed] = new
            self.info.dims[narrowed] = self.seq_entries(op.results[0])
            op.erase()
            return True
        raise DiagnosticError.at(op, "slices the sequence to a fixed length; autosp supports slices that "
                                     "trim a constant number of positions from either end")

    def bound(self, op, value, default: int) -> int:
        """A slice bound as an int, S-relative bounds evaluated at S = 1000 (None: ``default``)."""
        c = const_int(value)
        if c is not None:
            return c
        if not isinstance(value.owner, ir.Block) and op_name(value.owner) == "torch.constant.none":
            return default
        expr = self.info.scalars.get(value)
        lin = _linear_in_s(expr) if expr else None
        if lin is None or lin[0] != 1:
            raise DiagnosticError.at(op, "slices the sequence with a bound autosp cannot evaluate")
        return 1000 + lin[1]


def shard_sequence(module, info: SequenceInfo, seq_len: ir.Value, group: str = "sp",
                   gather_outputs: bool = False) -> dict:
    """Propagate layouts and rewrite ``@main`` so that each rank computes its shard.

    Returns ``{"returned": [layout per result]}``. Removes the symbolic-shape bindings:
    after sharding, the sizes they state are no longer the local ones.
    """
    func = main_func(module)
    block = func.regions[0].blocks[0]
    params = set()
    if "arg_attrs" in func.attributes:
        for i, attr in enumerate(func.attributes["arg_attrs"]):
            if "autosp.parameter" in attr:
                params.add(block.arguments[i])
    m = _Materializer(module, info, group, seq_len, params)
    m.run()
    ret = m.returned
    layouts = []
    for i, v in enumerate(list(ret.operands)):
        lay = m.layout.get(v)
        if lay == HEADS:
            raise DiagnosticError.at(ret, f"returns head-sharded attention internals (result {i})")
        if isinstance(lay, Seq) and gather_outputs:
            with ir.InsertionPoint(ret), ret.location:
                ret.operands[i] = b.autosp_op("all_gather", [v, seq_len], v.type, dim=lay.dim, lo=lay.lo,
                                              trim=lay.trim, group=group)
            lay = None
        layouts.append(lay)
    for op in list(body_ops(func)):
        if op_name(op) == "torch.bind_symbolic_shape":
            op.erase()
        else:  # the analysis' notes describe global sizes; the IR is now per rank
            for attr in ("autosp.seq", "autosp.attention"):
                if attr in op.attributes:
                    del op.attributes[attr]
    return {"returned": layouts}
