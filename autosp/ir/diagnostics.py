"""Diagnostics: errors that name an op, a constraint and a source location.

Everything autosp reports to a user about IR goes through :class:`DiagnosticError`,
whether it came from MLIR (parse and verifier errors) or from an autosp pass. The CLI
prints them as ``file:line:col: error: message``; ``--verify-diagnostics`` matches them
against ``expected-error`` comments.

Example::

    >>> raise DiagnosticError.at(op, "query heads (6) not divisible by sp-size 4")
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch_mlir import ir

_FILE_LINE_COL = re.compile(r'"([^"]*)":(\d+):(\d+)')


class AutospError(RuntimeError):
    """Base class of the errors autosp raises for bad input or an unsupported model."""


@dataclass
class Diagnostic:
    """One message, with where it points: ``file`` / ``line`` / ``col`` (None if unknown)."""

    severity: str
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None
    notes: list[Diagnostic] = field(default_factory=list)

    @classmethod
    def from_location(cls, severity: str, loc, message: str) -> Diagnostic:
        file, line, col = parse_location(loc)
        return cls(severity, message, file, line, col)

    def format(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}: " if self.line is not None else ""
        text = f"{where}{self.severity}: {self.message}"
        return "\n".join([text] + ["  " + n.format() for n in self.notes])


def parse_location(loc) -> tuple[str | None, int | None, int | None]:
    """``loc("f.mlir":3:5)`` (or any location that contains one) -> ``("f.mlir", 3, 5)``."""
    m = _FILE_LINE_COL.search(str(loc))
    if not m:
        return None, None, None
    return m.group(1), int(m.group(2)), int(m.group(3))


_SEVERITY = {
    ir.DiagnosticSeverity.ERROR: "error",
    ir.DiagnosticSeverity.WARNING: "warning",
    ir.DiagnosticSeverity.NOTE: "note",
    ir.DiagnosticSeverity.REMARK: "remark",
}


def _from_mlir(d) -> Diagnostic:
    diag = Diagnostic.from_location(_SEVERITY.get(getattr(d, "severity", None), "error"), d.location, d.message)
    diag.notes = [_from_mlir(n) for n in getattr(d, "notes", ())]
    return diag


class DiagnosticError(AutospError):
    """One or more located diagnostics; ``str(e)`` prints them like mlir-opt does."""

    def __init__(self, diagnostics: list[Diagnostic], summary: str | None = None):
        self.diagnostics = diagnostics
        self.summary = summary
        super().__init__(self.format())

    def format(self) -> str:
        lines = [d.format() for d in self.diagnostics]
        if self.summary and not lines:
            lines.append(f"error: {self.summary}")
        return "\n".join(lines)

    @classmethod
    def at(cls, op, message: str) -> DiagnosticError:
        """An error located at ``op`` (an ``ir.Operation``/``OpView``) or an ``ir.Location``."""
        loc = op if isinstance(op, ir.Location) else op.location
        name = ""
        if not isinstance(op, ir.Location):
            name = f"'{op.operation.name}' op "
            if op.operation.name == "torch.operator" and "name" in op.attributes:
                name = f"'torch.operator \"{ir.StringAttr(op.attributes['name']).value}\"' op "
        return cls([Diagnostic.from_location("error", loc, name + message)])

    @classmethod
    def from_mlir(cls, err: ir.MLIRError) -> DiagnosticError:
        diags = [_from_mlir(d) for d in err.error_diagnostics]
        if not diags:  # MLIR gave no detail: keep its own message
            diags = [Diagnostic("error", err.message)]
        return cls(diags, err.message)
