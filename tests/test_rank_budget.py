"""Hung or merely slow: ranks that a busy machine slows down are given time; ranks that wait in a
collective, use no CPU time, or compute past the CPU-time limit are stopped, and the message says
which (distlab.runtime.stuck.Budget)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import distlab
from distlab.runtime import stuck
from distlab.runtime.comms import Comm
from distlab.runtime.diagnosis import RankState
from distlab.runtime.launch import current_launcher
from distlab.runtime.outcome import HangError


def _states(*open_calls):
    states = []
    for rank, op in enumerate(open_calls):
        state = RankState(rank, pid=1000 + rank, status="running")
        if op:
            state.comms.append(Comm(rank=rank, seq=1, op=op, group=(0, 1), shapes=[[4]],
                                    dtype="torch.float32", bytes=16))
        states.append(state)
    return states


def _probe_sequence(monkeypatch, states, cpu_per_probe, timeout=10.0, probes=4,
                    cpu_in_calls=True, stuck_after=None, probed_at=None):
    """Probe a Budget (its run started at 100 s) at its own probe times with CPU clocks that
    advance as given per probe; the verdicts (None: given more time). The probe times are
    appended to ``probed_at`` when given."""
    clock = {s.pid: 0.0 for s in states}
    monkeypatch.setattr(stuck, "cpu_seconds", lambda pid: clock[pid])
    budget = stuck.Budget(timeout, deadline=100.0 + timeout, cpu_in_calls=cpu_in_calls,
                          stuck_after=stuck_after)
    verdicts = []
    for _ in range(probes):
        for s in states:
            clock[s.pid] += cpu_per_probe.get(s.rank, 0.0)
        if probed_at is not None:
            probed_at.append(budget.probe_at)
        verdicts.append(budget.probe(states, budget.probe_at))
    return verdicts


def test_ranks_that_compute_slowly_get_more_time(monkeypatch):
    # rank 0 computes a little in every window (a busy machine), rank 1 waits for it
    verdicts = _probe_sequence(monkeypatch, _states(None, "all_reduce"), {0: 0.3})
    assert verdicts == [None, None, None, None]


def test_ranks_that_use_no_cpu_time_are_stuck(monkeypatch):
    verdicts = _probe_sequence(monkeypatch, _states(None, "all_reduce"), {}, probes=2)
    assert verdicts[0] is None
    assert "stuck" in verdicts[1] and "not merely slowed down by a busy machine" in verdicts[1]
    assert "rank 0 used no CPU time" in verdicts[1]
    assert "rank 1 waits in all_reduce #1" in verdicts[1]


def _enter(state, op, seq, peer=None):
    """The rank leaves its open call and enters ``op`` number ``seq``."""
    for comm in state.comms:
        comm.end = comm.end or 1.0
    state.comms.append(Comm(rank=state.rank, seq=seq, op=op, group=(0, 1), shapes=[[4]],
                            dtype="torch.float32", bytes=16, peer=peer))


def test_ranks_caught_inside_sends_they_then_leave_are_not_stuck(monkeypatch):
    # A pipeline on a busy machine: at every probe both ranks happen to be inside a send or a
    # recv, but each time a later one (they use little CPU time between them).
    states = _states(None, None)
    _enter(states[0], "send", 1, peer=1)
    _enter(states[1], "recv", 1, peer=0)
    clock = {s.pid: 0.0 for s in states}
    monkeypatch.setattr(stuck, "cpu_seconds", lambda pid: clock[pid])
    budget = stuck.Budget(10.0, deadline=110.0)
    verdicts = []
    for seq in range(2, 6):
        verdicts.append(budget.probe(states, budget.probe_at))
        _enter(states[0], "send", seq, peer=1)
        _enter(states[1], "recv", seq, peer=0)
    assert verdicts == [None] * 4
    assert budget.probe(states, budget.probe_at) is None   # they entered #5 in that window
    # the same calls through a whole window, with no CPU time: now they wait
    verdict = budget.probe(states, budget.probe_at)
    assert "rank 0 waits in send #5" in verdict and "rank 1 waits in recv #5" in verdict


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_cpu_time_inside_one_collective_is_progress_on_gloo_only(monkeypatch, backend):
    # gloo: the ranks' threads reduce the data (a long all_reduce on a busy machine); NCCL: a
    # rank spins on the CPU while it waits for a collective that never ends.
    verdicts = _probe_sequence(monkeypatch, _states("all_reduce", "all_reduce"),
                               {0: 0.5, 1: 0.5}, probes=3, cpu_in_calls=backend == "gloo")
    if backend == "gloo":
        assert verdicts == [None, None, None]
    else:
        assert verdicts[0] is None and "rank 0 waits in all_reduce #1" in verdicts[1]


def test_a_rank_past_its_cpu_time_limit_is_stopped(monkeypatch):
    verdicts = _probe_sequence(monkeypatch, _states(None, None), {0: 4.0, 1: 0.0}, timeout=10.0)
    assert verdicts[:2] == [None, None]
    assert "rank 0 kept computing for 12 s of CPU time, over the limit of 10 s" in verdicts[2]


def test_the_wall_clock_still_bounds_a_starved_rank(monkeypatch):
    verdicts = _probe_sequence(monkeypatch, _states(None,), {0: 0.05}, timeout=1.0, probes=8)
    assert verdicts[:3] == [None, None, None]
    assert any(v and "the machine is too busy to finish it" in v for v in verdicts)


def test_stuck_ranks_are_stopped_at_stuck_after_not_at_a_longer_timeout(monkeypatch):
    at = []
    verdicts = _probe_sequence(monkeypatch, _states(None, "all_reduce"), {}, timeout=60.0,
                               probes=2, stuck_after=10.0, probed_at=at)
    assert at == [100.0 + 10.0 - stuck.CPU_WINDOW, 100.0 + 10.0]   # not 160 s, the deadline
    assert verdicts[0] is None
    assert "stuck" in verdicts[1] and "rank 1 waits in all_reduce #1" in verdicts[1]


def test_ranks_that_progress_keep_their_whole_timeout_under_stuck_after(monkeypatch):
    # rank 0 uses 30 s of CPU time per window: over the 60 s limit long before the deadline,
    # which is the only time that limit may stop it
    at = []
    verdicts = _probe_sequence(monkeypatch, _states(None, "all_reduce"), {0: 30.0},
                               timeout=60.0, probes=30, stuck_after=10.0, probed_at=at)
    before = [v for t, v in zip(at, verdicts) if t < 160.0]
    assert before and before == [None] * len(before)
    after = [v for t, v in zip(at, verdicts) if t >= 160.0 and v]
    assert "over the limit of 60 s" in after[0]


def test_stuck_after_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(stuck.ENV_STUCK_AFTER, raising=False)
    assert stuck.stuck_after() is None
    monkeypatch.setenv(stuck.ENV_STUCK_AFTER, "2.5")
    assert stuck.stuck_after() == 2.5
    monkeypatch.setenv(stuck.ENV_STUCK_AFTER, "soon")
    with pytest.raises(ValueError, match="DISTLAB_STUCK_AFTER='soon' is not a number of seconds"):
        stuck.stuck_after()


def test_ranks_that_cannot_join_are_reported_then_stopped(monkeypatch, capsys):
    states = _states(None, None)
    for s in states:
        s.status = "starting"
    clock = {s.pid: 1.0 for s in states}
    monkeypatch.setattr(stuck, "cpu_seconds", lambda pid: clock[pid])
    joining = stuck.Joining(0.0, "127.0.0.1:1234")
    assert joining.check(states, 5.0) is None and capsys.readouterr().err == ""
    assert joining.check(states, 10.0) is None
    assert "rank(s) 0, 1 still joining the process group after 10 s" in capsys.readouterr().err
    clock[states[0].pid] += 1.0  # rank 0 computes (imports, on a busy machine): more time
    assert joining.check(states, 20.0) is None
    verdict = joining.check(states, 30.0)
    assert "rank(s) 0, 1 could not join the process group in 30 s" in verdict
    assert "used no CPU time in the last 10 s" in verdict and "127.0.0.1:1234" in verdict
    states[0].status = "running"  # joined: nothing to say about the others... until the next one
    states[1].status = "running"
    assert joining.check(states, 40.0) is None


def _busy(rank, world_size, cpu):
    start = time.process_time()
    while time.process_time() - start < cpu:
        pass
    return rank


def _throttle(zygote_pid: int, stop: threading.Event) -> None:
    """Keep the zygote's children (the ranks) stopped three quarters of the time: a busy machine."""
    import psutil
    while not stop.is_set():
        ranks = psutil.Process(zygote_pid).children()
        for sig, pause in ((signal.SIGSTOP, 0.15), (signal.SIGCONT, 0.05)):
            for child in ranks:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(pause)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads CPU time from /proc")
