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
