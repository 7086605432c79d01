"""Lab 12, Section 1: the whole training state, graded by resuming from it. The solution's
``whole_state`` / ``restore`` pass on the stored run and on fresh ones (which vary where the run
stops and how long it goes on); each planted mistake (a generator or the data position left out
of the state) loses exactly this test, told why, and not Section 2's; the untouched stubs pass
nothing; what the section's table says about each part of the state is what a run shows.

Wrong submissions are the solution's own cell with a textual edit (``solution_namespace``), so
they stay in step with the lab."""
from __future__ import annotations

import re

import pytest

import launch_count
from check_verdicts import verdicts
from distlab.checks import lab12, lab12_state
from distlab.course import solutions

LAB = "12_checkpoint_restart"
CELL = "whole_state"
SETUP = ("state_imports", "reshard_imports")
SEEDS = (4, 3)        # hidden cases: stops after steps 3 and 4, then 2 and 3 steps more

# (name, [(old, new)] in the solution's whole_state cell, what the failure must say)
MISTAKES = [
    ("torch_rng_not_saved",
     [('        "torch": torch.get_rng_state(),           # the dropout masks\n', ""),
      ('    torch.set_rng_state(mine["torch"])\n', "")],
     "The first step after the resume already differs"),
    ("noise_rng_not_saved",
     [('        "noise": trainer.noise.get_state(),       # this rank\'s input noise\n', ""),
      ('    trainer.noise.set_state(mine["noise"])\n', "")],
     "The first step after the resume already differs"),
    ("python_rng_not_saved",
     [('        "python": random.getstate(),              # each epoch\'s shuffle\n', ""),
      ('\n    random.setstate(mine["python"])', "")],    # the cell's last line
     "shuffled again with Python's random"),
    ("data_position_not_saved",
     [('        "data": trainer.data.state_dict(),        # epoch, offset, the epoch\'s order\n',
       ""),
      ('    trainer.data.load_state_dict(state["progress"]["data"])\n', "")],
     "The first step after the resume already differs"),
]


