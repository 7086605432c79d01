"""Lab 12, Section 4: the resumable loop's check passes the solution's ``train_resumable`` on
the visible case and on a fresh one (a rank killed from outside at a random step, a relaunch),
and each planted mistake loses exactly its test, told why.

Wrong submissions are the solution's own cell with a textual edit (``solution_namespace``).
Sections 1 and 2's functions, which the cells call, come from the course where the notebook has
none yet (the branch that builds Sections 3 and 4 alone)."""
from __future__ import annotations

import os
import re

import pytest

import launch_count
from distlab.checks import lab12
from distlab.course import solutions
from distlab.course.notebooks import source_notebook

LAB = "12_checkpoint_restart"
CELL, TEST = "train_resumable", "test_train_resumable"
WAIT_NEXT = ("            if pending is not None:\n"
             "                pending.result()                 # one save in flight at a time\n")
WAIT_LAST = ("    if pending is not None:\n"
             "        pending.result()                         # the last save complete before "
             "returning\n")
# (name, [(old, new)] in the solution's cell, what the failure must say)
MISTAKES = [
    # every run from step 0, checkpoints or not
    ("resumes_from_step_0", [("    if complete:\n        load(", "    if False:\n        load(")],
     "trained 8 (its loss all_reduce calls)"),
    # the newest step folder, finished or not: the planted one has no .metadata
    ("loads_the_newest_even_if_incomplete",
     [('                and os.path.exists(os.path.join(root, n, ".metadata"))]', "]")],
     "the relaunch failed"),
    # a second save started while the first may still be written
    # (whether the two saves' collectives clash or not, the message says to wait)
    ("next_save_not_waited", [(WAIT_NEXT, "")], "Wait for a save's future"),
    # the loop returns with its last save in flight
    ("last_save_not_waited", [(WAIT_LAST, "")], "Wait for a save's future"),
]


def _setup() -> tuple[str, ...]:
    return tuple(c.metadata["nbgrader"]["grade_id"] for c in source_notebook(LAB).cells
                 if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked")
                 and c.metadata["nbgrader"]["grade_id"].endswith("imports"))


def _functions(edits=()) -> tuple:
    """(train_resumable, async_save_checkpoint, load_checkpoint) of the solution, edited."""
    from distlab.labs.checkpoint import run_state, saving
    ns = solutions.solution_namespace(LAB, [(CELL, old, new) for old, new in edits], _setup())
    ns.setdefault("training_state", run_state.training_state)      # Section 1's, if absent
    ns.setdefault("load_checkpoint", saving.load_checkpoint)        # Section 2's, if absent
    return ns["train_resumable"], ns["async_save_checkpoint"], ns["load_checkpoint"]


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}, for the lab's graded samples."""
    return {name: (TEST, [(CELL, old, new) for old, new in edits])
            for name, edits, _ in MISTAKES}


def _verdict(functions, **case) -> str:
    from distlab.checks.assertions import CheckFailed
    try:
        return lab12.check_train_resumable(*functions, **case)
    except CheckFailed as err:
        return f"FAILED: {err}"


def test_the_solution_passes_the_visible_case_and_a_fresh_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)     # the check's folders go in the launcher's folder: here
    functions = _functions()
    with launch_count.counted() as visible:
        line = _verdict(functions)
    # step 6's save may finish before the signal lands, or not, and step 4's may still be in
    # flight (under load it was): the judge reads which
    assert re.fullmatch(r"killed at step 6 \(rank 1\), resumed from step (2: 6|4: 4|6: 2) steps, "
                        r"bit-identical to a clean restart", line), line
    with launch_count.counted() as hidden:
        line = _verdict(functions, seed=20261128)
    assert not line.startswith("FAILED") and "bit-identical to a clean restart" in line, line
    # the launches the lab's budget counts (lab12.LAUNCHES): the test cell's two calls
    assert launch_count.launches_and_ranks(visible, hidden) == \
        lab12.LAUNCHES["test_train_resumable"], (visible, hidden)
    assert os.listdir(tmp_path) == []       # every folder of the check removed


def test_the_kill_step_leaves_a_save_before_it_and_two_steps_after():
    from distlab.checks.lab12_restart import kill_case
    drawn = {kill_case(seed, 2, 10, 2)[:2] for seed in range(200)}
    assert drawn == {(v, s) for v in (0, 1) for s in range(6, 9)}
    with pytest.raises(ValueError, match="steps >= 2 \\* save_every \\+ 4"):
        kill_case(1, 2, 7, 2)


@pytest.mark.parametrize("name,edits,says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_planted_mistake_fails_the_check_saying_why(name, edits, says, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _verdict(_functions(edits))
    assert line.startswith("FAILED") and says in line, line
