"""A training job planned before it runs: the report ``autosp-plan`` prints, as one function.

:func:`job_report` takes a model configuration and a :class:`JobRequest` (the mesh, the
sequence length, the ranks, the memory plan or budget, the GPU's memory) and returns the
report: the mesh the compiler chose and why, the plan, the peak per rank (state,
gradients, activations, transient), the CUDA kernel of every attention op, the
collectives' bytes, the checks a GPU would fail, and optionally the longest sequence that
fits. One training step of the first and the last rank runs on CUDA's kernels
(:func:`autosp.planning.fake_cuda.cuda_step`); a model whose layers repeat is put together
from shallow copies (:mod:`autosp.planning.depth`). The command line
(:mod:`autosp.tools.plan`) parses, calls this, and prints.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

from autosp.options import MeshOptions, Strategy
from autosp.units import human_bytes as _human

PROG = "autosp-plan"


class JobInputError(Exception):
    """A request this job cannot be planned for (the CLI prints it as one line, status 2)."""


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """What :func:`job_report` plans (the command line's options, by the same names)."""

    model: str  # the name the report gives the model (a path or a preset)
    seq: int = 131072
    world: int = 8
    gpu_mem: int = 80 << 30
    call: str = "position_ids"
    checkpointing: str = "off"
    memory_budget: int | None = None
    drop_logits: bool = False
    optimizer: str = "adamw"
    strategy: str = "auto"
    ranks_per_node: int = 8
    fsdp: int | None = None
    max_context: bool = False
    whole: bool = False
    granularity: int = 65536
    json: bool = False  # (quiet: no progress lines)

    @classmethod
    def from_args(cls, args) -> JobRequest:
        """The request of parsed command-line ``args``."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def format_tokens(n: int) -> str:
    """Tokens as the report writes them: 128K, 1M, or the number."""
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 and n else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def job_report(config, args: JobRequest, say: Callable | None = None) -> dict:
    """The report (``autosp-plan --json``'s object) of the job ``args`` on the model of
    ``config`` (a transformers configuration). ``say``: where progress lines go (None:
    stderr unless ``args.json``)."""
    import torch

    from autosp.ir.diagnostics import AutospError
    from autosp.planning.estimate import meta_model
    from autosp.planning.fake_cuda import clear_length, model_dims, trainer_call
    start = time.perf_counter()
    if say is None:
        say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    world, seq = args.world, args.seq
    fsdp = args.fsdp if args.fsdp is not None else world
    if world < 1 or fsdp < 1 or world % fsdp:
        raise JobInputError(f"--fsdp {fsdp} must divide --world {world}")
    if seq < world:
        raise JobInputError(f"--seq {seq} is shorter than --world {world}")
    mesh = MeshOptions(strategy=Strategy.parse(args.strategy, "--strategy"), seq_len=seq,
                       ranks_per_node=min(world, args.ranks_per_node))

    def inputs(ids):
        return trainer_call(args.call, ids)
    meta = meta_model(config, torch.bfloat16)
    plan_obj = None
    example = torch.zeros(1, max(16, 4 * world), dtype=torch.long, device="meta")

    def call_kwargs(ids) -> dict:  # in MemoryModel's order (its program takes the leaves in this order)
        kw: dict = {"labels": ids}
        if getattr(getattr(meta, "config", None), "use_cache", None) is not None:
            kw["use_cache"] = False
        return {**kw, **inputs(ids)}
    kwargs = call_kwargs(example)
    if args.memory_budget is not None:
        from autosp.planning.planner import plan_memory
        say(f"[{PROG}] planning for memory_budget {_human(args.memory_budget)} at S={format_tokens(seq)} "
            "(the planner estimates each candidate: minutes at 8B)")
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        try:
            plan_obj = plan_memory(meta, (ids,), call_kwargs(ids), args.memory_budget, sp_size=world, fsdp=fsdp,
                                   mesh=mesh, device="cuda", verbose=not args.json, drop_logits=args.drop_logits,
                                   optimizer=args.optimizer, drop_logits_hint="--drop-logits")
        except AutospError as e:
            raise JobInputError(str(e)) from None
    elif args.drop_logits:  # as autosp.compile(drop_logits=True) without a budget
        from autosp.cost.plan import MemoryPlan
        plan_obj = MemoryPlan(mode=args.checkpointing, drop_logits=True)
    say(f"[{PROG}] compiling for {world} ranks ({args.call} call, mesh {args.strategy}) ...")
    t0 = time.perf_counter()
    steps = _Steps(meta, args, world, fsdp, mesh, plan_obj, inputs, kwargs, example)
    say(f"[{PROG}] compiled in {time.perf_counter() - t0:.0f} s ({steps.how}); one step at S={format_tokens(seq)} "
        "on CUDA's kernels ...")
    ranks = sorted({0, world - 1})
    found = {r: steps.step(seq, r) for r in ranks}
    last = found[world - 1]
    saved = max(f["saved"] for f in found.values())
    activation_peak = max(f["activation_peak"] for f in found.values())
    step_peak = max(f["peak"] for f in found.values())  # with the gradients live at the peak
    state = steps.state_bytes
    half = steps.step(max(world, seq // 2), world - 1, watch=False)
    growth = activation_peak / max(1, half["activation_peak"])
    problems = sorted({p for f in found.values() for p in f["problems"]})
    checked_at = seq
    if last["ambiguous"]:  # a sequence size equal to a model dim: the S^2 check runs at a clear length
        checked_at = clear_length(seq, world, model_dims(meta))
        say(f"[{PROG}] S={seq} has sequence sizes equal to model dims {last['ambiguous']}: "
            f"checking at S={checked_at} ...")
        problems = sorted(set(problems) | set(steps.step(checked_at, world - 1, composed=False)["problems"]))
    layout, why = steps.layout, steps.why
    report = {
        "model": args.model, "seq_len": seq, "world": world, "call": args.call, "fsdp": fsdp,
        "optimizer": args.optimizer, "drop_logits": args.drop_logits,
        "mesh": {"ulysses": layout.ulysses if layout else 1, "ring": layout.ring if layout else 1,
                 "zigzag": bool(layout.zigzag) if layout else False, "why": why or "one rank"},
        "plan": {"checkpointing": "memory_budget" if args.memory_budget is not None else args.checkpointing,
                 "layers": list(plan_obj.layers) if plan_obj is not None and plan_obj.layers else None,
                 "tiles": plan_obj.tiles if plan_obj is not None else 1,
                 "loss_chunk": plan_obj.loss_chunk if plan_obj is not None else None,
                 "describe": plan_obj.describe() if plan_obj is not None and args.memory_budget is not None
                 else None},
        "peak_bytes": {"state": state, "gradients": step_peak - activation_peak, "activations": saved,
                       "transient": max(0, activation_peak - saved), "total": state + step_peak},
        "gpu_mem_bytes": args.gpu_mem, "fits": state + step_peak <= args.gpu_mem,
        "activation_growth": round(growth, 3),
        "kernels": last["kernels"],
        "attention": last["attention"],
        "collective_bytes": last["wire"],
        "problems": problems, "checked_at": checked_at,
        "warnings": sorted({w for f in found.values() for w in f["warnings"]}),
        "max_context": None, "kernel_set": "cuda", "composed": steps.composed,
    }
    if args.max_context:
        say(f"[{PROG}] searching the longest sequence that fits {_human(args.gpu_mem)} ...")
        report["max_context"] = _max_context(steps, args.gpu_mem, world, args.granularity, say)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def _max_context(steps: _Steps, budget: int, world: int, granularity: int, say) -> int:
    """The longest multiple of ``granularity`` tokens whose step fits ``budget`` per rank
    (:func:`autosp.planning.estimate.longest_fit`; each probe one step of the first and the
    last rank on CUDA's kernels)."""
    from autosp.planning.estimate import longest_fit
    step = max(granularity, world)

    def fits(n: int) -> bool:
        total = steps.state_bytes + max(steps.step(n * step, r, watch=False)["peak"] for r in sorted({0, world - 1}))
        ok = total <= budget
        say(f"[{PROG}]   S={format_tokens(n * step)}: {_human(total)} {'fits' if ok else 'does not fit'}")
        return ok
    return longest_fit(fits, step)


class _Steps:
    """One rank's training step on CUDA's kernels, for the report: the whole model compiled,
    or, for a model whose layers repeat (:func:`autosp.planning.depth.repeated_layers`, more
    than ``LEAD + TAIL`` of them), put together from shallow copies as the ``memory_budget``
    planner does (:func:`autosp.planning.depth.compose_counts`: the shallow plan's figures
    plus each run's extra layers times one more layer's). Everything that adds up per layer
    is composed: the peaks, saved bytes, attention kernel calls, collective bytes; problems
    and warnings are the shallow steps' (every layer is the same op sequence). The model
    state is counted on the whole model. ``--whole`` compiles every layer (the check)."""

    def __init__(self, meta, args, world, fsdp, mesh, plan_obj, inputs, kwargs, example):
        import torch

        from autosp.planning.depth import LEAD, TAIL, repeated_layers
        from autosp.planning.estimate import model_state
        self.meta, self.args, self.world, self.fsdp, self.mesh = meta, args, world, fsdp, mesh
        self.plan_obj, self.inputs, self.kwargs, self.example = plan_obj, inputs, kwargs, example
        found = "--whole" if args.whole else repeated_layers(meta)
        if isinstance(found, tuple) and found[1] <= LEAD + TAIL:
            found = f"'{found[0]}' has {found[1]} layers (a shallow copy saves little)"
        if isinstance(found, tuple) and plan_obj is not None and plan_obj.layers and len(plan_obj.layers) != found[1]:
            found = f"the plan has {len(plan_obj.layers)} regions for {found[1]} layers"
        self.path: str | None = found[0] if isinstance(found, tuple) else None
        self.depth: int = found[1] if isinstance(found, tuple) else 0
        mode = plan_obj.mode if plan_obj is not None and not plan_obj.layers else args.checkpointing
        self.layers = tuple(plan_obj.layers) if plan_obj is not None and plan_obj.layers else (mode,) * self.depth
        self.composed = {"layers": self.path, "depth": self.depth} if self.path else {"whole": found}
        self.how = (f"{self.depth} layers composed from shallow copies of '{self.path}'" if self.path
                    else f"the whole model: {found}")
        self._models: dict = {}
        self._layouts: dict = {}  # layers -> (the layout, why that mesh)
        # Parameters and optimizer state (sharded by FSDP2), as the memory_budget planner counts
        # them; the gradients are in the step's peak, where they are live.
        param, _, optimizer = model_state(meta, torch.bfloat16, args.optimizer)
        self.state_bytes = param // fsdp + optimizer // fsdp
        first = self.shallow_base() if self.path else None
        self._model(first)
        self.layout, self.why = self._layouts[first]

    def shallow_base(self) -> tuple:
        from autosp.planning.depth import shallow_plan
        return shallow_plan(self.layers)[0]

    def _model(self, layers: tuple | None):
        """The MemoryModel of the shallow copy running ``layers`` (None: the whole model)."""
        from dataclasses import replace

        import torch

        from autosp.driver import module_choice, module_layout, transform
        from autosp.planning.depth import with_depth
        from autosp.planning.estimate import MemoryModel
        from autosp.runtime import collectives
        if layers not in self._models:
            model = self.meta if layers is None or self.path is None else with_depth(self.meta, self.path, len(layers))
            plan = self.plan_obj
            if layers is not None and plan is not None and plan.layers:
                plan = replace(plan, layers=layers)
            with collectives.simulate(self.world, 0):
                transformed = transform(model, (self.example,), self.kwargs, sp_size=self.world,
                                        checkpointing=self.args.checkpointing, plan=plan, mesh=self.mesh)
            memory = MemoryModel(model, self.world, torch.bfloat16, self.args.checkpointing, fsdp=self.fsdp,
                                 inputs=self.inputs, plan=plan, mesh=self.mesh, transformed=transformed, device="cuda",
                                 optimizer=self.args.optimizer)
            self._layouts[layers] = (module_layout(transformed.module), module_choice(transformed.module))
            self._models[layers] = memory
        return self._models[layers]

    def _one(self, layers: tuple | None, seq: int, rank: int, watch: bool) -> dict:
        """One rank's step of one (shallow or whole) model, as additive counts and sets."""
        from collections import Counter

        from autosp.planning.fake_cuda import cuda_step
        model = self._model(layers)
        if not watch:
            est = model.estimate(seq, rank=rank)
            return {"peak": est.peak_bytes, "activation_peak": est.activation_peak_bytes, "saved": est.saved_bytes}
        s = cuda_step(None, seq, sp_size=self.world, model=model, ranks=[rank])[0]
        out: dict = {"peak": s.peak_bytes, "activation_peak": s.activation_peak_bytes, "saved": s.saved_bytes,
                     "problems": set(s.problems()), "warnings": set(s.warnings), "ambiguous": s.ambiguous}
        out.update({("kernel", k): n for k, n in s.kernels().items()})
        out.update({("wire", k): n for k, n in s.wire_bytes().items()})
        forward = Counter((k, tuple(shapes[0]), tuple(shapes[1])) for k, shapes in s.attention
                          if not k.endswith("backward"))
        out.update({("attention", *key): n for key, n in forward.items()})
        return out

    def step(self, seq: int, rank: int, watch: bool = True, composed: bool = True) -> dict:
        """The step of ``rank`` at ``seq`` tokens: ``peak``, ``activation_peak``, ``saved``
        (bytes), and with ``watch``: ``kernels``, ``attention`` (forward attention ops),
        ``wire`` (collective bytes by kind), ``problems``, ``warnings``, ``ambiguous``.
        ``composed=False``: the shallow base alone (its problems are the model's)."""
        from autosp.planning.depth import compose_counts
        if self.path is None:
            one = self._one(None, seq, rank, watch)
        elif not composed:
            one = self._one(self.shallow_base(), seq, rank, watch)
        else:
            sets: dict = {}

            def counts(layers, sets=sets):
                found = self._one(layers, seq, rank, watch)
                for key in ("problems", "warnings", "ambiguous"):
                    if key in found:
                        sets.setdefault(key, set()).update(found.pop(key))
                return found
            one = {**compose_counts(self.layers, counts), **{k: sorted(v) for k, v in sets.items()}}
        if not watch:
            return one
        attention = [{"kernel": k[1], "q": list(k[2]), "k": list(k[3])} for k, n in one.items()
                     if isinstance(k, tuple) and k[0] == "attention" for _ in range(n)]
        return {"peak": one["peak"], "activation_peak": one["activation_peak"], "saved": one["saved"],
                "kernels": {k[1]: n for k, n in one.items() if isinstance(k, tuple) and k[0] == "kernel" and n},
                "wire": {k[1]: n for k, n in one.items() if isinstance(k, tuple) and k[0] == "wire" and n},
                "attention": attention, "problems": sorted(one.get("problems", ())),
                "warnings": sorted(one.get("warnings", ())), "ambiguous": sorted(one.get("ambiguous", ()))}


