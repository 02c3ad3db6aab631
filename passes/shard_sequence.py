"""``autosp-shard-sequence``: give every value a layout and make each rank compute its shard."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.layout import shard_sequence
from autosp.ir.pass_base import ModulePass
from autosp.ir.sequence import analyze_sequence, sequence_length_value


@dataclass(frozen=True)
class ShardSequence(ModulePass):
    """Propagate replicated / sequence-sharded / head-sharded layouts and materialise them.

    Work that reads parameters is sequence-sharded; parameter-free work (positions, masks,
    shifted labels) stays replicated and is sliced (``autosp.shard``) where it meets
    sharded values; sizes derived from S that shape sharded values become local
    (``autosp.local_len``); sequence slices narrow a window (``autosp.rewindow``); sums
    over the sequence get an ``autosp.all_reduce``. Runs after
    ``autosp-partition-attention`` (its all-to-alls mark the head-sharded region). Shards
    may differ in length by one when P does not divide S: no padding, no dropped tokens.
    See ``autosp/ir/layout.py`` for the rules.

    Input::

        %e = torch.aten.embedding %w, %ids, ... -> !torch.vtensor<[2,?,32],f32>
        %n = torch.aten.mul.int %int2, %S : !torch.int, !torch.int -> !torch.int
        %l = torch.prim.ListConstruct %n, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
        %v = torch.aten.view %e, %l : ... -> !torch.vtensor<[?,32],f32>

    Output::

        %ids_r = "autosp.shard"(%ids, %S) {dim = 1 : i64, group = "sp", lo = 0 : i64, trim = 0 : i64} ...
        %e = torch.aten.embedding %w, %ids_r, ... -> !torch.vtensor<[2,?,32],f32>
        %L = "autosp.local_len"(%S) {group = "sp", lo = 0 : i64, trim = 0 : i64} : (!torch.int) -> !torch.int
        %n2 = torch.aten.mul.int %L, %int2_0 : !torch.int, !torch.int -> !torch.int
        %l2 = torch.prim.ListConstruct %n2, %int32 : (!torch.int, !torch.int) -> !torch.list<int>
        %v = torch.aten.view %e, %l2 : ... -> !torch.vtensor<[?,32],f32>
    """

    name: ClassVar[str] = "autosp-shard-sequence"
    group: str = "sp"
    gather_outputs: bool = False

    def apply(self, module) -> None:
        info = analyze_sequence(module, require_attention=False)
        shard_sequence(module, info, sequence_length_value(module, info), self.group, self.gather_outputs)
