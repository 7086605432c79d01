"""Lab 12, Sections 5 and 6 (served by ``distlab.checks.lab12``): how often to checkpoint.

- The graded prediction, ``predict_lost_fraction(tau, delta, restart, mtbf)``: the expected
  fraction of time a run loses, compared with the exact model (``labs.checkpoint.interval``) on
  three cases, within the error first order makes on each case (``prediction_tolerance``), so a
  first-order model and Daly's exact one both pass, and a term missing does not.
- The open design, ``plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write)
  -> (interval, mode)``, graded on three problems by the expected fraction of time its plan
  loses (``labs.checkpoint.plans``), on a scale of two tests (``common.design_scale``): the first
  at the loss of the hinted design (Young's interval for the mode that stalls less), the second at
  the bar halfway from it to the least loss a search over both modes and every interval finds.
  The problems are drawn where that search beats the hinted design by at least ``MIN_GAP``.
  Both tests grade one call (``_RUNS``). Visible figures are stored in ``data/<lab>/``; hidden ones
  are computed here, in the judge.
"""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import DesignRuns, design_scale
from distlab.checks.course_code import CourseCode, names
from distlab.checks.shown import joined
from distlab.labs.checkpoint.plans import MODES, Problem

LAB = "12_checkpoint_restart"
PREDICTION_SET, DESIGN_SET = "interval_prediction", "interval_design"
SEED = 1205
# (tau, delta, R, M) in seconds: a minute's save every 50 min with a 4-day MTBF and a 20-min
# restart; 30 s every 30 min, 2 days, 15 min; 2 min every 80 min, 6 days, 40 min
PREDICTION_VISIBLE = [(3000.0, 60.0, 1200.0, 4 * 86400.0), (1800.0, 30.0, 900.0, 2 * 86400.0),
                      (4800.0, 120.0, 2400.0, 6 * 86400.0)]
MIN_GAP = 0.01          # a graded problem: the hinted design loses 1% of the time more than best
EPS = 1e-9              # lost fractions computed in another order: a plan at a limit passes


# ---------------------------------------------------------------------------------------------
# The prediction

def prediction_tolerance(tau: float, delta: float, restart: float, mtbf: float) -> float:
    """How far a correct prediction may be from the exact model: the size of what a first-order
    model leaves out on this case."""
    # The square of the sum of the case's small ratios: the save over the interval, and the
    # interval, save and restart over the MTBF. A first-order model drops their products and
    # squares; within it, delta/tau and delta/(tau + delta) differ by a square too.
    return (delta / tau + (tau + delta + restart) / mtbf) ** 2


def lost_prediction_cases(seed: int | None) -> list[tuple[float, float, float, float]]:
    """The visible cases, or three drawn from ``seed`` where first order holds and each term of
    the loss is larger than the tolerance three times over."""
    if seed is None:
        return list(PREDICTION_VISIBLE)
    rng, out = random.Random(seed), []
    while len(out) < 3:
        mtbf = rng.uniform(1, 8) * 86400
        delta = rng.uniform(20, 300)
        tau = rng.uniform(0.5, 2) * math.sqrt(2 * delta * mtbf)
        restart = rng.uniform(0.005, 0.02) * mtbf
        case = (round(tau, 1), round(delta, 1), round(restart, 1), round(mtbf, 1))
        tol = prediction_tolerance(*case)
        if min(case[2] / case[3], case[0] / (2 * case[3]), case[1] / case[0]) >= 3 * tol:
            out.append(case)
    return out


def _exact(case) -> float:
    from distlab.labs.checkpoint.interval import lost_fraction
    return lost_fraction(*case)


def lost_prediction_sets() -> dict:
    return {PREDICTION_SET: {"seed": SEED, "cases": torch.tensor(PREDICTION_VISIBLE,
                                                                 dtype=torch.float64),
                             "lost": torch.tensor([_exact(c) for c in PREDICTION_VISIBLE],
                                                  dtype=torch.float64)}}


def grade_lost_prediction(predict_lost_fraction, seed: int | None = None) -> str:
    """``predict_lost_fraction(tau, delta, restart, mtbf)`` within ``prediction_tolerance`` of the
    exact model on every case."""
    from distlab.checks.ranks import call_each
    from distlab.checks.stored import expected_values
    cases = lost_prediction_cases(seed)
    want = expected_values(LAB, PREDICTION_SET, "lost", seed, cases, _exact)
    calls = [f"predict_lost_fraction{case}" for case in cases]
    answers = call_each(predict_lost_fraction, cases, names=calls)
    shown = []
    for case, call, got, expected in zip(cases, calls, answers, want):
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.120}: return one number, the fraction of "
                              f"wall-clock time lost (0.05 for 5%).") from None
        tol = prediction_tolerance(*case)
        if not abs(got - expected) <= tol:
            raise CheckFailed(f"{call}: {got:.5f}, expected {expected:.5f} within {tol:.5f} (the "
                              f"size of the terms a first-order model drops here). "
                              + _prediction_hint(got, expected, tol, case))
        shown.append(f"{got:.4f} (model {expected:.4f} ± {tol:.4f})")
    return joined("predict_lost_fraction: within first order's error of the model on "
                  f"{len(cases)} cases: ", shown)


