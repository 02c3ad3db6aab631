"""Which sequence parallelism the compiler picks, and the communication it predicts.

    python bench/strategy_table.py [--seq 1048576] [--ranks-per-node 8] [--no-write]

For Llama-3-8B, Llama-3-70B and a 2-head model at P = 8, 16 and 64 ranks (8 per node), runs
:func:`autosp.cost.strategy.choose` -- the same function ``autosp-partition-attention`` calls
with ``strategy=auto`` -- and prints the mesh it picks (Ulysses degree x ring degree),
the bytes one rank sends per training step (forward + backward, every layer, bf16) and
the communication time the model predicts is not hidden behind attention, with the
runner-up for comparison. Simulated: no GPU runs; the hardware numbers are
:class:`autosp.cost.strategy.Hardware`'s defaults. Appends the table to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results import append_section  # noqa: E402

from autosp.cost.strategy import Hardware, choose  # noqa: E402

MODELS = {  # name -> (query heads, KV heads, head dim, layers)
    "Llama-3-8B": (32, 8, 128, 32),
    "Llama-3-70B": (64, 8, 128, 80),
    "2-head (d=64, 12 layers)": (2, 2, 64, 12),
}


def table(seq: int, ranks_per_node: int, sizes=(8, 16, 64)) -> list[str]:
    hw = Hardware()
    rows = ["| model | P | nodes | picked (Ulysses x ring) | GiB sent / step / rank | exposed ms / step | "
            "attention ms / step | runner-up | why not Ulysses alone |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, (heads, kv, dim, layers) in MODELS.items():
        for p in sizes:
            c = choose(heads, kv, p, ranks_per_node=ranks_per_node, seq_len=seq, head_dim=dim, hw=hw)
            others = sorted((x for x in c.candidates if x is not c.best), key=lambda x: x.exposed_s)
            runner = (f"{others[0].strategy} {others[0].ulysses}x{others[0].ring}: "
                      f"{others[0].exposed_s * layers * 1e3:.0f} ms") if others else "-"
            ulysses_alone = next((x for x in c.candidates if x.ring == 1), None)
            why = ("picked" if c.best.ring == 1 else
                   f"{heads} query heads < P" if heads < p and ulysses_alone is None else
                   f"crosses nodes: {ulysses_alone.exposed_s * layers * 1e3:.0f} ms" if ulysses_alone else "-")
            rows.append(f"| {name} | {p} | {max(1, p // ranks_per_node)} | {c.strategy} {c.ulysses}x{c.ring} | "
                        f"{c.best.bytes * layers / 2**30:.2f} | {c.best.exposed_s * layers * 1e3:.0f} | "
                        f"{c.best.attention_s * layers * 1e3:.0f} | {runner} | {why} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=1 << 20)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = table(args.seq, args.ranks_per_node)
    print("\n".join(rows))
    if not args.no_write:
        hw = Hardware()
        append_section("Strategy choice (simulated)", f"S={args.seq}, batch 1, bf16, {args.ranks_per_node} ranks per "
                       f"node, intra {hw.intra_node_bw / 1e9:.0f} GB/s, inter {hw.inter_node_bw / 1e9:.0f} GB/s, "
                       f"attention {hw.attention_flops / 1e12:.0f} TFLOP/s", "\n".join(rows))


if __name__ == "__main__":
    main()
