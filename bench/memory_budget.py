"""``memory_budget`` measured on CPU: peak and step time of the budgeted plan against SAC
and no checkpointing, side by side in one run (P=2 gloo ranks, a Llama-style model with a
large vocabulary), then the memory model's max context for Llama-3-8B with each mechanism.

    python bench/memory_budget.py --measure            # the CPU table (V=8192, hidden 64, S=2048)
    python bench/memory_budget.py --simulate           # 8B on 8 GPUs (FSDP2, AdamW) and 1 GPU (HostAdamW)
    python bench/memory_budget.py --plan-8b 4194304    # the plan memory_budget prints for 8B, 8 x 80 GB

Budget = parameter bytes + 0.35 x the unbudgeted measured peak (the issue's acceptance).
Times are the median of ``--repeat`` steps, measured in the same processes one after another.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from autosp.testing.distributed import run_ranks


def _measure(rank, world, queue, seq, repeat):
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.memory import measure_step
    torch.manual_seed(0)
    base = LlamaLike(LlamaConfig(vocab=8192, hidden=64, layers=2, heads=4, kv_heads=2, ffn=172))
    ids = torch.randint(0, 8192, (1, seq))
    params = sum(p.numel() * p.element_size() for p in base.parameters())
    rows = {}

    def run(name, **options):
        model = copy.deepcopy(base)
        compiled = autosp.compile(model, **options)
        compiled(ids, labels=ids)["loss"].backward()
        model.zero_grad(set_to_none=True)
        peak = measure_step(lambda: compiled(ids, labels=ids)["loss"], exclude=list(model.parameters())).peak_bytes
        times = []
        for _ in range(repeat):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            compiled(ids, labels=ids)["loss"].backward()
            times.append(time.perf_counter() - t0)
        rows[name] = (params + peak, statistics.median(times))

    run("no checkpointing")
    run("sac", checkpointing="sac")
    peak = torch.tensor([rows["no checkpointing"][0] - params], dtype=torch.float64)
    torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    budget = params + int(0.35 * peak.item())
    run("memory_budget", memory_budget=budget, optimizer="none", drop_logits=True)
    queue.put((rank, dict(rows=rows, budget=budget)))


def measure(seq: int, repeat: int) -> str:
    results = run_ranks(_measure, 2, args=(seq, repeat), timeout=900, fresh=True)
    lines = [f"## memory_budget measured (CPU, P=2, LlamaLike V=8192 hidden 64 2 layers, S={seq}, fp32; "
             "budget = params + 0.35 x unbudgeted peak; the larger rank)", "",
             "| plan | measured peak incl. params (MiB) | budget (MiB) | within | step s (median) | vs no ckpt |",
             "|---|---|---|---|---|---|"]
    budget = max(r["budget"] for r in results.values())
    base_t = max(r["rows"]["no checkpointing"][1] for r in results.values())
    for name in ("no checkpointing", "sac", "memory_budget"):
        peak = max(r["rows"][name][0] for r in results.values())
        t = max(r["rows"][name][1] for r in results.values())
        lines.append(f"| {name} | {peak / 2**20:.1f} | {budget / 2**20:.1f} | {'yes' if peak <= budget else 'no'} | "
                     f"{t:.3f} | x{t / base_t:.2f} |")
    return "\n".join(lines)


def simulate(setups) -> str:
    """Total GiB per rank (state + activation peak) of Llama-3-8B for each plan, at each
    length of each setup ``(sp, fsdp, optimizer, lengths)``."""
    from autosp.cost.plan import MemoryPlan
    from autosp.planning.estimate import GiB, MemoryModel
    layers = 32
    rows = [("SAC-min (before)", MemoryPlan(mode="sac-min", tile_loss=False)),
            ("+ tiled loss", MemoryPlan(mode="sac-min", loss_chunk=4096, drop_logits=True)),
            ("+ full recompute, 16 tiles", MemoryPlan(layers=("full",) * layers, tiles=16, loss_chunk=4096,
                                                      drop_logits=True)),
            ("+ offload", MemoryPlan(layers=("full+offload",) * layers, tiles=16, loss_chunk=4096,
                                     drop_logits=True))]
    out = []
    for sp, fsdp, optimizer, seqs in setups:
        out += ["", f"Llama-3-8B, {sp} GPU(s), SP={sp}, FSDP2 over {fsdp}, bf16, optimizer state: {optimizer}; "
                "total GiB per rank (state + activation peak)", "",
                "| plan | " + " | ".join(f"S={s // 1024}K" for s in seqs) + " |", "|---|" + "---|" * len(seqs)]
        for name, plan in rows:
            model = MemoryModel("8b", sp_size=sp, dtype=torch.bfloat16, fsdp=fsdp, plan=plan, optimizer=optimizer)
            cells = []
            for s in seqs:
                e = model.estimate(s)
                cells.append(f"{(e.state_bytes() + e.activation_peak_bytes) / GiB:.1f}")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
            print(out[-1], flush=True)
    return "\n".join(out)


def plan_8b(seq: int, sp: int, budget: str, optimizer: str) -> None:
    """Print the plan ``memory_budget`` chooses for Llama-3-8B (random weights on meta,
    bf16) at ``seq`` tokens over ``sp`` GPUs with FSDP2 over the same ranks, planned as on
    CUDA (offload is a rung)."""
    from autosp.planning.estimate import meta_model
    from autosp.planning.planner import plan_memory
    from autosp.units import parse_bytes
    model = meta_model("8b", torch.bfloat16)
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    t0 = time.perf_counter()
    plan_memory(model, (ids,), {"labels": ids}, parse_bytes(budget), sp_size=sp, fsdp=sp, optimizer=optimizer,
                offload=True, drop_logits=True, verbose=True)
    print(f"planned in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--simulate", action="store_true")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1048576, 2097152, 4194304],
                        help="lengths for 8 GPUs (one GPU: 1/8 of each)")
    parser.add_argument("--plan-8b", type=int, metavar="SEQ",
                        help="print memory_budget's plan for Llama-3-8B at SEQ tokens (--sp GPUs, --budget each)")
    parser.add_argument("--sp", type=int, default=8)
    parser.add_argument("--budget", default="80GiB")
    parser.add_argument("--optimizer", default="adamw")
    a = parser.parse_args()
    if a.plan_8b:
        plan_8b(a.plan_8b, a.sp, a.budget, a.optimizer)
    if a.measure:
        print(measure(a.seq, a.repeat), flush=True)
    if a.simulate:
        print(simulate([(8, 8, "adamw", a.seqs), (1, 1, "host-adamw", [s // 8 for s in a.seqs])]), flush=True)