def test_a_correct_answer_on_a_busy_machine_is_not_a_hang():
    distlab.run(_busy, 2, 0.0)  # the zygote is up
    stop = threading.Event()
    thread = threading.Thread(target=_throttle, args=(current_launcher().zygote_pid(), stop))
    thread.start()
    try:
        start = time.perf_counter()
        out = distlab.run(_busy, 2, 0.8, timeout=1.5)
        wall = time.perf_counter() - start
    finally:
        stop.set()
        thread.join()
    assert list(out) == [0, 1]
    assert wall > 1.5  # it did run past the wall-clock timeout


def test_a_sleeping_rank_is_reported_as_using_no_cpu_time():
    def fn(rank, world_size):
        time.sleep(60)

    with pytest.raises(HangError) as info:
        distlab.run(fn, 2, timeout=1)
    assert "did not finish within 1 s: they are stuck" in str(info.value)
    assert "used no CPU time" in str(info.value)


def test_under_stuck_after_a_sleeping_rank_is_stopped_long_before_the_timeout(monkeypatch):
    def fn(rank, world_size):
        time.sleep(60)

    monkeypatch.setenv(stuck.ENV_STUCK_AFTER, "1")
    with pytest.raises(HangError) as info:
        distlab.run(fn, 2, timeout=60)
    text = str(info.value)   # this message is given only before the run's own deadline
    assert "stopped making progress, 1 s or more into the run and before its 60 s timeout" in text
    assert "DISTLAB_STUCK_AFTER=1" in text and "used no CPU time" in text


