"""``autosp-partition-attention``: split every attention op over the ranks (Ulysses, ring, or both).

For each ``torch.aten.scaled_dot_product_attention`` on ``[B, H, S, D]`` operands, q, k
and v go through ``autosp.all_to_all`` (split heads, concatenate the sequence), attention
runs on ``H/P`` heads over the full sequence, and its output goes back (split the
sequence, concatenate heads): 4 all-to-alls per layer, the Ulysses minimum.

GQA/MQA (``enable_gqa`` with fewer KV heads than query heads): when the KV heads do not
divide by P but divide P, each KV head is repeated ``P / KV`` times first, so every rank
gets the KV head its query heads use. When the model repeats KV heads itself before
attention (``repeat_kv``: unsqueeze -> broadcast -> reshape) and the KV heads divide by
P, the all-to-all moves the KV heads and the repeat runs after it, on each rank's heads:
k and v then cost KV/H of the bytes (the Ulysses volume for GQA). (``autosp-fuse-gqa``,
run before this pass in the pipeline, removes such repeats where SDPA can read the shared
heads itself: then the KV heads simply travel as they are.) Query heads that do not divide by P, or KV heads
that neither divide nor are divided by P, are diagnosed at the attention op.

**Ring and hybrid meshes** (``strategy=ring|hybrid|auto``, ``ulysses-degree``,
``ring-degree``): the ranks form ``ring`` groups of ``ulysses`` ranks. The all-to-alls
run on the ``<group>:ulysses`` sub-group and attention becomes ``autosp.ring_attention``
on ``<group>:ring`` (q, k, v sequence-sharded, K/V blocks travelling the ring inside the
op). ``auto`` prices every mesh the heads allow with :func:`autosp.cost.strategy.choose`
(``ranks-per-node``, ``seq-len``); the module gets ``autosp.sp_layout`` (the layout the
runtime shards the sequence in: zigzag whenever ring > 1) and ``autosp.sp_choice`` (why).
Ring attention takes SDPA with no mask, a proven sliding window, proven documents or proven
key padding (causal or not: the [B, 1, 1, S] padding becomes the op's ``mask`` operand with
``key_padding = 1``, replicated, read by position); other masks, key padding whose fully
masked rows follow eager attention's ``autosp.empty_rows`` rule, and hand-written attention
keep ``auto`` on Ulysses and make a forced ring an error at the op.

**The cheapest tensor across ranks** (a Ulysses mesh): where q, k or v is computed token by
token from smaller values without heads (MLA's latents), :class:`autosp.passes.head_cut.HeadSlicer`
proves each rank's heads of it computable from those values whole, and
:func:`autosp.cost.strategy.choose_cut` prices gathering them against the all-to-alls; the
cheaper wins, and its reason joins ``autosp.sp_choice``. The gathered values are
all-to-all'd as P copies (``split_dim = 0``), each rank computes its heads from them (a
parameter's rows through ``autosp.local_heads``), and the operand never crosses the ranks.

**Linear recurrences** (stated ops, :mod:`autosp.runtime.recurrences`; ``recurrence=
auto|heads|chain|prefix``), on a mesh without a ring: each is priced by
:func:`autosp.cost.recurrence.choose_recurrence` (``auto``) or forced. ``heads``
rewrites a Gated DeltaNet op here (all-to-alls to heads around it); ``chain`` and
``prefix`` are left to ``autosp-shard-sequence`` with ``autosp.scan_method`` on the op.
The reasons join ``autosp.sp_choice``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.passes.fuse_gqa import repeated_heads
from autosp.passes.head_cut import Axis, HeadSlicer, bytes_per_token
from torch_mlir import ir

from autosp.cost.recurrence import GATED_DELTA_NET, LIGHTNING, MAMBA1, MAMBA2, RecurrenceShape, choose_recurrence
from autosp.cost.strategy import Candidate, Choice, StrategyError, choose, choose_cut
from autosp.ir import builders as b
from autosp.ir import ops
from autosp.ir.contract import (
    ALL_TO_ALL,
    DOCUMENTS_ATTR,
    EMPTY_ROWS_ATTR,
    KEY_PADDING_ATTR,
    LOCAL_HEADS,
    RING_ATTENTION,
    SCAN_METHOD_ATTR,
    SINK_HEADS_ATTR,
    SP_CHOICE_ATTR,
    SP_LAYOUT_ATTR,
    WINDOW_ATTR,
    AttentionKind,
)
from autosp.ir.core import (
    as_operation,
    body_ops,
    const_bool,
    const_float,
    const_int,
    is_none,
    main_func,
    op_name,
    producer,
    users,
)
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.pass_base import ModulePass
from autosp.ir.sequence import SequenceInfo, analyze_sequence, sequence_length_value


@dataclass(frozen=True)
class PartitionAttention(ModulePass):
    """Split each attention op over sp-size ranks: Ulysses all-to-alls, a ring, or both.

    q, k and v ([B, H, S, D], sequence-sharded) become head-sharded over the full
    sequence, attention runs on H/P heads, and the output returns to sequence-sharded:
    4 ``autosp.all_to_all`` per layer. With GQA, KV heads fewer than P are repeated to P.
    Query heads not divisible by P are diagnosed at the attention op. (This pass only
    partitions attention; sharding the rest of the graph is the layout passes' job.)
    With ``strategy=ring`` (or ``hybrid``/``auto`` choosing a ring), attention becomes
    ``autosp.ring_attention`` on the ``:ring`` sub-group; see the module docstring.

    Input::

        %o = torch.aten.scaled_dot_product_attention %q, %k, %v, %none, %f0, %true, %none, %false
            : ... -> !torch.vtensor<[2,4,?,8],f32>

    Output::

        // sp-size=2
        %q2 = "autosp.all_to_all"(%q) {concat_dim = 2 : i64, group = "sp", split_dim = 1 : i64}
            : (!torch.vtensor<[2,4,?,8],f32>) -> !torch.vtensor<[2,2,?,8],f32>
        ... (same for %k, %v)
        %o2 = torch.aten.scaled_dot_product_attention %q2, %k2, %v2, ... -> !torch.vtensor<[2,2,?,8],f32>
        %o = "autosp.all_to_all"(%o2) {concat_dim = 1 : i64, group = "sp", split_dim = 2 : i64}
            : (!torch.vtensor<[2,2,?,8],f32>) -> !torch.vtensor<[2,4,?,8],f32>

        // sp-size=4 strategy=ring (module: autosp.sp_layout = "ulysses=1 ring=4 zigzag")
        %o = "autosp.ring_attention"(%q, %k, %v, %S) {group = "sp:ring", is_causal = 1 : i64,
                 key_padding = 0 : i64, scale = 0.000000e+00 : f64, window = 0 : i64}
                 : (...) -> !torch.vtensor<[2,4,?,8],f32>
    """

    name: ClassVar[str] = "autosp-partition-attention"
    sp_size: int = 2
    group: str = "sp"
    strategy: str = "ulysses"
    ulysses_degree: int = 0
    ring_degree: int = 0
    ranks_per_node: int = 0
    seq_len: int = 0
    recurrence: str = "auto"

    def apply(self, module) -> None:
        if self.recurrence not in RECURRENCE_METHODS:
            raise DiagnosticError.at(as_operation(module), f"recurrence must be one of {', '.join(RECURRENCE_METHODS)}"
                                                           f", got {self.recurrence!r}")
        if self.sp_size < 1:
            raise DiagnosticError.at(as_operation(module), f"sp-size must be >= 1, got {self.sp_size}")
        if self.sp_size == 1:
            return
        info = analyze_sequence(module)
        choice = choose_mesh(module, info, self)
        with module.context:
            as_operation(module).attributes[SP_LAYOUT_ATTR] = ir.StringAttr.get(choice.layout.describe())
            as_operation(module).attributes[SP_CHOICE_ATTR] = ir.StringAttr.get(choice.reason)
        cuts: list[str] = []
        partition_attention(module, info, self.sp_size, self.group, ulysses=choice.ulysses, ring=choice.ring,
                            cuts=cuts)
        if cuts:
            with module.context:
                reason = ir.StringAttr(as_operation(module).attributes[SP_CHOICE_ATTR]).value
                as_operation(module).attributes[SP_CHOICE_ATTR] = ir.StringAttr.get(
                    reason + "; " + "; ".join(dict.fromkeys(cuts)))
        if choice.ring == 1:
            why = partition_recurrences(module, info, self.sp_size, self.group, sequence_length_value(module, info),
                                        self)
            if why:
                with module.context:
                    as_operation(module).attributes[SP_CHOICE_ATTR] = ir.StringAttr.get(
                        choice.reason + "; recurrences: " + "; ".join(why))


RECURRENCE_METHODS = ("auto", "heads", "chain", "prefix")


HEAD_DIM, SEQ_DIM = 1, 2  # of SDPA's [B, H, S, D] operands


def ring_blocker(op, kind: str) -> str | None:
    """Why ring attention cannot run ``op`` (None: it can), read from constants in the IR:
    it needs SDPA whose mask is none (causal or not) or proven documents / a sliding
    window, a constant is_causal and scale, no dropout, and values as wide as the keys."""
    if kind == AttentionKind.MANUAL:
        return "it is softmax attention written out (ring attention runs SDPA)"
    mask = op.operands[3]
    if ops.is_relative_bias_attention(op):
        return "its bias depends on the distance k - q (T5's buckets): each ring pair would read its own band; " \
               "it runs on Ulysses"
    if EMPTY_ROWS_ATTR in op.attributes and not ops.is_sink_attention(op):  # (with sinks: zeros, as the ring)
        return (f"its queries whose keys are all masked attend as eager attention's "
                f"'{ir.StringAttr(op.attributes[EMPTY_ROWS_ATTR]).value}' rule says (a mean over every rank's values); "
                "the ring gives them zeros (SDPA's boolean-mask answer: attn_implementation='sdpa')")
    if DOCUMENTS_ATTR not in op.attributes and KEY_PADDING_ATTR not in op.attributes and not is_none(mask):
        return "its mask is not one autosp-causal-mask proved causal, documents, key padding or a window"
    if WINDOW_ATTR in op.attributes and DOCUMENTS_ATTR in op.attributes:
        return "it combines documents with a sliding window"
    if not is_none(op.operands[4]) and const_float(op.operands[4]) != 0.0:
        return "it has dropout (or a dropout probability that is not the constant 0)"
    if const_bool(op.operands[5]) is None:
        return "its is_causal is not a constant"
    k_shape, v_shape = b.vtensor_shape(op.operands[1].type), b.vtensor_shape(op.operands[2].type)
    if k_shape is not None and v_shape is not None and k_shape[0][-1:] != v_shape[0][-1:]:
        return (f"its values' head dim ({v_shape[0][-1]}) is not its keys' ({k_shape[0][-1]}): the ring's K/V "
                "blocks travel as one (MLA's narrower v runs on Ulysses)")
    if not is_none(op.operands[6]) and const_float(op.operands[6]) is None:
        return "its scale is not a constant"
    return None


def choose_mesh(module, info: SequenceInfo, options: PartitionAttention):
    """The Ulysses x ring mesh for every attention op (one layout for the module):
    :func:`autosp.cost.strategy.choose` on the first op's heads, limited to meshes every op
    can run. A forced strategy no op can run is diagnosed at that op."""
    heads = []
    ring_ok = None
    for op, kind in info.attention:
        q, k = (op.operands[0], op.operands[1]) if kind == AttentionKind.SDPA else (None, None)
        if q is not None:
            heads.append((op, _tensor_shape(op, q, "query")[0][HEAD_DIM], _tensor_shape(op, k, "key")[0][HEAD_DIM]))
        blocker = ring_blocker(op, kind)
        if blocker and ring_ok is None:
            ring_ok = (op, blocker)
    if heads and len({(h, kv) for _, h, kv in heads}) > 1:
        raise DiagnosticError.at(heads[1][0], "has other head counts than the first attention op; autosp lays "
                                             "the sequence out once for the module")
    h, kv = (heads[0][1], heads[0][2]) if heads else (None, None)
    strategy, ring = options.strategy, options.ring_degree
    forced_ring = strategy in ("ring", "hybrid") or ring > 1
    if not info.attention:  # recurrences only: each is priced by partition_recurrences
        why = f" (strategy '{strategy}' has no attention to apply to)" if forced_ring else ""
        return Choice(Candidate(options.sp_size, 1, 1, 0.0, 0.0, 0.0), f"no attention: recurrences only{why}")
    if h is None or kv is None:  # manual attention (or dynamic heads): Ulysses only, as before
        if forced_ring:
            raise DiagnosticError.at(info.attention[0][0], "ring attention needs SDPA with static head counts")
        return Choice(Candidate(options.sp_size, 1, 1, 0.0, 0.0, 0.0), "ulysses: manual attention")
    if strategy == "ulysses" and ring <= 1:  # the heads' checks are partition_sdpa's diagnostics
        return Choice(Candidate(options.sp_size, 1, 1, 0.0, 0.0, 0.0), "ulysses: requested")
    if ring_ok is not None:
        if forced_ring:
            raise DiagnosticError.at(ring_ok[0], f"cannot run as ring attention: {ring_ok[1]}")
        if strategy == "auto":
            strategy = "ulysses"
    head_dim = _tensor_shape(heads[0][0], heads[0][0].operands[0], "query")[0][3] or 128
    try:
        choice = choose(h, kv, options.sp_size, ranks_per_node=options.ranks_per_node or None,
                        seq_len=options.seq_len or 8192, head_dim=head_dim, strategy=strategy,
                        ulysses=options.ulysses_degree, ring=ring)
    except StrategyError as e:
        why = f"; ring attention is ruled out: an attention op: {ring_ok[1]}" if ring_ok is not None else ""
        raise DiagnosticError.at(heads[0][0], str(e) + why) from None
    if ring_ok is not None and options.strategy == "auto":
        choice = type(choice)(choice.best, choice.reason + f"; ring ruled out: an attention op: {ring_ok[1]}",
                              choice.candidates)
    return choice


def _tensor_shape(op, value, what: str) -> tuple[list[int | None], str]:
    """``(dims, dtype)`` of ``value``, which ``op``'s rewrite needs to be a ``!torch.vtensor``."""
    shape = b.vtensor_shape(value.type)
    if shape is None:
        raise DiagnosticError.at(op, f"{what} must be a tensor, got {value.type}")
    return shape


def _check_operand(op, value, what: str, info: SequenceInfo) -> tuple[list, str]:
    shape = b.vtensor_shape(value.type)
    if shape is None or len(shape[0]) != 4:
        raise DiagnosticError.at(op, f"{what} must be a rank-4 [batch, heads, seq, head_dim] tensor, "
                                     f"got {value.type}")
    if info.seq_dims(value) != [SEQ_DIM]:
        raise DiagnosticError.at(op, f"{what} {value.type} does not have the sequence at dim 2 "
                                     f"(sequence dims: {info.seq_dims(value)})")
    if shape[0][HEAD_DIM] is None:
        raise DiagnosticError.at(op, f"{what} has a dynamic head count; Ulysses needs it static")
    return shape


def partition_sdpa(op, info: SequenceInfo, sp_size: int, group: str, seq_len: ir.Value, *,
                   slicer: HeadSlicer | None = None, cuts: list | None = None) -> ir.Operation:
    """Rewrite one SDPA op as all_to_all -> SDPA on H/P heads -> all_to_all; return the new SDPA.
    With ``slicer``, an operand whose heads are cheaper to compute from gathered sources
    (:func:`cheaper_cut`) is computed so instead of all-to-all'd."""
    q, k, v, mask = op.operands[0], op.operands[1], op.operands[2], op.operands[3]
    (q_shape, dtype), (k_shape, _), (v_shape, _) = (_check_operand(op, x, n, info)
                                                    for x, n in ((q, "query"), (k, "key"), (v, "value")))
    heads, kv_heads = q_shape[HEAD_DIM], k_shape[HEAD_DIM]
    if heads % sp_size:
        raise DiagnosticError.at(op, f"query heads ({heads}) are not divisible by sp-size {sp_size}: "
                                     "Ulysses attention gives each rank heads/sp-size heads")
    per_head_mask = False
    if not is_none(mask):
        # Inside Ulysses attention queries and keys are whole, so a [.., S, S] mask is used
        # whole; a per-head mask (T5's position bias) is cut to the rank's heads.
        mask_shape = b.vtensor_shape(mask.type)
        per_head_mask = mask_shape is not None and len(mask_shape[0]) == 4 and mask_shape[0][HEAD_DIM] == heads
        if mask_shape is None or (len(mask_shape[0]) == 4 and mask_shape[0][HEAD_DIM] not in (1, heads)):
            raise DiagnosticError.at(op, f"has an attn_mask {mask.type} whose head dim neither holds the {heads} "
                                         "query heads nor broadcasts over them")
    repeat = 1
    if kv_heads % sp_size:
        if sp_size % kv_heads:
            raise DiagnosticError.at(op, f"key/value heads ({kv_heads}) neither divide nor are divisible by "
                                         f"sp-size {sp_size}")
        repeat = sp_size // kv_heads
    cut: dict = {}
    if slicer is not None and repeat == 1:
        chosen, why = cheaper_cut(op, info, sp_size, slicer, (heads, kv_heads, kv_heads))
        cut = {x: slicer.build(x, Axis(HEAD_DIM, h), op) for x, h in chosen.items()}
        if why and cuts is not None:
            cuts.append(why)

    with ir.InsertionPoint(op), op.location:
        def repeated_kv(x):
            """``(source, reps)`` when ``x`` = repeat_kv(source) and the all-to-all can move source."""
            found = repeated_heads(x)
            if found is None or not _is_bhsd(found[0], info):
                return None
            source, reps = found
            src = b.vtensor_shape(source.type)
            assert src is not None  # a [B, H, S, D] value (_is_bhsd)
            src_shape = src[0]
            heads = src_shape[HEAD_DIM]
            if heads is None or heads % sp_size or repeat != 1:
                return None
            return source, src_shape, reps

        def to_heads(x, shape, reps):
            if x in cut:  # computed on this rank's heads from gathered sources
                return cut[x]
            found = repeated_kv(x) if reps == 1 and x is not q else None
            if found is not None:
                source, src_shape, kv_reps = found
                local_src = [src_shape[0], src_shape[1] // sp_size, None, src_shape[3]]
                moved = b.autosp_op(ALL_TO_ALL, [source, seq_len], b.vtensor_type(local_src, dtype),
                                    split_dim=HEAD_DIM, concat_dim=SEQ_DIM, seq_dim=SEQ_DIM, group=group)
                local = [shape[0], shape[1] // sp_size, None, shape[3]]
                return ir.Operation.create("torch.aten.repeat_interleave.self_int",
                                           results=[b.vtensor_type(local, dtype)],
                                           operands=[moved, b.constant_int(kv_reps), b.constant_int(HEAD_DIM),
                                                     b.constant_none()]).result
            if reps > 1:
                rep = b.constant_int(reps)
                dim = b.constant_int(HEAD_DIM)
                shape = [shape[0], shape[1] * reps, shape[2], shape[3]]
                x = ir.Operation.create("torch.aten.repeat_interleave.self_int",
                                        results=[b.vtensor_type(shape, dtype)],
                                        operands=[x, rep, dim, b.constant_none()]).result
            local = [shape[0], shape[1] // sp_size, None, shape[3]]
            return b.autosp_op(ALL_TO_ALL, [x, seq_len], b.vtensor_type(local, dtype), split_dim=HEAD_DIM,
                               concat_dim=SEQ_DIM, seq_dim=SEQ_DIM, group=group)

        new_operands = [to_heads(q, q_shape, 1), to_heads(k, k_shape, repeat), to_heads(v, v_shape, repeat)]
        new_operands += list(op.operands[3:])
        if per_head_mask:
            new_operands[3] = _local_heads(op, mask, HEAD_DIM, heads, sp_size, group)
        out_shape, out_dtype = _tensor_shape(op, op.results[0], "the result")
        out_heads = out_shape[HEAD_DIM]
        if out_heads is None:
            raise DiagnosticError.at(op, f"result {op.results[0].type} has a dynamic head count; Ulysses needs it "
                                         "static")
        local_out = [out_shape[0], out_heads // sp_size, None, out_shape[3]]
        attrs = {n: op.attributes[n] for n in op.attributes}
        if ops.is_sink_attention(op):  # the sinks stay [H]: each rank reads its heads' chunk
            attrs[SINK_HEADS_ATTR] = ir.StringAttr.get(group)
        if ops.is_relative_bias_attention(op):  # the table [buckets, H]: this rank's heads of it
            new_operands[8] = _local_heads(op, op.operands[8], 1, heads, sp_size, group)
        if ops.is_key_bias_attention(op):  # the bias, whole on every rank: this rank's heads of it
            bias_shape = b.vtensor_shape(op.operands[8].type)
            if bias_shape is not None and bias_shape[0][HEAD_DIM] == heads:
                new_operands[8] = _local_heads(op, op.operands[8], HEAD_DIM, heads, sp_size, group)
        attention = ir.Operation.create(op_name(op), results=[b.vtensor_type(local_out, out_dtype)],
                                        operands=new_operands, attributes=attrs)
    with ir.InsertionPoint.after(attention), op.location:
        back = b.autosp_op(ALL_TO_ALL, attention.result,
                           b.vtensor_type([out_shape[0], out_shape[1], None, out_shape[3]], out_dtype),
                           split_dim=SEQ_DIM, concat_dim=HEAD_DIM, seq_dim=SEQ_DIM, group=group)
    # `back` has the old result's type ([B, H, S, D]), so its shape bindings stay valid.
    op.results[0].replace_all_uses_with(back)
    op.erase()
    return attention


def cheaper_cut(op, info: SequenceInfo, sp_size: int, slicer: HeadSlicer, heads: tuple) -> tuple[dict, str]:
    """``({operand: its head count}, why)`` for the q, k, v of SDPA ``op`` that cost fewer
    bytes computed on each rank's heads from gathered sources (:meth:`HeadSlicer.sources`)
    than all-to-all'd, priced by :func:`autosp.cost.strategy.choose_cut`; ``({}, "")``
    where none does (or the sizes are not known)."""
    named = dict(zip("qkv", op.operands[:3]))
    sizes = {n: bytes_per_token(x, info) for n, x in named.items()}
    sizes["o"] = bytes_per_token(op.results[0], info)
    if None in sizes.values():
        return {}, ""
    labels: dict = {}
    sources: dict = {}
    for (n, x), h in zip(named.items(), heads):
        got = slicer.sources(x, Axis(HEAD_DIM, h))
        if got:
            sources[n] = {labels.setdefault(s, _label(s, labels)): bytes_per_token(s, info) for s in got}
    if not sources:
        return {}, ""
    choice = choose_cut(sizes, sources, sp_size)  # type: ignore[arg-type]
    if not choice.cut:
        return {}, ""
    return {named[n]: h for n, h in zip("qkv", heads) if n in choice.cut}, choice.reason


def _label(value, taken: dict) -> str:
    """A source's name in ``autosp.sp_choice``: its shape and dtype (``[2,?,16]xf32``), numbered
    when another source has the same."""
    dims, dtype = b.vtensor_shape(value.type)  # type: ignore[misc]
    label = "[" + ",".join("?" if d is None else str(d) for d in dims) + f"]x{dtype}"
    same = sum(1 for other in taken.values() if other.split(" #")[0] == label)
    return label if not same else f"{label} #{same + 1}"


def to_ring(op, group: str, seq_len: ir.Value) -> None:
    """Replace SDPA ``op`` (which :func:`ring_blocker` accepted) by ``autosp.ring_attention``
    on the same (sharded) operands."""
    q, k, v, mask = op.operands[0], op.operands[1], op.operands[2], op.operands[3]
    causal = bool(const_bool(op.operands[5]))
    window = ir.IntegerAttr(op.attributes[WINDOW_ATTR]).value if WINDOW_ATTR in op.attributes else 0
    scale = const_float(op.operands[6]) or 0.0  # (none: 0.0, the op's spelling of 1/sqrt(D))
    padded = KEY_PADDING_ATTR in op.attributes
    masks = [mask] if DOCUMENTS_ATTR in op.attributes or padded else []
    sinks = [op.operands[8]] if ops.is_sink_attention(op) else []
    bias = [op.operands[8]] if ops.is_key_bias_attention(op) else []
    with ir.InsertionPoint(op), op.location:
        ring = b.autosp_op(RING_ATTENTION, [q, k, v, seq_len] + masks + sinks + bias, op.results[0].type,
                           is_causal=int(causal), window=window, scale=float(scale), group=group,
                           key_padding=int(padded))
        ring.owner.attributes["operandSegmentSizes"] = ir.DenseI32ArrayAttr.get(
            [1, 1, 1, 1, len(masks), len(sinks), len(bias)])
    if SINK_HEADS_ATTR in op.attributes:  # (hybrid: this rank's Ulysses heads)
        ring.owner.attributes[SINK_HEADS_ATTR] = op.attributes[SINK_HEADS_ATTR]
    op.results[0].replace_all_uses_with(ring)
    op.erase()


def gated_delta_rule_heads(op, sp_size: int) -> bool:
    """Can the Gated DeltaNet op run Ulysses-style, each rank on its heads over the whole
    sequence: q, k [B, S, Hk, dk], v [B, S, Hv, dv], g and beta [B, S, Hv], with both Hk and
    Hv static and divisible by ``sp_size`` (value head j reads key head j // (Hv / Hk), so
    contiguous chunks of both line up)."""
    shapes = [b.vtensor_shape(v.type) for v in op.operands[:5]]
    if any(s is None for s in shapes):
        return False
    ranks = [len(s[0]) for s in shapes if s is not None]
    heads = [s[0][2] for s in shapes if s is not None and len(s[0]) > 2]
    return ranks == [4, 4, 4, 3, 3] and all(h is not None and h % sp_size == 0 for h in heads)


def recurrence_documents(op) -> bool:
    """Does the Gated DeltaNet op restart at packed documents (its ``starts`` operand, 8)?"""
    if ops.operator_name(op) != ops.GATED_DELTA_RULE or len(op.operands) < 9:
        return False
    owner = op.operands[8].owner
    return isinstance(owner, ir.Block) or op_name(owner) != "torch.constant.none"


def recurrence_shape(op) -> RecurrenceShape | None:
    """The sizes :mod:`autosp.cost.recurrence` prices, read from a stated recurrence op
    (static head counts and dims; None where one is not static)."""
    name = ops.operator_name(op)
    first = b.vtensor_shape(op.operands[0].type)
    if first is None:
        return None
    elem = 2 if "bf16" in first[1] or "f16" in first[1] else 8 if "f64" in first[1] else 4
    if name == ops.SELECTIVE_SCAN:  # x [B, S, D], dt, A [D, N]
        a = b.vtensor_shape(op.operands[2].type)
        channels, state = (a[0] if a is not None and len(a[0]) == 2 else (None, None))
        if channels is None or state is None:
            return None
        return RecurrenceShape(MAMBA1, channels, channels, state, 1, 1, elem)
    dims = [b.vtensor_shape(v.type) for v in op.operands[:3]]
    if any(d is None or len(d[0]) != 4 for d in dims):
        return None
    (q, _), (k, _), (v, _) = dims  # type: ignore[misc]
    if name == ops.GATED_DELTA_RULE:
        sizes, chunk = (v[2], k[2], q[3], v[3]), const_int(op.operands[6])
        kind = GATED_DELTA_NET
    elif name == ops.MAMBA2_CHUNK_SCAN:  # x [B, S, H, hd], dt, B [B, S, G, N]
        groups = b.vtensor_shape(op.operands[2].type)
        if groups is None or len(groups[0]) != 4:
            return None
        sizes, chunk = (q[2], groups[0][2], groups[0][3], q[3]), const_int(op.operands[7])
        kind = MAMBA2
    elif name == ops.LIGHTNING_ATTENTION:  # q, k, v [B, S, H, D], slope, block
        sizes, chunk = (q[2], k[2], q[3], v[3]), const_int(op.operands[4])
        kind = LIGHTNING
    else:  # (mLSTM runs as a chain)
        return None
    if any(x is None for x in sizes) or chunk is None:
        return None
    heads, k_heads, key_dim, value_dim = sizes
    return RecurrenceShape(kind, heads, k_heads, key_dim, value_dim, chunk, elem)  # type: ignore[arg-type]


def partition_recurrences(module, info: SequenceInfo, sp_size: int, group: str, seq_len,
                          options: PartitionAttention | None = None) -> list[str]:
    """How each stated recurrence runs on ``sp_size`` ranks, priced
    (:func:`autosp.cost.recurrence.choose_recurrence`; ``options.recurrence`` forces
    one): **heads** rewrites a Gated DeltaNet op whose heads divide over the ranks
    (:func:`gated_delta_rule_heads`) to run on each rank's heads over the whole sequence,
    an all-to-all to heads for each input, the kernel as it is, an all-to-all back;
    **chain** and **prefix** leave the op to ``autosp-shard-sequence``, with the method in
    ``autosp.scan_method``. All three are exact. An op that restarts at packed documents
    (its ``starts`` operand) runs as a chain, whatever was asked. Returns the reasons, one
    per op."""
    forced = options.recurrence if options is not None else "auto"
    why = []
    for op in [o for o in body_ops(main_func(module)) if op_name(o) == "torch.operator"
               and ops.operator_name(o) in ops.RECURRENCE_OPERATORS]:
        documents = recurrence_documents(op)
        heads_ok = ops.operator_name(op) == ops.GATED_DELTA_RULE and seq_len is not None and not documents and \
            gated_delta_rule_heads(op, sp_size) and all(info.seq_dims(v) == [1] for v in op.operands[:5])
        shape = recurrence_shape(op)
        if documents:  # the prefix's summaries assume no restart; heads would need the whole starts
            method, reason = "chain", f"{ops.operator_name(op)}: chain (packed documents restart its state" + \
                ("" if forced in ("auto", "chain") else f"; not {forced}, as requested") + ")"
        elif forced != "auto":
            if forced == "heads" and not heads_ok:
                raise DiagnosticError.at(op, f"cannot run on each rank's heads (recurrence=heads): it needs a Gated "
                                             f"DeltaNet op whose key and value heads are static and divide by "
                                             f"{sp_size}")
            if forced == "prefix" and ops.operator_name(op) == ops.MLSTM:
                raise DiagnosticError.at(op, "cannot run as a prefix (recurrence=prefix): xLSTM's mLSTM is not linear "
                                             "in its state (its max stabilizer); it runs as a chain")
            method, reason = forced, f"{ops.operator_name(op)}: {forced} (requested)"
        elif ops.operator_name(op) == ops.MLSTM:
            method, reason = "chain", f"{ops.operator_name(op)}: chain (the only way: its max stabilizer is not " \
                                      "linear in the state)"
        elif shape is None:
            method, reason = ("heads" if heads_ok else "chain"), f"{ops.operator_name(op)}: sizes not static, " \
                                                                   "not priced"
        else:
            choice = choose_recurrence(shape, sp_size, heads_ok=heads_ok,
                                       seq_len=(options.seq_len if options is not None else 0) or 8192,
                                       ranks_per_node=(options.ranks_per_node if options is not None else 0) or None)
            method, reason = choice.method, choice.reason
        why.append(reason)
        if method != "heads":
            with op.context:
                op.attributes[SCAN_METHOD_ATTR] = ir.StringAttr.get(method)
            continue
        _to_heads(op, sp_size, group, seq_len)
    return why


def _to_heads(op, sp_size: int, group: str, seq_len) -> None:
    """The Gated DeltaNet op on this rank's heads over the whole sequence (see above)."""
    with ir.InsertionPoint(op), op.location:
        moved = []
        for v in op.operands[:5]:
            dims, dtype = b.vtensor_shape(v.type)  # type: ignore[misc]
            h = dims[2]
            assert h is not None  # gated_delta_rule_heads read it
            local = [dims[0], None, h // sp_size] + list(dims[3:])
            moved.append(b.autosp_op(ALL_TO_ALL, [v, seq_len], b.vtensor_type(local, dtype), split_dim=2,
                                     concat_dim=1, seq_dim=1, group=group))
        out_dims, out_dtype = b.vtensor_shape(op.results[0].type)  # type: ignore[misc]
        out_heads = out_dims[2]
        assert out_heads is not None  # the value's heads (static, as read above)
        local_out = [out_dims[0], None, out_heads // sp_size, out_dims[3]]
        attrs = {n: op.attributes[n] for n in op.attributes}
        heads = ir.Operation.create("torch.operator", results=[b.vtensor_type(local_out, out_dtype)],
                                    operands=moved + list(op.operands[5:]), attributes=attrs)
    with ir.InsertionPoint.after(heads), op.location:
        back = b.autosp_op(ALL_TO_ALL, [heads.result, seq_len], op.results[0].type, split_dim=1, concat_dim=2,
                           seq_dim=1, group=group)
    op.results[0].replace_all_uses_with(back)
    op.erase()


def partition_attention(module, info: SequenceInfo, sp_size: int, group: str = "sp", *, ulysses: int = 0,
                        ring: int = 1, cuts: list | None = None) -> int:
    """Partition every attention op found by the analysis on a ``ulysses x ring`` mesh
    (default: Ulysses over all ``sp_size`` ranks); return how many were rewritten.
    With ``ring > 1`` the all-to-alls run on the ``<group>:ulysses`` sub-group and
    attention becomes ``autosp.ring_attention`` on ``<group>:ring``. On a Ulysses mesh
    q, k or v may cross the ranks as a smaller source (:mod:`autosp.passes.head_cut`);
    the reasons are appended to ``cuts``."""
    ulysses = ulysses or sp_size // ring
    count = 0
    seq_len = sequence_length_value(module, info) if info.attention else None
    a2a_group = group if ring == 1 else f"{group}:ulysses"
    slicer = HeadSlicer(module, info, ulysses, a2a_group, seq_len) if ring == 1 and seq_len is not None else None
    for op, kind in info.attention:
        if kind == AttentionKind.MANUAL:
            partition_manual(op, info, ulysses, a2a_group, seq_len)
        elif ring == 1:
            partition_sdpa(op, info, ulysses, a2a_group, seq_len, slicer=slicer, cuts=cuts)
        else:
            if ulysses > 1:
                op = partition_sdpa(op, info, ulysses, a2a_group, seq_len)
            to_ring(op, f"{group}:ring", seq_len)
        count += 1
    return count


# ----------------------------------------------------------------------------- manual attention


def _is_bhsd(value, info: SequenceInfo) -> bool:
    shape = b.vtensor_shape(value.type)
    return shape is not None and len(shape[0]) == 4 and info.seq_dims(value) == [SEQ_DIM]


def _trace_back(value, info: SequenceInfo, attention_op, what: str):
    """From a matmul operand back through reshapes to the [B, H, S, D] tensor it came from."""
    while not _is_bhsd(value, info):
        op = producer(value)
        if op is None or op_name(op) not in ops.ATTENTION_RESHAPES:
            raise DiagnosticError.at(attention_op, f"is softmax attention whose {what} does not come from a "
                                                   "[batch, heads, seq, head_dim] tensor autosp can find")
        value = op.operands[0]
    return value


def _chain_back_to_matmul(value, info: SequenceInfo, attention_op, depth: int = 12):
    """From the softmax input back to the score matmul (through scale, mask, reshapes):
    a depth-first search over the operands that carry two sequence dims."""
    op = producer(value)
    if op is not None and depth > 0:
        if op_name(op) in ops.ATTENTION_MATMULS:
            return op
        for v in op.operands:
            if len(info.seq_dims(v)) >= 2:
                try:
                    return _chain_back_to_matmul(v, info, attention_op, depth - 1)
                except DiagnosticError:
                    continue
    raise DiagnosticError.at(attention_op, "is softmax attention whose scores do not come from a matmul")


def _chain_forward_to_matmul(value, info: SequenceInfo, attention_op, depth: int = 16):
    """From the softmax result forward to the matmul with the values (through casts,
    dropout, reshapes): a depth-first search over users that keep two sequence dims."""
    if depth > 0:
        for op in users(value):
            if op_name(op) in ops.ATTENTION_MATMULS and op.operands[0] == value:
                return op
            for r in op.results:
                if len(info.seq_dims(r)) >= 2 or op_name(op) in ops.ATTENTION_RESHAPES:
                    try:
                        return _chain_forward_to_matmul(r, info, attention_op, depth - 1)
                    except DiagnosticError:
                        continue
    raise DiagnosticError.at(attention_op, "is softmax attention whose probabilities do not reach a matmul "
                                           "with the values")


def _trace_forward(value, info: SequenceInfo, attention_op):
    """From the output matmul forward through reshapes to the [B, H, S, D] output."""
    while not _is_bhsd(value, info):
        found = users(value)
        if len(found) != 1 or op_name(found[0]) not in ops.ATTENTION_RESHAPES:
            raise DiagnosticError.at(attention_op, "is softmax attention whose output does not return to a "
                                                   "[batch, heads, seq, head_dim] tensor")
        value = found[0].results[0]
    return value


def partition_manual(softmax, info: SequenceInfo, sp_size: int, group: str, seq_len: ir.Value) -> None:
    """Ulysses around matmul -> (scale, mask) -> softmax -> matmul, written out by the model.

    Finds q, k, v and the output as the [B, H, S, D] tensors around the two matmuls,
    exchanges them like SDPA's operands, and divides the head count (H, or B*H in the
    batched-matmul form) by P in every op between them. Masks and biases that reach the
    scores replicated keep the full sequence (queries and keys are whole in there).
    """
    scores_mm = _chain_back_to_matmul(softmax.operands[0], info, softmax)
    pv_mm = _chain_forward_to_matmul(softmax.results[0], info, softmax)
    q = _trace_back(scores_mm.operands[0], info, softmax, "query")
    k = _trace_back(scores_mm.operands[1], info, softmax, "key")
    v = _trace_back(pv_mm.operands[1], info, softmax, "value")
    out = _trace_forward(pv_mm.results[0], info, softmax)
    (q_shape, dtype) = _tensor_shape(softmax, q, "query")
    batch, heads = q_shape[0], q_shape[HEAD_DIM]
    for x, what in ((k, "key"), (v, "value")):
        x_heads = _tensor_shape(softmax, x, what)[0][HEAD_DIM]
        if x_heads != heads:
            raise DiagnosticError.at(softmax, f"is softmax attention with {what} heads "
                                              f"({x_heads}) unlike query heads ({heads}); "
                                              "repeat the key/value heads in the model, or use SDPA")
    if heads is None or batch is None:
        raise DiagnosticError.at(softmax, "is softmax attention with a dynamic batch or head count")
    if heads % sp_size:
        raise DiagnosticError.at(softmax, f"query heads ({heads}) are not divisible by sp-size {sp_size}: "
                                          "Ulysses attention gives each rank heads/sp-size heads")

    # The ops between q/k/v and the output: reachable from the inputs and reaching the output.
    block_ops = [op.operation for op in softmax.operation.block.operations]
    index = {op: i for i, op in enumerate(block_ops)}
    forward = set()
    frontier = [q, k, v]
    while frontier:
        val = frontier.pop()
        for use in val.uses:
            user = use.owner.operation
            if user not in forward and index.get(user, -1) <= index[out.owner.operation]:
                forward.add(user)
                frontier.extend(user.results)
    backward, frontier = set(), [out.owner.operation]
    while frontier:
        op = frontier.pop()
        if op in backward or op not in forward:
            continue
        backward.add(op)
        frontier.extend(producer(x) for x in op.operands if producer(x) is not None)
    # `backward` holds producers of `out` (values of @main's flat block), so every op has an index.
    region = sorted(backward, key=lambda op: index[op])
    region_results = {r for op in region for r in op.results}

    def to_heads(x):
        found = b.vtensor_shape(x.type)
        assert found is not None  # a [B, H, S, D] value
        shape, dt = found
        heads = shape[1]
        assert heads is not None  # static heads (checked before the rewrite)
        local = [shape[0], heads // sp_size, None, shape[3]]
        with ir.InsertionPoint.after(x.owner) if not isinstance(x.owner, ir.Block) else \
                ir.InsertionPoint(block_ops[0]), softmax.location:
            y = b.autosp_op(ALL_TO_ALL, [x, seq_len], b.vtensor_type(local, dt), split_dim=HEAD_DIM,
                            concat_dim=SEQ_DIM, seq_dim=SEQ_DIM, group=group)
        for use in list(x.uses):
            if use.owner.operation in backward:
                use.owner.operands[use.operand_number] = y

    for x in {q: None, k: None, v: None}:
        to_heads(x)
    for op in region:
        for r in op.results:
            r.set_type(_divide_heads(r.type, batch, heads, sp_size))
        if op_name(op) in ops.SIZE_LIST_OPS:
            _divide_heads_in_list(op, batch, heads, sp_size)
        for i, operand in enumerate(op.operands):
            if operand in region_results or (producer(operand) is not None and
                                             op_name(producer(operand)) == ALL_TO_ALL):
                continue
            dim = _per_head_dim(op, operand, batch, heads)
            if dim is not None:  # a per-head bias from outside: this rank's heads of it
                op.operands[i] = _local_heads(op, operand, dim, heads, sp_size, group)
    out_shape, out_dtype = _tensor_shape(softmax, out, "the attention output")
    with ir.InsertionPoint.after(out.owner), softmax.location:
        back = b.autosp_op(ALL_TO_ALL, [out], b.vtensor_type([batch, heads, None, out_shape[3]], out_dtype),
                           split_dim=SEQ_DIM, concat_dim=HEAD_DIM, seq_dim=SEQ_DIM, group=group)
    out.replace_all_uses_except(back, back.owner.operation)


def _per_head_dim(op, operand, batch: int, heads: int) -> int | None:
    """The dim of ``operand`` (from outside the attention region, replicated) that meets the
    heads of ``op``'s result, where it holds them (``heads``, or ``batch * heads`` in the
    folded ``[B * H, S, S]`` form); None where it broadcasts over them (size 1) or the
    operand is no tensor of at least that rank. Another size there is an error."""
    shape, result = b.vtensor_shape(operand.type), b.vtensor_shape(op.results[0].type) if op.results else None
    if shape is None or result is None or len(result[0]) not in (3, 4):
        return None
    at = len(shape[0]) - (len(result[0]) - (HEAD_DIM if len(result[0]) == 4 else 0))  # aligned from the right
    if at < 0:
        return None
    size = shape[0][at]
    if size == 1:
        return None
    if size == (heads if len(result[0]) == 4 else batch * heads):
        return at
    raise DiagnosticError.at(op, f"mixes a tensor {operand.type} from outside attention into the scores whose dim "
                                 f"{at} ({size}) neither holds the {heads} heads nor broadcasts over them")


def _local_heads(op, operand, dim: int, heads: int, sp_size: int, group: str) -> ir.Value:
    """``autosp.local_heads`` of ``operand`` before ``op``: this rank's heads (a new value per use)."""
    shape, dtype = b.vtensor_shape(operand.type)  # type: ignore[misc]
    local = list(shape)
    local[dim] = shape[dim] // sp_size  # type: ignore[operator]
    with ir.InsertionPoint(op), op.location:
        return b.autosp_op(LOCAL_HEADS, [operand], b.vtensor_type(local, dtype), dim=dim, heads=heads, group=group)


def _divide_heads(type_, batch: int, heads: int, p: int):
    shape = b.vtensor_shape(type_)
    if shape is None:
        return type_
    dims, dtype = shape
    if len(dims) == 4 and dims[HEAD_DIM] == heads:
        dims = [dims[0], heads // p, *dims[2:]]
    elif len(dims) == 3 and dims[0] == batch * heads:
        dims = [batch * heads // p, *dims[1:]]
    return b.vtensor_type(dims, dtype)


def _divide_heads_in_list(op, batch: int, heads: int, p: int) -> None:
    lst = op.operands[1]
    owner = producer(lst)
    if owner is None or op_name(owner) != ops.LIST_CONSTRUCT:
        return
    items = list(owner.operands)
    if len(items) == 4:
        position, value = 1, heads
    elif len(items) == 3:
        position, value = 0, batch * heads
    else:
        return
    if const_int(items[position]) != value:
        return
    with ir.InsertionPoint(op), op.location:
        items[position] = b.constant_int(value // p)
        op.operands[1] = ir.Operation.create("torch.prim.ListConstruct", results=[lst.type], operands=items).result

