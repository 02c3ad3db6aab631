"""Pass pipelines that mix autosp's Python passes with upstream MLIR/torch-mlir passes.

Python passes cannot be named inside an MLIR textual pipeline, so autosp parses the
pipeline itself: each top-level element is either a registered autosp pass (with
typed ``{key=value}`` options) or upstream pipeline text handed to MLIR's
``PassManager`` unchanged (``canonicalize``, ``func.func(cse)``, torch-mlir passes).

Example::

    >>> run_pipeline(module, "builtin.module(autosp-dce, canonicalize)")

When a pass fails, the error carries the ``autosp-opt`` command that reproduces the
failure. When a reproducer is asked for (:class:`PipelineOptions`: ``reproducer``,
``dump_dir`` or ``$AUTOSP_REPRODUCER_DIR``), the module as it was before that pass is
written to a file and the command runs the rest of the pipeline on it. A pass that is a
pipeline of passes (``ModulePass.expand``) runs as its sub-passes, so dumps name them.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

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
    """A pass failed; ``reproducer`` is the command that reproduces it.

    ``reproducer_file`` is the saved module before the failing pass, or None when no
    reproducer was asked for (the command then runs the whole pipeline on the input).
    """

    def __init__(self, diagnostics, pass_text: str, reproducer: str, reproducer_file: str | None = None):
        self.pass_text = pass_text
        self.reproducer = reproducer
        self.reproducer_file = reproducer_file
        super().__init__(diagnostics)

    def format(self) -> str:
        text = super().format() + f"\nnote: pass '{self.pass_text}' failed; reproduce with:\n  {self.reproducer}"
        if self.reproducer_file is None:
            text += (f"\nnote: to save the module before the failing pass, set {REPRODUCER_DIR_ENV}=<dir> "
                     f"(autosp-opt: --mlir-pass-pipeline-crash-reproducer=<file>)")
        return text


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
_OPEN = {"(": ")", "{": "}", "[": "]"}


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split ``text`` at ``sep`` outside brackets and quotes (``sep=" "``: any whitespace)."""
    parts: list[str] = []
    cur: list[str] = []
    stack: list[str] = []
    quote = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in ")}]":
            if not stack or stack.pop() != ch:
                raise PipelineSyntaxError(f"unbalanced '{ch}' in pass pipeline '{text}'")
        if not stack and not quote and (ch.isspace() if sep == " " else ch == sep):
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if quote:
        raise PipelineSyntaxError(f"missing closing {quote} in pass pipeline '{text}'")
    if stack:
        raise PipelineSyntaxError(f"missing '{stack[-1]}' in pass pipeline '{text}'")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_COMMA_THEN_KEY = re.compile(r",\s*[A-Za-z][\w-]*\s*=")


def _parse_options(text: str, pass_name: str = "") -> dict[str, str]:
    """``a=1 b=x,y c='q r'`` -> ``{"a": "1", "b": "x,y", "c": "q r"}``, as MLIR separates them.

    Options are separated by whitespace; a list option's items by commas. A bare key
    means ``true``. The old comma-separated form (``a=1,b=2``) is diagnosed, since it
    cannot be told apart from a list value otherwise.
    """
    opts = {}
    for item in _split_top_level(text, " "):
        key, eq, value = item.partition("=")
        value = value.strip()
        if _COMMA_THEN_KEY.search(value) and value[:1] not in "{['\"":
            raise PipelineSyntaxError(
                f"options of pass '{pass_name}' are separated by spaces, as in MLIR: "
                f"'{{{key}={value.replace(',', ' ', 1)}}}', not '{{{item}}}'")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        opts[key.strip()] = value if eq else "true"
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
                opts = _parse_options(rest[1:-1], name)
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
#: A directory: when set, a failing pass writes its reproducer there (as ``reproducer=`` does).
REPRODUCER_DIR_ENV = "AUTOSP_REPRODUCER_DIR"
#: Stands for the input file in a reproduce command when no module was saved.
INPUT_PLACEHOLDER = "<input.mlir>"


