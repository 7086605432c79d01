"""A lab as the grader sees it, for the labs whose sections each plant their own mistakes
(tests/test_lab11.py, tests/test_lab12.py): the solution keeps every point, the untouched notebook
scores none, and the planted mistakes, packed in as few notebooks as keep each the one reason
its test fails (tests/submissions/packing.py), each lose exactly their tests."""
from __future__ import annotations

from distlab.course.notebooks import source_notebook


def own_graded_samples(lab: str, planted: dict, against_own=None) -> dict:
    """{(student, lab): notebook}: the solution, the untouched notebook, the packed mistakes
    (``against_own``: the module's declarations, tests/submissions/packing.py)."""
    import submissions
    from submissions import packing
    return {("solution", lab): submissions.solved(lab), ("untouched", lab): submissions.student(lab),
            **packing.packed_samples(lab, planted, against_own=against_own)}


def graded_tests(lab: str) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in source_notebook(lab).cells
            if c.metadata.get("nbgrader", {}).get("grade")]


def assert_every_test_has_a_mistake(lab: str, planted: dict) -> None:
    from submissions import packing
    lost = {t for loses, _ in planted.values() for t in packing.tests(loses)}
    assert lost == set(graded_tests(lab))


def assert_each_mistake_loses_its_tests(graded_samples: dict, lab: str, planted: dict,
                                        against_own=None) -> None:
    """Each packed notebook loses exactly its mistakes' tests: a declared test (``against_own``)
    kept by its witness's notebook, which holds a mistake in a declared cell, proves the check
    grades that cell against the student's own code (tests/submissions/packing.py)."""
    from submissions import packing
    rows = {student: row for (student, at), row in graded_samples["rows"].items() if at == lab}
    graded = graded_tests(lab)
    samples = packing.grouped(lab, planted, against_own=against_own)
    expected = {"solution": set(), "untouched": set(graded),
                **{sample: {t for name in group for t in packing.tests(planted[name][0])}
                   for sample, group in samples.items()}}
    for student, lost in expected.items():
        assert {t for t in graded if rows[student][t] != "pass"} == lost, (student, rows[student])
