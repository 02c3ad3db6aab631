"""What is live at the memory model's peak: each live storage at the step's peak, grouped
by the op that created it, the line of the compiled program that ran it and its shape
(and whether autograd saved it for backward), largest first (the memory model's own meta step, so the numbers are the ones
``estimate_memory`` reports).

    python bench/peak_breakdown.py --seq 4194304 --sp 8 --fsdp 8 --layers 2 \
        --plan full --tiles 16 --loss-chunk 4096

``--layers`` shrinks the 8B preset to that many layers (the step's structure, and so what
is live at the peak, repeats per layer); ``--plan`` is each layer's checkpointing choice.
"""
from __future__ import annotations

import argparse
import collections
import linecache
import sys

import torch

from autosp.planning.memory import PeakTracker, _storage_key

SAVED: set[int] = set()  # storages autograd saved for backward (and that still exist)


def _program_line() -> str:
    """The line of the compiled program (fx's generated code) running now, or the
    innermost autosp runtime frame."""
    frame = sys._getframe(3)
    fallback = ""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<eval_with_key"):
            return linecache.getline(name, frame.f_lineno).strip()[:110]
        if not fallback and "autosp" in name and "memory.py" not in name:
            fallback = f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return fallback


class BlameTracker(PeakTracker):
    """PeakTracker that remembers who created each storage and snapshots the live set at
    each new peak."""

    def __init__(self):
        super().__init__()
        self.origin: dict[int, tuple] = {}
        self.at_peak: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = set(self.live)
        peak = self.peak_bytes
        out = super().__torch_dispatch__(func, types, args, kwargs)
        phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key in self.live and key not in before:
                    SAVED.discard(key)  # a new storage at a freed one's address
                    self.origin[key] = (phase, str(func), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                        _program_line())
        if self.peak_bytes > peak:
            self.at_peak = [(self.origin.get(k, ("?",) * 5), n, k in self.set_aside, k in SAVED)
                            for k, (_, n) in self.live.items()]
            self.peak_phase = (phase, str(func))
        return out


def breakdown(seq, sp, fsdp, layers, plan_mode, tiles, loss_chunk, optimizer, rank, top):
    import autosp.planning.estimate as estimate
    from autosp.models import LLAMA_PRESETS, LlamaConfig
    from autosp.planning.estimate import GiB, MemoryModel
    from autosp.planning.plan import MemoryPlan
    config = LlamaConfig(**{**LLAMA_PRESETS["8b"], "layers": layers})
    plan = MemoryPlan(layers=(plan_mode,) * layers, tiles=tiles, loss_chunk=loss_chunk, drop_logits=True)
    model = MemoryModel(config, sp_size=sp, dtype=torch.bfloat16, fsdp=fsdp, plan=plan, optimizer=optimizer,
                        rank=rank)
    trackers = []
    original = estimate.PeakTracker

    def make():
        trackers.append(BlameTracker())
        return trackers[-1]

    def pack(t):
        SAVED.add(_storage_key(t))
        return t
    estimate.PeakTracker = make
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # (inner hooks take precedence)
            est = model.estimate(seq)
    finally:
        estimate.PeakTracker = original
    t = trackers[-1]
    groups: dict = collections.defaultdict(lambda: [0, 0])
    for origin, n, aside, kept in t.at_peak:
        g = groups[origin + (aside, kept)]
        g[0] += n
        g[1] += 1
    print(f"8B shape, {layers} layers, S={seq}, SP={sp}, FSDP={fsdp}, plan {plan_mode} tiles {tiles} "
          f"loss chunk {loss_chunk}: activation peak {est.activation_peak_bytes / GiB:.2f} GiB "
          f"(state {est.state_bytes() / GiB:.2f} GiB), peak at {t.peak_phase}")
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    for (phase, func, shape, dtype, line, aside, kept), (n, count) in rows[:top]:
        tag = (" [grad]" if aside else "") + (" [saved for backward]" if kept else "")
        print(f"{n / GiB:8.3f} GiB  x{count:<3} {phase:8s} {func:45s} {dtype:8s} {list(shape)}{tag}\n"
              f"{'':24s}{line}")
    rest = sum(v[0] for _, v in rows[top:])
    print(f"{rest / GiB:8.3f} GiB  in {max(0, len(rows) - top)} more groups")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=4194304)
    p.add_argument("--sp", type=int, default=8)
    p.add_argument("--fsdp", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--plan", default="full")
    p.add_argument("--tiles", type=int, default=16)
    p.add_argument("--loss-chunk", type=int, default=4096)
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    breakdown(a.seq, a.sp, a.fsdp, a.layers, a.plan, a.tiles, a.loss_chunk, a.optimizer, a.rank, a.top)
