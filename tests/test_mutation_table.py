"""The mutation check (tools/mutation_check.py) itself: its table matches the tree, and it reports a
mutation the tests do not notice as survived (so a green check means the mutations were really caught)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "tools" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_check"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_mutation_applies_to_the_current_tree() -> None:
    tool = _tool()
    mutations = tool.load_mutations()
    assert mutations, "no mutations listed"
    for m in mutations:
        text = (REPO / m.file).read_text()
        assert text.count(m.old) == 1, f"{m.name}: `old` occurs {text.count(m.old)} times in {m.file}"
        assert m.old != m.new, m.name
        for t in m.tests:
            assert (REPO / t.split("::")[0]).exists(), f"{m.name}: no test file {t}"


def test_the_bug_classes_of_the_acceptance_list_are_covered() -> None:
    classes = " | ".join(m.bug_class for m in _tool().load_mutations())
    for needed in ("install failure", "register", "shared", "barrier", "SASS", "WFI", "release words"):
        assert needed in classes, f"no mutation for {needed!r}: {classes}"


@pytest.mark.parametrize("change, caught", [("return a + b", False), ("return a - b", True)])
def test_a_mutation_nothing_notices_is_reported_as_survived(change: str, caught: bool) -> None:
    tool = _tool()
    # a mutation of this very file's helper, checked by the test below it: "a - b" is caught, "a + b" is the
    # unchanged behaviour and must be reported as survived
    m = tool.Mutation(name="self-check", bug_class="self-check", file="tests/test_mutation_table.py",
                      old="    return " + "a + b  # mutation target\n",
                      new=f"    {change}  # mutation target\n",
                      tests=["tests/test_mutation_table.py::test_add"])
    ok, detail = tool.run_one(m)
    assert ok is caught, detail
    if not caught:
        assert "SURVIVED" in detail


def _add(a: int, b: int) -> int:
    return a + b  # mutation target


def test_add() -> None:
    assert _add(2, 3) == 5