def namespace(edits=()) -> dict:
    return solutions.solution_namespace(LAB, [(CELL, old, new) for old, new in edits], SETUP)


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}: all edit the whole_state cell, so each is
    graded in a notebook of its own (tests/submissions/packing.py)."""
    return {name: ("test_whole_state", [(CELL, old, new) for old, new in edits])
            for name, edits, _ in MISTAKES}


def _all_checks(ns: dict, seed=None) -> dict:
    """Every graded check of Sections 1 and 2, each to "pass" or its failure message."""
    hidden = {} if seed is None else dict(seed=seed)
    return verdicts({
        "test_whole_state": lambda: lab12.check_whole_state(ns["whole_state"], ns["restore"],
                                                            **hidden),
        "test_resharding": lambda: lab12.check_resharding(ns["save"], ns["load"], **hidden)})


@pytest.mark.stored_data
def test_the_solution_passes_the_stored_run_and_fresh_ones():
    """... in the launches the lab's budget counts (``lab12.LAUNCHES``): the test cell's visible
    call and one hidden call."""
    ns = namespace()
    with launch_count.counted() as visible:
        line = lab12.check_whole_state(ns["whole_state"], ns["restore"])
    # On a CPU whose float64 sums differ from the one that wrote data/ in their last bits, the
    # check makes the stored run again (check_whole_state): both say the stored run.
    assert re.search(r"resumed after step 3 of 6 on 2 ranks \(the stored run(, made again on "
                     r"this machine)?\)", line), line
    assert "3 losses after the resume and all 8 parameters" in line, line
    if "made again" in line:   # the budget counts the stored run's check, not its remaking (last)
        visible = visible[:-1]
    for seed in SEEDS:
        with launch_count.counted() as hidden:
            line = lab12.check_whole_state(ns["whole_state"], ns["restore"], seed=seed)
        assert launch_count.launches_and_ranks(visible, hidden) == \
            lab12.LAUNCHES["test_whole_state"], (visible, hidden)
        _, _, steps, save_at, _ = lab12_state._case(seed, 2, 6, 3)
        assert f"resumed after step {save_at} of {steps}" in line and f"seed {seed}" in line
        # a run of seeds of its own, its uninterrupted run made here: not the stored run
        assert "a fresh run of seed" in line and "stored" not in line, line


def test_hidden_cases_vary_where_the_run_stops_and_how_long_it_goes_on():
    cases = [lab12_state._case(seed, 2, 6, 3) for seed in range(12)]
    assert len({(steps, save_at) for _, _, steps, save_at, _ in cases}) == 4
    assert {save_at for _, _, _, save_at, _ in cases} == {3, 4}
    assert {steps - save_at for _, _, steps, save_at, _ in cases} == {2, 3}
    # Python's random has shuffled more than a fresh trainer's before the stop, and shuffles
    # again after the resume (2 steps an epoch on 2 ranks): leaving it out always shows
    from distlab.labs.checkpoint.resume import epoch_starts
    for spec, ws, steps, save_at, _ in cases:
        starts = epoch_starts(spec, ws, steps)
        assert any(k <= save_at for k in starts) and any(k > save_at for k in starts)
    # a run of seeds of its own: the handout's stored run is no hidden case's reference
    stored = lab12_state._case(None, 2, 6, 3)[0]
    assert all(spec.seed != stored.seed and spec.dataset()[0].ne(stored.dataset()[0]).any()
               for spec, *_ in cases)


@pytest.mark.parametrize("name,edits,says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_this_test_only_and_says_why(name, edits, says):
    ns = namespace(edits)
    got = _all_checks(ns)
    assert got["test_resharding"] == "pass", (name, got)
    assert got["test_whole_state"] != "pass" and says in got["test_whole_state"], (name, got)
    hidden = verdicts({"hidden": lambda: lab12.check_whole_state(ns["whole_state"],
                                                                 ns["restore"], seed=SEEDS[0])})
    assert hidden["hidden"] != "pass", (name, hidden)


def test_the_step_is_part_of_the_state():
    ns = namespace([('    trainer.steps_done = int(state["progress"]["step"])\n', "")])
    got = verdicts({"t": lambda: lab12.check_whole_state(ns["whole_state"], ns["restore"])})
    assert "trainer.steps_done is 0" in got["t"], got


def test_a_live_object_in_the_state_is_refused_by_torch_save():
    ns = namespace([('            "rng": {f"rank{trainer.rank}": generators}}',
                     '            "rng": {f"rank{trainer.rank}": generators}, "f": lambda: 0}')])
    got = verdicts({"t": lambda: lab12.check_whole_state(ns["whole_state"], ns["restore"])})
    assert "torch.save could not write your state" in got["t"], got


def test_the_untouched_stubs_pass_nothing():
    def stub(*args):
        raise NotImplementedError("whole_state: yours to write")
    got = _all_checks({"whole_state": stub, "restore": stub, "save": stub, "load": stub})
    assert all(v != "pass" and "NotImplementedError" in v for v in got.values()), got


def test_what_each_part_of_the_state_is_for():
    """The section's table, with the solution: the whole state resumes bit-identically; the
    generators and the data position fork the run at the first step after the resume (step 4),
    AdamW's state and Python's random one step later (step 5: the first update without the
    moments, the first shuffle of a new epoch), as the text after it says."""
    import distlab
    from distlab.labs.checkpoint.student_runs import forgetting_table, resumes_forgetting
    ns = namespace()
    runs = distlab.run(resumes_forgetting, 2, ns["whole_state"], ns["restore"], 6, 3,
                       timeout=240)[0]
    first = {part: next((4 + i for i, (a, b) in enumerate(zip(losses, runs["uninterrupted"]))
                         if a != b), None)
             for part, losses in runs.items() if part != "uninterrupted"}
    assert first == {"": None, "torch_rng": 4, "noise_rng": 4, "data": 4, "python_rng": 5,
                     "optimizer": 5}
    assert "none: bit-identical" in forgetting_table(runs, 3)


@pytest.mark.stored_data
def test_the_stored_run_is_the_uninterrupted_run_made_now():
    """The visible case's stored run (``distlab references``) is what the course's run gives: its
    losses to float64's rounding on any CPU, its parameters to the last bit where the kernels
    are the writer's. Elsewhere AdamW's normalised first steps carry another CPU's last bits
    into the parameters' sixth digit (ATEN_CPU_CAPABILITY=default: 1.9e-6 relative), and the
    check must make the run again on this machine and grade against that."""
    import torch
    from distlab.labs.checkpoint.run_state import RunSpec
    steps = lab12_state.VISIBLE["steps"]
    exact = True
    for save_at in (3, 4):
        stored = lab12_state._stored(save_at)
        now = lab12_state._uninterrupted(RunSpec(), 2, steps, save_at)
        assert len(now["losses"]) == steps - save_at
        torch.testing.assert_close(torch.tensor(list(stored["losses"])),
                                   torch.tensor(now["losses"]), rtol=1e-12, atol=0)
        assert stored["params"].keys() == now["params"].keys()
        exact &= all(torch.equal(stored["params"][k], now["params"][k]) for k in now["params"])
    if not exact:
        ns = namespace()
        line = lab12.check_whole_state(ns["whole_state"], ns["restore"])
        assert "the stored run, made again on this machine" in line, line


def test_a_machine_that_rounds_otherwise_makes_the_run_again(monkeypatch):
    """Where the stored run differs from what this machine computes (another CPU's kernels), the
    course's run made here decides: a right answer still passes, and says so."""
    import torch
    real = lab12_state._stored

    def other_cpu(save_at):
        stored = real(save_at)
        stored["params"] = {k: v + torch.finfo(torch.float64).eps * v.abs()
                            for k, v in stored["params"].items()}
        return stored
    monkeypatch.setattr(lab12_state, "_stored", other_cpu)
    ns = namespace()
    line = lab12.check_whole_state(ns["whole_state"], ns["restore"])
    assert "the stored run, made again on this machine" in line, line
