"""Op-name tables: which torch and autosp ops belong to which class, in one place.

The passes decide what to do with an op by its class (token-wise, sequence-mixing, a
size-list reshape, a collective...), never by a name written in the pass itself, so a
new op is taught to autosp here once.

Example::

    >>> from autosp.ir import ops
    >>> "torch.aten.bmm" in ops.CONTRACTIONS
    True
    >>> ops.dim_operands("torch.aten.roll")      # roll(self, shifts, dims): dims is operand 2
    ((2, 'dims'),)
"""
from __future__ import annotations

import functools

from autosp.ir import stated
from autosp.ir.contract import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    LOCAL_LEN,
    REDUCE_SCATTER,
    RING_ATTENTION,
    SEQ_AMAX,
    SEQ_ARGMAX,
    SEQ_LOGSUMEXP,
    SEQ_SOFTMAX,
)

# ---------------------------------------------------------------- attention
SDPA_OP = "torch.aten.scaled_dot_product_attention"
# Attention with per-head sink logits in the softmax denominator (gpt-oss), as
# autosp-fuse-attention writes it: a ``torch.operator`` with SDPA's 8 operands and the
# sinks ``[H]`` as operand 8. Every SDPA rule (mask proofs, GQA, partitioning) holds for it.
SINK_ATTENTION = "torch.autosp.sink_attention"
# Attention with an additive per-head bias that depends on the key alone (ALiBi as MPT and
# BLOOM write it: ``[B|1, H|1, 1, S]`` broadcast over the queries), as autosp-fuse-attention
# writes it: SDPA's 8 operands and the bias as operand 8. The bias never becomes S x S:
# the kernels take it broadcast (stride 0 over the queries).
KEY_BIAS_ATTENTION = "torch.autosp.key_bias_attention"
# SDPA whose mask was a per-head bias of k - q (T5): operands 8-10 are the table [buckets, H],
# the buckets of every distance [2 S - 1] and the masking constant (autosp-relative-bias)
RELATIVE_BIAS_ATTENTION = "torch.autosp.relative_bias_attention"
SOFTMAX_OPS = ("torch.aten.softmax.int", "torch.aten._softmax", "torch.aten._safe_softmax")
# Matmuls of hand-written attention (scores = q @ k^T, out = p @ v).
ATTENTION_MATMULS = ("torch.aten.bmm", "torch.aten.matmul")

# ---------------------------------------------------------------- integer arithmetic on sizes
# ``!torch.int`` ops the sequence analysis reads: name -> operator (as printed).
SCALAR_ARITH = {"torch.aten.add.int": "+", "torch.aten.sub.int": "-", "torch.aten.mul.int": "*",
                "torch.aten.floordiv.int": "floordiv"}
SIZE_OP = "torch.aten.size.int"
CONSTANT_INT = "torch.constant.int"
CONSTANT_NONE = "torch.constant.none"
LIST_CONSTRUCT = "torch.prim.ListConstruct"
SYMBOLIC_INT = "torch.symbolic_int"
BIND_SHAPE = "torch.bind_symbolic_shape"

# ---------------------------------------------------------------- layout classes
# Matmuls: they mix positions when they contract the sequence dim.
CONTRACTIONS = ("torch.aten.mm", "torch.aten.bmm", "torch.aten.matmul")
# Which dims an op works along is read from its schema (:func:`dim_operands`): every
# integer argument with one of these names, wherever it sits (``roll(self, shifts, dims)``:
# operand 2). An op that works along the sequence dim combines positions that live on
# different ranks: autosp-shard-sequence refuses it unless a rule of its own covers it
# (sums, slices, selects, advanced indexing).
DIM_ARGUMENT_NAMES = ("dim", "dims", "dimension", "dim0", "dim1", "dim2", "start_dim", "end_dim")
# Ops whose dim arguments only move dims or insert / drop size-1 ones: every position keeps
# its data, and the shape bindings say where the sequence dim goes.
LAYOUT_DIM_OPS = ("torch.aten.permute", "torch.aten.transpose.int", "torch.aten.unsqueeze", "torch.aten.squeeze.dim",
                  "torch.aten.squeeze.dims", "torch.aten.stack")
