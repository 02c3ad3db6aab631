"""The parity matrix (python_tests/e2e/families.py): what every family's parity test runs."""
import ast
from pathlib import Path

import families
import pytest

E2E = Path(__file__).resolve().parents[1] / "e2e"


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_every_family_runs_at_two_and_four_ranks_and_a_length_they_do_not_divide(family):
    cases = families.cases(family)
    assert {2, 4} <= {c.world for c in cases}, f"{family}: {cases}"
    assert any(c.seq % c.world for c in cases), f"{family}: every S divisible by its P: {cases}"
    assert len(set(cases)) == len(cases), f"{family}: a case listed twice"


def test_every_family_is_drawn_by_a_test():
    """Each family's name appears in a ``families.params/at/worlds`` call of an e2e test
    (a family listed but run by no test would claim coverage nobody has)."""
    drawn = set()
    for path in E2E.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "families" and \
                    node.args and isinstance(node.args[0], ast.Constant):
                drawn.add(node.args[0].value)
    assert drawn == set(families.FAMILIES), (sorted(set(families.FAMILIES) - drawn), sorted(drawn - set(families.FAMILIES)))


def test_expected_failures_name_listed_cases_with_a_reason():
    for (family, case), reason in families.EXPECTED_FAILURES.items():
        assert case in families.cases(family) and reason, (family, case)
    with pytest.raises(KeyError, match="no family 'nope'"):
        families.cases("nope")


def test_params_mark_an_expected_failure_strict(monkeypatch):
    case = families.cases("falcon")[0]
    monkeypatch.setitem(families.EXPECTED_FAILURES, ("falcon", case), "a known gap")
    first = families.params("falcon")[0]
    assert first.id == case.id() and first.marks[0].kwargs == {"strict": True, "reason": "a known gap"}
