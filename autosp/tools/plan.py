"""``autosp-plan``: what a training job will need on CUDA, before renting the GPUs.

Examples::

    autosp-plan path/to/Llama-3-8B/            # a Hugging Face model directory (config.json only)
    autosp-plan config.json --seq 128K --world 8 --gpu-mem 80GiB --call position_ids
    autosp-plan 8b --seq 1M --world 8 --checkpointing full --max-context --json
    autosp-plan config.json --seq 512K --world 8 --memory-budget 70GiB      # the memory_budget planner
    autosp-plan bench/configs/llama-3-70b.json --seq 4M --world 32 --memory-budget 80GiB --drop-logits

The model is built from its configuration on the meta device (no weights are read, no
memory is used), compiled for ``--world`` sequence-parallel ranks as
:func:`autosp.compile` compiles it, and one training step (forward, backward; bf16, AdamW,
batch 1) of the first and the last rank is run on **CUDA's kernels**
(:func:`autosp.planning.fake_cuda.cuda_step`): each attention call runs the CUDA kernel it will run
on a GPU, and the memory model counts what those kernels allocate. It prints:

- the mesh (Ulysses x ring) the compiler chose and why;
- the per-layer plan (checkpointing, tiles, offload);
- the predicted peak per rank, split into **state** (parameters and optimizer state;
  sharded by FSDP2 over ``--fsdp`` ranks, default every rank; ``--optimizer host-adamw``
  keeps the optimizer's in host memory), **gradients** (the gradients live at the step's
  peak: they are made during backward), **activations** (bytes kept for backward) and
  **transient** (the rest of the step's peak), counted as the ``memory_budget`` planner
  counts them;
- the CUDA kernel of every attention op, and anything the harness flags (a tensor with
  two sequence dims, math attention, a collective NCCL refuses);
- the collectives' bytes per step;
- with ``--max-context``, the longest sequence that fits ``--gpu-mem``.

``--json`` prints one JSON object instead, with the keys: ``model``, ``seq_len``,
``world``, ``call``, ``mesh`` (``ulysses``, ``ring``, ``zigzag``, ``why``), ``plan``
(``checkpointing``, ``layers``, ``tiles``, ``loss_chunk``), ``peak_bytes`` (``state``,
``gradients``, ``activations``, ``transient``, ``total``: per rank, in bytes), ``gpu_mem_bytes``,
``fits``, ``activation_growth`` (the activation peak at ``seq_len`` over that at half of
it: 2.0 is linear), ``kernels`` (kernel name -> calls per step), ``attention`` (per forward
attention op: ``kernel``, ``q``, ``k`` shapes), ``collective_bytes`` (kind -> bytes per
step per rank), ``problems`` (what a GPU would not take: a tensor with two sequence dims,
math attention, a collective NCCL refuses; checked at ``checked_at``: ``seq_len``, or the
nearest length none of whose shard sizes equals a model dim), ``max_context`` (tokens, or null), ``kernel_set``
(``"cuda"``: the figures are costed on CUDA's kernels' meta implementations, not run on a
GPU), ``optimizer``, ``drop_logits``, ``composed`` (``layers`` and ``depth``: the repeated
layers put together from shallow copies; or ``whole``: why every layer was compiled) and
``seconds``.

A model whose layers repeat (a Llama's ``model.layers``) is compiled and stepped as shallow
copies of 4 to 8 layers, and the whole model's figures are put together from theirs
(:func:`autosp.planning.depth.compose_counts`), as the ``memory_budget`` planner does:
Llama-3-70B at 4M tokens on 32 ranks is planned in minutes, not a quarter of an hour;
``--whole`` compiles every layer. ``--drop-logits``: the caller uses the loss, not the
logits (``autosp.compile(drop_logits=True)``).

Bad input (a missing file, an unknown architecture, a budget nothing fits) prints one line
and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from autosp.units import human_bytes as _human

PROG = "autosp-plan"
CALLS = ("plain", "position_ids", "padded", "packed")
GiB = 1 << 30


class PlanInputError(Exception):
    """Bad input: printed as one line, exit status 2."""


def parse_tokens(text: str) -> int:
    """``131072``, ``128K``, ``1M`` (K = 1024) -> tokens."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a token count (e.g. 131072, 128K, 1M)")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[m.group(2).lower()])


