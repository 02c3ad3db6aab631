"""Ring, hybrid and Ulysses side by side at P = 4 on CPU, with a hand-written ring.

    .venv/bin/python bench/ring_sidebyside.py [--seq 2048] [--steps 5] [--warmup 2] [--no-write]

Every system trains the same Hugging Face ``LlamaForCausalLM`` (fp32, SDPA, same seed and
batch; 8 query / 4 KV heads so that every mesh fits) on P = 4 gloo ranks, one thread
per rank, one system after the other in one process group:

* autosp with ``sp_strategy="ulysses"`` (4 x 1), ``"hybrid"`` (2 x 2) and ``"ring"``
  (1 x 4), each as ``autosp.compile`` runs it (every rank passes the full batch);
* the hand-written zigzag ring of :func:`peers.run_ring_handwritten` (the project's own;
  ring-flash-attention and yunchang's ring need CUDA);
* hand-written Ulysses (yunchang's all-to-all) when ``bash bench/setup.sh`` installed it.

Per system: step time (forward, backward and gradient all-reduce: the median of
``--steps`` after ``--warmup``), the attention traffic one rank sends per step (the
all-to-alls seen by :class:`collectives.CollectiveCounter`, the ring's sends counted by
the ring itself, ``ring.stats()``), and the loss and gradients against single device. Ratios come from
this one run.
Appends the table to bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import peers  # noqa: E402
from results import append_section  # noqa: E402

from autosp.testing.distributed import run_ranks  # noqa: E402

MODEL = dict(hidden=256, layers=4, heads=8, kv_heads=4, ffn=768, vocab=1024)
SYSTEMS = ["autosp:ulysses", "autosp:hybrid", "autosp:ring", "ring_hand", "ulysses_yunchang"]


def _count_hand_ring():
    """Wrap the hand-written ring's exchange to count the bytes this rank sends."""
    sent = {"bytes": 0}
    original = peers._HandZigzagRing._exchange

    def counted(send, recv):
        sent["bytes"] += send.numel() * send.element_size()
        return original(send, recv)

    peers._HandZigzagRing._exchange = staticmethod(counted)
    return sent, lambda: setattr(peers._HandZigzagRing, "_exchange", staticmethod(original))


def _autosp(model, ids, steps, warmup, strategy):
    from collectives import CollectiveCounter

    import autosp
    from autosp.runtime import ring
    options = dict(sp_strategy=strategy) if strategy != "hybrid" else dict(sp_strategy="hybrid", ulysses_degree=2)
    compiled = autosp.compile(model, **options)

    def forward():
        return compiled(input_ids=ids, labels=ids, use_cache=False).loss

    def step():
        peers._zero_grads(model)
        forward().backward()

    first, step_s = peers._time_steps(step, steps, warmup)
    counter = CollectiveCounter(torch.distributed.get_rank(), torch.distributed.get_world_size())
    ring.reset_stats()
    peers._zero_grads(model)
    compiled.grad_sync.enabled = False  # attention traffic only
    with counter:
        loss = forward()
        loss.backward()
    compiled.grad_sync.enabled = True
    compiled.grad_sync.synchronize()
    traffic = counter.sent.get("all_to_all", 0) + ring.stats()["bytes"]
    return dict(name=f"autosp, {strategy} {compiled.layout.ulysses}x{compiled.layout.ring}", step_s=step_s,
                first_step_s=first, loss=float(loss.detach()), bytes=traffic, grads=peers._grads(model))


def _body(rank, world, queue, seq, systems, steps, warmup, seed):
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    ids = torch.randint(0, MODEL["vocab"], (1, seq))
    results = []
    single = peers.run_single(peers.build_llama(seed, **MODEL), ids, ids, 1, 0, return_grads=True)
    for system in systems:
        model = peers.build_llama(seed, **MODEL)
        if system.startswith("autosp:"):
            r = _autosp(model, ids, steps, warmup, system.split(":")[1])
        elif system == "ring_hand":
            sent, restore = _count_hand_ring()
            try:
                r = peers.run_ring_handwritten(model, ids, ids, steps, warmup, return_grads=True)
            finally:
                restore()
            runs = 1 + max(warmup - 1, 0) + steps + 1  # _time_steps' calls and _measure's step
            r["bytes"] = sent["bytes"] / runs
        elif system == "ulysses_yunchang":
            try:
                r = peers.run_ulysses_yunchang(model, ids, ids, steps, warmup, return_grads=True)
            except ImportError:
                continue
            r["bytes"] = None
        else:
            raise ValueError(system)
        r["grad_err"] = peers.grad_rel_error(r.pop("grads"), single["grads"])[1]
        r["system"], r["dloss"] = system, r["loss"] - single["loss"]
        results.append(r)
    queue.put((rank, results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    res = run_ranks(_body, 4, args=(args.seq, SYSTEMS, args.steps, args.warmup, args.seed), timeout=7200,
                    collective_timeout=1800)
    rows = []
    for i, r0 in enumerate(res[0]):
        step = max(res[r][i]["step_s"] for r in res)
        sent = [res[r][i].get("bytes") for r in res]
        rows.append((r0["name"], step, max(sent) if None not in sent else None, r0["dloss"], r0["grad_err"]))
    hand = next((row[1] for row in rows if "hand-written zigzag" in row[0]), None)
    lines = ["| system | step s (max over ranks) | / hand-written ring | attention MiB sent / step / rank | "
             "loss - single | grads vs single (rel. L2) |", "|---|---|---|---|---|---|"]
    for name, step, sent, dloss, gerr in rows:
        lines.append(f"| {name} | {step:.3f} | {step / hand:.2f} | "
                     f"{'n/a' if sent is None else f'{sent / 2**20:.2f}'} | {dloss:+.1e} | {gerr:.1e} |")
    print("\n".join(lines))
    if not args.no_write:
        append_section("Ring, hybrid and Ulysses side by side", f"P=4 gloo on CPU, one thread per rank, S={args.seq}, "
                       f"HF Llama hidden 256, 4 layers, 8 heads / 4 KV, fp32", "\n".join(lines))


if __name__ == "__main__":
    main()
