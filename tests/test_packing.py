"""Planted mistakes share a graded notebook only where none can change another's test
(tests/submissions/packing.py): proven on a made-up lab whose cells build on each other."""
from __future__ import annotations

import pytest

from submissions import packing

# (grade id, source) of a lab's code cells, in order: ``Base`` is built on by ``Derived``; ``plan``
# calls ``formula`` through a helper; ``table`` stands alone; a demo cell reuses the name ``x``.
CELLS = [
    ("imports", "import torch"),
    ("base", "class Base:\n    def run(self, x):\n        return torch.ones(x)"),
    ("test_base", "check(Base)"),
    ("derived", "class Derived(Base):\n    pass"),
    ("test_derived", "check(Derived)"),
    ("formula", "def formula(n):\n    return 2 * n"),
    ("helper", "def helper(n):\n    return formula(n) + 1"),
    ("plan", "def plan(n):\n    return helper(n)"),
    ("test_plan", "check(plan)"),
    ("table", "def table(n):\n    return [n]"),
    ("demo", "x = table(3)\ny = Derived().run(2)"),
    ("test_table", "check(table)"),
    ("test_formula", "check(formula)"),
]


@pytest.fixture(autouse=True)
def made_up_lab(monkeypatch):
    cells = [(gid, *packing._names(source)) for gid, source in CELLS]
    monkeypatch.setattr(packing, "_cells", lambda lab: cells)


def test_a_test_reaches_the_cells_its_names_come_from_and_theirs():
    assert packing.reach("lab", "test_derived") == {"test_derived", "derived", "base", "imports"}
    assert packing.reach("lab", "test_plan") == {"test_plan", "plan", "helper", "formula"}
    # the demo cell uses Derived, but no test of table's reaches the demo
    assert packing.reach("lab", "test_table") == {"test_table", "table"}


def test_mistakes_whose_tests_reach_each_other_stay_apart():
    mistakes = {"base_wrong": ("test_base", {"base"}), "derived_wrong": ("test_derived", {"derived"}),
                "formula_wrong": ("test_formula", {"formula"}), "plan_wrong": ("test_plan", {"plan"}),
                "table_wrong": ("test_table", {"table"}), "table_again": ("test_table", {"table"})}
    assert not packing.independent("lab", mistakes["base_wrong"], mistakes["derived_wrong"])
    assert not packing.independent("lab", mistakes["formula_wrong"], mistakes["plan_wrong"])
    assert not packing.independent("lab", mistakes["table_wrong"], mistakes["table_again"])
    assert packing.independent("lab", mistakes["base_wrong"], mistakes["table_wrong"])
    groups = packing.pack("lab", mistakes, alone=["plan_wrong"])
    assert groups == [["base_wrong", "formula_wrong", "table_wrong"], ["derived_wrong", "table_again"],
                      ["plan_wrong"]]
    for group in groups:   # each test lost once in a notebook: its mistake is the one reason
        assert len({mistakes[name][0] for name in group}) == len(group)


def test_a_cell_that_does_not_parse_keeps_every_mistake_it_might_touch_apart(monkeypatch):
    cells = [(gid, *packing._names(source)) for gid, source in CELLS]
    cells.insert(9, ("magic", *packing._names("%time formula(2)")))   # may define anything
    monkeypatch.setattr(packing, "_cells", lambda lab: cells)
    assert "magic" in packing.reach("lab", "test_table")
    assert not packing.independent("lab", ("test_table", {"table"}), ("test_plan", {"magic"}))


def test_a_functions_parameters_and_locals_are_not_the_globals_of_that_name(monkeypatch):
    cells = [(gid, *packing._names(source)) for gid, source in [
        ("curve", "restart = 3\nscale = 2"),
        ("predict", "def predict(tau, restart):\n    total = tau + restart\n    return total * scale"),
        ("test_predict", "check(predict)")]]
    monkeypatch.setattr(packing, "_cells", lambda lab: cells)
    # ``restart`` is predict's argument, ``scale`` the global curve defines: curve is reached
    assert packing._names("def f(a):\n    b = [a for a in g]\n    return b")[1] == {"g"}
    assert packing.reach("lab", "test_predict") == {"test_predict", "predict", "curve"}
    cells[0] = ("curve", *packing._names("restart = 3"))
    assert packing.reach("lab", "test_predict") == {"test_predict", "predict"}


# Two mistakes in each of base and derived: test_derived reaches base (Derived is built on Base)
BUILT_ON = {"base_wrong": ("test_base", {"base"}), "base_again": ("test_base", {"base"}),
            "derived_wrong": ("test_derived", {"derived"}),
            "derived_again": ("test_derived", {"derived"})}


def test_a_declared_cell_leaves_its_tests_reach_and_one_witness_checks_the_declaration():
    assert packing.pack("lab", BUILT_ON) == [["base_wrong"], ["base_again"], ["derived_wrong"],
                                            ["derived_again"]]
    declared = {"test_derived": {"base"}}   # as if derived's check compared with the own Base
    assert packing.graded_reach("lab", "test_derived", declared) == {"test_derived", "derived",
                                                                     "imports"}
    assert packing.witnesses(BUILT_ON, declared) == {"base_wrong": {"test_derived"}}
    # base_wrong, the witness, is graded without a derived mistake: its notebook must keep
    # test_derived, which a wrong declaration would lose (the grading assertion's expectation)
    assert packing.pack("lab", BUILT_ON, against_own=declared) == [
        ["base_wrong"], ["base_again", "derived_wrong"], ["derived_again"]]


def test_an_undeclared_dependency_still_separates(monkeypatch):
    cells = [(gid, *packing._names(source)) for gid, source in CELLS]
    cells.insert(7, ("test_helper", *packing._names("check(helper)")))
    monkeypatch.setattr(packing, "_cells", lambda lab: cells)
    # test_plan declared graded against its own helper: the search goes on through helper, so a
    # mistake in formula (which helper calls) still keeps apart from plan's
    declared = {"test_plan": {"helper"}}
    assert packing.graded_reach("lab", "test_plan", declared) == {"test_plan", "plan", "formula"}
    mistakes = {"formula_wrong": ("test_formula", {"formula"}),
                "plan_wrong": ("test_plan", {"plan"}), "helper_wrong": ("test_helper", {"helper"})}
    assert not packing.independent("lab", mistakes["formula_wrong"], mistakes["plan_wrong"],
                                   declared)
    assert packing.independent("lab", mistakes["helper_wrong"], mistakes["plan_wrong"], declared)
    # helper_wrong may share plan_wrong's notebook by the declaration, but as its witness it is
    # graded apart from it (and from formula_wrong, which test_helper reaches)
    assert packing.pack("lab", mistakes, against_own=declared) == [
        ["formula_wrong"], ["plan_wrong"], ["helper_wrong"]]


def test_a_declaration_of_a_cell_the_test_does_not_reach_is_refused():
    with pytest.raises(ValueError, match="test_table.*'base'.*does not reach"):
        packing.graded_reach("lab", "test_table", {"test_table": {"base"}})
