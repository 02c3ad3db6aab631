"""Per-rank memory with FSDP2 + sequence parallelism: measured next to autosp.estimate_memory.

    python bench/fsdp_memory.py [--worlds 2 4] [--seq 2048] [--modes off sac]

Model: a Llama-like (vocab 8192, hidden 128, 4 layers, 4 heads / 2 KV heads), fp32, AdamW,
sharded with the FSDP2 recipe (``fully_shard`` on each block, then the root) over the P
ranks of the world, SP over the same P ranks. Measured on every rank, the largest kept:
parameters, gradients and optimizer state (the bytes of the local shards after one step)
and the allocator peak of one forward + backward above what existed before
(:func:`autosp.planning.memory.measure_step`: activations, the unsharded layers, the prefetch
buffers, each layer's whole gradient until its reduce-scatter, and the local gradients).
Estimated: the same program on meta tensors with the FSDP2 mechanism simulated
(:func:`autosp.estimate_memory` with ``fsdp=P``). Prints a table and appends it to
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

CONFIG = dict(vocab=8192, hidden=128, layers=4, heads=4, kv_heads=2)
MiB = 1 << 20


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def measure(rank, world, queue, seq, mode):
    """One rank: model state bytes and the step's allocator peak (the smaller of two steps)."""
    from torch.distributed.fsdp import fully_shard

    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.memory import measure_step
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**CONFIG))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    sp = autosp.compile(model, checkpointing=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, CONFIG["vocab"], (1, seq))
    sp(ids, labels=ids)["loss"].backward()  # compile, and the optimizer state, outside the count
    opt.step()
    opt.zero_grad(set_to_none=True)
    locals_ = [p.to_local() for p in model.parameters()]
    peaks = []
    for _ in range(2):
        report = measure_step(lambda: sp(ids, labels=ids)["loss"], locals_)
        peaks.append(report.peak_bytes)
        grads = _local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        opt.zero_grad(set_to_none=True)
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    queue.put((rank, dict(params=_local_bytes(model.parameters()), grads=grads, optimizer=_local_bytes(state),
                          peak=min(peaks), unsharded=sp.programs[0].last_unsharder.max_unsharded)))


def estimate(world: int, seq: int, mode: str) -> dict:
    from autosp.models import LlamaConfig
    from autosp.planning.estimate import estimate_memory
    est = estimate_memory(LlamaConfig(**CONFIG), seq, sp_size=world, dtype=torch.float32, checkpointing=mode,
                          fsdp=world)
    n = world
    return dict(params=est.param_bytes // n, grads=est.grad_bytes // n, optimizer=est.optimizer_bytes // n,
                peak=est.peak_bytes, whole=est.param_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--modes", nargs="+", default=["off", "sac"])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = ["| P = FSDP = SP | checkpointing | parameters MiB (whole model) | gradients MiB | optimizer MiB | "
            "step peak MiB (activations, unsharded layers, grads) | total MiB | estimate: total MiB | "
            "estimate / measured | groups unsharded at once (of layers + root) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for world in args.worlds:
        for mode in args.modes:
            res = run_ranks(measure, world, args=(args.seq, mode), timeout=900)
            m = {k: max(r[k] for r in res.values()) for k in res[0]}
            e = estimate(world, args.seq, mode)
            total = m["params"] + m["optimizer"] + m["peak"]  # the peak includes the local gradients
            est_total = e["params"] + e["optimizer"] + e["peak"]

            def pair(measured, estimated):
                return f"{measured / MiB:.2f} / {estimated / MiB:.2f}"
            rows.append(f"| {world} | {mode} | {pair(m['params'], e['params'])} ({e['whole'] / MiB:.2f}) | "
                        f"{pair(m['grads'], e['grads'])} | {pair(m['optimizer'], e['optimizer'])} | "
                        f"{pair(m['peak'], e['peak'])} | {total / MiB:.2f} | {est_total / MiB:.2f} | "
                        f"{est_total / total:.3f} | {m['unsharded']} of {CONFIG['layers'] + 1} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    note = ("Columns with two numbers: measured / estimated. Total = parameters + optimizer state + step peak "
            "(the peak holds the local gradients).")
    if not args.no_write:
        append_section("FSDP2 + SP memory per rank, measured vs the memory model",
                       f"S={args.seq}, fp32, AdamW", table + "\n\n" + note)


if __name__ == "__main__":
    main()
