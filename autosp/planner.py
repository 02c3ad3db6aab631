"""``memory_budget``: choose a :class:`~autosp.plan.MemoryPlan` whose predicted peak fits.

The planner asks the memory model (:mod:`autosp.estimate`: the compiled program run on meta
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
from dataclasses import dataclass, replace

import torch
from torch.utils import _pytree as pytree

from autosp.ir.diagnostics import AutospError
from autosp.plan import MemoryPlan

GiB = 1 << 30
TILES = (2, 4, 8, 16, 32, 64)


@dataclass
class Prediction:
    plan: MemoryPlan
    total_bytes: int
    peak_bytes: int
    state_bytes: int


def human_bytes(n: float) -> str:
    """``n`` bytes as ``512 B``, ``1.50 MiB``, ``80.00 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


class Planner:
    """Candidate plans for one call, evaluated by the memory model (compiled once: each
    candidate re-runs only the memory passes and the meta step)."""

    def __init__(self, model, args, kwargs, *, sp_size: int, seq_dim: int = 1, fsdp: int = 1,
                 optimizer: str = "adamw", offload: bool | None = None, drop_logits: bool = False,
                 verbose: bool = False, mesh: dict | None = None, device: str | None = None):
        from autosp.api import transform
        from autosp.estimate import MemoryModel, _meta_model
        from autosp.runtime import collectives
        self.sp_size, self.fsdp, self.optimizer, self.verbose = sp_size, fsdp, optimizer, verbose
        leaves, spec = pytree.tree_flatten((args, kwargs))
        device_of = next((x.device for x in leaves if isinstance(x, torch.Tensor)), torch.device("cpu"))
        # The kernels the plan is costed on: the inputs' device unless given (autosp-plan: "cuda").
        self.device = device or ("cuda" if device_of.type == "cuda" else "cpu")
        self.offload = self.device == "cuda" if offload is None else offload
        self.drop_logits = drop_logits
        meta = [torch.empty_like(x, device="meta") if isinstance(x, torch.Tensor) else x for x in leaves]
        self.call = pytree.tree_unflatten(meta, spec)
        self.seq_len = next((x.shape[seq_dim] for x in leaves if isinstance(x, torch.Tensor) and x.dim() > seq_dim), 0)
        self.model = _meta_model(model, None)
        self._memory_model = MemoryModel
        start = time.perf_counter()
        with collectives.simulate(sp_size, 0):
            base = transform(self.model, *self.call, sp_size=sp_size, seq_dim=seq_dim, mesh=mesh)
        self._base = base.to_bytes()
        self.regions = self._count_regions()
        self.vocab = self._vocab()
        self.evaluations = 0
        self.seconds = time.perf_counter() - start

    def _count_regions(self) -> int:
        from autosp.api import Transformed
        from autosp.passes.checkpoint import plan_checkpoints
        return plan_checkpoints(Transformed.from_bytes(self._base).module, "sac").regions

    def _vocab(self) -> int:
        """The LM head's width (0 without a tiled loss)."""
        from autosp.api import Transformed
        from autosp.ir.builders import vtensor_shape
        from autosp.ir.core import body_ops, main_func, op_name
        from autosp.ir.contract import VOCAB_LOGPROB
        from autosp.passes.tile_loss import tile_loss
        module = Transformed.from_bytes(self._base).module
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
        """The memory model's prediction for ``plan`` (the larger of the first and last rank)."""
        from autosp.api import Transformed
        from autosp.pipeline import run_pipeline
        t0 = time.perf_counter()
        transformed = Transformed.from_bytes(self._base)
        run_pipeline(transformed.module, plan.pipeline())
        model = self._memory_model(self.model, self.sp_size, None, optimizer=self.optimizer, fsdp=self.fsdp,
                                   call=lambda n: self.call, transformed=transformed, device=self.device)
        est = model.estimate(self.seq_len)
        state = est.param_bytes // self.fsdp + est.optimizer_bytes // self.fsdp
        self.evaluations += 1
        self.seconds += time.perf_counter() - t0
        return Prediction(plan, state + est.peak_bytes, est.peak_bytes, state)

    def ladder(self) -> list[str]:
        return ["sac", "sac-min", "full"] + (["full+offload"] if self.offload else [])

    def most_aggressive(self) -> MemoryPlan:
        last = self.ladder()[-1]
        return MemoryPlan(layers=(last,) * self.regions, tiles=TILES[-1], drop_logits=self.drop_logits)

    def plan(self, budget: int) -> tuple[MemoryPlan, Prediction]:
        """The cheapest plan on the ladder whose prediction fits ``budget``."""
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
                                  "; if the model returns its logits, drop_logits=True removes them"))

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
                offload: bool | None = None, mesh: dict | None = None, device: str | None = None) -> MemoryPlan:
    """The plan :func:`autosp.compile` uses for ``memory_budget`` (see the module docstring);
    ``mesh``: the Ulysses x ring request (:func:`autosp.api.mesh_options`' arguments);
    ``device``: whose kernels the candidates are costed on (``"cpu"`` or ``"cuda"``;
    default: the inputs' device, so a CUDA job is planned on CUDA's kernels)."""
    planner = Planner(model, args, kwargs, sp_size=sp_size, seq_dim=seq_dim, fsdp=fsdp, optimizer=optimizer,
                      offload=offload, drop_logits=drop_logits, verbose=verbose, mesh=mesh, device=device)
    plan, found = planner.plan(budget)
    if verbose:
        print(f"[autosp] memory plan for S={planner.seq_len}, sp_size={sp_size}, budget {human_bytes(budget)} "
              f"({planner.evaluations} estimates, {planner.seconds:.1f}s):\n"
              f"  tiled LM head + loss: yes{' (logits dropped)' if plan.drop_logits else ''}; "
              f"token-wise tiles: {plan.tiles}\n{plan.describe()}\n"
              f"  predicted: {human_bytes(found.total_bytes)} = step peak {human_bytes(found.peak_bytes)} + parameters and "
              f"optimizer state {human_bytes(found.state_bytes)}", file=sys.stderr, flush=True)
    return plan
