"""Lab 12, Sections 3 and 4's teaching cells, with the solution's own functions: the stall table
of a blocking save beside an asynchronous one; a run that loses a rank (killed from outside),
relaunched, lands on the uninterrupted run bit for bit and is drawn against it; the same loop
under torchrun --max-restarts (handed to the workers in a file) restarts and lands there too."""
from __future__ import annotations

import os

import pytest
import torch

import distlab
from distlab.labs.checkpoint.async_views import stall_table
from distlab.labs.checkpoint.restart_views import (kill_and_relaunch, plot_restart,
                                                   same_to_the_bit, torchrun_restart)
from distlab.labs.checkpoint.run_state import RunSpec
from test_lab12_restart_check import _functions


@pytest.fixture(scope="module")
def functions():
    return _functions()      # (train_resumable, async_save_checkpoint, load_checkpoint)


def test_the_stall_table_times_both_saves_and_says_the_machine(functions, tmp_path):
    from distlab.labs.checkpoint import saving
    text = stall_table(saving.save_checkpoint, functions[1], under=str(tmp_path), steps=2,
                       save_every=1, spec=RunSpec())
    assert f"{os.cpu_count()} cores, load average" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[4:]}
    assert [rows[m][1] for m in ("none", "blocking", "async")] == ["0", "2", "2"]
    assert os.listdir(tmp_path) == []          # each mode's folder removed


def test_a_rank_killed_and_relaunched_lands_on_the_uninterrupted_run(functions, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    run = kill_and_relaunch(*functions, str(tmp_path), steps=8, save_every=2, kill_at=6)
    assert "rank 1 died: its process was killed by SIGKILL" in run["message"]
    # the newest complete save: step 4's may still be in flight when the kill lands (under
    # load it was, in CI), and then the relaunch goes back to step 2
    complete = [int(r["folder"][5:]) for r in run["left"] if r["complete"] == "yes"]
    resumed = run["relaunched"]["resumed_from"]
    assert resumed == max(complete) and resumed in (2, 4, 6)
    assert run["trained"] == [8 - resumed] * 2
    assert same_to_the_bit(run)
    ax = plot_restart(run)
    assert [len(line.get_xdata()) for line in ax.lines[:2]] == [8, 8 - resumed]


def test_under_torchrun_the_agent_restarts_the_students_loop(functions, tmp_path):
    clean = distlab.run(functions[0], 2, str(tmp_path / "clean"), 8, 2, functions[1],
                        functions[2], timeout=240)[0]
    under = torchrun_restart(*functions, str(tmp_path / "torchrun"), steps=8, save_every=2,
                             crash_at=(1, 6))
    assert any("exitcode: -9" in line for line in under["agent"]), under["agent"]
    result = under["result"]
    # killed as it was about to save step 6, after its own wait for step 4's save: step 4 is
    # the newest complete one unless the agent stopped rank 0 before it wrote .metadata
    resumed = result["resumed_from"]
    assert result["restart"] == 1 and resumed in (2, 4)
    assert result["losses"] == {s: clean["losses"][s] for s in range(resumed + 1, 9)}
    for name, value in clean["params"].items():
        assert torch.equal(result["params"][name], value), name
