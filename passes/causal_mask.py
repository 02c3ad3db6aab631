"""``autosp-causal-mask``: SDPA masks proven causal from the IR become ``is_causal``.

Traced Hugging Face models materialise a ``[B, 1, S, S]`` boolean mask that eager execution
skips (it calls SDPA with ``is_causal=True``); SDPA keeps the mask for backward (O(S^2) bytes
per layer) and takes the slower masked kernel. This pass removes such a mask when, and only
when, the ops that compute it prove that it is exactly ``k <= q``.

How: the mask's backward slice is read as a predicate over the mask's index space by a small
abstract interpreter (:class:`autosp.ir.mask_interp.MaskInterpreter`, in the algebra of
:mod:`autosp.ir.mask_algebra`: what is modelled is described there); this module holds
the proof on its answer and the rewrite. An integer scalar is a linear expression over
sizes, an integer tensor one over its own indices, a boolean tensor a formula of linear
constraints, a float tensor a few constants on formulas (an additive mask). Sizes are
tracked beside the values: a broadcast of two dims not proven equal, or a mask not proven
to span the query and key lengths, is "not proven". Data the domain cannot compute (an
input's values) is opaque: an element of a boolean or integer tensor it reads becomes an
atom ``pad[b, k]`` / a variable ``pos[b, q]`` of unknown value. Floats it cannot compute,
random ops and non-splat literals make the mask "not proven" and it stays, correct at its
memory cost.

The fold happens only when the formula simplifies to the single constraint
``i_q - i_k >= 0`` on the mask's last two dims (for an additive mask: 0 exactly there, and
elsewhere -inf or a value below half the dtype's lowest), or to exactly that and
``i_k - i_q + W - 1 >= 0`` for a constant W: a causal sliding window, which becomes
``is_causal`` plus ``autosp.window = W`` (without dropout; the backend's windowed kernel
never builds S x S). Two conjuncts over data are recognised beside that structure:

- key padding ``pad[b, k]`` (a [B, S] boolean, e.g. ``attention_mask``): the mask operand
  becomes ``pad`` as [B, 1, 1, S], with ``autosp.key_padding``;
- documents ``doc[b, q] == doc[b, k]`` (a [B, S] integer: a segment-id input, or ids
  computed in the model; ids the model derives from positions by a floor division,
  Llama 4's chunks ``i // c``, are one derived tensor of the interpreter, built as [1, S]
  or [B, S] from the model's own computation): the operand becomes ``doc`` as [B, 1, 1, S], with
  ``autosp.documents``. The rest may compare positions ``pos[b, k] <= pos[b, q]`` instead
  of indices (transformers' packed sequences) only when ``doc`` is proven to number the
  runs of consecutive positions: ``doc = cumsum(c)`` with ``c[i]`` exactly
  ``pos[i] - pos[i - 1] != 1`` for i >= 1. Then within a document ``pos[q] - pos[k] ==
  q - k`` and the comparison is rewritten to indices. Ids from ``cumsum(pos == 0)`` prove
  nothing about the steps between resets: kept.

Key padding alone (no causal structure: an encoder's bidirectional mask) becomes the same
[B, 1, 1, S] operand with ``autosp.key_padding``, ``is_causal`` left false.

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
from autosp.ir.contract import DOCUMENTS_ATTR, EMPTY_ROWS_ATTR, KEPT_MASK_ATTR, KEY_PADDING_ATTR, WINDOW_ATTR, EmptyRows
from autosp.ir.core import body_ops, const_bool, const_float, is_none, main_func, op_name
from autosp.ir.mask_algebra import (
    And,
    BoolTensor,
    Data,
    DataVar,
    Eq,
    FloatTensor,
    Formula,
    Ge,
    Lin,
    Not,
    NotProven,
    eq,
    f_not,
    f_or,
    f_subst,
    format_formula,
    formula_data,
    lins,
    map_lins,
    restrict,
)
from autosp.ir.mask_interp import MaskInterpreter, tensor_kind
from autosp.ir.ops import is_sdpa
from autosp.ir.pass_base import ModulePass
from autosp.ir.sizes import dim_sizes

_log = logging.getLogger(__name__)

# An additive mask entry at most this (half the dtype's lowest value, or -inf) adds a
# probability of exactly 0 after softmax, as masking does.
_MASKED_BELOW = {"f32": -1.7e38, "f64": -8.9e307, "f16": -32752.0, "bf16": -1.69e38}


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
    # UNIFORM: the mask is additive with a finite masking constant, so a query row whose
    # keys are all padded gets the same score everywhere: softmax is uniform over every key
    # (eager attention's answer), not the zeros a boolean mask gives.
    empty_rows: EmptyRows | None = None
    # True: the mask is key padding alone, no causal structure (an encoder: BERT, ViT)
    bidirectional: bool = False


def prove_causal(sdpa) -> MaskProof:
    """Decide from the IR whether the mask of ``sdpa`` (a scaled_dot_product_attention op)
    is exactly ``k <= q`` over the query and key positions.

    Example (transformers' MistralForCausalLM, sliding_window=8)::

        >>> prove_causal(sdpa)
        MaskProof(causal=False, reason='formula is not k <= q: and(- i2 + i3 + 7 >= 0, i2 - i3 >= 0)')
    """
    mask, query, key = sdpa.operands[3], sdpa.operands[0], sdpa.operands[1]
    interpreter = MaskInterpreter()
    try:
        value = interpreter.value(mask)
        if not isinstance(value, (BoolTensor, FloatTensor)) or value.rank < 2:
            return MaskProof(False, "not a boolean or float mask of rank >= 2")
        # SDPA broadcasts the mask: a mask dim of runtime size 1 would repeat row (or
        # column) 0, so the mask must provably span the query and key lengths.
        mask_q, mask_k = interpreter.shape(mask)[-2:]
        # A mask of one row ([B, 1, 1, S]: an encoder's key padding as written by hand) is
        # the same row for every query: allowed only for a formula that does not read q.
        one_row = mask_q == Lin((), 1) and mask_q != dim_sizes(query)[-2]
        if (mask_q != dim_sizes(query)[-2] and not one_row) or mask_k != dim_sizes(key)[-2]:
            return MaskProof(False, "cannot prove the mask spans the query and key lengths")
    except NotProven as e:
        return MaskProof(False, str(e))
    except RecursionError:
        return MaskProof(False, "mask computation too deep")
    q, k = value.rank - 2, value.rank - 1
    causal = Ge(Lin.of({q: 1, k: -1}))
    found = _allowed(value, mask)
    if isinstance(found, MaskProof):
        return found
    allowed, finite = found
    if one_row and (isinstance(allowed, And) or split_key_padding(And((allowed,)), k, mask, interpreter)[1] is None):
        return MaskProof(False, "cannot prove the mask spans the query and key lengths (one row, and not key "
                                "padding alone)")
    if allowed == causal:
        return MaskProof(True, "k <= q")
    padding = documents = None
    if not isinstance(allowed, And) and value.rank == 4:  # key padding alone: an encoder's mask
        rest, padding = split_key_padding(And((allowed,)), k, mask, interpreter)
        if padding is not None:
            if finite is None:
                return MaskProof(False, "key padding with an additive mask whose masking constant is too small "
                                        "for an all-padded row's softmax to be uniform")
            empty = EmptyRows.UNIFORM if isinstance(value, FloatTensor) and finite else None
            return MaskProof(False, f"key padding {padding[0].get_name()}[b, k]{' != 0' if padding[1] else ''} "
                                    "(bidirectional)", key_padding=padding, empty_rows=empty, bidirectional=True)
    if isinstance(allowed, And) and value.rank == 4:
        allowed, padding = split_key_padding(allowed, k, mask, interpreter)
    if isinstance(allowed, And) and value.rank == 4:
        allowed, documents = _split_documents(allowed, q, k, mask, interpreter, sdpa)
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
    read = [f"{n}: {interpreter.opaque[n]}" for n in formula_data(allowed) if n in interpreter.opaque]
    return MaskProof(False, reason + (f"; data read: {'; '.join(read)}" if read else ""))


def _allowed(value, mask: ir.Value) -> tuple[Formula, bool | None] | MaskProof:
    """Where the mask lets a query see a key, and ``finite``: whether an additive mask's
    masking constant is one finite value (None: one too small for an all-masked row's
    softmax to be uniform; False for a boolean mask). A MaskProof where the additive mask
    holds other values."""
    if isinstance(value, BoolTensor):
        return value.formula, False
    # additive: 0 where allowed, a value that underflows softmax to 0 elsewhere
    mask_type = b.vtensor_shape(mask.type)
    assert mask_type is not None  # interpreter.shape(mask) proved it a vtensor
    low = _MASKED_BELOW.get(mask_type[1])
    bad = [c for _, c in value.pieces if isinstance(c, Lin) or (c != 0.0 and (low is None or not c <= low))]
    if bad:
        return MaskProof(False, f"additive mask with values other than 0 and a masking constant: {bad}")
    masked = {c for _, c in value.pieces if c != 0.0}
    finite: bool | None = len(masked) == 1 and math.isfinite(next(iter(masked)))
    if finite and abs(next(iter(masked))) < 1e30:
        finite = None  # score + c need not round to c (fp16): an empty row is not uniform
    return f_or(*[f for f, c in value.pieces if c == 0.0]), finite


def _one_row(interpreter: MaskInterpreter, name: str, mask: ir.Value) -> bool:
    """Both the mask and the data tensor ``name`` have one batch row (so ``x[0, k]`` is ``x[b, k]``)."""
    return (tensor_kind(interpreter.data[name].type) or ("", [None]))[1][0] == 1 == \
        (tensor_kind(mask.type) or ("", [None]))[1][0]


def _without(allowed: And, conjunct: Formula) -> Formula:
    rest = [f for f in allowed.args if f != conjunct]
    return rest[0] if len(rest) == 1 else And(tuple(rest))


def split_key_padding(allowed: And, k: int, mask: ir.Value, interpreter: MaskInterpreter):
    """``(rest, padding)``: a conjunct ``pad[b, k]`` (or ``int_pad[b, k] != 0``) with ``pad``
    a [B, S] data tensor read at the mask's batch and key index (transformers'
    ``padding_mask_function``) taken out, ``padding = (pad, nonzero)``; else ``(allowed, None)``."""
    def element(f):  # (name, idx, nonzero) of pad[b, k] or of int_pad[b, k] != 0
        if isinstance(f, Data):
            return f.name, f.idx, False
        if isinstance(f, Not) and isinstance(f.arg, Eq) and f.arg.lin.const == 0 and \
                len(f.arg.lin.terms) == 1 and isinstance(f.arg.lin.terms[0][0], DataVar):
            var = f.arg.lin.terms[0][0]
            return var.name, var.idx, True
        return None
    key_pad = [(f, el) for f in allowed.args if (el := element(f)) is not None and len(el[1]) == 2
               and el[1][1] == Lin.var(k) and (el[1][0] == Lin.var(0) or (el[1][0] == Lin((), 0)
                                                                          and _one_row(interpreter, el[0], mask)))
               and len((tensor_kind(interpreter.data[el[0]].type) or ("", []))[1]) == 2]
    if len(key_pad) != 1:
        return allowed, None
    (conjunct, (name, _, nonzero)), = key_pad
    return _without(allowed, conjunct), (interpreter.data[name], nonzero)


def _split_documents(allowed: And, q: int, k: int, mask: ir.Value, interpreter: MaskInterpreter, sdpa):
    """``(rest, doc)``: a conjunct ``doc[b, q] == doc[b, k]`` with ``doc`` a [B, S] integer
    data tensor taken out, when the rest reads no other data, or compares positions within
    a document (transformers' packed sequences: :func:`_positions_within_documents`);
    else ``(allowed, None)``. Ids the model derives from positions (``i // c``: the
    interpreter's derived tensors) are built from its own computation before ``sdpa``."""
    found = [(f, d) for f in allowed.args if (d := _document_ids(f, q, k, mask, interpreter)) is not None]
    if len(found) != 1:
        return allowed, None
    conjunct, (name, batch) = found[0]
    rest: Formula | None = _without(allowed, conjunct)
    if formula_data(rest):  # type: ignore[arg-type]
        rest = _positions_within_documents(rest, name, batch, q, k, interpreter)  # type: ignore[arg-type]
    if rest is None:
        return allowed, None
    if name not in interpreter.derived:
        return rest, interpreter.data[name]
    with ir.InsertionPoint(sdpa), sdpa.location:
        ids = interpreter.materialise(name)  # (dead if the fold is refused later: left to autosp-dce)
        shape = b.vtensor_shape(ids.type)
        assert shape is not None  # the interpreter read it as an integer tensor
        if batch == Lin() and len(shape[0]) == 1:  # the same ids for every row: [1, S]
            ids = b.torch_op("torch.aten.unsqueeze", [ids, b.constant_int(0)], b.vtensor_type([1, *shape[0]], shape[1]))
    return rest, ids


def _window_of(allowed: Formula, q: int, k: int) -> int | None:
    """W when ``allowed`` is exactly ``and(q - k >= 0, k - q + W - 1 >= 0)`` with W >= 1."""
    if not isinstance(allowed, And) or len(allowed.args) != 2:
        return None
    causal = Ge(Lin.of({q: 1, k: -1}))
    if causal not in allowed.args:
        return None
    other = next(f for f in allowed.args if f != causal)
    if not isinstance(other, Ge) or other.lin.coeffs() != {q: -1, k: 1} or other.lin.const < 0:
        return None
    return other.lin.const + 1


def _document_ids(f: Formula, q: int, k: int, mask: ir.Value, interpreter: MaskInterpreter) -> tuple[str, Lin] | None:
    """(doc, b) when ``f`` is exactly ``doc[b, q] == doc[b, k]`` for an integer [B, S] data
    tensor ``doc``, ``b`` the mask's batch index (or 0 where both have one row)."""
    if not isinstance(f, Eq) or f.lin.const != 0 or len(f.lin.terms) != 2:
        return None
    (u, cu), (w, cw) = f.lin.terms
    if not (isinstance(u, DataVar) and isinstance(w, DataVar)) or u.name != w.name or cu + cw != 0 or abs(cu) != 1:
        return None
    if len(u.idx) == 1 and u.name in interpreter.derived and {u.idx[0], w.idx[0]} == {Lin.var(q), Lin.var(k)}:
        return u.name, Lin()  # ids derived from the position alone (Llama 4's chunks: i // c), every row alike
    if len(u.idx) != 2 or u.idx[0] != w.idx[0] or {u.idx[1], w.idx[1]} != {Lin.var(q), Lin.var(k)}:
        return None
    batch = u.idx[0]
    if batch != Lin.var(0) and not (batch == Lin() and _one_row(interpreter, u.name, mask)):
        return None
    return u.name, batch


def _positions_within_documents(rest: Formula, doc: str, batch: Lin, q: int, k: int,
                                interpreter: MaskInterpreter) -> Formula | None:
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
        dim = interpreter.constant(owner.operands[1])
        step = interpreter.value(source)
    except NotProven:
        return None
    if dim not in (1, -1) or not isinstance(step, BoolTensor) or step.rank != 2:
        return None
    step_f = f_subst(restrict(step.formula, 1, 1), {0: batch})
    i = Lin.var(1)
    for var in (v for lin_ in lins(step_f) for v in lin_.data_vars()):
        if len(var.idx) != 2 or var.idx[1] != i:
            continue
        pos, x = var.name, var.idx[0]
        at = lambda j, pos=pos, x=x: Lin.var(DataVar(pos, (x, j)))  # noqa: E731
        if step_f != f_not(eq(at(i) - at(i - Lin((), 1)) - Lin((), 1))):
            continue
        pq, pk = DataVar(pos, (x, Lin.var(q))), DataVar(pos, (x, Lin.var(k)))

        def within(lin: Lin, pq=pq, pk=pk):
            co = lin.coeffs()
            c = co.get(pq, 0)
            if co.get(pk, 0) != -c:
                return None
            rest_terms = {v: a for v, a in co.items() if v not in (pq, pk)}
            if any(isinstance(v, DataVar) for v in rest_terms):
                return None
            return Lin.of(rest_terms, lin.const) + (Lin.var(q) - Lin.var(k)).scale(c)
        out = map_lins(rest, within)
        if out is not None and not formula_data(out):
            return out
    return None


def fold_causal_masks(module) -> int:
    """Replace SDPA masks proven to be exactly ``k <= q`` by ``is_causal``, and those proven
    to be exactly a causal sliding window ``q - W < k <= q`` by ``is_causal`` plus
    ``autosp.window = W`` (the backend runs windowed attention without an S x S mask;
    only without dropout); return how many.

    Masks not proven stay, marked ``autosp.mask_kept = "<reason>"`` (they cost O(S^2)
    memory; :func:`autosp.driver.kept_masks` tells the user at compile time).
    """
    func = main_func(module)
    folded = 0
    for op in [o for o in body_ops(func) if is_sdpa(o)]:
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
            op.operands[3] = key_mask(op, proof.documents)
        elif proof.key_padding is not None:
            padding, nonzero = proof.key_padding
            op.operands[3] = key_mask(op, padding, nonzero)
        else:
            op.operands[3] = none
        if not proof.bidirectional:
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


def key_mask(op, padding: ir.Value, nonzero: bool = False) -> ir.Value:
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
