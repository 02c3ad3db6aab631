"""``autosp-plan``: what a training job will need on CUDA, before renting the GPUs.

Examples::

    autosp-plan path/to/Llama-3-8B/            # a Hugging Face model directory (config.json only)
    autosp-plan config.json --seq 128K --world 8 --gpu-mem 80GiB --call position_ids
    autosp-plan 8b --seq 1M --world 8 --checkpointing full --max-context --json
    autosp-plan config.json --seq 512K --world 8 --memory-budget 70GiB      # the memory_budget planner

The model is built from its configuration on the meta device (no weights are read, no
memory is used), compiled for ``--world`` sequence-parallel ranks as
:func:`autosp.compile` compiles it, and one training step (forward, backward; bf16, AdamW,
batch 1) of the first and the last rank is run on **CUDA's kernels**
(:func:`autosp.planning.fake_cuda.cuda_step`): each attention call runs the CUDA kernel it will run
on a GPU, and the memory model counts what those kernels allocate. It prints:

- the mesh (Ulysses x ring) the compiler chose and why;
- the per-layer plan (checkpointing, tiles, offload);
- the predicted peak per rank, split into **state** (parameters, gradients, optimizer
  state; sharded by FSDP2 over ``--fsdp`` ranks, default every rank), **activations**
  (bytes kept for backward) and **transient** (the rest of the step's peak);
- the CUDA kernel of every attention op, and anything the harness flags (a tensor with
  two sequence dims, math attention, a collective NCCL refuses);
- the collectives' bytes per step;
- with ``--max-context``, the longest sequence that fits ``--gpu-mem``.

``--json`` prints one JSON object instead, with the keys: ``model``, ``seq_len``,
``world``, ``call``, ``mesh`` (``ulysses``, ``ring``, ``zigzag``, ``why``), ``plan``
(``checkpointing``, ``layers``, ``tiles``, ``loss_chunk``), ``peak_bytes`` (``state``,
``activations``, ``transient``, ``total``: per rank, in bytes), ``gpu_mem_bytes``,
``fits``, ``activation_growth`` (the activation peak at ``seq_len`` over that at half of
it: 2.0 is linear), ``kernels`` (kernel name -> calls per step), ``attention`` (per forward
attention op: ``kernel``, ``q``, ``k`` shapes), ``collective_bytes`` (kind -> bytes per
step per rank), ``problems`` (what a GPU would not take: a tensor with two sequence dims,
math attention, a collective NCCL refuses; checked at ``checked_at``: ``seq_len``, or the
nearest length none of whose shard sizes equals a model dim), ``max_context`` (tokens, or null), ``kernel_set``
(``"cuda"``: the figures are costed on CUDA's kernels' meta implementations, not run on a
GPU) and ``seconds``.

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

    from autosp.driver import module_choice, module_layout, transform
    from autosp.ir.diagnostics import AutospError
    from autosp.planning.estimate import MemoryModel, meta_model
    from autosp.planning.fake_cuda import clear_length, cuda_step, model_dims, trainer_call
    from autosp.runtime import collectives
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
                                   mesh=mesh, device="cuda", verbose=not args.json)
        except AutospError as e:
            raise PlanInputError(str(e)) from None
    say(f"[{PROG}] compiling for {world} ranks ({args.call} call, mesh {args.strategy}) ...")
    t0 = time.perf_counter()
    with collectives.simulate(world, 0):
        transformed = transform(meta, (example,), kwargs, sp_size=world, checkpointing=args.checkpointing,
                                plan=plan_obj, mesh=mesh)
    layout = module_layout(transformed.module)
    why = module_choice(transformed.module)
    model = MemoryModel(meta, world, torch.bfloat16, args.checkpointing, fsdp=fsdp, inputs=inputs, plan=plan_obj,
                        mesh=mesh, transformed=transformed, device="cuda")
    say(f"[{PROG}] compiled in {time.perf_counter() - t0:.0f} s; one step at S={_tokens(seq)} on CUDA's kernels ...")
    steps = cuda_step(None, seq, sp_size=world, model=model, ranks=sorted({0, world - 1}))
    est = max((s.estimate for s in steps if s.estimate is not None), key=lambda e: e.peak_bytes)
    saved = max(s.saved_bytes for s in steps)
    activation_peak = max(s.activation_peak_bytes for s in steps)
    state = est.state_bytes()
    model.rank = world - 1  # (the last rank: one estimate)
    half = model.estimate(max(world, seq // 2))
    model.rank = None
    growth = activation_peak / max(1, half.activation_peak_bytes)
    step = steps[-1]
    problems = sorted({p for s in steps for p in s.problems()})
    checked_at = seq
    if step.ambiguous:  # a sequence size equal to a model dim: the S^2 check runs at a clear length
        checked_at = clear_length(seq, world, model_dims(meta))
        say(f"[{PROG}] S={seq} has sequence sizes equal to model dims {step.ambiguous}: "
            f"checking at S={checked_at} ...")
        probe = cuda_step(None, checked_at, sp_size=world, model=model, ranks=[world - 1])[0]
        problems = sorted(set(problems) | set(probe.problems()))
    forward = [(k, shapes) for k, shapes in step.attention if not k.endswith("backward")]
    report = {
        "model": args.model, "seq_len": seq, "world": world, "call": args.call, "fsdp": fsdp,
        "mesh": {"ulysses": layout.ulysses if layout else 1, "ring": layout.ring if layout else 1,
                 "zigzag": bool(layout.zigzag) if layout else False, "why": why or "one rank"},
        "plan": {"checkpointing": args.checkpointing if plan_obj is None else "memory_budget",
                 "layers": list(plan_obj.layers) if plan_obj is not None else None,
                 "tiles": plan_obj.tiles if plan_obj is not None else 1,
                 "loss_chunk": plan_obj.loss_chunk if plan_obj is not None else None,
                 "describe": plan_obj.describe() if plan_obj is not None else None},
        "peak_bytes": {"state": state, "activations": saved, "transient": max(0, activation_peak - saved),
                       "total": state + activation_peak},
        "gpu_mem_bytes": args.gpu_mem, "fits": state + activation_peak <= args.gpu_mem,
        "activation_growth": round(growth, 3),
        "kernels": step.kernels(),
        "attention": [{"kernel": k, "q": list(shapes[0]), "k": list(shapes[1])} for k, shapes in forward],
        "collective_bytes": step.wire_bytes(),
        "problems": problems, "checked_at": checked_at, "warnings": sorted({w for s in steps for w in s.warnings}),
        "max_context": None, "kernel_set": "cuda",
    }
    if args.max_context:
        say(f"[{PROG}] searching the longest sequence that fits {_human(args.gpu_mem)} ...")
        report["max_context"] = _max_context(model, args.gpu_mem, world, args.granularity, say)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def _max_context(model, budget: int, world: int, granularity: int, say) -> int:
    """The longest multiple of ``granularity`` tokens whose step fits ``budget`` per rank
    (:func:`autosp.planning.estimate.longest_fit`; each probe one step on CUDA's kernels)."""
    from autosp.planning.estimate import longest_fit
    step = max(granularity, world)

    def fits(n: int) -> bool:
        est = model.estimate(n * step)
        ok = est.total_bytes() <= budget
        say(f"[{PROG}]   S={_tokens(n * step)}: {_human(est.total_bytes())} {'fits' if ok else 'does not fit'}")
        return ok
    return longest_fit(fits, step)


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
    lines += [f"  peak per rank: {_human(peak['total'])} = state {_human(peak['state'])} (FSDP2 over {r['fsdp']}) "
              f"+ activations {_human(peak['activations'])} + transient {_human(peak['transient'])}; "
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
    from autosp.driver import CHECKPOINTING
    from autosp.planning.strategy import STRATEGIES
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
    p.add_argument("--strategy", choices=STRATEGIES, default="auto", help="the mesh (default auto)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--fsdp", type=int, default=None, help="FSDP2 degree of the model state (default --world)")
    p.add_argument("--max-context", action="store_true", help="also search the longest sequence that fits")
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
