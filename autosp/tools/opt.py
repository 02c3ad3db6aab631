"""``autosp-opt``: run autosp and upstream MLIR passes on a file, like ``mlir-opt``.

Examples::

    autosp-opt model.mlir --autosp-dce --canonicalize -o out.mlir
    autosp-opt model.mlir --pass-pipeline='builtin.module(autosp-dce, func.func(cse))'
    autosp-opt tests.mlir --split-input-file --verify-diagnostics
    autosp-opt --list-passes

Every registered autosp pass is also a flag, ``--<pass-name>`` or
``--<pass-name>='opt=v opt2=a,b'`` (options separated by spaces, list items by commas,
as in MLIR); pass flags and ``--pass-pipeline`` run in command-line order. A failing
pass prints the command that reproduces it; ``--mlir-pass-pipeline-crash-reproducer=FILE``
(or ``$AUTOSP_REPRODUCER_DIR``) also saves the module before the failing pass. Errors are printed as ``file:line:col: error: message`` with exit status 1; a
Python traceback is only shown for internal errors when ``AUTOSP_DEBUG=1`` is set.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from importlib import metadata
from pathlib import Path

from torch_mlir import ir

from autosp.dialect import IRDL_FILE
from autosp.ir.core import make_context, parse_module
from autosp.ir.diagnostics import AutospError, Diagnostic, DiagnosticError
from autosp.ir.pass_base import type_name
from autosp.passes import PASSES
from autosp.pipeline import PipelineOptions, PipelineSyntaxError, check_pipeline, parse_pipeline, run_pipeline
from autosp.tools.verify_diagnostics import check, parse_expectations

PROG = "autosp-opt"
#: Upstream passes with a shorthand flag; ``{opts}`` receives ``{key=value ...}``.
UPSTREAM_FLAGS = {
    "canonicalize": "canonicalize{opts}",
    "cse": "func.func(cse{opts})",
    "symbol-dce": "symbol-dce{opts}",
    "inline": "inline{opts}",
    "sccp": "sccp{opts}",
}
_SPLIT_MARKER = re.compile(r"^[ \t]*// -----[ \t]*$")
_SEVERITY = {ir.DiagnosticSeverity.ERROR: "error", ir.DiagnosticSeverity.WARNING: "warning",
             ir.DiagnosticSeverity.NOTE: "note", ir.DiagnosticSeverity.REMARK: "remark"}


def _version() -> str:
    """``autosp-opt 0.1.0 (torch-mlir 20261001, torch 2.13.0+cpu)``, without importing torch."""
    def ver(dist: str, default: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return default
    return f"{PROG} {ver('autosp', '0.1.0')} (torch-mlir {ver('torch-mlir', 'unknown')}, torch {ver('torch', 'unknown')})"


def _pass_flag(name: str, value: str | None) -> str:
    """Pipeline text for ``--<name>[=value]``: ``autosp-x='a=1 b=2,3'`` -> ``autosp-x{a=1 b=2,3}``."""
    opts = (value or "").strip()
    if opts.startswith("{") and opts.endswith("}"):
        opts = opts[1:-1].strip()
    opts = "{" + opts + "}" if opts else ""
    if name in UPSTREAM_FLAGS:
        return UPSTREAM_FLAGS[name].format(opts=opts)
    return name + opts


def split_pass_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """Take the pass flags and ``--pass-pipeline`` out of ``argv``, keeping their order.

    Returns ``(pipeline texts, remaining argv)``. Done before argparse so that a bare
    ``--autosp-dce`` never swallows the input file as its value. Unknown ``--autosp-*``
    flags become pipeline text too, so they are reported as unknown passes.
    """
    texts, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest.extend(argv[i:])
            break
        flag, eq, value = arg.partition("=")
        name = flag[2:]
        if flag == "--pass-pipeline" and (eq or i + 1 < len(argv)):
            if not eq:
                i, value = i + 1, argv[i + 1]
            texts.append(value)
        elif flag.startswith("--") and (name in PASSES or name in UPSTREAM_FLAGS or name.startswith("autosp-")):
            texts.append(_pass_flag(name, value if eq else None))
        else:
            rest.append(arg)
        i += 1
    return texts, rest


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; pass flags appear in ``--help`` but are parsed by split_pass_flags."""
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=False,
                                usage=f"{PROG} [options] [--<pass>[='opt=v ...'] ...] [input]",
                                description="Run autosp and upstream MLIR passes on MLIR text.")
    p.add_argument("input", nargs="?", default="-", help="input file ('-' or omitted: stdin)")
    p.add_argument("-o", dest="output", default="-", metavar="FILE", help="output file (default stdout)")
    p.add_argument("--pass-pipeline", metavar="PIPELINE", help="e.g. 'builtin.module(autosp-dce,canonicalize)'")
    p.add_argument("--split-input-file", action="store_true", help="process '// -----' chunks separately")
    p.add_argument("--verify-diagnostics", action="store_true", help="check expected-error/... comments")
    p.add_argument("--allow-unregistered-dialect", action="store_true")
    p.add_argument("--mlir-print-ir-after-all", action="store_true", help="print the IR after each pass (stderr)")
    p.add_argument("--mlir-print-ir-before", action="append", default=[], metavar="PASS[,PASS]",
                   help="print the IR before the named passes (stderr)")
    p.add_argument("--mlir-print-op-generic", action="store_true", help="print ops in generic form")
    p.add_argument("--mlir-print-debuginfo", action="store_true", help="print locations")
    p.add_argument("--mlir-timing", action="store_true", help="print per-pass times (stderr)")
    p.add_argument("--dump-dir", metavar="DIR",
                   help="write the IR after every pass into DIR (and a reproducer when a pass fails)")
    p.add_argument("--mlir-pass-pipeline-crash-reproducer", metavar="FILE",
                   help="when a pass fails, save the module before it to FILE with the command that reruns it")
    p.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    p.add_argument("--print-dialect", action="store_true", help="print the path of the autosp IRDL file")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    group = p.add_argument_group("passes (run in command-line order)")
    for name, cls in sorted(PASSES.items()):
        group.add_argument(f"--{name}", metavar="'OPT=V ...'", nargs="?", help=cls.summary())
    for name, text in UPSTREAM_FLAGS.items():
        group.add_argument(f"--{name}", metavar="'OPT=V ...'", nargs="?",
                           help=f"upstream: {text.format(opts='')}")
    return p


