"""``autosp-sp-pipeline``: the whole sequence-parallel transformation.

The pass is a pipeline of other passes (:meth:`SequenceParallelPipeline.expand`): the
pipeline runner runs them one by one, so ``--mlir-print-ir-after-all``, dump folders and
reproducers name the sub-pass (``autosp-shard-sequence{...}``), not the whole pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.passes.annotate_sequence import AnnotateSequence
from autosp.passes.causal_conv import CausalConv
from autosp.passes.causal_mask import CausalMask
from autosp.passes.dce import DeadCodeElimination
from autosp.passes.fuse_attention import FuseAttention
from autosp.passes.fuse_gqa import FuseGqa
from autosp.passes.hoist_shard import HoistShard
from autosp.passes.partition_attention import PartitionAttention
from autosp.passes.relative_bias import RelativeBias
from autosp.passes.shard_sequence import ShardSequence

from autosp.ir.pass_base import ModulePass, PassOptionError


@dataclass(frozen=True)
class SequenceParallelPipeline(ModulePass):
    """Make a torch-dialect model sequence-parallel over sp-size ranks (Ulysses).

    Runs ``autosp-fuse-attention`` (hand-written softmax attention proven exact becomes
    SDPA), ``autosp-causal-mask`` (masks proven causal from the IR become ``is_causal``),
    ``autosp-relative-bias`` (a per-head bias of ``k - q`` in a mask runs without S × S),
    ``autosp-causal-conv`` (a left-padded valid convolution becomes the padded convolution
    cut back to the input's length, the causal form split with a halo),
    ``autosp-fuse-gqa`` (attention reads shared KV heads, not repeated copies),
    ``autosp-annotate-sequence`` (diagnoses models without a sequence axis or
    attention), ``autosp-partition-attention{sp-size}`` (4 all-to-alls per attention
    layer), ``autosp-shard-sequence`` (layouts, local sizes, sliced positions and labels,
    global loss), ``autosp-hoist-shard`` (replicated tables such as RoPE's computed for the
    rank's rows only) and ``autosp-dce``. With sp-size=1 only ``autosp-fuse-gqa`` and
    ``autosp-dce`` run. ``strategy`` (``ulysses``, ``ring``, ``hybrid`` or ``auto``) and
    the degrees choose the Ulysses x ring mesh (see ``autosp-partition-attention``).

    Input::

        func.func @main(%w: ... {autosp.parameter = "embed.weight"},
                        %ids: !torch.vtensor<[2,?],si64> {autosp.input = "args[0]", autosp.seq_dim = 1 : i64})

    Output::

        // sp-size=2: %ids sharded with "autosp.shard", q/k/v through "autosp.all_to_all",
        // sizes from "autosp.local_len", the loss's sums through "autosp.all_reduce".
    """

    name: ClassVar[str] = "autosp-sp-pipeline"
    sp_size: int = 2
    group: str = "sp"
    gather_outputs: bool = False
    strategy: str = "ulysses"
    ulysses_degree: int = 0
    ring_degree: int = 0
    ranks_per_node: int = 0
    seq_len: int = 0
    recurrence: str = "auto"

    def __post_init__(self) -> None:
        if self.sp_size < 1:
            raise PassOptionError(f"option 'sp-size' of pass '{self.name}' must be >= 1, got {self.sp_size}")

    def expand(self) -> list[ModulePass]:
        """The sub-passes, run (and dumped, and reproduced) one by one by the pipeline."""
        if self.sp_size <= 1:
            return [FuseGqa(), DeadCodeElimination()]
        return [FuseAttention(), CausalMask(), RelativeBias(), CausalConv(), FuseGqa(), DeadCodeElimination(), AnnotateSequence(),
                PartitionAttention(sp_size=self.sp_size, group=self.group, strategy=self.strategy,
                                   ulysses_degree=self.ulysses_degree, ring_degree=self.ring_degree,
                                   ranks_per_node=self.ranks_per_node, seq_len=self.seq_len,
                                   recurrence=self.recurrence),
                ShardSequence(group=self.group, gather_outputs=self.gather_outputs),
                HoistShard(), DeadCodeElimination()]
