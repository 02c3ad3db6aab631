"""``autosp-dce``: erase torch ops whose results are never used."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir.dce import eliminate_dead_code
from autosp.ir.pass_base import ModulePass


@dataclass(frozen=True)
class DeadCodeElimination(ModulePass):
    """Erase torch ops (and their symbolic-shape bindings) whose results are unused.

    Upstream ``canonicalize``/``cse`` leave dead torch ops in place; this pass removes
    them, repeating until nothing changes.

    Input::

        %int1 = torch.constant.int 1
        %0 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
        %1 = torch.aten.neg %arg1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
        return %arg1 : !torch.vtensor<[4],f32>

    Output::

        return %arg1 : !torch.vtensor<[4],f32>
    """

    name: ClassVar[str] = "autosp-dce"

    def apply(self, module) -> None:
        eliminate_dead_code(module)
