"""The compile log: one JSON line per model transformed, where the ``AUTOSP_COMPILE_LOG`` environment variable names a file.

A compilation is mostly tracing (``torch.export``, then the decomposition's retrace, which the
import cache skips for a program it has seen), and a job or a test run compiles in many
processes: the group's first rank of each group, torchrun's workers, the memory model. Each
of them appends its own lines to the one file (one ``write`` per line, in append mode), so a
whole run's compile time can be added up afterwards::

    AUTOSP_COMPILE_LOG=/tmp/compiles.jsonl torchrun --nproc-per-node 4 train.py
    python -m autosp.compile_log /tmp/compiles.jsonl

A line: ``model`` (the class), ``sp_size``, ``pid``, and the seconds of each phase from
:func:`autosp.driver.transform` (``export_s``, ``import_s`` with ``import_cached`` 1 when the
import cache served it, ``pipeline_s``, ``transform_s``). Nothing is written, and nothing is
read, when the variable is unset.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable

COMPILE_LOG_ENV = "AUTOSP_COMPILE_LOG"
PHASES = ("export_s", "import_s", "pipeline_s", "transform_s")


def record(model_name: str, sp_size: int, timings: dict[str, float]) -> None:
    """Append one line for a transformed model to the file ``AUTOSP_COMPILE_LOG`` names (no-op
    when it is unset). A log that cannot be written is a warning on stderr, never an error:
    the compilation it describes has succeeded."""
    path = os.environ.get(COMPILE_LOG_ENV)
    if not path:
        return
    line = {"model": model_name, "sp_size": sp_size, "pid": os.getpid(),
            **{k: round(float(v), 4) for k, v in timings.items() if isinstance(v, (int, float))}}
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError as e:
        print(f"[autosp] could not append to the compile log {path} ({COMPILE_LOG_ENV}): {e}", file=sys.stderr)


def read(lines: Iterable[str]) -> list[dict]:
    """The records of a compile log's lines (blank lines skipped; a line that is not a JSON
    object raises ``ValueError`` naming its number)."""
    records = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {number} of the compile log is not JSON: {e}") from None
        if not isinstance(entry, dict):
            raise ValueError(f"line {number} of the compile log is not a JSON object")
        records.append(entry)
    return records


def summarize(records: list[dict], top: int = 10) -> str:
    """Totals over ``records``: compiles, processes, seconds per phase (the import split into
    misses and cache hits), and the ``top`` model classes by transform time."""
    if not records:
        return "compile log: no compilation recorded"
    total = {k: sum(r.get(k, 0.0) for r in records) for k in PHASES}
    misses = [r for r in records if not r.get("import_cached")]
    miss_s = sum(r.get("import_s", 0.0) for r in misses)
    lines = [
        f"compile log: {len(records)} compilations in {len({r.get('pid') for r in records})} processes, "
        f"{total['transform_s']:.1f}s in all",
        f"  export {total['export_s']:.1f}s; import {total['import_s']:.1f}s ({len(misses)} traced and imported: "
        f"{miss_s:.1f}s; {len(records) - len(misses)} from the import cache); passes {total['pipeline_s']:.1f}s",
    ]
    fallbacks = sum(1 for r in misses if r.get("import_fallback"))
    if fallbacks:  # (autosp/frontend/decompose.py)
        lines.append(f"  {fallbacks} of the traced imports decomposed by torch's run_decompositions, "
                     f"{len(misses) - fallbacks} by autosp's retrace")
    by_model: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in records:
        row = by_model[str(r.get("model", "?"))]
        row[0] += 1
        row[1] += 0 if r.get("import_cached") else 1
        row[2] += r.get("transform_s", 0.0)
    for name, (n, traced, seconds) in sorted(by_model.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"  {seconds:8.1f}s  {int(n):4d} compilations ({int(traced)} imported)  {name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m autosp.compile_log FILE [--top N]``: print :func:`summarize` of a compile log."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m autosp.compile_log", description=main.__doc__)
    parser.add_argument("file", help=f"the file {COMPILE_LOG_ENV} named")
    parser.add_argument("--top", type=int, default=10, help="model classes listed (default 10)")
    args = parser.parse_args(argv)
    try:
        with open(args.file, encoding="utf-8") as f:
            records = read(f)
    except (OSError, ValueError) as e:
        print(f"error: {args.file}: {e}", file=sys.stderr)
        return 1
    print(summarize(records, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
