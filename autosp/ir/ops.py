"""Op-name tables: which torch and autosp ops belong to which class, in one place.

The passes decide what to do with an op by its class (token-wise, sequence-mixing, a
size-list reshape, a collective...), never by a name written in the pass itself, so a
new op is taught to autosp here once.

Example::

    >>> from autosp.ir import ops
    >>> "torch.aten.bmm" in ops.CONTRACTIONS
    True
"""
from __future__ import annotations

# ---------------------------------------------------------------- attention
SDPA_OP = "torch.aten.scaled_dot_product_attention"
# On an SDPA with is_causal: keys restricted to the last W positions (q - W < k <= q).
WINDOW_ATTR = "autosp.window"
# On an SDPA whose mask autosp-causal-mask could not recognise: the reason (the mask stays).
KEPT_MASK_ATTR = "autosp.mask_kept"
# On an SDPA with is_causal: its mask operand is a [B, 1, 1, S] key padding mask, and-ed with
# the causal (or windowed) structure.
KEY_PADDING_ATTR = "autosp.key_padding"
# On an SDPA with is_causal: its mask operand is a [B, 1, 1, S] integer tensor of document
# ids; query i sees key j only within its document (and-ed with the causal or windowed structure).
DOCUMENTS_ATTR = "autosp.documents"
# With KEY_PADDING_ATTR: "uniform" when the original mask was additive with a finite masking
# constant, so a query whose keys are all padded attends uniformly to every key (as eager
# softmax over equal scores does) instead of getting zeros.
EMPTY_ROWS_ATTR = "autosp.empty_rows"
# On a softmax over attention scores that autosp-fuse-attention could not prove to be exact
# softmax attention: the reason (its [S, S] scores stay, and the compile warns).
UNFUSED_ATTR = "autosp.unfused_attention"
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
# Ops that combine the positions along their ``dim`` operand (operand 1).
MIXING_ALONG_DIM = ("torch.aten.cumsum", "torch.aten.cumprod", "torch.aten.softmax.int", "torch.aten._softmax",
                    "torch.aten.log_softmax.int", "torch.aten._log_softmax", "torch.aten.sort",
                    "torch.aten.logcumsumexp", "torch.aten.flip", "torch.aten.roll")
# Sums: over the sequence they split into local sums + an all-reduce.
SUM_OPS = ("torch.aten.sum.dim_IntList", "torch.aten.sum")
# Ops whose operand 1 is a list of sizes of the result.
SIZE_LIST_OPS = ("torch.aten.view", "torch.aten.reshape", "torch.aten.broadcast_to", "torch.aten.expand",
                 "torch.aten._unsafe_view")
SLICE_OP = "torch.aten.slice.Tensor"
# Advanced indexing (operand 1: one index tensor, or None, per leading dim).
INDEX_OPS = ("torch.aten.index.Tensor", "torch.aten.index.Tensor_hacked_twin")
# Ops that build 0, 1, ..., n-1 (with their start/step operands where they have them).
ARANGE_OPS = ("torch.aten.arange", "torch.aten.arange.start", "torch.aten.arange.start_step")
UNSQUEEZE_OP = "torch.aten.unsqueeze"
SELECT_OP = "torch.aten.select.int"
# Ops (name prefixes) that read values but compute no tensor of the layout problem.
NO_LAYOUT = ("torch.constant.", "torch.prim.ListConstruct", "torch.symbolic_int", "torch.bind_symbolic_shape",
             "torch.vtensor.literal", "func.return", "autosp.local_len")

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
ALL_TO_ALL = "autosp.all_to_all"
RING_ATTENTION = "autosp.ring_attention"
COMMUNICATION_OPS = ("autosp.all_to_all", "autosp.all_gather", "autosp.all_reduce", "autosp.reduce_scatter",
                     "autosp.ring_attention")

# ---------------------------------------------------------------- side effects (dead-code elimination)
# Ops that must stay even when their results are unused.
SIDE_EFFECT_OPS = ("func.return", "torch.overwrite.tensor.contents", "torch.prim.Print", "torch.runtime.assert")


def is_inplace(name: str) -> bool:
    """``torch.aten.add_.Tensor`` -> True: in-place aten ops write their first operand."""
    return name.startswith("torch.aten.") and name.split(".")[2].endswith("_")
