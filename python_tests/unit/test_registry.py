"""The pass registry: names, docs, options and a lit test for every pass."""
from pathlib import Path

import pytest
from autosp.passes import PASSES, lit_file_name

from autosp.ir.pass_base import ModulePass

LIT = Path(__file__).resolve().parents[2] / "lit_tests"


@pytest.mark.parametrize("key", sorted(PASSES))
def test_key_is_the_pass_name(key):
    assert PASSES[key].name == key
    assert key.startswith("autosp-")
    assert issubclass(PASSES[key], ModulePass)


@pytest.mark.parametrize("key", sorted(PASSES))
def test_every_pass_is_documented_with_an_ir_example(key):
    cls = PASSES[key]
    assert cls.summary(), f"{key} has no one-line summary"
    doc = cls.__doc__ or ""
    assert "Input::" in doc and "Output::" in doc, f"{key}'s docstring needs an input/output example"


@pytest.mark.parametrize("key", sorted(PASSES))
def test_every_pass_has_a_lit_file_that_runs_it(key):
    path = LIT / lit_file_name(key)
    assert path.exists(), f"missing lit test {path}"
    text = path.read_text()
    assert "// RUN: autosp-opt" in text and key in text and "CHECK-LABEL" in text


def test_options_are_typed_and_kebab_case():
    from dataclasses import dataclass
    from typing import ClassVar

    @dataclass(frozen=True)
    class Demo(ModulePass):
        """Demo."""
        name: ClassVar[str] = "autosp-demo"
        sp_size: int = 1
        fast: bool = False

    p = Demo.from_options({"sp-size": "4", "fast": "true"})
    assert p == Demo(sp_size=4, fast=True)
    assert p.pipeline_text() == "autosp-demo{sp-size=4 fast=true}"
    assert Demo.options() == {"sp-size": (int, 1), "fast": (bool, False)}
    from autosp.ir.pass_base import PassOptionError
    with pytest.raises(PassOptionError, match="expects int, got 'four'"):
        Demo.from_options({"sp-size": "four"})
    with pytest.raises(PassOptionError, match="has no option 'size'.*sp-size, fast"):
        Demo.from_options({"size": "4"})


def test_pass_reference_is_generated_from_the_docstrings():
    from autosp.tools.pass_docs import render
    path = LIT.parent / "docs" / "passes.md"
    assert path.read_text() == render(), "regenerate: python -m autosp.tools.pass_docs > docs/passes.md"


def test_design_layout_is_generated_from_the_tree():
    """docs/DESIGN.md §4's module map is the tree's: every module of autosp/ and passes/
    with its docstring's first sentence (a module added, moved or left without a docstring
    fails this until the map is regenerated)."""
    from autosp.tools import layout_docs
    assert layout_docs.current() == layout_docs.render().strip("\n"), \
        "regenerate: python -m autosp.tools.layout_docs --write"
    assert "(no docstring)" not in layout_docs.render()


def _imports(path, top_level_only: bool) -> list[str]:
    import ast
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_only_the_hugging_face_integration_imports_it_or_transformers():
    """No module outside autosp/hf/ imports autosp.hf (the Trainer/TRL integration, the top
    floor), and none imports transformers at module level: a core install compiles
    (test_core_install), and the compiler never runs back up to the integrations."""
    root = LIT.parent
    shipped = [p for p in sorted((root / "autosp").rglob("*.py")) + sorted((root / "passes").rglob("*.py"))
               if "autosp/hf/" not in p.as_posix()]
    up = {str(p.relative_to(root)): n for p in shipped for n in _imports(p, False)
          if n == "autosp.hf" or n.startswith("autosp.hf.")}
    assert not up, f"modules importing autosp.hf: {up}"
    eager = {str(p.relative_to(root)): n for p in shipped for n in _imports(p, True)
             if n.split(".")[0] in ("transformers", "trl", "peft")}
    assert not eager, f"module-level imports of optional packages: {eager}"


def _defines(path, name: str) -> bool:
    """Does ``path`` define ``name`` (a function, class or assignment at module level; or
    ``Class.method``; in a .mlir file, ``func.func @name``)?"""
    import ast
    if path.suffix == ".mlir":
        return f"func.func @{name}(" in path.read_text()
    body = ast.parse(path.read_text()).body
    for part in name.split("."):
        found = None
        for node in body:
            names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.append(node.target.id)
            if getattr(node, "name", None) == part or part in names:
                found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_adding_a_model_family_walks_the_code():
    """docs/adding_a_model_family.md names files and what they define (``file::name``):
    each must exist, so the walkthrough stays true to the code."""
    import re
    root = LIT.parent
    text = (root / "docs" / "adding_a_model_family.md").read_text()
    refs = re.findall(r"`([\w/.]+\.(?:py|mlir))::([\w.]+)`", text)
    assert len(refs) >= 25, refs
    missing = [f"{f}::{n}" for f, n in refs if not (root / f).exists() or not _defines(root / f, n)]
    assert not missing, f"the walkthrough names what the code no longer has: {missing}"


def test_every_stated_op_record_holds():
    """Each record of the stated-op registry (autosp.ir.stated) is true of the code: its
    runtime function exists and registered the torch op of its name with a fake, its
    export substitution is a context manager that leaves a model without the library
    function untouched, its layout is one the pass rules place, and its cost model exists."""
    import importlib

    import torch

    from autosp.ir import ops
    from autosp.ir.stated import RECURRENCE, STATED_OPS, TOKEN_WISE, stated
    assert {s.op for s in STATED_OPS} >= {ops.GATED_DELTA_RULE, ops.MAMBA2_CHUNK_SCAN}
    for record in STATED_OPS:
        assert callable(record.runtime_function()), record
        short = record.op.removeprefix("torch.autosp.")
        assert hasattr(torch.ops.autosp, short), f"{record.op}: no torch.ops.autosp.{short} after importing its runtime"
        opdef = torch._library.custom_ops._maybe_get_opdef(f"autosp::{short}")
        assert opdef is not None and opdef._abstract_fn is not None, f"{record.op}: no fake"
        model = torch.nn.Linear(2, 2)
        with record.substitution_context(model):
            pass
        assert "forward" not in vars(model), record
        assert record.layout in (TOKEN_WISE, RECURRENCE), record
        assert record.op in (ops.TOKEN_WISE_OPERATORS if record.layout == TOKEN_WISE else ops.RECURRENCE_OPERATORS)
        if record.priced_by:
            module, _, name = record.priced_by.partition(":")
            assert callable(getattr(importlib.import_module(module), name)), record
        assert stated(record.op) is record and record.replaces
    assert stated("torch.aten.mm") is None


def test_the_importer_names_no_stated_op_family():
    """The importer enters the registry's substitutions, not a family's module by name."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "autosp" / "frontend" / "importer.py").read_text()
    assert "stated.substitutions(model)" in text
    for name in ("autosp.runtime import experts", "recurrences_as", "experts_as_token_ops", "_as_op("):
        assert name not in text, name


def test_the_compiler_cli_starts_without_torch():
    """``autosp-opt`` (every lit RUN line starts one) imports the passes, the IR layer and
    the stated-op registry, not torch: importing torch costs each process seconds (lit's
    time grew from ~20 s to 97 s in CI when the registry imported it)."""
    import subprocess
    import sys
    code = "import sys; from autosp.tools import opt; from autosp.passes import PASSES; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
