"""Lab 12's open design: a checkpoint plan (an interval and a save mode, blocking or
asynchronous) for a run with a given failure rate, save costs and restart cost, and what it loses.

A ``Problem`` is the run's figures, in seconds: the job's mean time between failures M, the
restart R (a relaunch and a load, which failures interrupt too), a blocking save's stall, an
asynchronous save's stall (the copy to CPU memory) and its write (the background thread's time to
disk, while training goes on). The model is the one of ``interval``'s module doc (Daly 2006),
with what an asynchronous save changes: a checkpoint only counts once its write has ended, so a
failure during the write falls back to the one before; and a save waits for the previous write
(as ``stall.stall_run`` does), so saves closer than the write time stall the training.

``plan_lost_fraction`` is that model's expected fraction of time lost, exactly; ``best_plan``
finds the plan that minimises it, by a search over both modes and every interval; ``hinted_plan``
is the design the lab's hints lead to. ``simulate_plan`` draws the failures and measures it.
"""
from __future__ import annotations

import dataclasses
import math
import random
import statistics

from distlab.labs.checkpoint.interval import failure_free_time, golden_minimum, restart_time

MODES = ("blocking", "async")


@dataclasses.dataclass(frozen=True)
class Problem:
    """A run's figures, in seconds (module doc)."""
    mtbf: float
    restart: float
    blocking_stall: float
    async_stall: float
    async_write: float

    def args(self) -> tuple[float, ...]:
        """The figures in the order ``plan_checkpoints`` takes them."""
        return (self.mtbf, self.restart, self.blocking_stall, self.async_stall, self.async_write)

    def costs(self, mode: str) -> tuple[float, float]:
        """(stall, write) of a save in ``mode``: a blocking save writes within its stall."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {MODES}")
        return (self.blocking_stall, 0.0) if mode == "blocking" else (self.async_stall,
                                                                      self.async_write)

    def shown(self) -> str:
        return (f"M = {_t(self.mtbf)}, R = {_t(self.restart)}, blocking stall "
                f"{_t(self.blocking_stall)}, async stall {_t(self.async_stall)} + write "
                f"{_t(self.async_write)}")


def _t(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def _period(tau: float, stall: float, write: float) -> float:
    """Wall-clock time from one save's end to the next's: the compute, any wait for the previous
    write, the stall."""
    return max(tau, write) + stall


def plan_lost_fraction(tau: float, mode: str, problem: Problem) -> float:
    """The expected fraction of wall-clock time not spent on progress, for saves every ``tau``
    seconds of compute in ``mode`` (module doc: exact for the model)."""
    if not tau > 0:
        raise ValueError(f"need an interval tau > 0; got {tau}")
    stall, write = problem.costs(mode)
    m, r = problem.mtbf, problem.restart
    period = _period(tau, stall, write)
    # From the moment a checkpoint becomes durable, the next one is durable a period later if no
    # failure comes. After a failure (and its restart), the run starts from that checkpoint
    # afresh: it needs a period plus the write, failure-free, and each failure costs a restart.
    # Daly's expected time to get X failure-free with restarts: M e^(R/M) (e^(X/M) - 1); an
    # interrupted restart's expected cost: M (e^(R/M) - 1).
    fail = -math.expm1(-period / m)
    restart = m * math.expm1(r / m)
    fresh = m * math.exp(r / m) * math.expm1((period + write) / m)
    unit = m * fail + fail * (restart + fresh)
    return 1 - tau / unit


def best_plan(problem: Problem, points: int = 400) -> tuple[float, str, float]:
    """(tau, mode, lost fraction) of the plan with the least expected loss, over both modes and
    every interval from a thousandth of the smallest cost to ten MTBFs."""
    # A logarithmic grid of ``points`` intervals per mode; around its best point, a golden-section
    # search between the point's neighbours (the loss is smooth there, with one minimum).
    best = None
    for mode in MODES:
        stall, write = problem.costs(mode)
        lo, hi = 1e-3 * max(min(c for c in (stall, write, problem.mtbf) if c > 0), 1e-9), \
            10 * problem.mtbf
        grid = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]

        def lost(tau, mode=mode):
            return plan_lost_fraction(tau, mode, problem)

        k = min(range(points), key=lambda i: lost(grid[i]))
        tau = golden_minimum(lost, grid[max(k - 1, 0)], grid[min(k + 1, points - 1)])
        if best is None or lost(tau) < best[2]:
            best = (tau, mode, lost(tau))
    return best


def hinted_plan(problem: Problem) -> tuple[float, str]:
    """The lab's hinted design: the mode that stalls less, saved at Young's interval for its
    stall."""
    mode = "async" if problem.async_stall < problem.blocking_stall else "blocking"
    stall, _ = problem.costs(mode)
    return math.sqrt(2 * stall * problem.mtbf), mode


# ---------------------------------------------------------------------------------------------
# The failures drawn: the measurement that checks the model

def simulate_plan(tau: float, mode: str, problem: Problem, checkpoints: int = 20000,
                  seed: int = 0) -> tuple[float, float]:
    """Monte Carlo of the run: failures drawn from an exponential distribution (``seed``) until
    ``checkpoints`` checkpoints are durable; (fraction of time lost, its standard error: the time
    from one durable checkpoint to the next is independent of the others')."""
    if not tau > 0:
        raise ValueError(f"need an interval tau > 0; got {tau}")
    stall, write = problem.costs(mode)
    m, r = problem.mtbf, problem.restart
    period = _period(tau, stall, write)
    rng = random.Random(seed)
    times = []
    for _ in range(checkpoints):
        failure = rng.expovariate(1 / m)
        if failure >= period:          # the next checkpoint durable a period later
            times.append(period)
        else:                          # back to this checkpoint, then afresh: a period and a write
            times.append(failure + restart_time(rng, r, m)
                         + failure_free_time(rng, period + write, r, m))
    mean = statistics.fmean(times)
    error = statistics.stdev(times) / math.sqrt(checkpoints)
    return 1 - tau / mean, tau / mean ** 2 * error
