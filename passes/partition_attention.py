"""``autosp-partition-attention``: Ulysses all-to-alls around every attention op."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.pass_base import ModulePass
from autosp.ir.core import as_operation
from autosp.ir.sequence import analyze_sequence
from autosp.ir.ulysses import partition_attention


@dataclass(frozen=True)
class PartitionAttention(ModulePass):
    """Wrap each attention op in Ulysses all-to-alls: heads split across sp-size ranks.

    q, k and v ([B, H, S, D], sequence-sharded) become head-sharded over the full
    sequence, attention runs on H/P heads, and the output returns to sequence-sharded:
    4 ``autosp.all_to_all`` per layer. With GQA, KV heads fewer than P are repeated to P.
    Query heads not divisible by P are diagnosed at the attention op. (This pass only
    partitions attention; sharding the rest of the graph is the layout passes' job.)

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
    """

    name: ClassVar[str] = "autosp-partition-attention"
    sp_size: int = 2
    group: str = "sp"

    def apply(self, module) -> None:
        if self.sp_size < 1:
            raise DiagnosticError.at(as_operation(module), f"sp-size must be >= 1, got {self.sp_size}")
        if self.sp_size == 1:
            return
        partition_attention(module, analyze_sequence(module), self.sp_size, self.group)
