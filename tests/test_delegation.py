"""A submission that hands in the course's own implementation of an exercise earns nothing.

Every lab's delegable exercises are answered by the shipped object, by routes from a plain alias
to a copy of its code made at run time (``tests/submissions/delegation.py``): each lab by two
routes or more, each route on three labs or more and, where it makes classes otherwise than
functions, on both kinds of answer (its ``design()``, whose properties the last tests check). The
samples are graded in the suite's shared ``distlab grade`` run (tests/conftest.py). Each delegated
test scores zero with feedback that names the course object, and the sample scores no more than
its other exercises are worth.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from submissions import delegation
from submissions.delegation import DELEGATED, ROUTES, delegation_samples
from distlab.course.notebooks import source_notebook

SAMPLES = delegation_samples()
SAMPLE_KINDS = ("delegation",)     # of the shared grading run's samples (tests/conftest.py)


def _points(lab: str) -> dict[str, float]:
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in source_notebook(lab).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")}


@pytest.fixture(scope="module")
def graded(graded_samples):
    """{(student, lab): CSV row} of the samples, graded in the suite's shared grading run
    (tests/conftest.py)."""
    return {key: graded_samples["rows"][key] for key in SAMPLES}


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("student,lab", list(SAMPLES))
def test_delegated_exercises_score_zero_and_say_why(graded, student, lab):
    row = graded[(student, lab)]
    zeroed = SAMPLES[(student, lab)][1]
    # The guard's verdict (fail), or the student package's stub (not-done: "... is yours to
    # write"), or the instructor's file refused (the cell that read it failed): zero each way.
    assert all(row[t] not in ("pass", "") for t in zeroed), row
    feedback = html.unescape(Path(row["feedback"]).read_text())
    targets = [entry[1] for cell in DELEGATED[lab].values() for entry in cell]
    if student != "delegates_file":   # every zeroed test says why, naming the course object
        said = feedback.count("the course's own implementation: write your own") + \
            feedback.count(" is yours to write in Lab ")
        assert said >= len(zeroed), row
        assert any(f"{t}, the course's own implementation" in feedback
                   or re.search(re.escape(t) + r"(\.\w+)? is yours to write", feedback)
                   for t in targets), row
    else:
        assert "Permission denied" in feedback, row
    points = _points(lab)
    assert float(row["score"]) <= sum(p for t, p in points.items() if t not in zeroed)


def _design_covers(design: dict, kinds: dict, routes: tuple, varied: set) -> None:
    """Assert what tests/submissions/delegation.py promises of a design: every lab and no other
    by distinct routes, ROUTES_PER_LAB or more and never the plain alias alone; every route on
    LABS_PER_ROUTE labs or more; every route with a class variant on a lab with a class answer and
    on a lab with a function answer."""
    assert set(design) == set(kinds)
    for lab, its in design.items():
        assert len(set(its)) == len(its) >= delegation.ROUTES_PER_LAB, (lab, its)
        assert set(its) <= set(routes) and set(its) != {"alias"}, (lab, its)
    labs_of = {r: [lab for lab, its in design.items() if r in its] for r in routes}
    for route, labs in labs_of.items():
        assert len(labs) >= delegation.LABS_PER_ROUTE, (route, labs)
        if route in varied:
            met = set().union(*(kinds[lab] for lab in labs))
            assert {"class", "function"} <= met, (route, labs)


def test_the_design_samples_every_lab_route_and_delegated_object():
    design = delegation.design()
    kinds = {lab: delegation.answer_kinds(lab) for lab in DELEGATED}
    varied = {r for r in ROUTES if delegation.has_class_variant(r)}
    assert "alias" not in varied and varied, varied   # an alias is the same line for both kinds
    assert any("class" in k for k in kinds.values())  # so the class variants have a lab to meet
    _design_covers(design, kinds, ROUTES, varied)
    # the samples are the design's; each covers all its lab's delegated objects
    assert set(SAMPLES) == {(f"delegates_{r}", lab) for lab, its in design.items() for r in its}
    for (student, lab), (nb, zeroed) in SAMPLES.items():
        assert zeroed == delegation.ZEROED[lab]
        sources = "\n".join(cell.source for cell in nb.cells)
        route = student.removeprefix("delegates_")
        for cell in DELEGATED[lab].values():
            for entry in cell:
                assert delegation.delegation(*entry[:2], route, *entry[2:]) in sources, \
                    (student, lab, entry[1])


@pytest.mark.parametrize("labs,routes", [(0, 1), (1, 0), (5, 3), (0, 6)])
def test_the_design_covers_a_lab_or_route_added(labs, routes):
    """A course with more labs or routes gets a design with the same properties, made by the same
    code (the new ones are copies of existing ones' kinds)."""
    kinds = {lab: delegation.answer_kinds(lab) for lab in DELEGATED}
    varied = {r for r in ROUTES if delegation.has_class_variant(r)}
    rotation = list(kinds.values())
    kinds.update({f"99_new{i}": rotation[i % len(rotation)] for i in range(labs)})
    new_routes = tuple(f"new{i}" for i in range(routes))
    varied |= set(new_routes[::2])
    all_routes = ROUTES + new_routes
    _design_covers(delegation.covering_design(kinds, all_routes, varied), kinds, all_routes, varied)


def test_a_design_that_cannot_cover_says_what_is_lacking():
    """Fewer labs than a route must meet (LABS_PER_ROUTE), or than the routes a lab must have."""
    kinds = {f"0{i}_lab": frozenset({"function"}) for i in range(delegation.LABS_PER_ROUTE - 1)}
    with pytest.raises(ValueError, match=f"{len(kinds)} labs and {len(ROUTES)} routes: each lab "
                                         f"would need"):
        delegation.covering_design(kinds, ROUTES, set())
    kinds = {f"0{i}_lab": frozenset({"function"}) for i in range(delegation.LABS_PER_ROUTE)}
    with pytest.raises(ValueError, match="no covering design"):
        delegation.covering_design(kinds, ROUTES[:delegation.ROUTES_PER_LAB - 1], set())
