"""Lab 12 as the grader sees it: the solution keeps every point, the untouched notebook scores
none, and every section's planted mistakes (each section's test module lists its own) are graded
packed together, in as few notebooks as keep each the one reason its test fails
(tests/submissions/packing.py), each losing exactly its test."""
from __future__ import annotations

import pytest

import lab_mistakes

LAB = "12_checkpoint_restart"
# {test: cells whose mistakes its check grades against the student's own code}: they leave the
# test's reach (tests/submissions/packing.py), so their mistakes share its mistakes' notebooks.
AGAINST_OWN = {
    # Section 4's check compares the relaunch with the student's own clean restart, which loads
    # with the same load_checkpoint (whole_state and restore): a generator or the data position
    # left out of the state changes both runs alike (distlab/checks/lab12_restart.py).
    "test_train_resumable": {"whole_state"},
}


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
    return lab_mistakes.own_graded_samples(LAB, planted(), AGAINST_OWN)


def test_every_section_plants_a_mistake_in_each_graded_test():
    """Each graded test of the lab has a planted mistake that loses it."""
    lab_mistakes.assert_every_test_has_a_mistake(LAB, planted())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_grader_takes_from_each_mistake_exactly_its_tests(graded_samples):
    lab_mistakes.assert_each_mistake_loses_its_tests(graded_samples, LAB, planted(), AGAINST_OWN)


def test_the_launches_the_budget_counts_are_the_test_cells_calls():
    """``lab12.LAUNCHES`` is counted by each section's test of the solution over one visible call
    and one hidden call of its check (tests/test_lab12_state.py, _state_reshard.py,
    _restart_check.py): that is what each graded cell calls, and every graded cell that makes
    launches is counted."""
    import re
    from distlab.checks import lab12
    from distlab.course.notebooks import source_notebook
    cells = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source_notebook(LAB).cells
             if c.metadata.get("nbgrader", {}).get("grade")}
    launching = {"check_whole_state", "check_resharding", "check_train_resumable"}
    calls = {test: re.findall(r"^(check_\w+)\(", source, re.M) for test, source in cells.items()}
    assert {t for t, names in calls.items() if launching & set(names)} == set(lab12.LAUNCHES)
    for test in lab12.LAUNCHES:
        visible, _, hidden = cells[test].partition("### BEGIN HIDDEN TESTS")
        counts = [len(re.findall(r"^check_\w+\(", part, re.M)) for part in (visible, hidden)]
        assert counts[0] == 1 and counts[1] <= 1, (test, counts)
