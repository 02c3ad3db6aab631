"""``memory_budget``: choose a :class:`~autosp.cost.plan.MemoryPlan` whose predicted peak fits.

The planner asks the memory model (:mod:`autosp.planning.estimate`: the compiled program run on meta
tensors as one simulated rank, the first and the last, on the kernels of the inputs'
device: CUDA's for a CUDA job) for the peak of candidate plans,
and returns the cheapest it finds that fits:

    predicted total = parameters + optimizer state (AdamW: fp32 moments, plus fp32 master
                      weights for 16-bit parameters; divided by the FSDP degree)
                      + the step's peak (activations, temporaries and gradients)

The LM head and loss are always tiled (``autosp-tile-loss``: it costs one more [N, H] x
[H, V] product per chunk in backward, and removes [N, V] logits and log-probabilities from
the peak). Then layers climb a ladder of choices, cheapest in recompute and transfer time
first::

    keep -> sac -> (tiles 2, 4, ... 64 of the token-wise blocks) -> sac-min -> full -> full+offload

At each rung the planner moves the fewest layers (first layers first) that make the plan
fit, found by bisection over the number of layers, so a plan costs about 5 estimates per
rung. It is deterministic: the same model, inputs and budget give the same plan. Offload
is a rung only on CUDA (on CPU the host is the device, so it would save nothing). If even
the last rung (every layer ``full+offload`` where offload counts, the most tiles) does not
fit, :class:`~autosp.ir.diagnostics.AutospError` gives the smallest feasible budget.

Example::

    >>> plan = plan_memory(model, (ids,), {"labels": ids}, 70 * 2**30, sp_size=8)
    >>> print(plan.describe())
"""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch.utils import _pytree as pytree

from autosp.cost.plan import MemoryPlan
from autosp.driver import Transformed, transform
from autosp.ir.builders import vtensor_shape
from autosp.ir.contract import VOCAB_LOGPROB
from autosp.ir.core import body_ops, main_func, op_name
from autosp.ir.diagnostics import AutospError
from autosp.options import MeshOptions
from autosp.passes.checkpoint import plan_checkpoints
from autosp.passes.tile_loss import tile_loss
from autosp.pipeline import run_pipeline
from autosp.planning.depth import TAIL, compose, repeated_layers, with_depth
from autosp.planning.estimate import MemoryModel, meta_model, model_state
from autosp.runtime import collectives
from autosp.units import human_bytes

GiB = 1 << 30
TILES = (2, 4, 8, 16, 32, 64)


@dataclass
class Prediction:
    plan: MemoryPlan
    total_bytes: int
    peak_bytes: int
    state_bytes: int


