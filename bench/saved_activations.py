"""Saved-activation bytes per rank: single device vs autosp at P=2 (CPU, gloo, fp32).

    python bench/saved_activations.py [--seqs 1024 4096]

Bytes of tensors saved for backward during one forward, counted once per storage,
parameters excluded (``torch.autograd.graph.saved_tensors_hooks``); the model is
PEERS.md's baseline: Llama-like, hidden 256, 4 layers, 8 heads, SwiGLU 768, vocab 1024,
batch 1. Prints a table and appends it to bench/RESULTS.md. Ideal ratio at P=2: 0.5.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autosp.testing.distributed import run_ranks  # noqa: E402


def saved_mib(call, params) -> float:
    seen, total = set(), [0]
    skip = {p.untyped_storage().data_ptr() for p in params}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and ptr not in skip:
            seen.add(ptr)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = call()
    loss.backward()
    return total[0] / 2**20


def _body(rank, world, queue, seq):
    import autosp
    from autosp.testing.models import LlamaConfig, LlamaLike
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(vocab=1024, hidden=256, layers=4, heads=8, ffn=768))
    ids = torch.randint(0, 1024, (1, seq))
    single = saved_mib(lambda: model(ids, labels=ids)["loss"], list(model.parameters()))
    sp = autosp.compile(model)
    sp(ids, labels=ids)  # compile outside the measurement
    mine = saved_mib(lambda: sp(ids, labels=ids)["loss"], list(model.parameters()))
    queue.put((rank, (single, mine)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096])
    args = parser.parse_args()
    rows = ["| S | single device MiB | autosp P=2 MiB/rank | ratio |", "|---|---|---|---|"]
    for seq in args.seqs:
        res = run_ranks(_body, 2, args=(seq,), timeout=900)
        single = res[0][0]
        mine = max(v[1] for v in res.values())
        rows.append(f"| {seq} | {single:.1f} | {mine:.1f} | {mine / single:.3f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    print("\n" + table)
    with Path(__file__).with_name("RESULTS.md").open("a") as f:
        f.write(f"\n## Saved activations per rank ({datetime.date.today().isoformat()}, CPU, fp32)\n\n{table}\n")


if __name__ == "__main__":
    main()
