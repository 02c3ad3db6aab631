"""What is live at the memory model's peak: each live storage at the step's peak, grouped
by the op that created it, the line of the compiled program that ran it and its shape
(and whether autograd saved it for backward), largest first (the memory model's own meta step, so the numbers are the ones
``estimate_memory`` reports).

    python bench/peak_breakdown.py --seq 4194304 --sp 8 --fsdp 8 --layers 2 \
        --plan full --tiles 16 --loss-chunk 4096
    python bench/peak_breakdown.py --model bench/configs/llama-3-70b.json --seq 4194304 --sp 32 \
        --fsdp 32 --layers 4 --plan full+offload --tiles 64 --device cuda --optimizer host-adamw

``--layers`` shrinks the model (``--model``: the 8B preset, another preset, or a Hugging Face
``config.json`` / model directory as ``autosp-plan`` reads it, called as a trainer calls it:
``--call``) to that many layers (the step's structure, and so what is live at the peak,
repeats per layer); ``--plan`` is each layer's checkpointing choice; ``--device`` the kernels
the step is costed on (``cuda``: CUDA's kernels' meta implementations, as ``autosp-plan``).
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
        self.blame: dict[int, tuple] = {}
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
                    self.blame[key] = (phase, str(func), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                        _program_line())
        if self.peak_bytes > peak:
            self.at_peak = [(self.blame.get(k, ("?",) * 5), n, k in self.set_aside, k in SAVED)
                            for k, (_, n) in self.live.items()]
            self.peak_phase = (phase, str(func))
        return out


def breakdown(seq, sp, fsdp, layers, plan_mode, tiles, loss_chunk, optimizer, rank, top, model_spec="8b",
              device="cpu", call="position_ids"):
    import autosp.planning.estimate as estimate
    from autosp.cost.plan import MemoryPlan
    from autosp.models import LLAMA_PRESETS, LlamaConfig
    from autosp.planning.estimate import GiB, MemoryModel
    inputs = None
    if model_spec in LLAMA_PRESETS:
        config = LlamaConfig(**{**LLAMA_PRESETS[model_spec], "layers": layers})
    else:  # a Hugging Face config, called as autosp-plan calls it
        from autosp.planning.fake_cuda import trainer_call
        from autosp.tools.plan import load_config
        config = load_config(model_spec)
        config.num_hidden_layers = layers
        inputs = (lambda ids: trainer_call(call, ids))
    plan = MemoryPlan(layers=(plan_mode,) * layers, tiles=tiles, loss_chunk=loss_chunk, drop_logits=True)
    model = MemoryModel(config, sp_size=sp, dtype=torch.bfloat16, fsdp=fsdp, plan=plan, optimizer=optimizer,
                        rank=rank, inputs=inputs, device=device, mesh={"strategy": "auto", "seq_len": seq, "ranks_per_node": min(sp, 8)})
    trackers = []
    originals = estimate.PeakTracker, estimate.SavedTensors

    def make():
        trackers.append(BlameTracker())
        return trackers[-1]

    class Saved(estimate.SavedTensors):
        """The forward's saved tensors, as the memory model counts them. (Not an outer
        saved_tensors_hooks around the whole step: in backward, where the recomputation runs,
        a hook that returns the tensor keeps the recomputed outputs alive, 2 GiB per layer at
        70B / 4M / 32, which the step without it releases.)"""

        def _pack(self, t):
            SAVED.add(_storage_key(t))
            return super()._pack(t)
    estimate.PeakTracker, estimate.SavedTensors = make, Saved
    try:
        est = model.estimate(seq)
    finally:
        estimate.PeakTracker, estimate.SavedTensors = originals
    t = trackers[-1]
    groups: dict = collections.defaultdict(lambda: [0, 0])
    for origin, n, aside, kept in t.at_peak:
        g = groups[origin + (aside, kept)]
        g[0] += n
        g[1] += 1
    print(f"{model_spec} shape, {layers} layers, S={seq}, SP={sp}, FSDP={fsdp}, plan {plan_mode} tiles {tiles} "
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
    p.add_argument("--model", default="8b", help="a preset, or a Hugging Face config.json / model directory")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the kernels the step is costed on")
    p.add_argument("--call", default="position_ids", help="the call, for a Hugging Face config (autosp-plan --call)")
    a = p.parse_args()
    breakdown(a.seq, a.sp, a.fsdp, a.layers, a.plan, a.tiles, a.loss_chunk, a.optimizer, a.rank, a.top,
              a.model, a.device, a.call)
