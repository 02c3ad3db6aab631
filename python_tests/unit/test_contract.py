"""The IR contract (autosp/ir/contract.py) is the one place its names are spelled."""
import ast
import re
from pathlib import Path

from autosp.dialect import IRDL_FILE
from autosp.ir import contract

ROOT = Path(__file__).resolve().parents[2]


def _code_strings(path: Path):
    """(line, text) of every string constant of a file, docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_the_dialect_defines_exactly_the_contract_ops():
    defined = {f"{contract.PREFIX}{name}" for name in re.findall(r"irdl\.operation @(\w+)", IRDL_FILE.read_text())}
    assert defined == set(contract.OPS)


def test_every_name_is_spelled_once():
    names = set(contract.OPS) | set(contract.ATTRIBUTES) | {contract.plan_key(a) for a in contract.PLAN_ATTRS}
    found = []
    for path in sorted([*(ROOT / "autosp").rglob("*.py"), *(ROOT / "passes").rglob("*.py")]):
        if path == ROOT / "autosp" / "ir" / "contract.py":
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {text!r}" for line, text in _code_strings(path) if text in names]
    assert not found, "import these names from autosp.ir.contract:\n" + "\n".join(found)


def test_attributes_and_their_values():
    assert all(name.startswith(contract.PREFIX) for name in [*contract.OPS, *contract.ATTRIBUTES])
    assert contract.ATTRIBUTES[contract.EMPTY_ROWS_ATTR].allowed is contract.EmptyRows
    assert [str(v) for v in contract.EmptyRows] == ["mean", "uniform"]
    assert contract.EmptyRows.MEAN == "mean" and f"{contract.AttentionKind.SDPA}" == "sdpa"
    assert set(contract.ARG_ATTRS.values()) == {a for a, d in contract.ATTRIBUTES.items() if d.on == "argument"} - {
        contract.SEQ_DIM_ATTR}
