"""Pass pipelines that mix autosp's Python passes with upstream MLIR/torch-mlir passes.

Python passes cannot be named inside an MLIR textual pipeline, so autosp parses the
pipeline itself: each top-level element is either a registered autosp pass (with
typed ``{key=value}`` options) or upstream pipeline text handed to MLIR's
``PassManager`` unchanged (``canonicalize``, ``func.func(cse)``, torch-mlir passes).

Example::

    >>> run_pipeline(module, "builtin.module(autosp-dce, canonicalize)")

When a pass fails, the module as it was before that pass is written to a file and the
error carries the exact ``autosp-opt`` command that reproduces the failure.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from torch_mlir import ir, passmanager

from autosp.ir.core import as_operation, verify
from autosp.ir.diagnostics import Diagnostic, DiagnosticError
from autosp.ir.pass_base import ModulePass, PassOptionError
from autosp.passes import PASSES


class PipelineSyntaxError(DiagnosticError):
    """The pipeline text is malformed, names an unknown pass, or has a bad option."""

    def __init__(self, message: str):
        super().__init__([Diagnostic("error", message)])


class PipelineError(DiagnosticError):
    """A pass failed; ``reproducer`` is the command that reproduces it."""

    def __init__(self, diagnostics, pass_text: str, reproducer: str):
        self.pass_text = pass_text
        self.reproducer = reproducer
        super().__init__(diagnostics)

    def format(self) -> str:
        return super().format() + f"\nnote: pass '{self.pass_text}' failed; reproduce with:\n  {self.reproducer}"


@dataclass(frozen=True)
class UpstreamPass:
    """A pipeline element run by MLIR's PassManager (``canonicalize``, ``func.func(cse)``)."""

    text: str

    @property
    def name(self) -> str:
        return self.text.split("{")[0].split("(")[0].strip()

    def pipeline_text(self) -> str:
        return self.text

    def apply(self, module: ir.Operation) -> None:
        with module.context:
            try:
                pm = passmanager.PassManager.parse(f"builtin.module({self.text})")
                pm.run(module)
            except ir.MLIRError as e:
                raise DiagnosticError.from_mlir(e) from None
            except ValueError as e:  # unknown pass or bad option in the text
                raise PipelineSyntaxError(f"in pipeline element '{self.text}': {e}") from None


Element = ModulePass | UpstreamPass


# ----------------------------------------------------------------------------- parsing
def _split_top_level(text: str, sep: str = ",") -> list[str]:
    parts, cur = [], []
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack: list[str] = []
    for ch in text:
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            if not stack or stack.pop() != ch:
                raise PipelineSyntaxError(f"unbalanced '{ch}' in pass pipeline '{text}'")
        if ch == sep and not stack:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if stack:
        raise PipelineSyntaxError(f"missing '{stack[-1]}' in pass pipeline '{text}'")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _parse_options(text: str) -> dict[str, str]:
    opts = {}
    for item in text.replace(",", " ").split():
        key, eq, value = item.partition("=")
        opts[key.strip()] = value.strip().strip("'\"") if eq else "true"
    return opts


def parse_pipeline(text: str) -> list[Element]:
    """Parse ``builtin.module(a, b{k=v}, func.func(c))`` (or the bare list ``a, b``).

    Raises :class:`PipelineSyntaxError` for unbalanced brackets, unknown autosp passes
    and bad options. Upstream names are checked by MLIR when the pipeline is built.
    """
    text = text.strip()
    if text.startswith("builtin.module(") and text.endswith(")"):
        text = text[len("builtin.module("):-1]
    elements: list[Element] = []
    for part in _split_top_level(text):
        name = part.split("{")[0].split("(")[0].strip()
        if name in PASSES:
            cls = PASSES[name]
            rest = part[len(name):].strip()
            if rest.startswith("("):
                raise PipelineSyntaxError(f"'{name}' is a module pass and cannot nest passes")
            opts = {}
            if rest:
                if not (rest.startswith("{") and rest.endswith("}")):
                    raise PipelineSyntaxError(f"malformed options '{rest}' for pass '{name}'")
                opts = _parse_options(rest[1:-1])
            try:
                elements.append(cls.from_options(opts))
            except PassOptionError as e:
                raise PipelineSyntaxError(str(e)) from None
        elif name.startswith("autosp-"):
            raise PipelineSyntaxError(
                f"unknown pass '{name}' (autosp-opt --list-passes shows the registered passes)")
        else:
            elements.append(UpstreamPass(part))
    return elements


