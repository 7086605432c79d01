"""A submission that hands in the course's own implementation of an exercise earns nothing.

Every lab's delegable exercises are answered by the shipped object, by three routes (an alias,
``importlib``/``getattr``, a default argument or a base class: ``tests/submissions/delegation.py``);
all samples are graded in the suite's shared ``distlab grade`` run (tests/conftest.py). Each
delegated test scores zero with feedback that names the course object, and the sample scores
no more than its other exercises are worth.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

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


def test_every_route_and_every_delegable_lab_is_sampled():
    assert {route for route, _ in ((s.split("_", 1)[1], lab) for s, lab in SAMPLES)} == set(ROUTES)
    assert {lab for _, lab in SAMPLES} == set(DELEGATED)