def _prediction_hint(got: float, want: float, tol: float, case) -> str:
    tau, delta, restart, mtbf = case
    if abs(got - (want - restart / mtbf)) <= tol:
        return ("About what the restarts cost is missing: each failure also stops the run while "
                "it relaunches and loads.")
    if abs(got - (want + tau / (2 * mtbf))) <= tol:
        return ("Too much rework: a failure comes at a random moment of the interval; how much "
                "of it is lost, on average?")
    if got > 1 or got < 0:
        return "A fraction of the time: between 0 and 1."
    return ("Count, per unit of time, what the saves take and what each failure costs (how many "
            "failures per second?), and check your units: every argument is in seconds.")


# ---------------------------------------------------------------------------------------------
# The open design

DESIGN_KINDS = ("long write", "frequent failures", "short MTBF")
FIGURES = ("hinted", "bar", "best", "best_tau", "best_mode")


def _draw(kind: str, rng: random.Random) -> Problem:
    """A problem of ``kind``: the async write longer than Young's interval for the async stall;
    failures frequent beside the write; failures every few saves."""
    if kind == "long write":
        m, b = rng.uniform(4, 12) * 3600, rng.uniform(120, 300)
        s = b * rng.uniform(0.01, 0.04)
        w, r = rng.uniform(1.5, 3) * math.sqrt(2 * s * m), rng.uniform(300, 900)
    elif kind == "frequent failures":
        m, b = rng.uniform(1, 3) * 3600, rng.uniform(30, 90)
        s = b * rng.uniform(0.1, 0.3)
        w, r = rng.uniform(0.1, 0.2) * m, rng.uniform(120, 600)
    else:
        m = rng.uniform(20, 60) * 60
        b = rng.uniform(0.05, 0.15) * m
        s = b * rng.uniform(0.5, 0.8)
        w, r = s * rng.uniform(1, 2), rng.uniform(60, 300)
    return Problem(*(round(v, 1) for v in (m, r, b, s, w)))


def design_problems(seed: int | None) -> list[Problem]:
    """One problem of each kind, drawn from ``seed`` (the visible ones from ``SEED``), each where
    the best plan beats the hinted one by ``MIN_GAP`` at least."""
    rng = random.Random(SEED if seed is None else seed)
    out = []
    for kind in DESIGN_KINDS:
        while True:
            problem = _draw(kind, rng)
            fig = plan_scale(problem)
            if fig["hinted"] - fig["best"] >= MIN_GAP:
                out.append(problem)
                break
    return out


def plan_scale(problem: Problem) -> dict:
    """The hinted design's loss, the bar, the best loss, and the best plan (the judge's)."""
    from distlab.labs.checkpoint.plans import best_plan, hinted_plan, plan_lost_fraction
    hinted = plan_lost_fraction(*hinted_plan(problem), problem)
    tau, mode, best = best_plan(problem)
    return {**design_scale(hinted, best), "best": best, "best_tau": tau,
            "best_mode": float(MODES.index(mode))}


def plan_sets() -> dict:
    problems = design_problems(None)
    return {DESIGN_SET: {"seed": SEED,
                         "problems": torch.tensor([p.args() for p in problems],
                                                  dtype=torch.float64),
                         "figures": torch.tensor([[plan_scale(p)[f] for f in FIGURES]
                                                  for p in problems], dtype=torch.float64)}}


def design_scales(seed: int | None) -> tuple[list[Problem], list[dict]]:
    """The problems and their scales: stored for the visible test, computed (in the judge) else."""
    if seed is None:
        from distlab.checks.stored import load
        stored = load(LAB, DESIGN_SET)
        problems = [Problem(*row) for row in stored["problems"].tolist()]
        return problems, [dict(zip(FIGURES, row)) for row in stored["figures"].tolist()]
    try:
        problems = design_problems(seed)
        return problems, [plan_scale(p) for p in problems]
    except NotImplementedError:
        raise CheckFailed("Hidden problems need the grader's code to draw and score them (your "
                          "handout has none); call the check as the test cell does, without a "
                          "seed.") from None


def design_figures() -> str:
    """The visible problems and their scales, as stored (the lab prints them before the
    exercise)."""
    problems, scales = design_scales(None)
    return "\n".join(f"{kind}: {p.shown()}: the hinted design loses {f['hinted']:.4f}, the bar "
                     f"{f['bar']:.4f}" for kind, p, f in zip(DESIGN_KINDS, problems, scales))


