"""The registry of autosp passes: ``PASSES[name] -> pass class``.

One file per pass in this folder (imported as ``autosp.passes``); each pass has a lit
test ``lit_tests/<name without "autosp-", dashes as underscores>.mlir``.
"""
from __future__ import annotations

from autosp.passes.annotate_sequence import AnnotateSequence
from autosp.passes.causal_conv import CausalConv
from autosp.passes.causal_mask import CausalMask
from autosp.passes.checkpoint import Checkpoint
from autosp.passes.dce import DeadCodeElimination
from autosp.passes.fuse_attention import FuseAttention
from autosp.passes.fuse_gqa import FuseGqa
from autosp.passes.hoist_shard import HoistShard
from autosp.passes.partition_attention import PartitionAttention
from autosp.passes.relative_bias import RelativeBias
from autosp.passes.shard_sequence import ShardSequence
from autosp.passes.sp_pipeline import SequenceParallelPipeline
from autosp.passes.tile_loss import TileLoss
from autosp.passes.tile_tokens import TileTokens

from autosp.ir.pass_base import ModulePass

PASSES: dict[str, type[ModulePass]] = {
    p.name: p
    for p in (
        AnnotateSequence,
        CausalConv,
        CausalMask,
        Checkpoint,
        DeadCodeElimination,
        FuseAttention,
        FuseGqa,
        HoistShard,
        PartitionAttention,
        RelativeBias,
        SequenceParallelPipeline,
        ShardSequence,
        TileLoss,
        TileTokens,
    )
}


def lit_file_name(pass_name: str) -> str:
    """``autosp-sp-pipeline`` -> ``sp_pipeline.mlir``: the lit test every pass has."""
    return pass_name.removeprefix("autosp-").replace("-", "_") + ".mlir"
