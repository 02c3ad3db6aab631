"""``autosp-sp-pipeline``: the whole sequence-parallel transformation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.causal import fold_causal_masks
from autosp.ir.dce import eliminate_dead_code
from autosp.ir.pass_base import ModulePass
from autosp.passes.annotate_sequence import AnnotateSequence
from autosp.passes.partition_attention import PartitionAttention
from autosp.passes.shard_sequence import ShardSequence


@dataclass(frozen=True)
class SequenceParallelPipeline(ModulePass):
    """Make a torch-dialect model sequence-parallel over sp-size ranks (Ulysses).

    Runs ``autosp-causal-mask`` (size-only causal masks become ``is_causal``),
    ``autosp-annotate-sequence`` (diagnoses models without a sequence axis or
    attention), ``autosp-partition-attention{sp-size}`` (4 all-to-alls per attention
    layer), ``autosp-shard-sequence`` (layouts, local sizes, sliced positions and labels,
    global loss) and ``autosp-dce``. With sp-size=1 only dead code is removed.

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

    def apply(self, module) -> None:
        if self.sp_size > 1:
            fold_causal_masks(module)
            eliminate_dead_code(module)
            AnnotateSequence().apply(module)
            PartitionAttention(sp_size=self.sp_size, group=self.group).apply(module)
            ShardSequence(group=self.group, gather_outputs=self.gather_outputs).apply(module)
        eliminate_dead_code(module)
