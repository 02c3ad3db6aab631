"""Collectives per layer and bytes moved by autosp, against the analytical Ulysses volume.

    python bench/collectives.py [--seq 1024] [--world 2]

Every collective a rank issues during one training step (forward, backward and the
gradient all-reduce) is seen by a dispatch mode: PyTorch's c10d and functional
collective ops. Bytes "moved" are what a rank sends to the other ranks (an all-to-all
keeps its own part). The analytical Ulysses minimum per attention layer and rank:
4 all-to-alls forward (q, k, v, output) and 4 backward, each sending (P-1)/P of a
[B, S/P, heads x head_dim] tensor, with k and v at the KV-head width. Prints a table and
appends it to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autosp.testing.distributed import run_ranks  # noqa: E402
from results import append_section  # noqa: E402

MODELS = {  # name -> LlamaConfig kwargs (PEERS.md's model, and the same with GQA)
    "Llama-like, 8 heads / 8 KV": dict(vocab=1024, hidden=256, layers=4, heads=8, ffn=768),
    "Llama-like, 8 heads / 4 KV (GQA)": dict(vocab=1024, hidden=256, layers=4, heads=8, kv_heads=4, ffn=768),
}


class CollectiveCounter(TorchDispatchMode):
    """Counts collective ops and the bytes this rank sends to others."""

    def __init__(self, rank: int, world: int):
        super().__init__()
        self.rank, self.world = rank, world
        self.calls: Counter = Counter()
        self.sent: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        name = func._schema.name.split("::")[-1]
        if ns in ("c10d", "_c10d_functional") and name not in ("wait_tensor", "_wrap_tensor_autograd"):
            x = args[0]
            tensors = x if isinstance(x, (list, tuple)) else [x]
            nbytes = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
            kind = name.rstrip("_")
            if "all_to_all" in kind or "alltoall" in kind:
                splits = args[2] if len(args) > 2 and args[2] else None  # input split sizes
                flat = tensors[0]
                own = (splits[self.rank] * flat[0].numel() * flat.element_size() if splits and flat.dim() > 1
                       else splits[self.rank] * flat.element_size() if splits else nbytes // self.world)
                nbytes -= own
                kind = "all_to_all"
            elif "reduce" in kind and "scatter" not in kind:
                kind = "all_reduce"
                nbytes = nbytes * (self.world - 1) // self.world * 2  # ring all-reduce
            self.calls[kind] += 1
            self.sent[kind] += nbytes
        return func(*args, **kwargs)


def _body(rank, world, queue, cfg, seq, checkpointing):
    import autosp
    from autosp.testing.models import LlamaConfig, LlamaLike
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(**cfg))
    ids = torch.randint(0, cfg["vocab"], (1, seq))
    compiled = autosp.compile(model, checkpointing=checkpointing)
    compiled(ids, labels=ids)["loss"].backward()  # compile outside the count
    fwd, bwd = CollectiveCounter(rank, world), CollectiveCounter(rank, world)
    with fwd:
        loss = compiled(ids, labels=ids)["loss"]
    with bwd:
        loss.backward()
    queue.put((rank, (dict(fwd.calls), dict(fwd.sent), dict(bwd.calls), dict(bwd.sent))))


def analytical_bytes_per_layer(cfg: dict, seq: int, world: int, elem: int = 4) -> float:
    """Ulysses minimum, bytes a rank sends per attention layer (forward + backward)."""
    head_dim = cfg["hidden"] // cfg["heads"]
    kv = cfg.get("kv_heads") or cfg["heads"]
    per_token = (2 * cfg["heads"] + 2 * kv) * head_dim  # q + o at H heads, k + v at KV heads
    return 2 * (world - 1) / world * (seq / world) * per_token * elem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = ["| model | P | all-to-all / layer fwd + bwd (Ulysses min 4 + 4) | other collectives / step | "
            "all-to-all MiB sent / layer / rank | analytical Ulysses MiB | ratio |",
            "|---|---|---|---|---|---|---|"]
    print(rows[0], flush=True)
    for (name, cfg), checkpointing in [(m, c) for m in MODELS.items() for c in ("off", "sac", "full")]:
        res = run_ranks(_body, args.world, args=(cfg, args.seq, checkpointing), timeout=600)
        fc, fs, bc, bs = res[0]
        layers = cfg["layers"]
        a2a = f"{fc.get('all_to_all', 0) / layers:g} + {bc.get('all_to_all', 0) / layers:g}"
        other = Counter(fc) + Counter(bc)
        other.pop("all_to_all", None)
        other_text = ", ".join(f"{v} {k}" for k, v in sorted(other.items())) or "none"
        sent = (fs.get("all_to_all", 0) + bs.get("all_to_all", 0)) / layers
        ideal = analytical_bytes_per_layer(cfg, args.seq, args.world)
        label = name if checkpointing == "off" else f"{name}, checkpointing={checkpointing}"
        rows.append(f"| {label} | {args.world} | {a2a} | {other_text} | {sent / 2**20:.2f} | "
                    f"{ideal / 2**20:.2f} | {sent / ideal:.2f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if not args.no_write:
        append_section("Collectives and bytes moved", f"S={args.seq}, fp32", table)


if __name__ == "__main__":
    main()
