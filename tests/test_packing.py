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