def pipeline_text(elements: list[Element]) -> str:
    """The textual form of a parsed pipeline (round-trips through parse_pipeline)."""
    return "builtin.module(" + ", ".join(e.pipeline_text() for e in elements) + ")"


def check_pipeline(elements: list[Element], ctx: ir.Context) -> None:
    """Let MLIR validate the upstream elements (unknown passes, bad options) up front."""
    for e in elements:
        if isinstance(e, UpstreamPass):
            with ctx:
                try:
                    passmanager.PassManager.parse(f"builtin.module({e.text})")
                except (ValueError, ir.MLIRError) as err:
                    msg = [m.strip() for m in str(err).strip().splitlines()]
                    # drop MLIR's echo of the pipeline text and its '^' marker line
                    detail = "; ".join(m for m in msg if m and m != e.text and m.strip("^ "))
                    raise PipelineSyntaxError(f"invalid pipeline element '{e.text}': {detail}") from None


# ----------------------------------------------------------------------------- running
@dataclass
class PipelineOptions:
    """Instrumentation for :func:`run_pipeline` (mirrors mlir-opt's flags)."""

    print_ir_after_all: bool = False
    print_ir_before: tuple[str, ...] = ()
    dump_dir: str | None = None
    verify_each: bool = True
    timing: bool = False
    out: TextIO | None = None  # where IR dumps go (stderr by default)


def _banner(when: str, element: Element) -> str:
    return f"// -----// IR Dump {when} {element.pipeline_text()} //----- //"


def run_pipeline(module, pipeline: str | list[Element], options: PipelineOptions | None = None,
                 on_pass: Callable[[Element, float], None] | None = None) -> None:
    """Run ``pipeline`` on ``module`` in place.

    On failure raises :class:`PipelineError` whose text includes the command that
    reproduces it; the module before the failing pass is saved next to it.
    """
    options = options or PipelineOptions()
    module = as_operation(module)
    elements = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
    check_pipeline(elements, module.context)
    out = options.out or sys.stderr
    if options.dump_dir:
        Path(options.dump_dir).mkdir(parents=True, exist_ok=True)
        (Path(options.dump_dir) / "00_input.mlir").write_text(str(module))
    for i, element in enumerate(elements):
        if element.name in options.print_ir_before or "*" in options.print_ir_before:
            print(_banner("Before", element), file=out)
            print(module, file=out)
        before = str(module)
        start = time.perf_counter()
        try:
            with module.context, ir.Location.unknown():
                element.apply(module)
            if options.verify_each:
                verify(module)
        except DiagnosticError as e:
            if isinstance(e, PipelineSyntaxError):
                raise
            repro = _write_reproducer(before, elements[i:], options.dump_dir)
            raise PipelineError(e.diagnostics, element.pipeline_text(), repro) from None
        elapsed = time.perf_counter() - start
        if on_pass:
            on_pass(element, elapsed)
        if options.timing:
            print(f"// {element.pipeline_text()}: {elapsed * 1e3:.1f} ms", file=out)
        if options.print_ir_after_all:
            print(_banner("After", element), file=out)
            print(module, file=out)
        if options.dump_dir:
            safe = element.name.replace(".", "_").replace("/", "_")
            (Path(options.dump_dir) / f"{i + 1:02d}_{safe}.mlir").write_text(str(module))


def _write_reproducer(text: str, remaining: list[Element], dump_dir: str | None) -> str:
    folder = Path(dump_dir) if dump_dir else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="autosp_repro_", suffix=".mlir", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return f"autosp-opt --pass-pipeline='{pipeline_text(remaining)}' {path} --mlir-print-ir-after-all"