class Planner:
    """Candidate plans for one call, evaluated by the memory model. The model is compiled
    once per depth: where its layers repeat (:mod:`autosp.planning.depth`) as shallow copies
    (4 to 8 layers), each candidate put together from their estimates; otherwise whole
    (:attr:`why_whole` says why).
    Each candidate then re-runs only the memory passes and the meta step, on the last
    rank during the search (it also narrows the shifted logits) and on the first rank
    too for the plan returned; every estimate is cached."""

    def __init__(self, model, args, kwargs, *, sp_size: int, seq_dim: int = 1, fsdp: int = 1,
                 optimizer: str = "adamw", offload: bool | None = None, drop_logits: bool = False,
                 verbose: bool = False, mesh: MeshOptions | Mapping | None = None, device: str | None = None,
                 whole: bool = False, drop_logits_hint: str = "drop_logits=True"):
        self.sp_size, self.fsdp, self.optimizer, self.verbose = sp_size, fsdp, optimizer, verbose
        self.drop_logits_hint = drop_logits_hint  # how the caller says drop_logits (the CLI: --drop-logits)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        device_of = next((x.device for x in leaves if isinstance(x, torch.Tensor)), torch.device("cpu"))
        # The kernels the plan is costed on: the inputs' device unless given (autosp-plan: "cuda").
        self.device = device or ("cuda" if device_of.type == "cuda" else "cpu")
        self.offload = self.device == "cuda" if offload is None else offload
        self.drop_logits = drop_logits
        meta = [torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x for x in leaves]
        self.call = pytree.tree_unflatten(meta, spec)
        self.seq_len = next((x.shape[seq_dim] for x in leaves if isinstance(x, torch.Tensor) and x.dim() > seq_dim), 0)
        self.model = meta_model(model, None)
        self._seq_dim, self._mesh = seq_dim, mesh
        start = time.perf_counter()
        param_bytes, _, optimizer_bytes = model_state(self.model, next(self.model.parameters()).dtype, optimizer)
        self.state_bytes = param_bytes // fsdp + optimizer_bytes // fsdp
        self._bases: dict[int | None, tuple[torch.nn.Module, bytes]] = {}  # depth -> (model, transformed program)
        self._peaks: dict[tuple, int] = {}  # (shallow plan, rank) -> step peak
        self.ranks: tuple[int, ...] = (sp_size - 1,)
        found = "whole=True" if whole else repeated_layers(self.model)
        self.layers_path: str | None = found[0] if isinstance(found, tuple) else None
        self.depth: int = found[1] if isinstance(found, tuple) else 0
        self.why_whole = found if isinstance(found, str) else None
        if self.layers_path is not None and self._regions(TAIL) != TAIL:
            self.layers_path, self.why_whole = None, "its checkpoint regions are not one per layer"
        self.regions = self._regions(None) if self.layers_path is None else self.depth
        self.vocab = self._vocab()
        self.evaluations = 0
        self.seconds = time.perf_counter() - start

    def _base(self, depth: int | None) -> tuple[torch.nn.Module, bytes]:
        """The model at ``depth`` layers (None: whole) and its transformed program, compiled once."""
        if depth not in self._bases:
            model = self.model if depth is None or self.layers_path is None else \
                with_depth(self.model, self.layers_path, depth)
            with collectives.simulate(self.sp_size, 0):
                base = transform(model, *self.call, sp_size=self.sp_size, seq_dim=self._seq_dim, mesh=self._mesh)
            self._bases[depth] = (model, base.to_bytes())
        return self._bases[depth]

    def _regions(self, depth: int | None) -> int:
        return plan_checkpoints(Transformed.from_bytes(self._base(depth)[1]).module, "sac").regions

    def _vocab(self) -> int:
        """The LM head's width (0 without a tiled loss)."""
        module = Transformed.from_bytes(self._base(TAIL if self.layers_path else None)[1]).module
        tile_loss(module)
        for op in body_ops(main_func(module)):
            if op_name(op) == VOCAB_LOGPROB:
                shape = vtensor_shape(op.operands[1].type)
                return shape[0][-1] if shape and shape[0][-1] else 0
        return 0

    def loss_chunk(self, budget: int) -> int:
        """Rows per chunk of the tiled loss: one chunk's fp32 logits at most 1/32 of the
        budget (a chunk keeps about three such tensors live), and at most 64 MiB."""
        if not self.vocab:
            return 0
        return max(1, min(budget // 32, 64 << 20) // (self.vocab * 4))

    def predict(self, plan: MemoryPlan) -> Prediction:
        """The memory model's prediction for ``plan`` on :attr:`ranks` (the largest)."""
        t0 = time.perf_counter()
        if self.layers_path is None:
            peak = self._peak(plan, None)
        else:
            peak = compose(plan.layers, lambda layers: self._peak(replace(plan, layers=layers), len(layers)))
        self.evaluations += 1
        self.seconds += time.perf_counter() - t0
        return Prediction(plan, self.state_bytes + peak, peak, self.state_bytes)

    def _peak(self, plan: MemoryPlan, depth: int | None) -> int:
        """The step peak of ``plan`` on the model at ``depth`` layers, the largest over :attr:`ranks`."""
        for rank in self.ranks:
            if (plan, rank) not in self._peaks:
                model, base = self._base(depth)
                transformed = Transformed.from_bytes(base)
                run_pipeline(transformed.module, plan.pipeline())
                memory = MemoryModel(model, self.sp_size, None, optimizer=self.optimizer, fsdp=self.fsdp,
                                     rank=rank, call=lambda n: self.call, transformed=transformed,
                                     device=self.device)
                self._peaks[(plan, rank)] = memory.estimate(self.seq_len).peak_bytes
        return max(self._peaks[(plan, rank)] for rank in self.ranks)

    def ladder(self) -> list[str]:
        return ["sac", "sac-min", "full"] + (["full+offload"] if self.offload else [])

    def most_aggressive(self) -> MemoryPlan:
        last = self.ladder()[-1]
        return MemoryPlan(layers=(last,) * self.regions, tiles=TILES[-1], drop_logits=self.drop_logits)

    def plan(self, budget: int) -> tuple[MemoryPlan, Prediction]:
        """The cheapest plan on the ladder whose prediction fits ``budget``: searched on the
        last rank, then predicted on the first rank too. If the first rank's peak is the
        larger and no longer fits (not seen on the models we plan), the search runs again
        on both ranks."""
        self.ranks = (self.sp_size - 1,)
        plan, found = self._search(budget)
        self.ranks = tuple(sorted({0, self.sp_size - 1}))
        checked = self.predict(plan)
        if checked.total_bytes > budget:
            plan, checked = self._search(budget)
        return plan, checked

    def _search(self, budget: int) -> tuple[MemoryPlan, Prediction]:
        n = self.regions
        # The last rung first: an infeasible budget fails after one estimate, not a whole ladder.
        floor = self.predict(replace(self.most_aggressive(), loss_chunk=self.loss_chunk(budget)))
        if floor.total_bytes > budget:
            self._infeasible(budget, floor)
        plan = MemoryPlan(layers=("keep",) * n, drop_logits=self.drop_logits, loss_chunk=self.loss_chunk(budget))
        best = self.predict(plan)
        self._log(best)
        if best.total_bytes <= budget:
            return plan, best
        rungs: list[tuple[str, object]] = [("layers", "sac"), ("tiles", None)]
        rungs += [("layers", r) for r in self.ladder()[1:]]
        for kind, rung in rungs:
            if kind == "tiles":
                for tiles in TILES:
                    candidate = replace(plan, tiles=tiles)
                    found = self.predict(candidate)
                    self._log(found)
                    if found.total_bytes <= budget:
                        return candidate, found
                plan = replace(plan, tiles=TILES[-1])
                continue
            # Bisection: the fewest leading layers moved to this rung that fit.
            previous = plan.layers

            def moved(k: int, previous=previous, rung=rung, base=plan) -> MemoryPlan:
                return replace(base, layers=tuple([rung] * k + list(previous[k:])))
            top = self.predict(moved(n))
            self._log(top)
            if top.total_bytes > budget:
                plan = moved(n)
                continue
            lo, hi, fit = 0, n, top
            while hi - lo > 1:
                mid = (lo + hi) // 2
                found = self.predict(moved(mid))
                self._log(found)
                if found.total_bytes <= budget:
                    hi, fit = mid, found
                else:
                    lo = mid
            return moved(hi), fit
        return replace(self.most_aggressive(), loss_chunk=self.loss_chunk(budget)), floor

    def _infeasible(self, budget: int, floor: Prediction):
        raise AutospError(
            f"memory_budget {human_bytes(budget)} is below the smallest feasible budget {human_bytes(floor.total_bytes)} "
            f"for this call (S={self.seq_len}, sp_size={self.sp_size}): every layer "
            f"{self.ladder()[-1]} with {TILES[-1]} tiles and the tiled loss still needs "
            f"{human_bytes(floor.peak_bytes)} of step peak plus {human_bytes(floor.state_bytes)} of parameters and "
            f"optimizer state" + ("" if self.drop_logits else
                                  f"; if the model returns its logits, {self.drop_logits_hint} removes them"))

    def _log(self, found: Prediction) -> None:
        if self.verbose:
            runs: list[list] = []
            for choice in found.plan.layers:  # run-length: "full x5, sac-min x27"
                if runs and runs[-1][0] == choice:
                    runs[-1][1] += 1
                else:
                    runs.append([choice, 1])
            layers = ", ".join(f"{c} x{n}" for c, n in runs)
            print(f"[autosp] plan candidate tiles={found.plan.tiles} layers={layers}: predicted "
                  f"{human_bytes(found.total_bytes)}", file=sys.stderr, flush=True)


def plan_memory(model, args, kwargs, budget: int, *, sp_size: int, seq_dim: int = 1, drop_logits: bool = False,
                verbose: bool = False, fsdp: int = 1, optimizer: str = "adamw",
                offload: bool | None = None, mesh: MeshOptions | Mapping | None = None, device: str | None = None,
                drop_logits_hint: str = "drop_logits=True") -> MemoryPlan:
    """The plan :func:`autosp.compile` uses for ``memory_budget`` (see the module docstring);
    ``mesh``: the Ulysses x ring request (:class:`autosp.options.MeshOptions` or a dict of its fields);
    ``device``: whose kernels the candidates are costed on (``"cpu"`` or ``"cuda"``;
    default: the inputs' device, so a CUDA job is planned on CUDA's kernels);
    ``drop_logits_hint``: how the caller's user asks for ``drop_logits`` (named in the error
    for a budget nothing fits; ``autosp-plan``: ``--drop-logits``)."""
    planner = Planner(model, args, kwargs, sp_size=sp_size, seq_dim=seq_dim, fsdp=fsdp, optimizer=optimizer,
                      offload=offload, drop_logits=drop_logits, verbose=verbose, mesh=mesh, device=device,
                      drop_logits_hint=drop_logits_hint)
    plan, found = planner.plan(budget)
    if verbose:
        print(f"[autosp] memory plan for S={planner.seq_len}, sp_size={sp_size}, budget {human_bytes(budget)} "
              f"({planner.evaluations} estimates, {planner.seconds:.1f}s"
              f"{'; the whole model: ' + planner.why_whole if planner.why_whole else ''}):\n"
              f"  tiled LM head + loss: yes{' (logits dropped)' if plan.drop_logits else ''}; "
              f"token-wise tiles: {plan.tiles}\n{plan.describe()}\n"
              f"  predicted: {human_bytes(found.total_bytes)} = step peak {human_bytes(found.peak_bytes)} + parameters and "
              f"optimizer state {human_bytes(found.state_bytes)}", file=sys.stderr, flush=True)
    return plan