def _bytes(text: str) -> int:
    from autosp.ir.diagnostics import AutospError
    from autosp.units import parse_bytes
    try:
        return parse_bytes(text)
    except AutospError as e:
        raise argparse.ArgumentTypeError(str(e).replace("memory_budget: ", "")) from None


def load_config(spec: str):
    """A preset name (autosp's Llama presets, as a Hugging Face Llama of those sizes, so every
    ``--call`` applies), a model directory with ``config.json``, or a ``config.json`` file
    -> a transformers config."""
    import transformers

    from autosp.models import LLAMA_PRESETS
    if spec in LLAMA_PRESETS:
        p = LLAMA_PRESETS[spec]
        return transformers.LlamaConfig(
            vocab_size=p["vocab"], hidden_size=p["hidden"], num_hidden_layers=p["layers"],
            num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"], intermediate_size=p["ffn"],
            tie_word_embeddings=p.get("tie_embeddings", True), rms_norm_eps=1e-6, use_cache=False,
            max_position_embeddings=1 << 20)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise PlanInputError(f"{spec}: no such file, model directory with config.json, or preset "
                             f"({', '.join(LLAMA_PRESETS)})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PlanInputError(f"{path}: not a JSON configuration ({e})") from None
    model_type = raw.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise PlanInputError(f"{path}: unknown architecture (model_type {model_type!r}; transformers "
                             f"{transformers.__version__} does not know it)")
    config = transformers.CONFIG_MAPPING[model_type].from_dict(raw)
    config.use_cache = False
    from transformers import AutoModelForCausalLM
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise PlanInputError(f"{path}: {model_type} has no causal-LM model in transformers (autosp-plan plans "
                             "causal language models)")
    return config


def _tokens(n: int) -> str:
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 and n else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def plan(args) -> dict:
    """The report (the ``--json`` object) for parsed command-line ``args``."""
    import torch

    from autosp.ir.diagnostics import AutospError
    from autosp.planning.estimate import meta_model
    from autosp.planning.fake_cuda import clear_length, model_dims, trainer_call
    start = time.perf_counter()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    config = load_config(args.model)
    world, seq = args.world, args.seq
    fsdp = args.fsdp if args.fsdp is not None else world
    if world < 1 or fsdp < 1 or world % fsdp:
        raise PlanInputError(f"--fsdp {fsdp} must divide --world {world}")
    if seq < world:
        raise PlanInputError(f"--seq {seq} is shorter than --world {world}")
    mesh = {"strategy": args.strategy, "seq_len": seq, "ranks_per_node": min(world, args.ranks_per_node)}

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
        say(f"[{PROG}] planning for memory_budget {_human(args.memory_budget)} at S={_tokens(seq)} "
            "(the planner estimates each candidate: minutes at 8B)")
        ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
        try:
            plan_obj = plan_memory(meta, (ids,), call_kwargs(ids), args.memory_budget, sp_size=world, fsdp=fsdp,
                                   mesh=mesh, device="cuda", verbose=not args.json, drop_logits=args.drop_logits,
                                   optimizer=args.optimizer, drop_logits_hint="--drop-logits")
        except AutospError as e:
            raise PlanInputError(str(e)) from None
    elif args.drop_logits:  # as autosp.compile(drop_logits=True) without a budget
        from autosp.cost.plan import MemoryPlan
        plan_obj = MemoryPlan(mode=args.checkpointing, drop_logits=True)
    say(f"[{PROG}] compiling for {world} ranks ({args.call} call, mesh {args.strategy}) ...")
    t0 = time.perf_counter()
    steps = _Steps(meta, args, world, fsdp, mesh, plan_obj, inputs, kwargs, example)
    say(f"[{PROG}] compiled in {time.perf_counter() - t0:.0f} s ({steps.how}); one step at S={_tokens(seq)} "
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
        say(f"[{PROG}]   S={_tokens(n * step)}: {_human(total)} {'fits' if ok else 'does not fit'}")
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
            model.rank = rank
            est = model.estimate(seq)
            model.rank = None
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


def render(r: dict) -> str:
    """The report as text."""
    peak = r["peak_bytes"]
    mesh = r["mesh"]
    lines = [f"autosp-plan: {r['model']} at S={_tokens(r['seq_len'])} over {r['world']} ranks ({r['call']} call), "
             f"costed on CUDA's kernels (meta implementations; not run on a GPU)",
             f"  mesh: ulysses={mesh['ulysses']} ring={mesh['ring']}{' zigzag' if mesh['zigzag'] else ''}: "
             f"{mesh['why']}"]
    p = r["plan"]
    if p["describe"]:
        lines.append("  plan (memory_budget): " + p["describe"].replace("\n", "\n    "))
    else:
        lines.append(f"  plan: every layer checkpointing={p['checkpointing']}")
    lines += [f"  peak per rank: {_human(peak['total'])} = state {_human(peak['state'])} (FSDP2 over {r['fsdp']}, "
              f"{r['optimizer']}) + gradients {_human(peak['gradients'])} + activations {_human(peak['activations'])}"
              f" + transient {_human(peak['transient'])}; "
              f"{'fits' if r['fits'] else 'does NOT fit'} {_human(r['gpu_mem_bytes'])}",
              f"  activation peak at S over S/2: {r['activation_growth']:.2f}x (2.00 is linear)"]
    kinds: dict = {}
    for a in r["attention"]:
        kinds[a["kernel"]] = kinds.get(a["kernel"], 0) + 1
    lines.append(f"  attention: {len(r['attention'])} ops: " + ", ".join(f"{n} x {k}" for k, n in kinds.items())
                 + (f" (q {r['attention'][0]['q']}, k {r['attention'][0]['k']})" if r["attention"] else ""))
    lines.append("  kernels per step: " + ", ".join(f"{k} {n}" for k, n in sorted(r["kernels"].items())))
    wire = r["collective_bytes"]
    lines.append("  collectives per step per rank: " + (", ".join(f"{k} {_human(n)}" for k, n in sorted(wire.items()))
                                                        or "none"))
    for w in r["warnings"]:
        lines.append(f"  warning: {w}")
    for prob in r["problems"]:
        lines.append(f"  PROBLEM: {prob}")
    if not r["problems"]:
        at = "" if r["checked_at"] == r["seq_len"] else f" (checked at S={r['checked_at']}: at S, a shard size equals a model dim)"
        lines.append(f"  checks: no tensor with two sequence dims, no math attention, NCCL-ready collectives{at}")
    if r["max_context"] is not None:
        lines.append(f"  max context in {_human(r['gpu_mem_bytes'])} per rank: {_tokens(r['max_context'])} tokens "
                     f"({r['max_context']})")
    lines.append(f"  ({r['seconds']:.0f} s)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from autosp.cost.strategy import STRATEGIES
    from autosp.options import CHECKPOINTING
    from autosp.planning.estimate import OPTIMIZERS
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a Hugging Face model directory, its config.json, or a preset (tiny, small, 1b, 8b)")
    p.add_argument("--seq", type=parse_tokens, default=131072, help="sequence length (e.g. 131072, 128K, 1M)")
    p.add_argument("--world", type=int, default=8, help="sequence-parallel ranks (default 8)")
    p.add_argument("--gpu-mem", type=_bytes, default=80 * GiB, help="memory per GPU (e.g. 80GiB, 141GiB)")
    p.add_argument("--call", choices=CALLS, default="position_ids",
                   help="how the trainer calls the model (default position_ids: HF Trainer's padding collator)")
    p.add_argument("--checkpointing", choices=CHECKPOINTING, default="off")
    p.add_argument("--memory-budget", type=_bytes, default=None, help="plan per-layer memory to fit this budget")
    p.add_argument("--drop-logits", action="store_true",
                   help="the caller needs the loss, not the logits (as autosp.compile(drop_logits=True)): the tiled "
                        "loss never materialises the [S, vocab] logits")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                   help="adamw (default: fp32 moments and masters on the GPU, sharded by FSDP2) or host-adamw "
                        "(autosp.runtime.host_optimizer.HostAdamW: masters and moments in host memory, as ZeRO's "
                        "optimizer offload); sgd, none")
    p.add_argument("--strategy", choices=STRATEGIES, default="auto", help="the mesh (default auto)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--fsdp", type=int, default=None, help="FSDP2 degree of the model state (default --world)")
    p.add_argument("--max-context", action="store_true", help="also search the longest sequence that fits")
    p.add_argument("--whole", action="store_true",
                   help="compile and step every layer (default: a model whose layers repeat is put together from "
                        "shallow copies, as the memory_budget planner does; the same figures in a fraction of the time)")
    p.add_argument("--granularity", type=parse_tokens, default=65536, help="max-context step (default 64K)")
    p.add_argument("--json", action="store_true", help="print one JSON object (keys: see the module docstring)")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: usage and one line, status 2
        return int(e.code or 0)
    try:
        report = plan(args)
    except PlanInputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
