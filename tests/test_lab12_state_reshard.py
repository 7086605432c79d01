"""Lab 12, Section 2: save and load with torch.distributed.checkpoint, graded by resharding. The
solution's ``save`` / ``load`` pass 2 -> 4 (the lab's model) and 4 -> 2 (a model whose widths 4
does not divide), on the check's states and on fresh ones; each planted mistake (optimizer state saved from rank 0 only;
resharding by slicing the ranks' flat buffers laid end to end) loses exactly this test, told
why, and not Section 1's; a save that is not every rank's own is refused; the section's
refusals refuse, with nothing loaded; the checker leaves no folder behind."""
from __future__ import annotations

import glob
import os
import tempfile

import pytest

import launch_count
from check_verdicts import verdicts
from distlab.checks import lab12, lab12_reshard
from test_lab12_state import _all_checks, namespace as _namespace

LAB = "12_checkpoint_restart"
CELL = "save_load"
SEED = 5

SAVE = ('    model_sd, optim_sd = get_state_dict(model, optimizer)    # this rank\'s DTensor shards\n'
        '    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)\n')
LOAD_STATE = '    state = {"model": model_sd, "optim": optim_sd}\n'
# the cell's last line: no newline after it once the solution's markers are gone
SET_STATE = ('    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
             '                   optim_state_dict=state["optim"])')
LOAD = ('    model_sd, optim_sd = get_state_dict(model, optimizer)    # the shards this rank owns now\n'
        + LOAD_STATE
        + '    checked_folder(folder, state)                             # whole, and this model\'s, or refused\n'
        '    dcp.load(state, checkpoint_id=folder)                     # fills `state` in place\n'
        + SET_STATE)

# the optimizer as one process saves it: its state_dict, written by rank 0, read by every rank
RANK0_SAVE = ('    model_sd, optim_sd = get_state_dict(model, optimizer)\n'
              '    dcp.save({"model": model_sd}, checkpoint_id=folder)\n'
              '    if torch.distributed.get_rank() == 0:                    # the optimizer, once\n'
              '        torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))\n')
RANK0_LOAD = [(LOAD_STATE, '    state = {"model": model_sd}\n'),
              (SET_STATE, '    set_state_dict(model, optimizer, model_state_dict=state["model"],\n'
                          '                   optim_state_dict=optim_sd)\n'
                          '    optimizer.load_state_dict(torch.load(os.path.join(folder, '
                          '"optimizer.pt"), weights_only=False))')]

# each rank's shards in one flat buffer (as ZeRO keeps them), saved under the rank's key; loaded
# by laying the writers' buffers end to end and cutting this world size's equal share of it
FLAT_SAVE = '''    params = list(model.parameters())
    flat = {"params": torch.cat([p.detach().to_local().reshape(-1) for p in params])}
    for kind in ("exp_avg", "exp_avg_sq"):
        flat[kind] = torch.cat([optimizer.state[p][kind].to_local().reshape(-1) for p in params])
    flat["step"] = optimizer.state[params[0]]["step"]
    dcp.save({f"rank{torch.distributed.get_rank()}": flat}, checkpoint_id=folder)
'''
FLAT_LOAD = '''    get_state_dict(model, optimizer)                           # AdamW's state, to copy into
    meta = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    keys = sorted({k.split(".")[0] for k in meta})
    saved = {k: {n: torch.empty(meta[f"{k}.{n}"].size, dtype=torch.float64)
                 for n in ("params", "exp_avg", "exp_avg_sq")} for k in keys}
    for k in keys:
        saved[k]["step"] = torch.zeros(())
    dcp.load(saved, checkpoint_id=folder)
    rank, ranks = torch.distributed.get_rank(), torch.distributed.get_world_size()
    params = list(model.parameters())
    for n in ("params", "exp_avg", "exp_avg_sq"):
        mine = torch.cat([saved[k][n] for k in keys]).chunk(ranks)[rank]
        start = 0
        for p in params:
            local = p.to_local() if n == "params" else optimizer.state[p][n].to_local()
            with torch.no_grad():
                local.copy_(mine[start:start + local.numel()].view_as(local))
            start += local.numel()
    for p in params:
        optimizer.state[p]["step"].copy_(saved[keys[0]]["step"])
'''

