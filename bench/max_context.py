"""Simulated max trainable context per GPU: Llama-3-8B and a 1B Llama at SP 8, 80 GB.

    python bench/max_context.py [--budget-gib 80] [--sp 8] [--models 8b 1b]
    python bench/max_context.py --mechanisms [--device cpu cuda]    # 8B: 8 x 80 GiB and 1 x 141 GiB
    python bench/max_context.py --mechanisms --model bench/configs/llama-3-70b.json --world 32 64

``--mechanisms``: Llama-3-8B's max context with each mechanism of ``memory_budget`` (full
recompute with 64 tiles of the token-wise blocks and the tiled loss; then every layer's
input offloaded), on 8 GPUs of 80 GiB (SP 8, FSDP2 over 8, AdamW) and on one GPU of 141 GiB
(HostAdamW: fp32 masters and moments on the host), costed on each ``--device``'s kernels
(``cpu``: the fused CPU kernel on meta, today's figures; ``cuda``: CUDA's kernels through
the fake-CUDA path, :func:`autosp.runtime.kernels.target`), side by side in one run. Every
figure names the kernel set it was costed on; none was run on a GPU.

``--mechanisms --model CONFIG --world N...``: a Hugging Face config (Llama-3-70B), costed on
CUDA's kernels as ``autosp-plan`` costs it (the trainer's ``position_ids`` call, the mesh
``auto`` chooses at 8 ranks per node, FSDP2 over every rank, the logits dropped), its 80
layers put together from shallow copies of 4 and 5 layers
(:func:`autosp.planning.depth.compose`, as the ``memory_budget`` planner does): per rank,
parameters and optimizer state / N plus the step's peak (gradients counted where they are
live), for: full recompute (64 tiles, tiled loss); + every layer's input offloaded; +
HostAdamW (fp32 masters and moments on the host, as ALST's ZeRO-3 optimizer offload).

``autosp.max_context`` searches the longest sequence whose training step fits the
budget per rank, from the memory model (the compiled program run on meta tensors as
one of 8 simulated ranks; bf16, AdamW, flash attention, batch 1), in the configuration
the runtime executes: model state sharded by FSDP2 over the 8 ranks (the recipe:
``fully_shard`` on each layer, then the root), with the unsharded layers, the prefetch
buffers and each layer's whole gradient until its reduce-scatter counted as the runtime
allocates them (``fsdp=8``). Columns: autosp without checkpointing (eager Ulysses: the
same saved tensors as hand-written Ulysses, which bench/memory.py measures side by
side), autosp + SAC, autosp + SAC-min, autosp + full recompute. Prints a table and appends it to
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.options import CHECKPOINTING  # noqa: E402
from autosp.planning.estimate import GiB, MemoryModel, longest_fit, max_context  # noqa: E402

MECHANISMS = ("full recompute, 64 tiles, tiled loss", "+ offload of every layer's input")
SETUPS = (("8 x 80 GiB", 8, 80, "adamw", 1 << 19), ("1 x 141 GiB", 1, 141, "host-adamw", 1 << 17))


def mechanisms(devices) -> str:
    """The per-mechanism max-context table (see the module docstring)."""
    from autosp.cost.plan import MemoryPlan
    rows = ["| setup | mechanism | " + " | ".join(f"max context ({d} kernels)" for d in devices)
            + " | GiB/rank at the limit (" + devices[-1] + ") |", "|---|---|" + "---|" * (len(devices) + 1)]
    for label, sp, gib, optimizer, granule in SETUPS:
        for name, offload in zip(MECHANISMS, (False, True)):
            plan = MemoryPlan(layers=("full+offload" if offload else "full",) * 32, tiles=64, loss_chunk=4096,
                              drop_logits=True)
            found, at = {}, None
            model = MemoryModel("8b", sp, torch.bfloat16, plan=plan, fsdp=sp, optimizer=optimizer)
            model.rank = sp - 1  # the last rank: it also narrows the shifted logits (the larger peak here)
            for device in devices:
                start = time.perf_counter()
                model.device = device  # one compiled program, costed on each device's kernels

                def fits(n: int, model=model, tag=f"{label} {name} {device}", granule=granule, gib=gib) -> bool:
                    est = model.estimate(n * granule)
                    print(f"    {tag}: S={n * granule // 1024}K {est.total_bytes() / GiB:.1f} GiB", flush=True)
                    return est.total_bytes() <= gib * GiB
                found[device] = longest_fit(fits, granule, start=2)
                at = model.estimate(max(granule, found[device]))
                print(f"  {label} {name} {device}: {found[device] // 1024}K ({time.perf_counter() - start:.0f} s)",
                      flush=True)
            cells = " | ".join(f"{found[d] / (1 << 20):.2f}M" for d in devices)
            rows.append(f"| {label} | {name} | {cells} | {at.state_bytes() / GiB:.1f} + "
                        f"{at.activation_peak_bytes / GiB:.1f} |")
            print(rows[-1], flush=True)
    return "\n".join(rows)


MECHANISMS_70B = (("full recompute, 64 tiles, tiled loss, logits dropped", "full", "adamw"),
                  ("+ offload of every layer's input", "full+offload", "adamw"),
                  ("+ HostAdamW (optimizer state on the host)", "full+offload", "host-adamw"))


def composed_mechanisms(config_path: str, worlds, gib: float, granule: int) -> str:
    """The per-mechanism max-context table of a Hugging Face config (module docstring)."""
    from dataclasses import replace

    from autosp.cost.plan import MemoryPlan
    from autosp.driver import transform
    from autosp.planning.depth import TAIL, compose, repeated_layers, with_depth
    from autosp.planning.estimate import meta_model, model_state
    from autosp.planning.fake_cuda import trainer_call
    from autosp.runtime import collectives
    from autosp.tools.plan import load_config
    meta = meta_model(load_config(config_path), torch.bfloat16)
    path, n_layers = repeated_layers(meta)
    rows = ["| setup | mechanism | max context (cuda kernels) | GiB/rank at the limit: state + step peak | seconds |",
            "|---|---|---|---|---|"]
    for world in worlds:
        mesh = {"strategy": "auto", "ranks_per_node": min(world, 8), "seq_len": 4 << 20}
        example = torch.zeros(1, max(16, 4 * world), dtype=torch.long, device="meta")
        kwargs = {"labels": example, "use_cache": False, **trainer_call("position_ids", example)}
        for name, choice, optimizer in MECHANISMS_70B:
            start = time.perf_counter()
            plan = MemoryPlan(layers=(choice,) * n_layers, tiles=64, loss_chunk=4096, drop_logits=True)
            param, _, opt = model_state(meta, torch.bfloat16, optimizer)
            state = param // world + opt // world
            models = {}
            for depth in (TAIL, TAIL + 1):
                shallow = with_depth(meta, path, depth)
                p = replace(plan, layers=(choice,) * depth)
                with collectives.simulate(world, 0):
                    t = transform(shallow, (example,), kwargs, sp_size=world, plan=p, mesh=mesh)
                models[depth] = MemoryModel(shallow, world, torch.bfloat16, plan=p, fsdp=world, optimizer=optimizer,
                                            rank=world - 1, inputs=lambda ids: trainer_call("position_ids", ids),
                                            mesh=mesh, transformed=t, device="cuda")

            def total(seq: int, models=models, state=state, plan=plan) -> int:
                return state + compose(plan.layers, lambda layers: models[len(layers)].estimate(seq).peak_bytes)

            def fits(n: int, total=total, tag=f"{world} x {gib:g} GiB {name}") -> bool:
                t = total(n * granule)
                print(f"    {tag}: S={n * granule / (1 << 20):.2f}M {t / GiB:.1f} GiB", flush=True)
                return t <= gib * GiB
            found = longest_fit(fits, granule, start=4)
            at = total(max(found, granule))
            rows.append(f"| {world} x {gib:g} GiB | {name} | {found / (1 << 20):.2f}M | {state / GiB:.1f} + "
                        f"{(at - state) / GiB:.1f} | {time.perf_counter() - start:.0f} |")
            print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mechanisms", action="store_true", help="the 8B per-mechanism table (module docstring)")
    parser.add_argument("--device", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    parser.add_argument("--budget-gib", type=float, default=80.0)
    parser.add_argument("--sp", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=["8b", "1b"])
    parser.add_argument("--modes", nargs="+", default=list(CHECKPOINTING), choices=CHECKPOINTING)
    parser.add_argument("--granularity", type=int, default=8192)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--model", default=None, help="with --mechanisms: a Hugging Face config.json (e.g. 70B)")
    parser.add_argument("--world", nargs="+", type=int, default=[32, 64], help="with --model: ranks (SP = FSDP)")
    parser.add_argument("--granule", type=int, default=1 << 19, help="with --model: the search's step in tokens")
    args = parser.parse_args()
    if args.mechanisms and args.model:
        table = composed_mechanisms(args.model, args.world, args.budget_gib, args.granule)
        if not args.no_write:
            append_section(f"{Path(args.model).stem} max context per mechanism",
                           "costed (fake-CUDA/meta), not GPU-measured: the memory model on CUDA's kernels' meta "
                           "implementations, bf16, batch 1, the last rank, the position_ids call, mesh auto at 8 "
                           "ranks per node, FSDP2 over every rank, 80 layers composed from shallow copies; "
                           f"`python bench/max_context.py --mechanisms --model {args.model} --world "
                           f"{' '.join(map(str, args.world))}`", table)
        return
    if args.mechanisms:
        table = mechanisms(args.device)
        if not args.no_write:
            append_section("Llama-3-8B max context per mechanism, by kernel set",
                           "memory model on meta, bf16, batch 1, the last rank; kernel sets: cpu = the fused CPU "
                           "kernel, cuda = CUDA's kernels' meta implementations (not run on a GPU); "
                           "`python bench/max_context.py --mechanisms`", table)
        return
    budget = int(args.budget_gib * GiB)
    rows = ["| model | SP | eager Ulysses / autosp (off) | autosp + SAC | autosp + SAC-min | autosp + full | "
            "SAC gain | GiB/rank at the SAC limit (state + activation peak) |", "|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for name in args.models:
        found = {}
        for mode in args.modes:
            start = time.perf_counter()
            found[mode] = max_context(budget, name, sp_size=args.sp, dtype=torch.bfloat16, checkpointing=mode,
                                      granularity=args.granularity, fsdp=args.sp)
            print(f"  {name} {mode}: {found[mode]} tokens ({time.perf_counter() - start:.0f} s)", flush=True)
        at = "sac" if "sac" in found else args.modes[0]
        est = MemoryModel(name, args.sp, torch.bfloat16, at, fsdp=args.sp).estimate(max(found[at], args.granularity))
        state = est.state_bytes() / GiB
        gain = found["sac"] / found["off"] if found.get("off") and "sac" in found else float("nan")

        cells = {mode: f"{found[mode] // 1024}K" if mode in found else "-" for mode in CHECKPOINTING}
        rows.append(f"| {name} | {args.sp} | {cells['off']} | {cells['sac']} | {cells['sac-min']} | {cells['full']} | "
                    f"{gain:.2f}x | {state:.1f} + {est.activation_peak_bytes / GiB:.1f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Simulated max context per GPU",
                       f"{args.budget_gib:g} GiB, bf16, AdamW, FSDP2 over the {args.sp} SP ranks as executed", table)


if __name__ == "__main__":
    main()
