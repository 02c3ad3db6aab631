"""The sequence layout of a sequence-parallel group: which pieces of the sequence each rank holds.

``autosp-partition-attention`` writes it on the module (``autosp.sp_layout``), the mesh
chooser (:mod:`autosp.cost.strategy`) prices it, and the runtime
(:mod:`autosp.runtime.collectives`) cuts the sequence by it. It is plain data: this module
imports torch only when a layout is cut at run time, so ``autosp-opt`` and the passes never
load torch through it.

Example::

    >>> SeqLayout(ulysses=1, ring=2, zigzag=True).pieces(10, 0)   # ring group 0: chunks 0 and 3 of 4
    [(0, 2), (7, 10)]
"""
from __future__ import annotations

from dataclasses import dataclass

from autosp.ir.contract import LayoutField


def chunk(seq_len: int, ranks: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of ``rank``'s chunk of a length-``seq_len`` sequence."""
    return rank * seq_len // ranks, (rank + 1) * seq_len // ranks


@dataclass(frozen=True)
class SeqLayout:
    """How a sequence-parallel group of ``ulysses * ring`` ranks holds the sequence (see
    the module docstring). ``SeqLayout(ulysses=P)`` is the even split of Ulysses.

    Example::

        >>> SeqLayout(ulysses=1, ring=2, zigzag=True).pieces(10, 0)
        [(0, 2), (7, 10)]
    """

    ulysses: int = 1
    ring: int = 1
    zigzag: bool = False

    @property
    def size(self) -> int:
        return self.ulysses * self.ring

    def ring_pieces(self, seq_len: int, i: int) -> list[tuple[int, int]]:
        """The pieces ring group ``i`` holds (the frame its ranks' attention sees)."""
        if not self.zigzag:
            return [chunk(seq_len, self.ring, i)]
        return [chunk(seq_len, 2 * self.ring, i), chunk(seq_len, 2 * self.ring, 2 * self.ring - 1 - i)]

    def pieces(self, seq_len: int, g: int) -> list[tuple[int, int]]:
        """Rank ``g``'s pieces ``[(start, end), ...]`` (absolute positions), in the order it
        holds them. Some may be empty."""
        from torch import sym_max, sym_min  # (symbolic under torch.compile; loaded by the runtime already)
        i, j = divmod(g, self.ulysses)
        frame = self.ring_pieces(seq_len, i)
        if self.ulysses == 1:
            return frame
        total = sum(b - a for a, b in frame)
        v0, v1 = chunk(total, self.ulysses, j)  # this rank's part of the concatenated frame
        out, offset = [], 0
        for a, b in frame:
            lo = a + sym_min(sym_max(v0 - offset, 0), b - a)
            hi = a + sym_min(sym_max(v1 - offset, 0), b - a)
            out.append((lo, hi))
            offset = offset + (b - a)
        return out

    def order(self) -> list[tuple[int, int]]:
        """Every ``(rank, piece index)`` in sequence order (the same for every length)."""
        keyed = []
        for g in range(self.size):
            i, j = divmod(g, self.ulysses)
            chunks = [i, 2 * self.ring - 1 - i] if self.zigzag else [i]
            keyed += [((c, j), (g, k)) for k, c in enumerate(chunks)]
        return [rk for _, rk in sorted(keyed)]

    def describe(self) -> str:
        """``"ulysses=2 ring=2 zigzag"``: the form of the IR's ``autosp.sp_layout``."""
        return f"{LayoutField.ULYSSES}={self.ulysses} {LayoutField.RING}={self.ring}" + (
            f" {LayoutField.ZIGZAG}" if self.zigzag else "")

    @classmethod
    def parse(cls, text: str) -> SeqLayout:
        """The inverse of :meth:`describe`."""
        degrees: dict[str, int] = {LayoutField.ULYSSES: 1, LayoutField.RING: 1}
        zigzag = False
        for word in text.split():
            key, _, value = word.partition("=")
            if key == LayoutField.ZIGZAG and not value:
                zigzag = True
            elif key in degrees:
                degrees[key] = int(value)
            else:
                raise ValueError(f"sequence layout {text!r}: unknown field {key!r}")
        return cls(degrees[LayoutField.ULYSSES], degrees[LayoutField.RING], zigzag)