# (name, [(old, new)] in the solution's save_load cell, what the failure must say)
MISTAKES = [
    ("optimizer_saved_from_rank0_only", [(SAVE, RANK0_SAVE), *RANK0_LOAD],
     "AdamW's exp_avg of"),
    ("resharding_by_slicing_the_flat_buffer", [(SAVE, FLAT_SAVE), (LOAD, FLAT_LOAD)],
     "not this rank's rows"),
]


def namespace(edits=()) -> dict:
    return _namespace(edits) if not edits else _edited(edits)


def _edited(edits) -> dict:
    from distlab.course import solutions
    from test_lab12_state import SETUP
    return solutions.solution_namespace(LAB, [(CELL, old, new) for old, new in edits], SETUP)


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}: both edit the save_load cell, so each is graded
    in a notebook of its own (tests/submissions/packing.py)."""
    return {name: ("test_resharding", [(CELL, old, new) for old, new in edits])
            for name, edits, _ in MISTAKES}


def _checks_folders(root: str) -> set[str]:
    from distlab.labs.checkpoint.shards import FOLDER_PREFIX
    return set(glob.glob(os.path.join(root, f"{FOLDER_PREFIX}*"))
               + glob.glob(os.path.join(root, "lab12-merge-*")))


def test_the_solution_passes_both_ways_on_the_checks_states_and_fresh_ones(tmp_path, monkeypatch):
    # The check's folders go to a temporary folder of this test's (a Lab 12 check on the other
    # pytest worker writes to the shared one at the same time); a watcher notes what appears
    # there, so that "none left behind" is said of folders the check did make.
    import threading
    import time
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(_checks_folders(str(tmp_path)))
            time.sleep(0.005)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        ns = namespace()
        with launch_count.counted() as launched:     # the test cell's one call
            line = lab12.check_resharding(ns["save"], ns["load"])
        assert launch_count.launches_and_ranks(launched) == lab12.LAUNCHES["test_resharding"]
        assert "saved on 2 ranks, loaded on 4; saved on 4, loaded on 2 (the check's states" in line
        assert "from 2 writers" in line and "from 4 writers" in line, line
        # 4 readers x 8 parameters x 4 (weights, moments, step), then 2 readers x the same
        assert "(192 tensors)" in line, line
        line = lab12.check_resharding(ns["save"], ns["load"], seed=SEED)
        assert f"fresh states (seed {SEED})" in line, line
    finally:
        done.set()
        watcher.join()
    assert any("lab12-merge-" in f for f in seen) and any("checkpoint-rank" in f for f in seen), seen
    assert not _checks_folders(str(tmp_path)), "the check left folders behind"


def test_the_second_state_is_for_widths_that_four_does_not_divide():
    import torch
    from distlab.labs.checkpoint.shards import rows_of
    for seed in (None, *range(8)):
        (a, _, w_a, r_a), (b, _, w_b, r_b), = lab12_reshard._cases(seed)[0]
        assert (w_a, r_a, w_b, r_b) == (2, 4, 4, 2)
        assert b.d % 4 and b.hidden % 4 and a == type(a)()
        # the ranks get the model's sizes, never the case's seed
        assert a.seed == b.seed == type(a)().seed
    assert len({lab12_reshard._cases(seed)[0][1][0] for seed in range(8)}) == 4
    # a rank of 4 then holds fewer rows than the others, or none (FSDP2 cuts as torch.chunk)
    assert [rows_of(torch.zeros(6, 2), r, 4).shape[0] for r in range(4)] == [2, 2, 2, 0]
    assert [rows_of(torch.zeros(10, 2), r, 4).shape[0] for r in range(4)] == [3, 3, 3, 1]


@pytest.mark.parametrize("name,edits,says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_this_test_only_and_says_why(name, edits, says):
    ns = namespace(edits)
    got = _all_checks(ns)
    assert got["test_whole_state"] == "pass", (name, got)
    assert got["test_resharding"] != "pass" and says in got["test_resharding"], (name, got)
    hidden = _all_checks(ns, seed=SEED)
    assert hidden["test_resharding"] != "pass", (name, hidden)


def test_a_save_that_one_rank_writes_is_refused():
    """Rank 0 alone writes (``no_dist``): a checkpoint of one writer for 2 ranks."""
    ns = namespace([(SAVE, '    model_sd, optim_sd = get_state_dict(model, optimizer)\n'
                           '    if torch.distributed.get_rank() == 0:\n'
                           '        dcp.save({"model": model_sd, "optim": optim_sd}, '
                           'checkpoint_id=folder, no_dist=True)\n')])
    got = verdicts({"t": lambda: lab12.check_resharding(ns["save"], ns["load"])})
    assert "names 1 shard file(s) for 2 ranks" in got["t"], got


def test_a_load_that_loads_nothing_is_told_so():
    ns = namespace([(SET_STATE, ""),
                    ("    dcp.load(state, checkpoint_id=folder)                     # fills `state` "
                     "in place\n", "")])
    got = verdicts({"t": lambda: lab12.check_resharding(ns["save"], ns["load"])})
    assert "the fresh trainer's own values" in got["t"], got


def test_the_sections_refusals_refuse_and_load_nothing(tmp_path):
    """The section's teaching cells with the solution: 4 ranks save, 2 load it whole; a save
    that did not finish and another model's run are refused, naming the file, parameters
    untouched."""
    import distlab
    from distlab.labs.checkpoint.run_state import RunSpec
    from distlab.labs.checkpoint.student_runs import (load_and_gather, loaded_beside_saved,
                                                      train_and_save, try_loads,
                                                      unfinished_copy)
    ns = namespace()
    four = str(tmp_path / "four")
    saved = distlab.run(train_and_save, 4, ns["save"], four, 2, timeout=240)
    loaded = distlab.run(load_and_gather, 2, ns["load"], four, timeout=240)
    assert saved[0].keys() == loaded[0].keys() and len(saved[0]) == 32
    assert "8                         8" in loaded_beside_saved(saved[0], loaded[0], 4, 2)
    unfinished = unfinished_copy(four, str(tmp_path / "unfinished"))
    out = distlab.run(try_loads, 2, ns["load"], [("unfinished", unfinished, RunSpec()),
                                                ("other", four, RunSpec(hidden=24))],
                      timeout=240)
    (a, b) = out[0]
    assert a["refused"][0] == ".metadata" and "did not finish" in a["refused"][1]
    assert b["refused"][0] == ".metadata" and "another model" in b["refused"][1]
    assert a["untouched"] and b["untouched"]


def test_the_checker_merges_only_folders_the_ranks_made_for_the_save(tmp_path):
    """A writer's reported folder must be one its rank made for the save (the checker removes
    them once merged): anything else is refused, and nothing is removed."""
    from distlab.checks.assertions import CheckFailed
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(CheckFailed, match="left no folder of its own"):
        lab12_reshard._folders([str(other)], 1)
    from distlab.labs.checkpoint.shards import FOLDER_PREFIX
    link = tmp_path / f"{FOLDER_PREFIX}0-link"
    link.symlink_to(other)
    with pytest.raises(CheckFailed, match="left no folder of its own"):
        lab12_reshard._folders([str(link)], 1)
    assert other.exists()


def test_a_link_in_a_writers_folder_is_refused_not_followed(tmp_path):
    """The checker reads the writers' files and hands them to the readers: a symbolic link (to a
    file the ranks may not read themselves) is refused, never followed."""
    from distlab.checks.assertions import CheckFailed
    from distlab.labs.checkpoint.shards import FOLDER_PREFIX
    folder = tmp_path / f"{FOLDER_PREFIX}0-x"
    folder.mkdir()
    (folder / ".metadata").symlink_to(__file__)
    with pytest.raises(CheckFailed, match="not a plain file"):
        lab12_reshard._merged_files([str(folder)], 1, "save")
    assert not folder.exists()      # the rank's own folder, removed as after every check
