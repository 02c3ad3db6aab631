"""``autosp-dce``: erase torch ops whose results are never used.

MLIR's canonicalize/cse/remove-dead-values keep dead torch ops (they are not marked
side-effect free), so autosp erases them itself: an op is dead when it has results,
none is used, and it is not known to write memory. A ``torch.bind_symbolic_shape``
is dead once the value it describes has no other user.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autosp.ir import ops
from autosp.ir.contract import PREFIX
from autosp.ir.core import as_operation, funcs, op_name
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


def _has_side_effects(name: str) -> bool:
    return name in ops.SIDE_EFFECT_OPS or ops.is_inplace(name)


def _is_dead(op) -> bool:
    name = op_name(op)
    # Only ops whose semantics we know: torch ops and autosp collectives (an unused
    # collective is unused on every rank alike, so erasing it keeps ranks in step).
    if not name.startswith(("torch.", PREFIX)) or _has_side_effects(name):
        return False
    if name == ops.BIND_SHAPE:
        value = op.operands[0]
        return all(op_name(u.owner) == ops.BIND_SHAPE for u in value.uses)  # (a value may have several)
    results = op.results
    return len(results) > 0 and all(len(list(r.uses)) == 0 for r in results)


def eliminate_dead_code(module) -> int:
    """Erase dead ops in every function of ``module``; return how many were erased.

    Only the top-level block of each function is visited; ops nested in regions
    (``torch.prim.If``/``Loop``) are kept.
    """
    erased = 0
    for func in funcs(as_operation(module)):
        block = func.regions[0].blocks[0]
        changed = True
        while changed:
            changed = False
            for op in reversed(list(block.operations)):
                if _is_dead(op):
                    op.operation.erase()
                    erased += 1
                    changed = True
    return erased