# Ops for which an empty dim list means no dim (for reductions and roll it means every dim).
EMPTY_DIMS_MEAN_NONE = ("torch.aten.flip",)
# Ops that combine positions with no dim argument to say along which dims: name -> the
# input dims they keep apart (they mix along every other one). Conservative: a 1-wide
# convolution or batch norm with running statistics is refused too.
MIXING_WITHOUT_DIM = {
    "torch.aten.convolution": (0,), "torch.aten._convolution": (0,), "torch.aten.conv1d": (0,),
    "torch.aten.conv2d": (0,), "torch.aten.conv3d": (0,), "torch.aten.conv_transpose1d": (0,),
    "torch.aten.avg_pool1d": (0,), "torch.aten.avg_pool2d": (0,), "torch.aten.max_pool1d": (0,),
    "torch.aten.max_pool2d": (0,), "torch.aten.max_pool2d_with_indices": (0,),
    "torch.aten.adaptive_avg_pool1d": (0,), "torch.aten.adaptive_avg_pool2d": (0,),
    "torch.aten.adaptive_max_pool1d": (0,), "torch.aten.adaptive_max_pool2d": (0,),
    "torch.aten.batch_norm": (1,), "torch.aten.native_batch_norm": (1,), "torch.aten._native_batch_norm_legit": (1,),
    "torch.aten._native_batch_norm_legit_functional": (1,), "torch.aten.instance_norm": (0, 1),
    "torch.aten.group_norm": (0,), "torch.aten.native_group_norm": (0,),
}
# Sums: over the sequence they split into local sums + an all-reduce.
SUM_OPS = ("torch.aten.sum.dim_IntList", "torch.aten.sum")
# Ops that draw random numbers into the shape of an operand (``rand_like``, ``exponential_``
# on an ``empty_like``, ``bernoulli``): on a sequence-sharded operand each rank would draw
# its own numbers, not its part of one device's draw (dropout's draw from a size list is
# made whole and sliced instead, see the user guide).
RANDOM_OPS = ("torch.aten.uniform", "torch.aten.normal_functional", "torch.aten.exponential",
              "torch.aten.bernoulli", "torch.aten.bernoulli.p", "torch.aten.bernoulli.Tensor",
              "torch.aten.rand_like", "torch.aten.randn_like", "torch.aten.randint_like",
              "torch.aten.multinomial", "torch.aten.geometric", "torch.aten.log_normal", "torch.aten.cauchy")
# Opaque ops (torch.operator: torch-mlir has no op of its own) whose semantics autosp states.
# Counting every element into fixed bins: over a split of the input, the parts' counts add up.
COUNTING_OPS = ("torch.aten.histc",)
# Scatter-adds into a target: over a split of (index, src) along the scattered dim, the
# parts' scatters into zeros add up (the target must be proven zero: it would count P times).
SCATTER_SUM_OPS = ("torch.aten.scatter_add",)
# The stated ops (autosp.ir.stated: one record each), by how they are placed: row-wise over
# the leading dim of their tensor inputs (MoE experts), or linear recurrences along dim 1.
TOKEN_WISE_OPERATORS = stated.names(stated.TOKEN_WISE)
RECURRENCE_OPERATORS = stated.names(stated.RECURRENCE)
GATED_DELTA_RULE = "torch.autosp.gated_delta_rule"
MAMBA2_CHUNK_SCAN = "torch.autosp.mamba2_chunk_scan"
SELECTIVE_SCAN = "torch.autosp.selective_scan"
LIGHTNING_ATTENTION = "torch.autosp.lightning_attention"
MLSTM = "torch.autosp.mlstm"
# Ops whose operand 1 is a list of sizes of the result.
SIZE_LIST_OPS = ("torch.aten.view", "torch.aten.reshape", "torch.aten.broadcast_to", "torch.aten.expand",
                 "torch.aten._unsafe_view")
