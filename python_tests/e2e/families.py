"""The parity matrix: the (P, S) each model family's parity test runs, in one table.

Each family's test draws its cases from :data:`FAMILIES` (``params(name)`` for
``pytest.mark.parametrize``, ``at(name, world)`` for a test that runs a world's cases in
one set of ranks); a case that is known to fail is listed in :data:`EXPECTED_FAILURES`
with its reason and runs as a strict xfail, so it is reported the day it passes.

A case is ``Case(world, seq, variant)``: ``variant`` is what else the family's test
varies, as words it reads (an attention implementation, a strategy, padding, a backend).
``python_tests/unit/test_family_matrix.py`` checks the table: every family runs at P = 2
and P = 4, and at an S that P does not divide.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    """One parity case: P ranks, sequence length S, and the family test's own variant words."""

    world: int
    seq: int
    variant: tuple[str, ...] = ()

    def has(self, word: str) -> bool:
        return word in self.variant

    def id(self) -> str:
        return "-".join([f"P{self.world}", f"S{self.seq}", *self.variant])


def _cases(*rows) -> tuple[Case, ...]:
    return tuple(Case(w, s, tuple(v.split())) if v else Case(w, s) for w, s, v in rows)


FAMILIES: dict[str, tuple[Case, ...]] = {
    # transformers (test_hf_models: attention implementation and padding as variant words)
    "llama": _cases((2, 16, "sdpa"), (2, 15, "eager"), (2, 16, "eager mask left_pad"), (4, 33, "sdpa")),
    "gpt2": _cases((2, 16, "eager"), (2, 15, "sdpa mask"), (4, 18, "eager")),
    "falcon": _cases((2, 15, ""), (4, 32, "")),
    "gpt_neox": _cases((2, 31, ""), (4, 34, "")),
    "bert": _cases((2, 15, ""), (4, 19, ""), (2, 15, "ring")),
    # (strategy, whether the whole model or its first layers, padding, backend)
    "llama4": _cases((2, 15, "ulysses full"), (2, 16, "ring full"), (4, 19, "ulysses full"),
                     (4, 19, "hybrid full"), (4, 20, "ulysses full")),
    "gpt_oss": _cases((2, 15, "ulysses pad full"), (2, 16, "ring full"), (2, 15, "ring aot_eager"),
                      (4, 19, "ulysses full"), (4, 19, "hybrid pad full"), (4, 20, "ulysses pad full")),
    "moe": _cases((2, 15, "mixtral"), (2, 15, "mixtral_masked"), (2, 15, "qwen3_moe"), (2, 15, "hand"),
                  (4, 19, "mixtral")),
    # per-head position biases inside written-out attention (test_position_biases)
    "mpt": _cases((2, 15, ""), (2, 16, ""), (4, 19, ""), (4, 20, "")),
    "bloom": _cases((2, 15, ""), (2, 16, ""), (4, 19, ""), (4, 20, "")),
    "t5": _cases((2, 15, ""), (2, 16, ""), (4, 19, ""), (4, 20, "")),  # an encoder, token classification
    # MLA: q, k and v computed on each rank's heads from gathered latents (test_mla)
    "deepseek_v3": _cases((2, 15, ""), (2, 16, ""), (4, 19, ""), (4, 20, "")),
    # recurrences (test_recurrences)
    "mamba2": _cases((2, 15, ""), (2, 16, ""), (4, 19, ""), (4, 20, "")),
    # (variant word: the recurrence method asked for)
    "mamba": _cases((2, 15, "auto"), (2, 16, "prefix"), (4, 19, "prefix"), (4, 20, "auto")),
    "jamba": _cases((2, 15, "auto"), (2, 16, "prefix"), (4, 19, "auto"), (4, 20, "prefix")),
    # (MiniMax: lightning attention layers (block 8) with a full-attention layer and MoE)
    "minimax": _cases((2, 15, "auto"), (2, 16, "prefix"), (4, 19, "prefix"), (4, 20, "auto")),
    # (xLSTM: mLSTM blocks, chunk 8; a chain only)
    "xlstm": _cases((2, 16, "auto"), (2, 15, "chain"), (4, 32, "auto"), (4, 30, "chain")),
    # torchtitan (test_titan, test_titan_deltanet)
    "titan_llama3": _cases((2, 128, ""), (4, 128, ""), (2, 127, "uneven"), (4, 130, "uneven")),
    "titan_muse_glimmer": _cases((2, 128, ""), (4, 130, "uneven")),
    "titan_qwen3_moe": _cases((2, 128, "fp32_experts"), (2, 128, "bf16_experts"), (4, 130, "fp32_experts")),
    "titan_qwen3_5": _cases((2, 64, ""), (2, 61, ""), (4, 66, "")),
}

# (family, case) -> why it fails; run as strict xfails.
EXPECTED_FAILURES: dict[tuple[str, Case], str] = {}


def cases(family: str) -> tuple[Case, ...]:
    """The family's cases (KeyError naming the known families if it has none)."""
    if family not in FAMILIES:
        raise KeyError(f"no family {family!r} in the parity matrix: {sorted(FAMILIES)}")
    return FAMILIES[family]


def params(family: str, where=lambda case: True, lead: tuple = ()) -> list:
    """The family's cases (those ``where`` keeps) as ``pytest.param(*lead, case)``, with
    ids, and the expected failures marked strict xfail."""
    import pytest
    out = []
    for case in cases(family):
        if not where(case):
            continue
        reason = EXPECTED_FAILURES.get((family, case))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(*lead, case, id="-".join([*map(str, lead), case.id()]), marks=marks))
    return out


def worlds(family: str) -> list[int]:
    """The rank counts the family runs at."""
    return sorted({c.world for c in cases(family)})


def at(family: str, world: int) -> list[Case]:
    """The family's cases at ``world`` ranks (a test that runs them in one set of ranks)."""
    return [c for c in cases(family) if c.world == world]
