"""Killing a rank from outside, as a failing node would: the launcher sends SIGKILL to the rank's
process when the rank's record shows its n-th call of a given kind (the rank is not asked, warned
or waited for: it needs no code of its own for it, so a rank that runs a student's code cannot
dodge it or choose when)::

    with distlab.runtime.kill.killing(KillPlan(rank=1, call=5)):   # its 5th all_reduce
        distlab.run(train, 2, ...)      # raises RankCrashed: rank 1 ... killed by SIGKILL

The n-th call is counted as the rank reports it starting (``Comm``, ``distlab.runtime.comms``):
the signal lands while that call runs or a moment after, never before it. A training loop's
step is such a call, e.g. the loss ``all_reduce`` every step makes on the default group from
the main thread (``op``, ``group_name``, ``threaded``: an asynchronous save's own collectives,
made from its thread on a group of its own, are not counted).

The plan is a context variable, read by ``Launcher.run`` for one run: nothing else changes.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import signal

from distlab.runtime.comms import Comm

DEFAULT_GROUP = "0"     # c10d's name of the default process group


@dataclasses.dataclass(frozen=True)
class KillPlan:
    """SIGKILL rank ``rank`` when it starts its ``call``-th (from 1) call of ``op`` on the group
    named ``group_name`` (None: any group) from its main thread (``threaded``: from another
    thread; None: either)."""
    rank: int
    call: int
    op: str = "all_reduce"
    group_name: str | None = DEFAULT_GROUP
    threaded: bool | None = False

    def __post_init__(self):
        if self.call < 1 or self.rank < 0:
            raise ValueError(f"KillPlan: rank >= 0 and call >= 1 (the first call is 1); got "
                             f"rank={self.rank}, call={self.call}")

    def counts(self, rank: int, comm: Comm) -> bool:
        return (rank == self.rank and comm.op == self.op
                and (self.group_name is None or comm.group_name == self.group_name)
                and (self.threaded is None or comm.threaded == self.threaded))

    def describe(self) -> str:
        where = f" on group {self.group_name!r}" if self.group_name is not None else ""
        return f"its {_ordinal(self.call)} {self.op}{where}"


class Killer:
    """One run's side of a plan: counts the victim's calls as they are reported and kills it;
    ``fired`` (the block's list) gets the victim's rank when the signal is sent."""

    def __init__(self, plan: KillPlan, fired: list | None = None):
        self.plan, self.seen, self.killed_pid = plan, 0, None
        self.fired = fired if fired is not None else []

    def note(self, rank: int, comm: Comm, pid: int) -> None:
        """``rank``: the rank whose connection reported ``comm`` (not what the report says)."""
        if self.killed_pid is not None or not self.plan.counts(rank, comm):
            return
        self.seen += 1
        if self.seen == self.plan.call:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.killed_pid = pid
            self.fired.append(rank)

    def aftermath(self, rank: int) -> str:
        """What a RankCrashed message adds when the dead rank is the one this plan killed."""
        if self.killed_pid is None or rank != self.plan.rank:
            return ""
        return (f"\nThe launcher killed it on purpose (a KillPlan): SIGKILL from outside when it "
                f"started {self.plan.describe()}.")


_PLAN: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("distlab_kill",
                                                                     default=None)


@contextlib.contextmanager
def killing(plan: KillPlan):
    """Within the block (this thread or task), ``distlab.run`` carries out ``plan``. Yields a
    list that gets the victim's rank once the signal is sent: a caller told of another rank's
    failure (its peer vanished) can tell the kill's aftermath from a failure of its own."""
    fired: list[int] = []
    token = _PLAN.set((plan, fired))
    try:
        yield fired
    finally:
        _PLAN.reset(token)


def current_killer() -> Killer | None:
    current = _PLAN.get()
    return Killer(*current) if current is not None else None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
