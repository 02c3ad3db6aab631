"""Byte sizes as users write them and as autosp prints them.

Example::

    >>> parse_bytes("80GiB") == 80 * 2**30
    True
    >>> human_bytes(3 * 2**29)
    '1.50 GiB'
"""
from __future__ import annotations

import re

from autosp.ir.diagnostics import AutospError


def parse_bytes(value: int | str) -> int:
    """``"70GiB"``, ``"512 MiB"``, ``"1.5e9"``, ``"2GB"`` or an int -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise AutospError(f"memory_budget must be positive, got {value}")
        return value
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in units:
        raise AutospError(f"memory_budget: cannot read {value!r} as bytes (e.g. 80 * 2**30, \"70GiB\", \"512MiB\")")
    n = int(float(m.group(1)) * units[m.group(2).lower()])
    if n <= 0:
        raise AutospError(f"memory_budget must be positive, got {value!r}")
    return n



def human_bytes(n: float, digits: int = 2) -> str:
    """``n`` bytes as ``512 B``, ``1.50 MiB``, ``80.00 GiB`` (``digits`` after the point)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"