def list_passes() -> str:
    """The text of ``--list-passes``: each pass, its summary and its typed options."""
    lines = ["autosp passes:"]
    for name, cls in sorted(PASSES.items()):
        lines.append(f"  {name:<28} {cls.summary()}")
        for opt, (typ, default) in cls.options().items():
            lines.append(f"    {opt} ({type_name(typ)}, default {default})")
    lines.append("Upstream MLIR and torch-mlir passes (canonicalize, func.func(cse), "
                 "torch-...) are also accepted in --pass-pipeline.")
    return "\n".join(lines)


def split_chunks(text: str) -> list[str]:
    """Split on ``// -----`` lines; each chunk is padded with newlines to keep line numbers."""
    chunks: list[str] = []
    cur: list[str] = []
    start = 0
    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines):
        if _SPLIT_MARKER.match(line.rstrip("\n")):
            chunks.append("\n" * start + "".join(cur))
            cur, start = [], n + 1
        else:
            cur.append(line)
    chunks.append("\n" * start + "".join(cur))
    return chunks


def _located(d) -> Diagnostic:
    """A Diagnostic from an MLIR diagnostic seen by the context's handler."""
    diag = Diagnostic.from_location(_SEVERITY.get(d.severity, "error"), d.location, d.message)
    diag.notes = [_located(n) for n in getattr(d, "notes", ())]
    return diag


