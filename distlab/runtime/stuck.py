"""Stuck or merely slow: a busy machine slows processes down without them being stuck, so the
launcher judges ranks (and its zygote) by the CPU time they use, not by the wall clock alone.

- ``Budget``: when ranks past their timeout count as hung (``distlab.runtime.rank_watch``), and,
  where ``DISTLAB_STUCK_AFTER`` is set (the grader sets it to its ``--rank-timeout``), from when
  ranks that all make no progress count as stuck although the run's own timeout is longer.
- ``Joining``: ranks that have not joined the process group within seconds are reported, and
  stopped when none of them uses CPU time (they wait for a connection that does not come).
- ``cpu_seconds(pid)``: the CPU time a process has used (Linux: /proc; None elsewhere).
"""
from __future__ import annotations

import os
import sys

CPU_WINDOW = 2.0   # seconds over which a rank that uses no CPU time counts as stuck
MIN_WINDOW = 0.5   # the shortest window (the CPU clock ticks in 10 ms)
SLACK = 10         # the wall-clock deadline, at most, for ranks that keep computing slowly
ENV_STUCK_AFTER = "DISTLAB_STUCK_AFTER"


def stuck_after() -> float | None:
    """``DISTLAB_STUCK_AFTER``: seconds into a run from which ranks that all make no progress are
    stopped, whatever the run's timeout; None when unset. The grader sets it so that a helper's
    long timeout (a lab cell's ``timeout=300``) does not make a stuck submission cost minutes."""
    value = os.environ.get(ENV_STUCK_AFTER)
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{ENV_STUCK_AFTER}={value!r} is not a number of seconds; set it to one "
                         f"(e.g. 10), or unset it to stop stuck ranks only at each run's "
                         f"timeout") from None


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system, all threads) the process ``pid`` has used; None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return None


