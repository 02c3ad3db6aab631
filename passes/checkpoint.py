"""``autosp-checkpoint``: plan activation checkpointing (per-layer regions, save / recompute)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.checkpoint import MODES, plan_checkpoints
from autosp.ir.pass_base import ModulePass, PassOptionError


@dataclass(frozen=True)
class Checkpoint(ModulePass):
    """Plan activation checkpointing: per-layer regions, what to save and what to recompute.

    One region per attention layer, cut where the fewest sequence-dependent activations
    cross (the residual stream). ``mode=sac`` (sequence-aware) keeps attention and the
    collectives around it (``autosp.save``) and recomputes the O(S) rest in segments
    (``autosp.segment = N``); ``mode=full`` recomputes each whole region; ``mode=sac-min``
    recomputes each whole region but marks SDPA ``autosp.replay``: its output and
    log-sum-exp are kept and replayed, so attention never runs twice while q/k/v and their
    all-to-alls are recomputed. The backend runs each segment under a checkpoint that keeps
    only its inputs (and replayed outputs).

    Input::

        %q = torch.aten.mm %x, %wq ...
        %a = "autosp.all_to_all"(%q4) {...}
        %o = torch.aten.scaled_dot_product_attention %a, %b, %c, ...

    Output::

        %q = torch.aten.mm %x, %wq {autosp.region = 0 : i64, autosp.segment = 0 : i64} ...
        %a = "autosp.all_to_all"(%q4) {autosp.region = 0 : i64, autosp.save, ...}
        %o = torch.aten.scaled_dot_product_attention %a, %b, %c, ... {autosp.region = 0 : i64, autosp.save}
    """

    name: ClassVar[str] = "autosp-checkpoint"
    mode: str = "sac"

    def __post_init__(self):
        if self.mode not in MODES:
            raise PassOptionError(f"option 'mode' of pass '{self.name}' must be one of "
                                  f"{', '.join(MODES)}, got '{self.mode}'")

    def apply(self, module) -> None:
        plan_checkpoints(module, self.mode)
