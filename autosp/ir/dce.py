"""Dead-code elimination for torch-dialect functions.

MLIR's canonicalize/cse/remove-dead-values keep dead torch ops (they are not marked
side-effect free), so autosp erases them itself: an op is dead when it has results,
none is used, and it is not known to write memory. A ``torch.bind_symbolic_shape``
is dead once the value it describes has no other user.
"""
from __future__ import annotations

from autosp.ir.core import as_operation, funcs, op_name

# Ops that must stay even when their results are unused.
_KEEP = {"func.return", "torch.overwrite.tensor.contents", "torch.prim.Print", "torch.runtime.assert"}


def _has_side_effects(name: str) -> bool:
    if name in _KEEP:
        return True
    # In-place aten ops (add_, copy_) write their operand.
    return name.startswith("torch.aten.") and name.split(".")[2].endswith("_")


def _is_dead(op) -> bool:
    name = op_name(op)
    # Only ops whose semantics we know: torch ops and autosp collectives (an unused
    # collective is unused on every rank alike, so erasing it keeps ranks in step).
    if not name.startswith(("torch.", "autosp.")) or _has_side_effects(name):
        return False
    if name == "torch.bind_symbolic_shape":
        value = op.operands[0]
        return all(u.owner == op.operation for u in value.uses)
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
