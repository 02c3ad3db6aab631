"""Append a dated section to bench/RESULTS.md (shared by the bench scripts).

    append_section("Compile time vs depth", "CPU, 1 thread", table)
    # -> "## Compile time vs depth (2026-12-01, CPU, 1 thread)" followed by the table
"""
from __future__ import annotations

import datetime
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def append_section(title: str, context: str, body: str, path: Path = RESULTS) -> None:
    """Append ``## title (today, context)`` and ``body`` to ``path``."""
    with path.open("a") as f:
        f.write(f"\n## {title} ({datetime.date.today().isoformat()}, {context})\n\n{body}\n")