SLICE_OP = "torch.aten.slice.Tensor"
CONVOLUTION_OP = "torch.aten.convolution"
MASKED_SCATTER_OP = "torch.aten.masked_scatter"
# Advanced indexing (operand 1: one index tensor, or None, per leading dim).
INDEX_OPS = ("torch.aten.index.Tensor", "torch.aten.index.Tensor_hacked_twin")
# Ops that build 0, 1, ..., n-1 (with their start/step operands where they have them).
ARANGE_OPS = ("torch.aten.arange", "torch.aten.arange.start", "torch.aten.arange.start_step")
UNSQUEEZE_OP = "torch.aten.unsqueeze"
SELECT_OP = "torch.aten.select.int"
# Ops that pick positions by an index tensor along a dim (operand 1) from operand 0.
GATHER_OP = "torch.aten.gather"
INDEX_SELECT_OP = "torch.aten.index_select"
CONSTANT_PAD_OP = "torch.aten.constant_pad_nd"
SQUEEZE_DIM_OP = "torch.aten.squeeze.dim"
# Softmax along a dim (operand 1) that autosp splits over the sequence (autosp.softmax), and
# whether it is the log-softmax.
SEQUENCE_SOFTMAX = {"torch.aten.softmax.int": False, "torch.aten._softmax": False,
               "torch.aten.log_softmax.int": True, "torch.aten._log_softmax": True}
# Reductions along dims (operand 1, a list) with keepdim (operand 2) that split over the
# sequence by a max and a sum of exponentials (autosp.logsumexp / autosp.amax).
SEQUENCE_REDUCTIONS = {"torch.aten.logsumexp": SEQ_LOGSUMEXP, "torch.aten.amax": SEQ_AMAX}
# Reductions to the position of the largest value along a dim (operand 1, an int), with
# keepdim (operand 2): autosp.argmax; max.dim's values are autosp.amax's.
ARGMAX_OPS = ("torch.aten.argmax", "torch.aten.max.dim")
# Ops (name prefixes) that read values but compute no tensor of the layout problem.
NO_LAYOUT = ("torch.constant.", "torch.prim.ListConstruct", "torch.symbolic_int", "torch.bind_symbolic_shape",
             "torch.vtensor.literal", "func.return", LOCAL_LEN)

# ---------------------------------------------------------------- reshapes (attention partitioning)
# Ops that only reinterpret or copy their operand 0 (a repeat_kv chain's tail).
VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view", "torch.aten.clone",
         "torch.aten.contiguous")
BROADCASTS = ("torch.aten.broadcast_to", "torch.aten.expand")
# Ops that move or broadcast data between [B, H, S, D] and the [B*H, S, D] matmul form
# (and the scalar scaling hand-written attention applies on the way).
ATTENTION_RESHAPES = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view", "torch.aten.broadcast_to",
                      "torch.aten.expand", "torch.aten.permute", "torch.aten.transpose.int", "torch.aten.clone",
                      "torch.aten.contiguous", "torch.aten.mul.Scalar", "torch.aten.div.Scalar")

# ---------------------------------------------------------------- collectives
# (the names: autosp.ir.contract, with every autosp.* attribute)
COMMUNICATION_OPS = (ALL_TO_ALL, ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, RING_ATTENTION, SEQ_SOFTMAX, SEQ_LOGSUMEXP,
                     SEQ_AMAX, SEQ_ARGMAX)

# ---------------------------------------------------------------- side effects (dead-code elimination)
# Ops that must stay even when their results are unused.
SIDE_EFFECT_OPS = ("func.return", "torch.overwrite.tensor.contents", "torch.prim.Print", "torch.runtime.assert")