def test_under_stuck_after_ranks_that_compute_longer_still_finish(monkeypatch):
    monkeypatch.setenv(stuck.ENV_STUCK_AFTER, "0.5")
    assert list(distlab.run(_busy, 2, 2.0, timeout=60)) == [0, 1]


def test_a_zygote_that_waits_on_something_fails_within_seconds(tmp_path, monkeypatch):
    from distlab.runtime import zygote_client
    from distlab.runtime.outcome import DistributedError
    from distlab.runtime.zygote_client import ZygoteHandle
    # Reports every 2 s instead of 10: the same watch (the zygote imports torch, busy, then waits
    # without CPU) found within two reports of the wait, not two of the 10-s ones (20 s of wall).
    monkeypatch.setattr(zygote_client, "STARTUP_NOTICE", 2.0)
    (tmp_path / "waits_forever.py").write_text("import time\ntime.sleep(600)\n")
    handle = ZygoteHandle({"DISTLAB_ZYGOTE_PRELOAD": "waits_forever", "PYTHONPATH": str(tmp_path)})
    start = time.monotonic()
    try:
        with pytest.raises(DistributedError, match="used no CPU time in the last 2 s") as info:
            handle.wait_ready()
        assert "process state S" in str(info.value)
        assert time.monotonic() - start < 150  # not the 300 s it used to wait in silence
    finally:
        handle.proc.kill()
        handle.proc.wait()
