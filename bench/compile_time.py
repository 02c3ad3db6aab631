"""Compile time of autosp.compile vs torch.compile as the model deepens (2, 8, 32 layers).

    python bench/compile_time.py [--layers 2 8 32] [--no-inductor]
    python bench/compile_time.py --decompositions [--repeats 3]   # autosp's retrace vs run_decompositions

autosp: export + torch-mlir import + the SP=2 pass pipeline (+ autosp-checkpoint for
the SAC column) + FX emission, timed by ``autosp.driver.build_program`` (no process group
needed to compile). torch.compile: the first forward+backward of
``torch.compile(model, dynamic=True)`` with Inductor on one process, minus an eager step,
with Inductor's caches off so every run compiles from scratch. Model: Llama-like, hidden
64, 4 heads, SwiGLU 172, vocab 256 (narrow, so compile time dominates), S=256.
Prints a table and appends it to bench/RESULTS.md. Growth is judged per layer: a
constant or falling time per layer is linear or better.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import append_section  # noqa: E402

from autosp.driver import build_program  # noqa: E402
from autosp.models import LlamaConfig, LlamaLike  # noqa: E402


def _model(layers: int) -> LlamaLike:
    torch.manual_seed(0)
    return LlamaLike(LlamaConfig(vocab=256, hidden=64, layers=layers, heads=4, kv_heads=2, ffn=172))


def autosp_seconds(layers: int, checkpointing: str) -> dict:
    model = _model(layers)
    ids = torch.randint(0, 256, (1, 256))
    start = time.perf_counter()
    program = build_program(model, (ids,), {"labels": ids}, sp_size=2, checkpointing=checkpointing)
    total = time.perf_counter() - start
    return dict(total=total, **{k: v for k, v in program.timings.items() if k.endswith("_s")})


def decomposition_rows(layers_list: list[int], repeats: int) -> list[str]:
    """The import (decomposition + torch-mlir) of the same exported model by autosp's
    retrace (``autosp/frontend/decompose.py``) and by torch's ``run_decompositions``
    (``AUTOSP_DECOMPOSE=aot``), alternating in one process, the import cache bypassed:
    the median of ``repeats`` each."""
    import statistics

    from autosp.frontend import cache
    from autosp.frontend.decompose import DECOMPOSE_ENV
    rows = ["| layers | import, retrace s | import, run_decompositions s | ratio | export s |", "|---|---|---|---|---|"]
    print(rows[0], flush=True)
    lookup = cache.lookup
    cache.lookup = lambda key, context: None  # (every import traced)
    try:
        for layers in layers_list:
            times: dict[str, list[float]] = {"retrace": [], "aot": [], "export": []}
            for _ in range(repeats):
                for mode in ("retrace", "aot"):
                    os.environ[DECOMPOSE_ENV] = mode
                    t = autosp_seconds(layers, "off")
                    times[mode].append(t["import_s"])
                    times["export"].append(t["export_s"])
            fast, slow = statistics.median(times["retrace"]), statistics.median(times["aot"])
            rows.append(f"| {layers} | {fast:.2f} | {slow:.2f} | {slow / fast:.2f}x | "
                        f"{statistics.median(times['export']):.2f} |")
            print(rows[-1], flush=True)
    finally:
        cache.lookup = lookup
        os.environ.pop(DECOMPOSE_ENV, None)
    return rows


def inductor_seconds(layers: int) -> float:
    import torch._dynamo
    torch._dynamo.reset()
    model = _model(layers)
    ids = torch.randint(0, 256, (1, 256))
    start = time.perf_counter()
    model(ids, labels=ids)["loss"].backward()
    eager = time.perf_counter() - start
    compiled = torch.compile(model, dynamic=True)
    start = time.perf_counter()
    compiled(ids, labels=ids)["loss"].backward()
    return time.perf_counter() - start - eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--no-inductor", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--no-write", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--decompositions", action="store_true",
                        help="only compare the import by autosp's retrace and by torch's run_decompositions")
    parser.add_argument("--repeats", type=int, default=3, help="with --decompositions: runs of each, alternating")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.decompositions:
        table = "\n".join(decomposition_rows(args.layers, args.repeats))
        if not args.no_write:
            append_section("Decomposition: autosp's retrace vs run_decompositions", "CPU, 1 thread",
                           "Llama-like, hidden 64, S=256, SP=2; the import (decomposition, torch-mlir import and "
                           "lowering) of one exported program, each way alternating in one process, median of "
                           f"{args.repeats}; the import cache bypassed.\n\n{table}")
        return
    rows = ["| layers | autosp total s | export | import | passes | emit | per layer | autosp + SAC s | "
            "torch.compile (Inductor) s | per layer |", "|---|---|---|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for layers in args.layers:
        a = autosp_seconds(layers, "off")
        s = autosp_seconds(layers, "sac")
        ind = None if args.no_inductor else inductor_seconds(layers)
        ind_text = "n/a" if ind is None else f"{ind:.1f} | {ind / layers:.2f}"
        rows.append(f"| {layers} | {a['total']:.2f} | {a['export_s']:.2f} | {a['import_s']:.2f} | "
                    f"{a['pipeline_s']:.2f} | {a['emit_s']:.2f} | {a['total'] / layers:.3f} | {s['total']:.2f} | "
                    f"{ind_text} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Compile time vs depth", "CPU, 1 thread",
                       "Llama-like, hidden 64, S=256; autosp at SP=2 (no process group needed to compile); "
                       f"torch.compile = first fwd+bwd minus eager, caches off.\n\n{table}")


if __name__ == "__main__":
    main()
