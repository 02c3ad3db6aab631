"""The memory model against measurement: autosp.estimate_memory vs two real gloo ranks.

    python bench/memory_model.py [--seqs 1024 4096]

Model: PEERS.md's Llama-like (hidden 256, 4 layers, 8 heads, SwiGLU 768, vocab 1024),
fp32, P=2. Measured: saved and allocator-peak bytes of one step on each rank
(:func:`autosp.planning.memory.measure_step`, the largest rank). Estimated: the same program on
meta tensors as a simulated rank (:func:`autosp.estimate_memory`). Prints a table and
appends it to bench/RESULTS.md. (python_tests/e2e/test_memory.py checks the 10% bound.)
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

CONFIG = dict(vocab=1024, hidden=256, layers=4, heads=8, ffn=768)
MODES = ("off", "sac", "full")


def _body(rank, world, queue, seq):
    import autosp
    from autosp.models import LlamaConfig, LlamaLike
    from autosp.planning.memory import measure_step
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**CONFIG))
    ids = torch.randint(0, CONFIG["vocab"], (1, seq))
    out = {}
    for mode in MODES:
        compiled = autosp.compile(model, checkpointing=mode)
        compiled(ids, labels=ids)["loss"].backward()
        reports = [measure_step(lambda compiled=compiled: compiled(ids, labels=ids)["loss"], model.parameters()) for _ in range(2)]
        out[mode] = (reports[0].saved_bytes, min(r.peak_bytes for r in reports))
    queue.put((rank, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from autosp.models import LlamaConfig
    from autosp.planning.estimate import MemoryModel
    rows = ["| S | checkpointing | saved MiB measured | estimated | error | peak MiB measured | estimated | error |",
            "|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    models = {mode: MemoryModel(LlamaConfig(**CONFIG), 2, torch.float32, mode) for mode in MODES}
    for seq in args.seqs:
        measured = run_ranks(_body, 2, args=(seq,), timeout=900)
        for mode in MODES:
            saved = max(r[mode][0] for r in measured.values())
            peak = max(r[mode][1] for r in measured.values())
            est = models[mode].estimate(seq)
            rows.append(f"| {seq} | {mode} | {saved / 2**20:.1f} | {est.saved_bytes / 2**20:.1f} | "
                        f"{est.saved_bytes / saved - 1:+.1%} | {peak / 2**20:.1f} | {est.peak_bytes / 2**20:.1f} | "
                        f"{est.peak_bytes / peak - 1:+.1%} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Memory model vs measurement", f"CPU, P=2, fp32, Llama-like {CONFIG}", table)


if __name__ == "__main__":
    main()
