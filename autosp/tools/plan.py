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
from pathlib import Path

from autosp.planning.job import PROG, JobInputError, JobRequest, format_tokens, job_report
from autosp.units import human_bytes as _human

CALLS = ("plain", "position_ids", "padded", "packed")
GiB = 1 << 30


# Bad input: printed as one line, exit status 2 (the planner's, and this CLI's own).
PlanInputError = JobInputError


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


def render(r: dict) -> str:
    """The report as text."""
    peak = r["peak_bytes"]
    mesh = r["mesh"]
    lines = [f"autosp-plan: {r['model']} at S={format_tokens(r['seq_len'])} over {r['world']} ranks ({r['call']} call), "
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
        lines.append(f"  max context in {_human(r['gpu_mem_bytes'])} per rank: {format_tokens(r['max_context'])} tokens "
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
        report = job_report(load_config(args.model), JobRequest.from_args(args))
    except PlanInputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
