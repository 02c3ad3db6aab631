"""The IR contract: every ``autosp.*`` op and attribute name, and the values they take.

Passes write these names, the backend and the runtime read them, the API reports them:
each is spelled here once, registered in :data:`OPS` or :data:`ATTRIBUTES` (what it is
on, the kind of its value, what it means). An attribute whose value is one of a fixed set
of strings has a :class:`Token` enum: its members are ``str``, equal to the attribute
text, so ``ir.StringAttr.get(EmptyRows.UNIFORM.value)`` prints ``"uniform"`` and a value
read back compares equal to the member. The dialect's ops are defined (with their own
operand attributes: ``group``, ``dim``, ...) in ``autosp/dialect/autosp.irdl.mlir``.

Pure data: nothing here imports MLIR or torch, so the runtime reads it too.

Example::

    >>> from autosp.ir import contract
    >>> contract.ALL_TO_ALL
    'autosp.all_to_all'
    >>> contract.EmptyRows("uniform") is contract.EmptyRows.UNIFORM, str(contract.EmptyRows.MEAN)
    (True, 'mean')
    >>> contract.ATTRIBUTES[contract.WINDOW_ATTR].value
    'i64'
    >>> contract.plan_key(contract.SEGMENT_ATTR)   # the torch.fx node.meta key the backend uses
    'autosp_segment'
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PREFIX = "autosp."  # the dialect's namespace: every name below starts with it


class Token(str, Enum):
    """A fixed set of attribute strings: members are ``str`` and print as their value."""

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Op:
    """An op of the autosp dialect."""

    name: str
    meaning: str


@dataclass(frozen=True)
class Attribute:
    """An ``autosp.*`` attribute: ``on`` what it sits (an op, ``@main``, one of its
    arguments, the module), ``value`` its kind (``unit``, ``i64``, ``string``, ``strings``
    (one per dim), ``i64 array``), ``allowed`` its values where they are a fixed set."""

    name: str
    on: str
    value: str
    meaning: str
    allowed: type[Token] | None = None


OPS: dict[str, Op] = {}
ATTRIBUTES: dict[str, Attribute] = {}


def _op(name: str, meaning: str) -> str:
    OPS[name] = Op(name, meaning)
    return name


def _attr(name: str, on: str, value: str, meaning: str, allowed: type[Token] | None = None) -> str:
    ATTRIBUTES[name] = Attribute(name, on, value, meaning, allowed)
    return name


# ---------------------------------------------------------------- ops (autosp.irdl.mlir)
ALL_TO_ALL = _op("autosp.all_to_all", "Ulysses: split one dim over the group, concatenate another")
ALL_GATHER = _op("autosp.all_gather", "every rank's part concatenated along a dim: replicated")
ALL_REDUCE = _op("autosp.all_reduce", "element-wise reduction over the group: replicated")
REDUCE_SCATTER = _op("autosp.reduce_scatter", "reduce over the group, keep this rank's chunk")
SHARD = _op("autosp.shard", "replicated -> this rank's chunk of a sequence window, no communication")
REWINDOW = _op("autosp.rewindow", "a shard narrowed to a window inside its own (a sequence slice)")
LOCAL_LEN = _op("autosp.local_len", "this rank's length of a sequence window")
MASKED_SCATTER = _op("autosp.masked_scatter",
                     "masked_scatter of a replicated source into sharded values: each rank takes its rows")
GRAD_SHARE = _op("autosp.grad_share",
                 "identity forward; backward 1/P of the gradient: a value every rank computes whole")
LOCAL_HEADS = _op("autosp.local_heads", "replicated -> this rank's block of heads of a per-head tensor mixed into "
                  "Ulysses attention (a position bias), no communication")
HALO = _op("autosp.halo", "a shard with the positions before it prepended: a causal convolution's input")
VOCAB_LOGPROB = _op("autosp.vocab_logprob", "the LM head's log-probability of each label, in row chunks")
LOCAL_POSITIONS = _op("autosp.local_positions",
                      "positions of a window -> this rank's local rows (its length where another rank holds one)")
SEQ_SOFTMAX = _op("autosp.softmax", "softmax / log_softmax along the sharded sequence dim, over the group")
SEQ_LOGSUMEXP = _op("autosp.logsumexp", "logsumexp along the sharded sequence dim, over the group: replicated")
SEQ_AMAX = _op("autosp.amax", "amax along the sharded sequence dim, over the group: replicated")
SEQ_ARGMAX = _op("autosp.argmax", "argmax along the sharded sequence dim, over the group: replicated positions")
RING_ATTENTION = _op("autosp.ring_attention", "softmax attention with K/V blocks travelling a ring")


# ---------------------------------------------------------------- values of a fixed set
class EmptyRows(Token):
    """``autosp.empty_rows``: what a query whose keys are all masked attends to (instead of
    SDPA's zeros), as the eager attention the compiler replaced gave it."""

    MEAN = "mean"  # masked_fill(~mask, finfo.min): the mean of the values, gradient to the values only
    UNIFORM = "uniform"  # an additive mask of a finite constant: the same, with the gradient through the scores


class AttentionKind(Token):
    """``autosp.attention``: how the sequence analysis found an attention op."""

    SDPA = "sdpa"  # torch.aten.scaled_dot_product_attention
    MANUAL = "manual"  # a softmax over [..., S, S] scores (matmul -> softmax -> matmul)


class ArgKind(Token):
    """What an argument of ``@main`` is (its attribute: :data:`ARG_ATTRS`)."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"


class LayoutField(Token):
    """The words of ``autosp.sp_layout`` (``"ulysses=2 ring=2 zigzag"``)."""

    ULYSSES = "ulysses"  # ulysses=<degree>
    RING = "ring"  # ring=<degree>
    ZIGZAG = "zigzag"  # (no value) ring pieces in the zigzag order


# ---------------------------------------------------------------- attributes
# @main's arguments (frontend), and the sequence analysis' notes (autosp-annotate-sequence).
PARAMETER_ATTR = _attr("autosp.parameter", "argument", "string", "a parameter: its qualified name")
BUFFER_ATTR = _attr("autosp.buffer", "argument", "string", "a buffer: its qualified name")
INPUT_ATTR = _attr("autosp.input", "argument", "string", "a call input: its path (\"kwargs['labels']\")")
ARG_ATTRS = {ArgKind.PARAMETER: PARAMETER_ATTR, ArgKind.BUFFER: BUFFER_ATTR, ArgKind.INPUT: INPUT_ATTR}
SEQ_DIM_ATTR = _attr("autosp.seq_dim", "argument", "i64", "the input's sequence dim")
SEQ_ATTR = _attr("autosp.seq", "op", "strings", "the result's length in S per dim (\"_\": none), or a size's")
ATTENTION_ATTR = _attr("autosp.attention", "op", "string", "an attention op of the analysis", AttentionKind)

# Attention (SDPA) masks: autosp-causal-mask, autosp-fuse-attention.
WINDOW_ATTR = _attr("autosp.window", "sdpa", "i64", "with is_causal: keys restricted to q - W < k <= q")
KEPT_MASK_ATTR = _attr("autosp.mask_kept", "sdpa", "string", "why the mask could not be proven (it stays)")
KEY_PADDING_ATTR = _attr("autosp.key_padding", "sdpa", "unit",
                         "with is_causal: the mask operand is a [B, 1, 1, S] key padding mask, and-ed with it")
DOCUMENTS_ATTR = _attr("autosp.documents", "sdpa", "unit",
                       "with is_causal: the mask operand is [B, 1, 1, S] document ids; attention stays inside one")
EMPTY_ROWS_ATTR = _attr("autosp.empty_rows", "sdpa", "string",
                        "a query whose keys are all masked attends as eager attention did", EmptyRows)
SINK_HEADS_ATTR = _attr("autosp.sink_heads", "sdpa", "string",
                        "sink attention on this rank's heads: the group whose rank picks its chunk of the [H] sinks")
SCAN_GROUP_ATTR = _attr("autosp.scan_group", "op", "string",
                        "a recurrence along the sequence run over this group's ranks, each its part in sequence order")
SCAN_METHOD_ATTR = _attr("autosp.scan_method", "op", "string",
                         "how: 'chain' (each rank from the previous rank's state, one after another) or 'prefix' (all "
                         "at once from the identity, summaries all-gathered and composed); absent: chain")
UNFUSED_ATTR = _attr("autosp.unfused_attention", "softmax", "string",
                     "why softmax attention could not be fused into SDPA (its [S, S] scores stay)")

# Partitioning: autosp-partition-attention (on the module), autosp-tile-loss (on @main).
SP_LAYOUT_ATTR = _attr("autosp.sp_layout", "module", "string",
                       "the SeqLayout the runtime lays the sequence out in", LayoutField)
SP_CHOICE_ATTR = _attr("autosp.sp_choice", "module", "string", "the strategy chosen, and why")
BUFFER_WRITES_ATTR = _attr("autosp.buffer_writes", "@main", "i64 array",
                           "the leading results are new values of buffers: the argument each is written to")
SHARDED_RESULTS_ATTR = _attr("autosp.sharded_results", "@main", "i64 array",
                             "the results each rank returns its sequence shard of (gradients outside the call are "
                             "shares)")
DROPPED_ATTR = _attr("autosp.dropped_results", "@main", "i64 array", "results removed by autosp-tile-loss")

# The memory plan: autosp-checkpoint, autosp-tile-tokens. The backend copies each onto
# the op's torch.fx nodes (node.meta[plan_key(name)]).
REGION_ATTR = _attr("autosp.region", "op", "i64", "the checkpoint region (layer) of the op")
SEGMENT_ATTR = _attr("autosp.segment", "op", "i64", "the recomputed segment of the op")
SAVE_ATTR = _attr("autosp.save", "op", "unit", "kept for backward, never recomputed (an anchor)")
REPLAY_ATTR = _attr("autosp.replay", "sdpa", "unit", "recomputed by replaying its kept output and log-sum-exp")
OFFLOAD_ATTR = _attr("autosp.offload", "op", "unit", "its segment's kept inputs go to host memory")
TILE_ATTR = _attr("autosp.tile", "op", "i64", "the token-wise run the op belongs to")
TILES_ATTR = _attr("autosp.tiles", "op", "i64", "how many sequence chunks its run is split into")
PLAN_ATTRS = (REGION_ATTR, SEGMENT_ATTR, SAVE_ATTR, REPLAY_ATTR, OFFLOAD_ATTR, TILE_ATTR, TILES_ATTR)


def plan_key(attr: str) -> str:
    """The ``torch.fx`` ``node.meta`` key of a plan attribute (:data:`PLAN_ATTRS`).

    Example::

        >>> plan_key(TILES_ATTR)
        'autosp_tiles'
    """
    return attr.replace(".", "_")
