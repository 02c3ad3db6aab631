"""Memory plans: what each layer keeps, recomputes or offloads, and the tile sizes.

A :class:`MemoryPlan` is the compiler's answer to ``memory_budget``: one choice per
checkpoint region (one region per attention layer; the last one also holds the head and
the loss), a tile count for the token-wise blocks (the MLP) and the tiled LM head + loss.
:meth:`MemoryPlan.pipeline` is the pass pipeline that applies it after the
sequence-parallel pipeline::

    autosp-tile-loss{chunk=0 drop-logits=false}, autosp-dce,
    autosp-checkpoint{layers=sac,sac,full+offload,...}, autosp-tile-tokens{tiles=4}, autosp-dce

Per-region choices, cheapest first: ``keep`` (nothing recomputed), ``sac`` (keep attention
and its collectives, recompute the O(S) rest), ``sac-min`` (keep the layer's input and
attention's output and log-sum-exp), ``full`` (keep the layer's input only), each with an
optional ``+offload`` (the kept inputs go to host memory: pinned, asynchronous copies on
CUDA; accounted but not moved on CPU).

Example::

    >>> plan = MemoryPlan(layers=("sac",) * 4 + ("full",), tiles=4)
    >>> plan.pipeline()
    'builtin.module(autosp-tile-loss{chunk=0 drop-logits=false},autosp-dce,...)'
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MemoryPlan:
    """One compilation's memory choices (see the module docstring). ``layers`` empty:
    every region uses ``mode`` (``"off"``: no checkpointing)."""
    layers: tuple[str, ...] = ()
    mode: str = "off"
    tiles: int = 1
    tile_loss: bool = True
    loss_chunk: int = 0
    drop_logits: bool = False

    def pipeline(self) -> str:
        """The pass pipeline that applies this plan (after the sequence-parallel pipeline)."""
        passes = []
        if self.tile_loss:
            passes += [f"autosp-tile-loss{{chunk={self.loss_chunk} drop-logits={str(self.drop_logits).lower()}}}",
                       "autosp-dce"]
        if self.layers:
            passes.append(f"autosp-checkpoint{{layers={','.join(self.layers)}}}")
        elif self.mode != "off":
            passes.append(f"autosp-checkpoint{{mode={self.mode}}}")
        if self.tiles > 1 and (self.layers or self.mode != "off"):
            passes += [f"autosp-tile-tokens{{tiles={self.tiles}}}", "autosp-dce"]
        return f"builtin.module({','.join(passes) or 'autosp-dce'})"

    def with_layers(self, layers) -> MemoryPlan:
        return replace(self, layers=tuple(layers))

    def describe(self) -> str:
        """One line per run of equal layer choices."""
        if not self.layers:
            return f"every layer: {self.mode}"
        lines, start = [], 0
        for i in range(1, len(self.layers) + 1):
            if i == len(self.layers) or self.layers[i] != self.layers[start]:
                last = " (with the head and loss)" if i == len(self.layers) else ""
                span = f"region {start}" if i - start == 1 else f"regions {start}-{i - 1}"
                lines.append(f"  {span}{last}: {self.layers[start]}")
                start = i
        return "\n".join(lines)