@dataclass
class PipelineOptions:
    """Instrumentation for :func:`run_pipeline` (mirrors mlir-opt's flags).

    A reproducer (the module before the failing pass, and the command that runs the rest
    of the pipeline on it) is written only when asked for: ``reproducer`` (a file path,
    like ``--mlir-pass-pipeline-crash-reproducer``), ``dump_dir`` (written there), or the
    ``AUTOSP_REPRODUCER_DIR`` environment variable (a folder). Otherwise nothing is copied
    or printed per pass, and the error still gives the command, with ``input_name`` (or
    ``<input.mlir>``) for the input file.

    Example::

        >>> run_pipeline(module, "builtin.module(autosp-sp-pipeline{sp-size=2})",
        ...              PipelineOptions(reproducer="/tmp/repro.mlir"))
    """

    print_ir_after_all: bool = False
    print_ir_before: tuple[str, ...] = ()
    dump_dir: str | None = None
    verify_each: bool = True
    timing: bool = False
    out: TextIO | None = None  # where IR dumps go (stderr by default)
    reproducer: str | None = None  # file to write the module before a failing pass to
    input_name: str | None = None  # the input file, for the reproduce command without a reproducer

    def reproducer_target(self) -> tuple[str, bool] | None:
        """``(path, is_folder)`` where a reproducer goes, or None when none was asked for."""
        if self.reproducer:
            return self.reproducer, False
        if self.dump_dir:
            return self.dump_dir, True
        folder = os.environ.get(REPRODUCER_DIR_ENV)
        return (folder, True) if folder else None


def _banner(when: str, element: Element) -> str:
    return f"// -----// IR Dump {when} {element.pipeline_text()} //----- //"


def expand_pipeline(elements: list[Element]) -> list[tuple[Element, frozenset[str]]]:
    """Replace every pass that is a pipeline of passes (``expand()``) by its sub-passes.

    Returns ``(element, names)`` pairs: ``names`` is the element's own name plus those of
    the pipelines it begins, so ``--mlir-print-ir-before=autosp-sp-pipeline`` still prints
    before the first sub-pass.
    """
    out: list[tuple[Element, frozenset[str]]] = []
    for e in elements:
        subs = e.expand() if isinstance(e, ModulePass) else None
        if subs is None:
            out.append((e, frozenset({e.name})))
            continue
        inner = expand_pipeline(list(subs))
        if inner:
            first, names = inner[0]
            inner[0] = (first, names | {e.name})
        out.extend(inner)
    return out


def run_pipeline(module, pipeline: str | list[Element], options: PipelineOptions | None = None,
                 on_pass: Callable[[Element, float], None] | None = None) -> None:
    """Run ``pipeline`` on ``module`` in place.

    Passes that are pipelines of passes run as their sub-passes (see
    :func:`expand_pipeline`). On failure raises :class:`PipelineError` whose text includes
    the command that reproduces it; with a reproducer requested (``options``), the module
    before the failing pass is saved and the command runs the rest of the pipeline on it.
    """
    options = options or PipelineOptions()
    module = as_operation(module)
    elements = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
    check_pipeline(elements, module.context)
    flat = expand_pipeline(elements)
    repro_target = options.reproducer_target()
    out = options.out or sys.stderr
    before_names = set(options.print_ir_before)
    if options.dump_dir:
        Path(options.dump_dir).mkdir(parents=True, exist_ok=True)
        (Path(options.dump_dir) / "00_input.mlir").write_text(str(module))
    for i, (element, names) in enumerate(flat):
        if "*" in before_names or names & before_names:
            print(_banner("Before", element), file=out)
            print(module, file=out)
        # A copy for the reproducer only when one is wanted: cloning is cheaper than
        # printing, and nothing at all is kept otherwise.
        saved = module.clone() if repro_target else None
        start = time.perf_counter()
        try:
            with module.context, ir.Location.unknown():
                element.apply(module)
            if options.verify_each:
                verify(module)
        except DiagnosticError as e:
            if isinstance(e, PipelineSyntaxError):
                raise
            remaining = [el for el, _ in flat[i:]]
            if saved is not None:
                assert repro_target is not None  # saved only when a reproducer was asked for
                path = _write_reproducer(str(saved), remaining, *repro_target)
                repro = f"autosp-opt --pass-pipeline='{pipeline_text(remaining)}' {path} --mlir-print-ir-after-all"
            else:
                path = None
                repro = f"autosp-opt --pass-pipeline='{pipeline_text(elements)}' " \
                        f"{options.input_name or INPUT_PLACEHOLDER}"
            raise PipelineError(e.diagnostics, element.pipeline_text(), repro, path) from None
        finally:
            del saved
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


def _write_reproducer(text: str, remaining: list[Element], target: str, is_folder: bool) -> str:
    """Write the module and, as a comment, the pipeline still to run; return the file's path."""
    if is_folder:
        Path(target).mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="autosp_repro_", suffix=".mlir", dir=target)
        f = os.fdopen(fd, "w")
    else:
        path = target
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "w")
    with f:
        f.write(f"// autosp reproducer: the module before '{remaining[0].pipeline_text()}' failed.\n"
                f"// autosp-opt --pass-pipeline='{pipeline_text(remaining)}' {path}\n")
        f.write(text)
    return path
