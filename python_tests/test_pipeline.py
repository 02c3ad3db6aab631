"""Pipeline parsing, mixed autosp/upstream execution, dumps and failure reproducers."""
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest

from autosp.ir.core import parse_module
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.pass_base import ModulePass
from autosp.passes import PASSES
from autosp.pipeline import (PipelineError, PipelineOptions, PipelineSyntaxError, UpstreamPass, parse_pipeline,
                             pipeline_text, run_pipeline)

SRC = """
func.func @main(%arg0: !torch.vtensor<[2,?],si64>, %arg1: !torch.vtensor<[4],f32>) -> !torch.vtensor<[4],f32> {
  %int1 = torch.constant.int 1
  %0 = torch.aten.size.int %arg0, %int1 : !torch.vtensor<[2,?],si64>, !torch.int -> !torch.int
  %1 = torch.aten.neg %arg1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  %2 = torch.aten.neg %1 : !torch.vtensor<[4],f32> -> !torch.vtensor<[4],f32>
  return %2 : !torch.vtensor<[4],f32>
}
"""


def test_parse_mixed_pipeline_round_trips():
    elements = parse_pipeline("builtin.module(autosp-dce, canonicalize{max-iterations=3}, func.func(cse))")
    assert [e.name for e in elements] == ["autosp-dce", "canonicalize", "func.func"]
    assert isinstance(elements[1], UpstreamPass)
    text = pipeline_text(elements)
    assert text == "builtin.module(autosp-dce, canonicalize{max-iterations=3}, func.func(cse))"
    assert pipeline_text(parse_pipeline(text)) == text


@pytest.mark.parametrize("bad, message", [
    ("builtin.module(autosp-nope)", "unknown pass 'autosp-nope'"),
    ("builtin.module(autosp-dce{bogus=1})", "has no option 'bogus'"),
    ("builtin.module(func.func(cse)", "missing ')'"),
    ("builtin.module(autosp-dce(cse))", "cannot nest"),
])
def test_malformed_pipelines_are_diagnosed(bad, message):
    with pytest.raises(PipelineSyntaxError, match=re.escape(message)):
        parse_pipeline(bad)


def test_unknown_upstream_pass_is_diagnosed_before_running():
    module = parse_module(SRC, "t.mlir")
    before = str(module)
    with pytest.raises(PipelineSyntaxError, match="canonicalise"):
        run_pipeline(module, "builtin.module(autosp-dce, canonicalise)")
    assert str(module) == before, "nothing may run when the pipeline is invalid"


def test_mixed_pipeline_runs_and_dumps(tmp_path):
    module = parse_module(SRC, "t.mlir")
    run_pipeline(module, "builtin.module(autosp-dce, canonicalize, func.func(cse))",
                 PipelineOptions(dump_dir=str(tmp_path)))
    text = str(module)
    assert "torch.aten.size.int" not in text and "torch.constant.int" not in text
    assert text.count("torch.aten.neg") == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00_input.mlir", "01_autosp-dce.mlir", "02_canonicalize.mlir", "03_func_func.mlir"]


@dataclass(frozen=True)
class _Failing(ModulePass):
    """Always fails at the first torch.aten.neg.

    Input::
    Output::
    """
    name: ClassVar[str] = "autosp-test-fail"

    def apply(self, module):
        from autosp.ir.core import body_ops, main_func
        for op in body_ops(main_func(module)):
            if op.operation.name == "torch.aten.neg":
                raise DiagnosticError.at(op, "cannot handle this op")


def test_failure_writes_a_reproducer_with_the_exact_command(tmp_path, monkeypatch):
    monkeypatch.setitem(PASSES, _Failing.name, _Failing)
    module = parse_module(SRC, "t.mlir")
    with pytest.raises(PipelineError) as info:
        run_pipeline(module, "builtin.module(autosp-dce, autosp-test-fail, canonicalize)",
                     PipelineOptions(dump_dir=str(tmp_path)))
    err = info.value
    text = err.format()
    assert "t.mlir:5:" in text and "'torch.aten.neg' op cannot handle this op" in text
    assert err.reproducer.startswith(
        "autosp-opt --pass-pipeline='builtin.module(autosp-test-fail, canonicalize)' ")
    assert err.reproducer.endswith("--mlir-print-ir-after-all")
    repro_file = err.reproducer.split("' ")[1].split(" ")[0]
    saved = open(repro_file).read()
    assert "torch.aten.size.int" not in saved, "the reproducer holds the module *before* the failing pass"
    assert "torch.aten.neg" in saved


def test_print_ir_after_all_and_before(capsys):
    import io
    out = io.StringIO()
    module = parse_module(SRC, "t.mlir")
    run_pipeline(module, "builtin.module(autosp-dce, canonicalize)",
                 PipelineOptions(print_ir_after_all=True, print_ir_before=("canonicalize",), out=out))
    text = out.getvalue()
    assert text.index("IR Dump After autosp-dce") < text.index("IR Dump Before canonicalize") \
        < text.index("IR Dump After canonicalize")


def test_several_top_level_functions_are_wrapped_and_errors_keep_their_lines():
    module = parse_module("func.func @a() { return }\nfunc.func @b() { return }", "two.mlir")
    assert str(module).count("func.func") == 2
    with pytest.raises(DiagnosticError, match=r"two\.mlir:2:18: error: custom op 'retur'"):
        parse_module("func.func @a() { return }\nfunc.func @b() { retur }", "two.mlir")