class Budget:
    """When ranks that have not finished count as hung. Until ``deadline``, never. From then on,
    every CPU_WINDOW seconds: hung when no rank made progress over the window, or when one has
    used ``timeout`` seconds of CPU time; ranks that progress, however slowly the busy machine
    lets them, get more time, up to SLACK x ``timeout`` of wall time. The state and CPU time are
    sampled CPU_WINDOW before each probe.

    A rank made progress when it entered or left a collective in the window, or used CPU time
    outside one. Inside the same collective at both samples it made progress only when
    ``cpu_in_calls`` (gloo: the rank's own threads move and reduce the data, and a rank that
    waits for a peer sleeps) and it used CPU time; NCCL ranks spin while they wait, so there a
    collective that does not end is a wait. A rank caught inside a call at one instant is not
    stuck: on a busy machine both ends of a send are often inside it at once.

    With ``stuck_after`` shorter than ``timeout``, probing starts that many seconds into the run:
    until the deadline, only ranks that are stuck (by the same test) are stopped; the CPU-time
    and wall-clock limits still wait for the deadline, so a long run that progresses is never
    cut short."""

    def __init__(self, timeout: float, deadline: float, cpu_in_calls: bool = True,
                 stuck_after: float | None = None):
        self.timeout, self.start, self.deadline = timeout, deadline - timeout, deadline
        self.cpu_in_calls = cpu_in_calls
        self.stuck_after = timeout if stuck_after is None else min(timeout, stuck_after)
        self.watch_from = self.start + self.stuck_after
        self.probe_at = max(self.start, self.watch_from - CPU_WINDOW)
        self.marks, self.marked = None, 0.0

    def early(self, now: float) -> bool:
        """Whether ``now`` is before the deadline (a verdict then means stuck, never over time)."""
        return now < self.deadline

    def headline(self, now: float) -> str:
        """What a verdict given at ``now`` follows: over time, or stopped early as stuck."""
        if not self.early(now):
            return f"the ranks did not finish within {self.timeout:g} s"
        return (f"the ranks stopped making progress, {self.stuck_after:g} s or more into the run "
                f"and before its {self.timeout:g} s timeout ({ENV_STUCK_AFTER}="
                f"{self.stuck_after:g}, as the grader sets it, stops stuck ranks that early)")

    @staticmethod
    def _sample(states) -> dict:
        """Per live rank: (CPU seconds, (calls entered, calls returned))."""
        return {s.rank: (cpu_seconds(s.pid), (len(s.comms), sum(c.end is not None for c in s.comms)))
                for s in states if s.status in ("starting", "running") and s.pid}

    def probe(self, states, now: float) -> str | None:
        live = [s for s in states if s.status in ("starting", "running") and s.pid]
        sample = self._sample(states)
        if self.marks is None:   # the sample CPU_WINDOW before the deadline
            self.marks, self.marked = sample, now
            self.probe_at = max(self.watch_from, now + MIN_WINDOW)
            return None
        window = now - self.marked
        stuck, computing = [], []
        for s in live:
            (before, calls_before), (after, calls) = self.marks.get(s.rank, (None, None)), sample[s.rank]
            call = s.open_call()
            used = None if before is None or after is None else after - before
            if calls != calls_before:   # entered or left a collective: it moves
                computing.append((after or 0.0, s.rank))
            elif used is None:   # no CPU clock to read: as if stuck
                stuck.append(f"rank {s.rank} is still running" if call is None
                             else f"rank {s.rank} waits in {call.op} #{call.seq}")
            elif call is not None and not (self.cpu_in_calls and used >= 0.05 * window):
                stuck.append(f"rank {s.rank} waits in {call.op} #{call.seq}")
            elif used >= 0.01 * window:
                computing.append((after, s.rank))
            else:
                stuck.append(f"rank {s.rank} used no CPU time in the last {window:.1f} s")
        if not live:
            return "every rank returned, but a process they started still holds their output"
        if not computing:
            return ("they are stuck (" + "; ".join(stuck) + "), not merely slowed down by a "
                    "busy machine")
        used, rank = max(computing)
        if used >= self.timeout and not self.early(now):   # limits start at the deadline
            return (f"rank {rank} kept computing for {used:.0f} s of CPU time, over the "
                    f"limit of {self.timeout:g} s (an endless loop, or far too much work)")
        if now - self.start >= SLACK * self.timeout:
            return (f"rank {rank} was still computing after {now - self.start:.0f} s "
                    f"({used:.1f} s of CPU time): the machine is too busy to finish it")
        self.marks, self.marked, self.probe_at = sample, now, now + CPU_WINDOW
        return None


JOIN_NOTICE = 10.0   # seconds between reports on ranks that have not joined the process group


class Joining:
    """Ranks still joining the process group (rendezvous, gloo's connections), which takes well
    under a second on an idle machine: every JOIN_NOTICE seconds, one line on stderr says which
    ranks are still joining; when none of them used CPU time over that interval, the verdict says
    they are stuck (``check`` returns it)."""

    def __init__(self, start: float, store: str):
        self.next, self.store, self.start, self.marks = start + JOIN_NOTICE, store, start, None

    def check(self, states, now: float) -> str | None:
        waiting = [s for s in states if s.status == "starting" and s.pid]
        if not waiting or now < self.next:
            return None
        cpu = {s.rank: cpu_seconds(s.pid) for s in waiting}
        names = ", ".join(str(s.rank) for s in waiting)
        if self.marks is not None and all(
                cpu[r] is not None and self.marks.get(r) is not None
                and cpu[r] - self.marks[r] < 0.005 * JOIN_NOTICE for r in cpu):
            return (f"rank(s) {names} could not join the process group in {now - self.start:.0f} s "
                    f"and used no CPU time in the last {JOIN_NOTICE:g} s: they wait for a "
                    f"connection that does not come (the rendezvous store, {self.store}, or a "
                    f"peer's connection). A process left over from an earlier run, or a firewall "
                    f"on the loopback interface, can cause this; run `distlab doctor`.")
        print(f"distlab.run: rank(s) {names} still joining the process group after "
              f"{now - self.start:.0f} s (they are using CPU time: the machine is busy)",
              file=sys.stderr, flush=True)
        self.marks, self.next = cpu, now + JOIN_NOTICE
        return None
