"""Lab 12 as the grader sees it: the solution keeps every point, the untouched notebook scores
none, and every section's planted mistakes (each section's test module lists its own) are graded
packed together, in as few notebooks as keep each the one reason its test fails
(tests/submissions/packing.py), each losing exactly its test."""
from __future__ import annotations

import pytest

from distlab.course.notebooks import source_notebook

LAB = "12_checkpoint_restart"


def planted() -> dict:
    """{mistake: (the test it loses, its edits)} of every section."""
    import test_lab12_design
    import test_lab12_interval_prediction
    import test_lab12_restart_check
    import test_lab12_state
    import test_lab12_state_reshard
    interval = {name: (tuple(loses.split()) if " " in loses else loses, [(cell, old, new)])
                for module in (test_lab12_interval_prediction, test_lab12_design)
                for name, cell, old, new, loses in module.MISTAKES}
    return {**test_lab12_state._planted(), **test_lab12_state_reshard._planted(),
            **test_lab12_restart_check._planted(), **interval}


def own_graded_samples() -> dict:
    import submissions
    from submissions import packing
    return {("solution", LAB): submissions.solved(LAB), ("untouched", LAB): submissions.student(LAB),
            **packing.packed_samples(LAB, planted())}


def graded_tests() -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in source_notebook(LAB).cells
            if c.metadata.get("nbgrader", {}).get("grade")]


def test_every_section_plants_a_mistake_in_each_graded_test():
    """Each graded test of the lab has a planted mistake that loses it."""
    from submissions import packing
    lost = {t for loses, _ in planted().values() for t in packing.tests(loses)}
    assert lost == set(graded_tests())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_grader_takes_from_each_mistake_exactly_its_tests(graded_samples):
    from submissions import packing
    rows = {student: row for (student, lab), row in graded_samples["rows"].items() if lab == LAB}
    graded, mistakes = graded_tests(), planted()
    expected = {"solution": set(), "untouched": set(graded),
                **{sample: {t for name in group for t in packing.tests(mistakes[name][0])}
                   for sample, group in packing.grouped(LAB, mistakes).items()}}
    for student, lost in expected.items():
        assert {t for t in graded if rows[student][t] != "pass"} == lost, (student, rows[student])
