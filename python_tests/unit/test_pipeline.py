"""Pipeline parsing, mixed autosp/upstream execution, dumps and failure reproducers."""
import re
from dataclasses import dataclass
from typing import ClassVar

import pytest
from autosp.passes import PASSES

from autosp.ir.core import parse_module
from autosp.ir.diagnostics import DiagnosticError
from autosp.ir.pass_base import ModulePass
from autosp.pipeline import (
    PipelineError,
    PipelineOptions,
    PipelineSyntaxError,
    UpstreamPass,
    parse_pipeline,
    pipeline_text,
    run_pipeline,
)

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


def test_no_reproducer_unless_asked_for(tmp_path, monkeypatch):
    """Without a request nothing is saved; the command runs the whole pipeline on the input."""
    monkeypatch.setitem(PASSES, _Failing.name, _Failing)
    monkeypatch.delenv("AUTOSP_REPRODUCER_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    module = parse_module(SRC, "t.mlir")
    with pytest.raises(PipelineError) as info:
        run_pipeline(module, "builtin.module(autosp-dce, autosp-test-fail)")
    err = info.value
    assert err.reproducer_file is None and list(tmp_path.iterdir()) == []
    assert err.reproducer == "autosp-opt --pass-pipeline='builtin.module(autosp-dce, autosp-test-fail)' <input.mlir>"
    assert "AUTOSP_REPRODUCER_DIR" in err.format()
    with pytest.raises(PipelineError) as info:
        run_pipeline(parse_module(SRC, "t.mlir"), "builtin.module(autosp-test-fail)",
                     PipelineOptions(input_name="model.mlir"))
    assert info.value.reproducer.endswith("'builtin.module(autosp-test-fail)' model.mlir")


@pytest.mark.parametrize("how", ["file", "env"])
def test_reproducer_on_request_holds_the_module_before_the_failing_pass(how, tmp_path, monkeypatch):
    monkeypatch.setitem(PASSES, _Failing.name, _Failing)
    if how == "env":
        monkeypatch.setenv("AUTOSP_REPRODUCER_DIR", str(tmp_path / "repros"))
        options = PipelineOptions()
    else:
        monkeypatch.delenv("AUTOSP_REPRODUCER_DIR", raising=False)
        options = PipelineOptions(reproducer=str(tmp_path / "r.mlir"))
    with pytest.raises(PipelineError) as info:
        run_pipeline(parse_module(SRC, "t.mlir"), "builtin.module(autosp-dce, autosp-test-fail, canonicalize)",
                     options)
    err = info.value
    path = err.reproducer_file
    assert path == str(tmp_path / "r.mlir") if how == "file" else path.startswith(str(tmp_path / "repros"))
    assert err.reproducer == (f"autosp-opt --pass-pipeline='builtin.module(autosp-test-fail, canonicalize)' "
                              f"{path} --mlir-print-ir-after-all")
    saved = open(path).read()
    assert saved.startswith("// autosp reproducer: the module before 'autosp-test-fail' failed.")
    assert "torch.aten.size.int" not in saved and "torch.aten.neg" in saved
    # The saved file parses, and the pipeline it names fails on it the same way.
    with pytest.raises(PipelineError, match="cannot handle this op"):
        run_pipeline(parse_module(saved, path), "builtin.module(autosp-test-fail, canonicalize)")


@dataclass(frozen=True)
class _TwoStep(ModulePass):
    """A pipeline pass: dce, then a pass that fails when asked to.

    Input::
    Output::
    """
    name: ClassVar[str] = "autosp-test-two-step"
    fail: bool = False

    def expand(self):
        from autosp.passes.dce import DeadCodeElimination
        return [DeadCodeElimination()] + ([_Failing()] if self.fail else [])


def test_pipeline_passes_run_as_their_sub_passes(tmp_path, monkeypatch):
    import io
    monkeypatch.setitem(PASSES, _TwoStep.name, _TwoStep)
    monkeypatch.setitem(PASSES, _Failing.name, _Failing)
    module = parse_module(SRC, "t.mlir")
    ran, out = [], io.StringIO()
    run_pipeline(module, "builtin.module(autosp-test-two-step, canonicalize)",
                 PipelineOptions(dump_dir=str(tmp_path), print_ir_before=("autosp-test-two-step",), out=out),
                 on_pass=lambda element, seconds: ran.append(element.pipeline_text()))
    assert ran == ["autosp-dce", "canonicalize"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_input.mlir", "01_autosp-dce.mlir", "02_canonicalize.mlir"]
    assert out.getvalue().count("IR Dump Before") == 1 and "IR Dump Before autosp-dce" in out.getvalue()
    # Applied directly (not through run_pipeline), a pipeline pass runs its expansion too.
    direct = parse_module(SRC, "t.mlir")
    _TwoStep().apply(direct)
    assert "torch.aten.size.int" not in str(direct)
    # A failing sub-pass is named, and the reproducer runs the remaining sub-passes.
    with pytest.raises(PipelineError) as info:
        run_pipeline(parse_module(SRC, "t.mlir"), "builtin.module(autosp-test-two-step{fail=true}, canonicalize)",
                     PipelineOptions(dump_dir=str(tmp_path / "fail")))
    assert info.value.pass_text == "autosp-test-fail"
    assert "--pass-pipeline='builtin.module(autosp-test-fail, canonicalize)'" in info.value.reproducer


def test_sp_pipeline_expands_into_the_sequence_parallel_passes():
    from autosp.passes.sp_pipeline import SequenceParallelPipeline
    sub = [p.pipeline_text() for p in SequenceParallelPipeline(sp_size=4, group="g", gather_outputs=True).expand()]
    assert sub == ["autosp-fuse-attention", "autosp-causal-mask", "autosp-relative-bias", "autosp-causal-conv", "autosp-fuse-gqa", "autosp-dce",
                   "autosp-annotate-sequence", "autosp-partition-attention{sp-size=4 group=g}",
                   "autosp-shard-sequence{group=g gather-outputs=true}", "autosp-hoist-shard", "autosp-dce"]
    assert [p.name for p in SequenceParallelPipeline(sp_size=1).expand()] == ["autosp-fuse-gqa", "autosp-dce"]
    with pytest.raises(PipelineSyntaxError, match="'sp-size' of pass 'autosp-sp-pipeline' must be >= 1, got 0"):
        parse_pipeline("builtin.module(autosp-sp-pipeline{sp-size=0})")


@dataclass(frozen=True)
class _Lists(ModulePass):
    """List options.

    Input::
    Output::
    """
    name: ClassVar[str] = "autosp-test-lists"
    dims: tuple[int, ...] = ()
    groups: tuple[str, ...] = ("sp",)
    fast: bool = False
    width: int = 1


def test_options_are_space_separated_and_lists_comma_separated(monkeypatch):
    monkeypatch.setitem(PASSES, _Lists.name, _Lists)
    (p,) = parse_pipeline("builtin.module(autosp-test-lists{dims=1,2,-3 groups=a,b fast width=4})")
    assert p == _Lists(dims=(1, 2, -3), groups=("a", "b"), fast=True, width=4)
    assert p.pipeline_text() == "autosp-test-lists{dims=1,2,-3 groups=a,b fast=true width=4}"
    assert parse_pipeline(pipeline_text([p])) == [p]
    # Quoted and braced values, an empty list, and the defaults.
    assert parse_pipeline("autosp-test-lists{dims={4,5} groups='x' }")[0] == _Lists(dims=(4, 5), groups=("x",))
    assert parse_pipeline("autosp-test-lists{dims=}")[0].dims == ()
    assert parse_pipeline("autosp-test-lists")[0] == _Lists()
    from autosp.ir.pass_base import type_name
    assert _Lists.options()["dims"] == (tuple[int, ...], ())
    assert type_name(tuple[int, ...]) == "list of int" and type_name(bool) == "bool"


@pytest.mark.parametrize("bad, message", [
    ("autosp-test-lists{dims=1,x}", "option 'dims' of pass 'autosp-test-lists' expects int, got 'x'"),
    ("autosp-test-lists{width=2,fast=true}", "separated by spaces, as in MLIR: '{width=2 fast=true}'"),
    ("autosp-test-lists{groups='a b}", "missing closing '"),
    ("autosp-test-lists{width=two}", "expects int, got 'two'"),
])
def test_bad_options_are_diagnosed(bad, message, monkeypatch):
    monkeypatch.setitem(PASSES, _Lists.name, _Lists)
    with pytest.raises(PipelineSyntaxError, match=re.escape(message)):
        parse_pipeline(bad)