def _plan(got, call: str) -> tuple[float, str]:
    try:
        tau, mode = got
        tau = float(tau)
    except (TypeError, ValueError):
        raise CheckFailed(f"{call} returned {got!r:.120}: return (interval, mode), the compute "
                          f"time between saves in seconds and 'blocking' or 'async'.") from None
    if mode not in MODES or not (math.isfinite(tau) and tau > 0):
        raise CheckFailed(f"{call} returned ({tau!r}, {mode!r}): the interval is a number of "
                          f"seconds > 0, the mode 'blocking' or 'async'.")
    return tau, mode


def _lost(tau: float, mode: str, problem: Problem) -> tuple[float, str]:
    """The plan's expected loss: exact in the judge; where a handout has no model (a student's
    kernel), simulated, with its standard error."""
    try:
        from distlab.labs.checkpoint.plans import plan_lost_fraction
        return plan_lost_fraction(tau, mode, problem), ""
    except NotImplementedError:
        from distlab.labs.checkpoint.plans import simulate_plan
        lost, error = simulate_plan(tau, mode, problem, checkpoints=20000, seed=SEED)
        # three standard errors in your favour: the grader computes it exactly
        return lost - 3 * error, f" (simulated here ± {error:.4f}; the grader's is exact)"


def _measure(fn, seed: int | None) -> dict:
    from distlab.checks.ranks import call_each
    problems, scales = design_scales(seed)
    calls = [f"plan_checkpoints({', '.join(f'{v:g}' for v in p.args())})" for p in problems]
    answers = call_each(fn, [p.args() for p in problems], names=calls)
    rows = []
    for kind, problem, fig, call, got in zip(DESIGN_KINDS, problems, scales, calls, answers):
        tau, mode = _plan(got, call)
        lost, note = _lost(tau, mode, problem)
        rows.append({"kind": kind, "call": call, "tau": tau, "mode": mode, "lost": lost,
                     "note": note, "fig": fig})
    case = "the visible problems" if seed is None else f"hidden problems, seed {seed}"
    return {"rows": rows, "case": case}


_RUNS = DesignRuns()


def _row(row: dict) -> str:
    f = row["fig"]
    return (f"{row['kind']}: {row['mode']} every {row['tau']:.0f} s loses {row['lost']:.4f}"
            f"{row['note']} (hinted {f['hinted']:.4f}, bar {f['bar']:.4f}, best {f['best']:.4f})")


def grade_plan(fn, seed: int | None, level: str) -> str:
    """Both tests: every problem's expected loss at most ``level``'s figure ("hinted" or "bar");
    returns the verdict line."""
    got = _RUNS.run(fn, (seed,), lambda: _measure(fn, seed), first=level == "hinted")
    name = "the hinted design's loss" if level == "hinted" else "the bar"
    for row in got["rows"]:
        if row["lost"] > row["fig"][level] + EPS:
            advice = ("Which mode, at which interval? Young's interval for the stall of the mode "
                      "you choose is the start; does the training wait for anything else?"
                      if level == "hinted" else
                      "Where is first order off? Compare the two modes with what a failure "
                      "really costs in each, and minimise the whole model, not its first order.")
            raise CheckFailed(f"{row['call']} ({got['case']}): {_row(row)}. This test's limit "
                              f"is {name}, {row['fig'][level]:.4f}. {advice}")
    return joined(f"plan_checkpoints ({got['case']}), expected fraction of time lost, within "
                  f"{name}: ", [_row(r) for r in got["rows"]])


def plan_verdict(plan_checkpoints) -> str:
    """The student's plans for the visible problems, on the stored scale (the lab's last cell of
    the exercise; runs in the kernel)."""
    problems, scales = design_scales(None)
    lines = []
    for kind, problem, fig in zip(DESIGN_KINDS, problems, scales):
        tau, mode = _plan(plan_checkpoints(*problem.args()), "plan_checkpoints")
        lost, note = _lost(tau, mode, problem)
        lines.append(_row({"kind": kind, "tau": tau, "mode": mode, "lost": lost, "note": note,
                           "fig": fig}))
    return "\n".join(lines)


# What ``distlab.checks.lab12`` adds to its COURSE_CODE: the models (the prediction's answer and
# the design's yardstick), the search and the hinted design; the course's simulations stay in the
# handout (the lab's measurement cells run them) but an answer may not call them.
INTERVAL = "distlab.labs.checkpoint.interval"
PLANS = "distlab.labs.checkpoint.plans"
MODELS = (names(INTERVAL, "lost_fraction", "lost_fraction_first_order", "best_interval")
          + names(PLANS, "plan_lost_fraction", "best_plan", "hinted_plan")
          + names(__name__, "_exact", "plan_scale"))
SIMULATIONS = (names(INTERVAL, "simulate_lost_fraction", "failure_free_time", "restart_time")
               + names(PLANS, "simulate_plan"))
COURSE_CODE = {
    "check_lost_prediction": CourseCode(forbidden=MODELS, watched=SIMULATIONS),
    "check_checkpoint_plan": CourseCode(forbidden=MODELS, watched=SIMULATIONS),
    "check_checkpoint_plan_bar": CourseCode(forbidden=MODELS, watched=SIMULATIONS),
}
