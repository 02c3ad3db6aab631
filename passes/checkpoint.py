"""``autosp-checkpoint``: plan activation checkpointing (per-layer regions, save / recompute).

Sequence-aware checkpointing (SAC) rests on one asymmetry: at long context attention
costs O(S^2) while everything else costs O(S). So the expensive results (attention and
the collectives around it) are kept, and the cheap, memory-heavy rest (norms,
projections, RoPE, the MLP, the logits) is recomputed during backward.

**Anchors** are the ops never recomputed in ``sac`` mode:

* attention: ``scaled_dot_product_attention``, and every op with a tensor operand or
  result of two or more dynamic dimensions (in autosp's IR only the sequence is dynamic,
  so these are the O(S^2) scores, masks and probabilities of hand-written attention);
* communication: ``autosp.all_to_all``, ``all_gather``, ``all_reduce``, ``reduce_scatter``
  (recomputing them would repeat the exchange in backward).

**Regions** are layers: one per attention op, cut between consecutive attention ops
where the fewest sequence-dependent activations cross (after a block's last residual
add only the residual stream does). Everything before the first cut is region 0's,
everything after the last belongs to the last region (the logits and loss).

**Segments** are what the backend recomputes: in ``sac`` mode, the non-anchor ops of a
region grouped by how many anchors lie between them and the region's start (so one
layer gives "norm, q/k/v, RoPE" and "o_proj, residual, norm, MLP, residual"); in
``full`` mode, the whole region, anchors included. A segment keeps only its inputs for
backward and recomputes the rest. ``sac-min`` is ``full`` with SDPA marked
``autosp.replay``: the backend keeps the fused attention kernel's output and log-sum-exp
and replays them in the recomputation instead of running attention again, so a layer
keeps its input and attention's output only, and backward repeats the all-to-alls.
``autosp.ring_attention`` is an attention op (it starts a layer) and an anchor; in
``sac-min`` it is kept (``autosp.save``) rather than replayed.

Example::

    >>> plan = plan_checkpoints(module, mode="sac")
    >>> plan.regions, plan.segments           # 4, 9 for a 4-layer Llama
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch_mlir import ir

from autosp.ir.builders import i64, vtensor_shape
from autosp.ir.contract import (
    OFFLOAD_ATTR,
    REGION_ATTR,
    REPLAY_ATTR,
    RING_ATTENTION,
    SAVE_ATTR,
    SEGMENT_ATTR,
    VOCAB_LOGPROB,
)
from autosp.ir.core import body_ops, main_func, op_name
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.ops import BIND_SHAPE, COMMUNICATION_OPS, SDPA_OP, is_sdpa
from autosp.ir.pass_base import ModulePass, PassOptionError


@dataclass(frozen=True)
class Checkpoint(ModulePass):
    """Plan activation checkpointing: per-layer regions, what to save and what to recompute.

    One region per attention layer, cut where the fewest sequence-dependent activations
    cross (the residual stream). ``mode=sac`` (sequence-aware) keeps attention and the
    collectives around it (``autosp.save``) and recomputes the O(S) rest in segments
    (``autosp.segment = N``); ``mode=full`` recomputes each whole region; ``mode=sac-min``
    recomputes each whole region but marks SDPA ``autosp.replay``: its output and
    log-sum-exp are kept and replayed, so attention never runs twice while q/k/v and their
    all-to-alls are recomputed. The backend runs each segment under a checkpoint that keeps
    only its inputs (and replayed outputs).

    Input::

        %q = torch.aten.mm %x, %wq ...
        %a = "autosp.all_to_all"(%q4) {...}
        %o = torch.aten.scaled_dot_product_attention %a, %b, %c, ...

    Output::

        %q = torch.aten.mm %x, %wq {autosp.region = 0 : i64, autosp.segment = 0 : i64} ...
        %a = "autosp.all_to_all"(%q4) {autosp.region = 0 : i64, autosp.save, ...}
        %o = torch.aten.scaled_dot_product_attention %a, %b, %c, ... {autosp.region = 0 : i64, autosp.save}
    """

    name: ClassVar[str] = "autosp-checkpoint"
    mode: str = "sac"
    layers: str = ""

    def __post_init__(self):
        if self.mode not in MODES:
            raise PassOptionError(f"option 'mode' of pass '{self.name}' must be one of "
                                  f"{', '.join(MODES)}, got '{self.mode}'")
        for choice in filter(None, self.layers.split(",")):
            if choice.removesuffix("+offload") not in LAYER_MODES or choice == "keep+offload":
                raise PassOptionError(f"option 'layers' of pass '{self.name}': '{choice}' is not one of "
                                      f"{', '.join(LAYER_MODES)} (optionally with '+offload', except keep: "
                                      "a kept layer recomputes nothing, so it keeps no segment input to offload)")

    def apply(self, module) -> None:
        plan_checkpoints(module, self.mode, [c for c in self.layers.split(",") if c] or None)


MODES = ("sac", "sac-min", "full")  # the one definition (autosp.compile adds "off")
LAYER_MODES = ("keep", *MODES)  # per region (option ``layers``): "keep" recomputes nothing
_IGNORED = (BIND_SHAPE, "func.return")


@dataclass
class CheckpointPlan:
    regions: int
    segments: int
    anchors: int


def _dynamic_dims(value: ir.Value) -> int:
    shape = vtensor_shape(value.type)
    return sum(d is None for d in shape[0]) if shape else 0


def is_attention_op(op) -> bool:
    """SDPA, ring attention, or an op touching an O(S^2) tensor (two or more dynamic dimensions)."""
    if is_sdpa(op) or op_name(op) == RING_ATTENTION:
        return True
    return any(_dynamic_dims(v) >= 2 for v in list(op.operands) + list(op.results))


def is_anchor(op) -> bool:
    """Kept in ``sac`` mode: attention, communication, and the tiled LM head
    (``autosp.vocab_logprob``: it keeps only its [N, H] input, and recomputing it would
    cost a second [N, H] x [H, V] product)."""
    return op_name(op) in (*COMMUNICATION_OPS, VOCAB_LOGPROB) or is_attention_op(op)


def _layer_markers(ops) -> list[int]:
    """Indices of the op that starts each attention (first of a run of attention ops)."""
    markers, previous = [], False
    for i, op in enumerate(ops):
        attention = is_attention_op(op)
        if attention and not previous:
            markers.append(i)
        previous = attention
    return markers


def _cuts(ops, markers: list[int]) -> list[int]:
    """For consecutive attention markers a < b, the index c (a < c <= b) such that ops
    [c, ...) start the next region, chosen where the fewest sequence-dependent
    activations defined before c are used at or after c."""
    index = {}
    for i, op in enumerate(ops):
        for r in op.results:
            index[r] = i
    last_use: dict = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            if v in index:
                last_use[v] = i
    # live[i]: values defined before i and used at or after i (sequence-dependent only).
    n = len(ops)
    delta = [0] * (n + 1)
    for v, d in index.items():
        u = last_use.get(v)
        if u is not None and u > d and _dynamic_dims(v) >= 1:
            delta[d + 1] += 1
            delta[u + 1] -= 1
    live, acc = [0] * (n + 1), 0
    for i in range(n + 1):
        acc += delta[i]
        live[i] = acc
    cuts = []
    for a, b in zip(markers, markers[1:]):
        # After the end of attention a's run of attention ops.
        start = a + 1
        while start < b and is_attention_op(ops[start]):
            start += 1
        best = min(range(start + 1, b + 1), key=lambda c: (live[c], -c))
        cuts.append(best)
    return cuts


def plan_checkpoints(module, mode: str = "sac", layers: list[str] | None = None) -> CheckpointPlan:
    """Annotate ``@main``'s ops: ``autosp.region`` (every op), ``autosp.segment`` (ops
    recomputed in backward, numbered in execution order), ``autosp.save`` (anchors kept in
    ``sac`` mode). See the module docstring. ``layers``: one choice per region instead of
    ``mode`` for all (``keep``: nothing recomputed; a ``+offload`` suffix marks the
    region's segments ``autosp.offload``: their kept inputs go to host memory)."""
    func = main_func(module)
    if mode not in MODES:
        raise DiagnosticError.at(func, f"unknown checkpointing mode '{mode}' (expected one of: {', '.join(MODES)})")
    ops = [op for op in body_ops(func)
           if op_name(op) not in _IGNORED and not op_name(op).startswith("torch.constant.")]
    markers = _layer_markers(ops)
    if not markers:
        raise DiagnosticError.at(func, "has no attention op to checkpoint around (found no "
                                       "torch.aten.scaled_dot_product_attention and no op on an "
                                       "[..., S, S] tensor)")
    cuts = _cuts(ops, markers)
    choices = layers or [mode] * (len(cuts) + 1)
    if len(choices) != len(cuts) + 1:
        raise DiagnosticError.at(func, f"has {len(cuts) + 1} checkpoint regions (one per attention layer, the "
                                       f"last with the head and loss), but option 'layers' gives {len(choices)}")
    region_of = []
    r = 0
    for i in range(len(ops)):
        while r < len(cuts) and i >= cuts[r]:
            r += 1
        region_of.append(r)

    # Level: anchors passed since the start of the region (sac); segments group by it.
    level: dict = {}
    producer_anchor: dict = {}
    keys: list = []
    def mode_of(i: int) -> str:
        return choices[region_of[i]].removesuffix("+offload")

    for i, op in enumerate(ops):
        # sac-min keeps ring attention as sac does: its fused kernels run inside the ring,
        # which a replay cannot stand in for, and recomputing it would run the ring again.
        anchor = (mode_of(i) == "sac" and is_anchor(op)) or (mode_of(i) == "sac-min" and op_name(op) == RING_ATTENTION)
        lvl = 0
        for v in op.operands:
            if v in level and level[v][0] == region_of[i]:
                lvl = max(lvl, level[v][1] + (1 if producer_anchor[v] else 0))
        for res in op.results:
            level[res] = (region_of[i], lvl)
            producer_anchor[res] = anchor
        keys.append(None if anchor else (region_of[i], lvl))
    numbers: dict = {}
    with func.context:
        for i, op in enumerate(ops):
            op.attributes[REGION_ATTR] = i64(region_of[i])
            if mode_of(i) == "keep":
                continue
            if keys[i] is None:
                op.attributes[SAVE_ATTR] = ir.UnitAttr.get()
            else:
                op.attributes[SEGMENT_ATTR] = i64(numbers.setdefault(keys[i], len(numbers)))
                if mode_of(i) == "sac-min" and op_name(op) == SDPA_OP:
                    op.attributes[REPLAY_ATTR] = ir.UnitAttr.get()
                if choices[region_of[i]].endswith("+offload"):
                    op.attributes[OFFLOAD_ATTR] = ir.UnitAttr.get()
    return CheckpointPlan(regions=len(cuts) + 1, segments=len(numbers), anchors=keys.count(None))
