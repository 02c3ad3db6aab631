"""Simulated max trainable context per GPU: Llama-3-8B and a 1B Llama at SP 8, 80 GB.

    python bench/max_context.py [--budget-gib 80] [--sp 8] [--models 8b 1b]

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
from autosp.api import CHECKPOINTING  # noqa: E402
from autosp.estimate import GiB, MemoryModel, max_context  # noqa: E402
from results import append_section  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-gib", type=float, default=80.0)
    parser.add_argument("--sp", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=["8b", "1b"])
    parser.add_argument("--modes", nargs="+", default=list(CHECKPOINTING), choices=CHECKPOINTING)
    parser.add_argument("--granularity", type=int, default=8192)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
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