def process_chunk(text: str, source: str, ctx, elements, args, produced: list[Diagnostic]) -> str | None:
    """Parse, run the pipeline and print one chunk; diagnostics go into ``produced``.

    Returns the printed module, or None when an error occurred. Outside
    ``--verify-diagnostics`` errors are also printed to stderr.
    """
    try:
        module = parse_module(text, source, ctx)
        if elements:
            options = PipelineOptions(
                print_ir_after_all=args.mlir_print_ir_after_all,
                print_ir_before=tuple(n.strip() for v in args.mlir_print_ir_before for n in v.split(",") if n.strip()),
                dump_dir=args.dump_dir, timing=args.mlir_timing,
                reproducer=args.mlir_pass_pipeline_crash_reproducer,
                input_name=None if source == "<stdin>" or args.split_input_file else source)
            run_pipeline(module, elements, options)
    except PipelineSyntaxError:
        raise  # a bad pipeline is fatal for every chunk
    except DiagnosticError as e:
        produced.extend(e.diagnostics)
        if not args.verify_diagnostics:
            print(e.format(), file=sys.stderr)
        return None
    asm = module.get_asm(print_generic_op_form=args.mlir_print_op_generic,
                         enable_debug_info=args.mlir_print_debuginfo)
    return asm if asm.endswith("\n") else asm + "\n"


def run(argv: list[str]) -> int:
    """The body of :func:`main`: returns the exit status; may raise AutospError/OSError."""
    texts, rest = split_pass_flags(argv)
    args = build_parser().parse_args(rest)
    if args.version:
        print(_version())
        return 0
    if args.list_passes:
        print(list_passes())
        return 0
    if args.print_dialect:
        print(IRDL_FILE)
        return 0
    elements = [e for t in texts for e in parse_pipeline(t)]
    ctx = make_context(allow_unregistered_dialects=args.allow_unregistered_dialect)
    check_pipeline(elements, ctx)

    source = "<stdin>" if args.input == "-" else args.input
    try:
        text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"{PROG}: error: could not open input file '{source}': {getattr(e, 'strerror', None) or e}",
              file=sys.stderr)
        return 1

    produced: list[Diagnostic] = []

    def handler(d) -> bool:  # diagnostics MLIR emits outside an error capture (warnings, remarks)
        diag = _located(d)
        produced.append(diag)
        if not args.verify_diagnostics:
            print(diag.format(), file=sys.stderr)
        return True

    ctx.attach_diagnostic_handler(handler)
    status, outputs = 0, []
    for chunk in (split_chunks(text) if args.split_input_file else [text]):
        produced.clear()
        out = process_chunk(chunk, source, ctx, elements, args, produced)
        if args.verify_diagnostics:
            failures = check(parse_expectations(chunk), produced, source)
            for f in failures:
                print(f.format(), file=sys.stderr)
            status |= bool(failures)
        elif out is None or any(d.severity == "error" for d in produced):
            status = 1
        if out is not None:
            outputs.append(out)

    result = "// -----\n".join(outputs)
    if args.output == "-":
        sys.stdout.write(result)
        sys.stdout.flush()
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as out_file:
                out_file.write(result)
        except OSError as e:
            print(f"{PROG}: error: could not write output file '{args.output}': {e.strerror or e}", file=sys.stderr)
            return 1
    return status


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``autosp-opt [options] [input]``; returns the exit status."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `autosp-opt ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # silence the flush at exit
    except DiagnosticError as e:  # a bad pipeline; PipelineError.format() adds the reproducer
        print(e.format(), file=sys.stderr)
    except (AutospError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - last resort: never show a bare traceback
        if os.environ.get("AUTOSP_DEBUG"):
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        if not os.environ.get("AUTOSP_DEBUG"):
            print(f"{PROG}: rerun with AUTOSP_DEBUG=1 to see the traceback", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
