"""The launcher kills a rank from outside (``distlab.runtime.kill``): SIGKILL by pid when the
rank's record shows its n-th call of a kind, with no code of the rank's own; the run raises
RankCrashed naming the rank and the signal (a death, not a hang), and a relaunch on the same
folder resumes from the last complete checkpoint."""
import os
import threading

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.labs.checkpoint.restart import complete_checkpoints, train_resumable
from distlab.runtime.kill import KillPlan, killing

STEPS, SAVE_EVERY = 6, 2


def _count_up(rank, world_size, root, calls):
    """All-reduces ``calls`` times on the default group, writing the count to a file of its own
    after each: what the victim got through before the signal."""
    t = torch.zeros(1)
    for i in range(1, calls + 1):
        dist.all_reduce(t)
        path = os.path.join(root, f"rank{rank}")
        with open(path + ".tmp", "w") as f:
            f.write(str(i))
        os.replace(path + ".tmp", path)   # whole or the last one: a kill mid-write leaves no ''
    return calls


def _threaded_first(rank, world_size, calls):
    """Three all_reduces from another thread on a group of its own (not counted), then
    ``calls`` on the default group from the main thread."""
    group = dist.new_group(backend="gloo")
    thread = threading.Thread(target=lambda: [dist.all_reduce(torch.zeros(1), group=group)
                                              for _ in range(3)])
    thread.start()
    thread.join()
    for _ in range(calls):
        dist.all_reduce(torch.zeros(1))
    return "survived"


def test_the_launcher_kills_the_rank_at_its_nth_call_and_reports_sigkill(tmp_path):
    with killing(KillPlan(rank=1, call=3)) as fired:
        with pytest.raises(distlab.RankCrashed) as crashed:
            distlab.run(_count_up, 2, str(tmp_path), 50, timeout=120)
    assert fired == [1]
    text = str(crashed.value)
    assert "rank 1 died: its process was killed by SIGKILL" in text
    assert "The launcher killed it on purpose" in text and "3rd all_reduce" in text
    # killed while in its 3rd call or a moment after: never before it, never allowed to finish
    done = int((tmp_path / "rank1").read_text())
    assert 2 <= done < 50


def test_the_plan_counts_only_the_calls_it_names_and_only_within_its_block(tmp_path):
    # 3 threaded calls on another group + 2 on the default group: a plan for the 3rd main-thread
    # all_reduce on the default group never fires
    with killing(KillPlan(rank=0, call=3)) as fired:
        out = distlab.run(_threaded_first, 2, 2, timeout=120)
    assert list(out) == ["survived", "survived"] and fired == []
    with killing(KillPlan(rank=0, call=2, group_name=None, threaded=None)):
        with pytest.raises(distlab.RankCrashed, match="rank 0 died: .*SIGKILL"):
            distlab.run(_threaded_first, 2, 2, timeout=120)
    assert list(distlab.run(_threaded_first, 2, 2, timeout=120)) == ["survived"] * 2


def test_a_plan_refuses_a_call_number_below_one():
    with pytest.raises(ValueError, match="call >= 1"):
        KillPlan(rank=0, call=0)


def test_a_relaunch_after_the_kill_resumes_from_the_last_complete_checkpoint(tmp_path):
    clean = distlab.run(train_resumable, 2, str(tmp_path / "clean"), STEPS, SAVE_EVERY,
                        timeout=240)[0]
    root = str(tmp_path / "killed")
    # the 5th training step's loss all_reduce: saves at 2 and 4 complete (the loop is blocking)
    with killing(KillPlan(rank=1, call=5)):
        with pytest.raises(distlab.RankCrashed, match="rank 1 died: .*SIGKILL"):
            distlab.run(train_resumable, 2, root, STEPS, SAVE_EVERY, timeout=240)
    resume_at = complete_checkpoints(root)[-1][0]
    assert resume_at >= 4
    out = distlab.run(train_resumable, 2, root, STEPS, SAVE_EVERY, timeout=240)
    assert out[0]["resumed_from"] == resume_at
    # it trained the remaining steps only: one loss all_reduce on the default group per step
    steps = [c for c in out.comms[0] if c.op == "all_reduce" and c.group_name == "0"
             and not c.threaded]
    assert len(steps) == STEPS - resume_at
    assert out[0]["losses"] == {s: clean["losses"][s] for s in range(resume_at + 1, STEPS + 1)}
    for name, value in clean["params"].items():
        assert torch.equal(out[0]["params"][name], value), name



def test_a_calls_index_and_its_start_report_go_together(tmp_path):
    """Two threads (training, an asynchronous save's writer) calling at once: the one that took
    the earlier index reports first, so the launcher's copy of the record (in report order)
    matches the rank's. Here the first report is slow, and the other thread's call comes in
    meanwhile: it must wait, not report first."""
    from distlab.runtime.comms import Recorder
    reports, first, other_reported = [], threading.Event(), threading.Event()

    def sink(kind, comm, index):
        if kind == "enter" and index == 0:
            first.set()
            other_reported.wait(0.5)     # the other thread's report, if it could come first
        if kind == "enter" and index == 1:
            other_reported.set()
        reports.append((kind, index))

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    recorder = Recorder(0, sink).install()
    try:
        slow = threading.Thread(target=lambda: dist.all_reduce(torch.ones(1)))
        slow.start()
        first.wait(5)
        dist.all_reduce(torch.ones(1))
        slow.join()
    finally:
        recorder.uninstall()
        dist.destroy_process_group()
    assert [index for kind, index in reports if kind == "enter"] == [0, 1]

