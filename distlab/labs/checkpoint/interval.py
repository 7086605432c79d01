"""How often to checkpoint: the fraction of time a run loses to saves, restarts and rework, and
the interval that minimises it.

The model (Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
dumps", Future Generation Computer Systems 22(3)): failures arrive at random, at rate
1/M (exponential inter-arrival times; M is the mean time between failures of the whole job).
The run computes for tau, saves for delta, computes for tau, ...; a failure, during compute, save
or restart alike, costs the restart R and everything since the last completed save.
``lost_fraction`` is that model's expected fraction of wall-clock time lost, exactly;
``lost_fraction_first_order`` is the first-order approximation behind Young's interval (Young
1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9)), valid for
saves short beside the period and periods short beside the MTBF; ``young_period`` minimises
that approximation and ``daly_interval`` is Daly's higher-order estimate of the exact optimum
(``best_interval``).
The formulas are in the functions' bodies (the lab asks for them before it shows them).
"""
from __future__ import annotations

import math
import random
import statistics


def young_period(delta: float, mtbf: float) -> float:
    """Young's interval: the time from one save's start to the next's (compute plus save) that
    minimises ``lost_fraction_first_order``."""
    # where the first-order loss's derivative in the period is zero (the handout ships this
    # body: the loss itself, the lab's prediction, is not spelled out here)
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's (2006) higher-order estimate of the optimal compute time between saves."""
    # sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta for delta < 2M, else M
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def lost_fraction(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """The expected fraction of wall-clock time not spent on progress (module doc: exact model)."""
    # A segment of L = tau + delta needs L failure-free; each failure costs the time since the
    # segment began plus a restart, which failures interrupt too. In expectation a segment then
    # takes M e^(R/M) (e^(L/M) - 1) of wall-clock time (Daly 2006), of which tau is progress.
    _check(tau, delta, restart, mtbf)
    wall = mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf)
    return 1 - tau / wall


def lost_fraction_first_order(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """The first-order approximation of ``lost_fraction`` behind Young's interval (module doc)."""
    # Per unit of time a share delta / L goes to saves, and failures (1/M of them) each cost R plus
    # half a segment redone; products and squares of delta/L, L/M and R/M are dropped.
    _check(tau, delta, restart, mtbf)
    return delta / (tau + delta) + (restart + (tau + delta) / 2) / mtbf


def best_interval(delta: float, restart: float, mtbf: float, grid: int = 2000) -> float:
    """The compute time between saves that minimises the exact ``lost_fraction``: a golden-section
    search (the function is unimodal in tau), from delta/1000 to 10 M."""
    return golden_minimum(lambda tau: lost_fraction(tau, delta, restart, mtbf),
                          1e-3 * max(delta, 1e-12), 10 * mtbf, grid)


def golden_minimum(f, lo: float, hi: float, rounds: int = 200) -> float:
    """Where ``f``, unimodal on [lo, hi], is least: a golden-section search, to 1e-12 relative."""
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def _check(tau, delta, restart, mtbf) -> None:
    if not (tau > 0 and delta >= 0 and restart >= 0 and mtbf > 0):
        raise ValueError(f"need tau > 0, delta >= 0, R >= 0, M > 0; got tau={tau}, "
                         f"delta={delta}, R={restart}, M={mtbf}")


def failure_free_time(rng: random.Random, length: float, restart: float, mtbf: float) -> float:
    """Wall-clock time to get ``length`` of failure-free time, each failure costing what ran
    since the segment began plus a restart (which a failure may interrupt too)."""
    spent = 0.0
    while True:
        failure = rng.expovariate(1 / mtbf)
        if failure >= length:
            return spent + length
        spent += failure + restart_time(rng, restart, mtbf)


def restart_time(rng: random.Random, restart: float, mtbf: float) -> float:
    """Wall-clock time of a restart that failures interrupt, each starting it again."""
    spent = 0.0
    while True:
        failure = rng.expovariate(1 / mtbf)
        if failure >= restart:
            return spent + restart
        spent += failure


def simulate_lost_fraction(tau: float, delta: float, restart: float, mtbf: float,
                           segments: int = 20000, seed: int = 0) -> tuple[float, float]:
    """Monte Carlo of the model: ``segments`` segments of tau + delta run under random failures;
    (fraction of time lost, its standard error by the delta method: the segments' wall times are
    independent, and lost = 1 - tau / mean)."""
    _check(tau, delta, restart, mtbf)
    rng = random.Random(seed)
    times = [failure_free_time(rng, tau + delta, restart, mtbf) for _ in range(segments)]
    mean = statistics.fmean(times)
    error = statistics.stdev(times) / math.sqrt(segments)
    return 1 - tau / mean, tau / mean ** 2 * error