def operator_name(op) -> str:
    """The name an op is known by: its registered name, or for a ``torch.operator`` (an op
    torch-mlir keeps opaque, or one autosp writes) the operator it names, as
    ``torch.<ns>.<op>``."""
    name = op.operation.name
    if name == "torch.operator" and "name" in op.attributes:
        from torch_mlir import ir
        inner = ir.StringAttr(op.attributes["name"]).value
        return inner if inner.startswith("torch.") else "torch." + inner
    return name


def is_sdpa(op) -> bool:
    """SDPA, SDPA with attention sinks (:data:`SINK_ATTENTION`) or with a key bias
    (:data:`KEY_BIAS_ATTENTION`): an op whose operands 0-7 are SDPA's (q, k, v, mask,
    dropout, is_causal, scale, enable_gqa)."""
    return operator_name(op) in (SDPA_OP, SINK_ATTENTION, KEY_BIAS_ATTENTION, RELATIVE_BIAS_ATTENTION)


def is_relative_bias_attention(op) -> bool:
    """Attention with a bias of ``k - q`` (:data:`RELATIVE_BIAS_ATTENTION`; operand 8: the
    table ``[buckets, H]``, 9: the buckets ``[2 S - 1]``, 10: the masking constant)."""
    return operator_name(op) == RELATIVE_BIAS_ATTENTION


def is_key_bias_attention(op) -> bool:
    """Attention with a key bias (:data:`KEY_BIAS_ATTENTION`; operand 8: ``[B|1, H|1, 1, S]``)."""
    return operator_name(op) == KEY_BIAS_ATTENTION


def is_sink_attention(op) -> bool:
    """Attention with sinks (:data:`SINK_ATTENTION`; its operand 8 is the sinks ``[H]``)."""
    return operator_name(op) == SINK_ATTENTION


def is_inplace(name: str) -> bool:
    """``torch.aten.add_.Tensor`` -> True: in-place aten ops write their first operand."""
    return name.startswith("torch.aten.") and name.split(".")[2].endswith("_")


@functools.cache
def argument_names(name: str) -> tuple[str, ...]:
    """The argument names of the aten op ``name``, in operand order, from its schema
    (``torch.ops.aten.<op>.<overload>._schema``); empty for ops PyTorch does not know.

    Example::

        >>> argument_names("torch.aten.sum.dim_IntList")
        ('self', 'dim', 'keepdim', 'dtype')
    """
    schema = _schema(name)
    return () if schema is None else tuple(arg.name for arg in schema.arguments)


@functools.cache
def dim_operands(name: str) -> tuple[tuple[int, str], ...]:
    """``(operand index, argument name)`` of the dims the aten op ``name`` works along: its
    schema's integer arguments named in :data:`DIM_ARGUMENT_NAMES` (``int``, ``int[]``,
    ``int?``, ``int[]?``). Empty for ops PyTorch does not know (and for non-aten ops).

    Example::

        >>> dim_operands("torch.aten.topk")       # topk(self, k, dim, largest, sorted)
        ((2, 'dim'),)
        >>> dim_operands("torch.aten.sum.dim_IntList")
        ((1, 'dim'),)
    """
    schema = _schema(name)
    if schema is None:
        return ()
    return tuple((i, arg.name) for i, arg in enumerate(schema.arguments)
                 if arg.name in DIM_ARGUMENT_NAMES and str(arg.type).replace("Optional[", "").replace("List[", "")
                 .rstrip("]") == "int")


def _schema(name: str):
    parts = name.split(".")
    if len(parts) < 3 or parts[:2] != ["torch", "aten"]:
        return None
    import torch  # already loaded wherever a pass runs (torch-mlir's importer needs it)
    try:
        return getattr(getattr(torch.ops.aten, parts[2]), ".".join(parts[3:]) or "default")._schema
    except (AttributeError, RuntimeError):
        return None
