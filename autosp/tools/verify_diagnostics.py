"""``--verify-diagnostics``: match produced diagnostics against ``expected-*`` comments.

The comment syntax is MLIR's::

    // expected-error {{text}}          on the same line as the comment
    // expected-error@+1 {{text}}       N lines below (``@-N``: above)
    // expected-note@above {{text}}     the previous line (``@below``: the next one)

``expected-warning`` and ``expected-remark`` work the same way. A diagnostic matches
when it has the expected severity, sits on the expected line and its message
*contains* the text. Notes attached to a diagnostic are only considered when the input
has an ``expected-note``; an unmatched produced note is never an error.

Example::

    >>> exps = parse_expectations(text)
    >>> failures = check(exps, produced_diagnostics, "test.mlir")
    >>> for f in failures: print(f.format())
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from autosp.ir.diagnostics import Diagnostic

_EXPECTED = re.compile(
    r"expected-(error|warning|note|remark)(?:@([+-]\d+|above|below))?\s*\{\{(.*?)\}\}")


@dataclass
class Expectation:
    """One ``expected-<severity>`` comment: what it wants and where it points."""

    severity: str
    text: str
    line: int  # the line the diagnostic must be on
    comment_line: int  # where the comment itself is (for reporting)
    comment_col: int
    matched: bool = False


def parse_expectations(text: str) -> list[Expectation]:
    """Every ``expected-*`` comment in ``text`` (line numbers are 1-based, as in the file)."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for m in _EXPECTED.finditer(line):
            severity, offset, want = m.group(1), m.group(2), m.group(3)
            target = lineno
            if offset == "above":
                target -= 1
            elif offset == "below":
                target += 1
            elif offset:
                target += int(offset)
            out.append(Expectation(severity, want.strip(), target, lineno, m.start() + 1))
    return out


def _flatten(diagnostics: list[Diagnostic], with_notes: bool) -> list[Diagnostic]:
    flat = []
    for d in diagnostics:
        flat.append(d)
        if with_notes:
            flat.extend(_flatten(d.notes, True))
    return flat


def check(expectations: list[Expectation], produced: list[Diagnostic], file: str) -> list[Diagnostic]:
    """Match ``produced`` against ``expectations``; return the failures as diagnostics.

    A failure is either a produced error/warning/remark no comment expects
    (``unexpected error: ...``) or a comment no diagnostic satisfies
    (``expected error "..." was not produced``).
    """
    with_notes = any(e.severity == "note" for e in expectations)
    failures = []
    for d in _flatten(produced, with_notes):
        hit = next((e for e in expectations
                    if not e.matched and e.severity == d.severity and e.line == d.line
                    and e.text in d.message), None)
        if hit is not None:
            hit.matched = True
        elif d.severity != "note":
            failures.append(Diagnostic("error", f"unexpected {d.severity}: {d.message}",
                                       d.file, d.line, d.col))
    for e in expectations:
        if not e.matched:
            failures.append(Diagnostic("error", f'expected {e.severity} "{e.text}" was not produced',
                                       file, e.comment_line, e.comment_col))
    return failures
