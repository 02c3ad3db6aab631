"""The emitted program's shapes, checked before its first run: no program fails at run time.

A partition that splits one operand of an op and not the other (a bias left whole while the
heads are split, a positions table cut at the wrong offset) would otherwise surface on the
first real step as a ``RuntimeError`` deep in the emitted module, on some ranks only: the
others then wait in their next collective. :func:`check_shapes` runs the program's forward
once per distinct set of local sizes, on **meta tensors** (shapes and dtypes, no data) with
the collectives simulated (:class:`autosp.runtime.collectives.simulate`), node by node. An op
whose operands do not agree raises an :class:`~autosp.ir.diagnostics.AutospError` that names
the op, the model's source line it comes from (the MLIR location the emitter kept on the
node) and the rank and local sizes where it fails. In a process group each rank checks its
own share and the ranks exchange their verdicts (one small all-gather), so every rank raises
the same error, before the program's first collective; alone, one process checks every
distinct share.

What the check cannot judge it leaves, and says so: an op that needs values (``.item()``, a
data-dependent size), has no meta implementation, or fails on meta for a reason that is not
its operands' shapes (a meta kernel stricter about dtypes than the CPU one) stops the check at that node
(:attr:`ShapeCheck.stopped`): the ops before it were checked, the ones after it were not.
The memory model runs programs the same way (meta tensors, simulated collectives), so the
runtime's ops take their meta paths here too.

Example::

    >>> result = check_shapes(program, model, leaves, sp_size=2, layout=SeqLayout(ulysses=2), seq_len=30)
    >>> result.ranks, result.stopped        # ([0, 1], None): rank 0 holds 15 positions, rank 1 holds 15
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.fx
from torch.utils import _pytree as pytree

from autosp.ir.diagnostics import AutospError
from autosp.ir.layout import SeqLayout
from autosp.runtime import collectives, fsdp, kernels

# An error the program's shapes cause (operands that do not agree). Any other error of the
# meta run (an op that needs values, a meta kernel stricter than the CPU one about dtypes)
# stops the check at that op: it is not the program's fault as far as the check can tell.
_SHAPE_ERROR = re.compile(r"size|shape|broadcast|dimension|mismatch", re.I)
_UNJUDGEABLE = re.compile(r"meta|data.dependent|item\(\)|_local_scalar_dense|nonzero|could not guard on data", re.I)


@dataclass
class ShapeCheck:
    """What :func:`check_shapes` ran: the ranks it stood for (one per distinct set of local
    sizes) and, if it stopped early, at which op and why."""
    ranks: list[int] = field(default_factory=list)
    stopped: str | None = None


def source_line(loc: str) -> str:
    """``<last 3 path parts>:<line>`` of the first file location in an MLIR location's text
    (the model's source line), or ``""``."""
    files = re.findall(r'"([^"]+)":(\d+)', loc)
    return f"{'/'.join(files[0][0].split('/')[-3:])}:{files[0][1]}" if files else ""


def representative_ranks(layout: SeqLayout, sp_size: int, seq_len: int) -> list[int]:
    """One rank per distinct tuple of local piece lengths (the first that has it)."""
    seen: dict[tuple, int] = {}
    for rank in range(sp_size):
        lengths = tuple(int(b - a) for a, b in layout.pieces(seq_len, rank))
        seen.setdefault(lengths, rank)
    return sorted(seen.values())


class _MetaRun(torch.fx.Interpreter):
    """The graph on meta tensors; the node that raises is kept (:attr:`failed`)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.failed: torch.fx.Node | None = None

    def run_node(self, n):
        try:
            return super().run_node(n)
        except Exception:
            self.failed = n
            raise

    def call_function(self, target, args, kwargs):  # ops that create tensors on a device: on meta
        args, kwargs = pytree.tree_map_only(torch.device, _on_meta, (args, kwargs))
        return super().call_function(target, args, kwargs)

    def get_attr(self, target, args, kwargs):  # the graph's tensor literals (CPU): their meta twins
        value = super().get_attr(target, args, kwargs)
        return value.to("meta") if isinstance(value, torch.Tensor) and value.device.type != "meta" else value


def _on_meta(device: torch.device) -> torch.device:
    return torch.device("meta")


def _meta(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(tuple(t.shape), dtype=dtype or t.dtype, device="meta")


def _describe(node: torch.fx.Node) -> tuple[str, str]:
    op = node.meta.get("autosp_op") or getattr(node.target, "__name__", str(node.target))
    return str(op), source_line(node.meta.get("autosp_loc", ""))


def check_shapes(program, model: torch.nn.Module, leaves: list, *, sp_size: int, layout: SeqLayout | None,
                 seq_len: int, ranks: list[int] | None = None) -> ShapeCheck:
    """Run ``program``'s forward (a :class:`~autosp.backend.module.CompiledProgram`) on meta
    twins of ``model``'s state and the call's ``leaves`` (as the compiled call passes them),
    as each of ``ranks`` (default: each representative rank, :func:`representative_ranks`)
    of ``sp_size`` holding its share of ``seq_len`` positions under ``layout``. Raises
    :class:`AutospError` naming the first op whose operands do not agree, its source line,
    and the rank; returns what it checked (see the module docstring)."""
    layout = layout or SeqLayout(ulysses=sp_size)
    state = program.state_tensors(model)
    metas = []
    for i, t in enumerate(state):  # an FSDP2 parameter: its global shape, in its param_dtype
        precision = program.precisions.get(i)
        metas.append(_meta(t, precision.param_dtype if precision is not None and fsdp.is_sharded(t) else None))
    inputs = [leaves[i] for i in program.tensor_leaves]
    target = "cuda" if any(t.device.type == "cuda" for t in inputs) else "cpu"
    metas += [_meta(t) for t in inputs]
    result = ShapeCheck()
    for rank in ranks if ranks is not None else representative_ranks(layout, sp_size, seq_len):
        result.ranks.append(rank)
        run = _MetaRun(program.graph_module)
        try:
            with torch.no_grad(), torch.device("meta"), collectives.simulate(sp_size, rank, layout), kernels.target(target):
                run.run(*metas)
        except AutospError:
            raise
        except Exception as e:  # noqa: BLE001 - judged below: the program's fault, or the meta run's limit
            op, where = _describe(run.failed) if run.failed is not None else ("the program", "")
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if isinstance(e, NotImplementedError) or _UNJUDGEABLE.search(str(e)) or not _SHAPE_ERROR.search(first):
                result.stopped = f"{op}{f' at {where}' if where else ''}: {first}"
                return result
            pieces = [int(b - a) for a, b in layout.pieces(seq_len, rank)]
            raise AutospError(
                f"the compiled program's shapes do not agree: {op}{f' at {where}' if where else ''} fails on rank "
                f"{rank} of {sp_size} (its sequence share {' + '.join(map(str, pieces))} of {seq_len} positions, "
                f"{layout.describe()}): {type(e).__name__}: {first}. Found before the first run, on meta tensors; "
                "this is a bug in autosp's partition of this model: please report it with the model "
                "(autosp.compile(..., dump_dir=...) keeps the IR)") from None
    return result
