"""Lab 11, Section 2: schedules as tables, graded on paper.

The student writes three functions that return a table (per rank, the ordered list of actions
``(op, microbatch, stage)``, ``distlab.labs.pipeline.tables``' form):
- ``interleaved_1f1b(p, m, v)``: v stages per rank, placed round-robin (stage s on rank s mod p),
  whole backwards (F and B only);
- ``zb_h1(p, m)``: one stage per rank, backward split (F, B and W);
- ``zb_v(p, m)``: stages s and 2p-1-s on rank s (``tables.v_shape``), backward split;
and ``predict_interleaved(p, m, v) -> (bubble, peak)`` before the replay shows them.

A table is valid when it runs every action once on its stage's rank and completes
(``validity.table_problem``, which names the first violated dependency). A valid table is graded
by ``replay`` with t_F = t_B = t_W (a stage of v per rank takes 1/v of a rank's time): its bubble
(idle over compute) and its peak activations (the most stage-microbatches any rank holds) must be
no worse than the expected figures. Those are the formulas of the lab's sources, computed in the
judge, which equal the replay of the course's tables and of torch's own (``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble`` at v = 1, ``ScheduleZBVZeroBubble``;
tests/test_lab11_tables.py). Where the formulas are withheld (a handout), the visible cases are
graded against torch's own tables, replayed.

Hidden cases are drawn from the test's seed over ranges too wide to keep a table for each (p up
to 16, m up to 8p, v up to 4: ``hidden_cases``); each test's first is of its special kind (m = p
for interleaving, where the warm-up is every forward; m not a multiple of p for ZB-H1; m = 2p or
2p + 1 for the V).
"""
from __future__ import annotations

import math
import random

from distlab.checks.assertions import CheckFailed
from distlab.checks.shown import joined
from distlab.labs.pipeline.schedules import replay
from distlab.labs.pipeline.tables import round_robin, v_shape
from distlab.labs.pipeline.validity import table_problem

RANK_IMPORTS = ()
REL = 1e-9   # replayed times are sums of 1/v: exact but for float rounding

VISIBLE = {"interleaved": [(4, 8, 2), (2, 4, 3)], "zb_h1": [(4, 8, 1), (2, 4, 1)],
           "zb_v": [(4, 8, 2), (2, 4, 2)], "prediction": [(4, 8, 2), (8, 16, 2), (4, 12, 3)]}
MAX_RANKS, MAX_ROUNDS, MAX_V = 16, 8, 4   # the hidden draw's ranges (m up to MAX_ROUNDS * p)
NAMES = {"interleaved": "interleaved_1f1b", "zb_h1": "zb_h1", "zb_v": "zb_v"}
TORCH = {"interleaved": "ScheduleInterleaved1F1B", "zb_h1": "ScheduleInterleavedZeroBubble",
         "zb_v": "ScheduleZBVZeroBubble"}


def placement_of(kind: str, p: int, v: int) -> list[int]:
    """The rank of each stage: round-robin (interleaved), one per rank (ZB-H1), a V."""
    return {"interleaved": lambda: round_robin(p, v), "zb_h1": lambda: list(range(p)),
            "zb_v": lambda: v_shape(p)}[kind]()


def table_figures(table, placement: list[int]) -> tuple[float, dict[int, int]]:
    """(bubble, peak per rank) of a valid table, replayed with unit times per rank."""
    v = len(placement) // (max(placement) + 1)
    r = replay(table, t_fwd=1 / v, t_bwd=1 / v, t_wgt=1 / v, placement=placement)
    return r.bubble, dict(r.peak)


def formula_figures(kind: str, p: int, m: int, v: int) -> tuple[float, int]:
    """(bubble, peak on the busiest rank) that the lab derives, for unit times."""
    if kind == "interleaved":   # PTD-P sec. 2.2; the warm-up of its schedule, plus one
        return (p - 1) / (v * m), min((v + 1) * p - 1, v * m)
    if kind == "zb_h1":         # Qi et al. 2023, sec. 2.1: (p-1)(t_F + t_B - t_W) idle per rank
        return (p - 1) / (3 * m), min(p, m)
    # the V: rank p-1 cannot start before (p-1) stage forwards; nothing else idles (m >= 2p)
    return (p - 1) / (6 * m), 2 * p


def _torch_figures(kind: str, p: int, m: int, v: int) -> tuple[float, int]:
    from distlab.labs.pipeline.torch_tables import torch_table
    table, placement = torch_table(TORCH[kind], p, m, v)
    bubble, peaks = table_figures(table, placement)
    return bubble, max(peaks.values())


def expected_figures(kind: str, p: int, m: int, v: int) -> tuple[float, int]:
    """The figures a case is graded against: the formulas (in the judge); in a handout, where
    they are withheld, torch's own table of the schedule, replayed (equal on the visible cases)."""
    try:
        return formula_figures(kind, p, m, v)
    except NotImplementedError:
        return _torch_figures(kind, p, m, v)


def _cases(kind: str, seed: int | None, count: int = 3) -> list[tuple[tuple, str]]:
    if seed is None:
        return [(case, "visible") for case in VISIBLE[kind]]
    return hidden_cases(kind, seed, count)


def hidden_cases(kind: str, seed: int, count: int = 3) -> list[tuple[tuple, str]]:
    """``count`` cases (p, m, v) drawn from ``seed``, each with what makes it special: the first
    of the test's special kind, the others anywhere in the ranges (interleaving needs m a
    multiple of p, the V m >= 2p, every schedule m >= p)."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        p = rng.randint(2, MAX_RANKS)
        if kind == "interleaved":
            v, m = rng.randint(2, MAX_V), p * (1 if k == 0 else rng.randint(1, MAX_ROUNDS))
        elif kind == "zb_h1":
            v, m = 1, (p * rng.randint(1, MAX_ROUNDS - 1) + rng.randint(1, p - 1) if k == 0
                       else rng.randint(p, MAX_ROUNDS * p))
        else:
            v, m = 2, (2 * p + rng.randint(0, 1) if k == 0 else rng.randint(2 * p, MAX_ROUNDS * p))
        out.append(((p, m, v), _special(kind, p, m)))
    return out


def _special(kind: str, p: int, m: int) -> str:
    if m == p:
        return "m = p: the warm-up is every forward" if kind == "interleaved" else "m = p"
    if kind == "zb_v" and m in (2 * p, 2 * p + 1):
        return "m = 2p" if m == 2 * p else "m = 2p + 1"
    if m % p:
        return "m not a multiple of p"
    return f"{m // p} rounds of p"


def _call(fn, kind: str, cases) -> list:
    from distlab.checks.ranks import call_each
    args = [(p, m, v) if kind == "interleaved" else (p, m) for (p, m, v), _ in cases]
    return list(call_each(fn, args, names=[_shown(kind, case) for case, _ in cases]))


def _shown(kind: str, case) -> str:
    p, m, v = case
    return f"{NAMES[kind]}({p}, {m}{f', {v}' if kind == 'interleaved' else ''})"


def grade_table(fn, kind: str, seed: int | None = None) -> str:
    """Every case's table valid, its bubble and peak no worse than the expected figures."""
    cases = _cases(kind, seed)
    answers = _call(fn, kind, cases)
    ops = "FB" if kind == "interleaved" else "FBW"
    shown = []
    for ((p, m, v), why), table in zip(cases, answers):
        call = _shown(kind, (p, m, v)) + ("" if why == "visible" else f" ({why})")
        placement = placement_of(kind, p, v)
        problem = table_problem(table, placement, m, ops)
        if problem:
            raise CheckFailed(f"{call}: {problem}{_placement_hint(kind, table, placement)}")
        bubble, peaks = table_figures(table, placement)
        want_bubble, want_peak = expected_figures(kind, p, m, v)
        peak, busiest = max(peaks.values()), max(peaks, key=peaks.get)
        per_rank = "/".join(str(peaks[r]) for r in sorted(peaks))
        if bubble > want_bubble * (1 + REL) + REL:
            raise CheckFailed(
                f"{call} is valid but idles more: bubble {bubble:.4f} of the compute, expected "
                f"{want_bubble:.4f} (peak per rank {per_rank}). {_too_idle(kind)}")
        if peak > want_peak:
            raise CheckFailed(
                f"{call} is valid but holds more: rank {busiest} holds {peak} stage-microbatches' "
                f"activations at once (per rank {per_rank}), expected at most {want_peak} "
                f"(bubble {bubble:.4f}, expected {want_bubble:.4f}). {_too_full(kind)}")
        special = "" if why == "visible" else f" ({why})"
        shown.append(f"p={p}, m={m}{f', v={v}' if kind == 'interleaved' else ''}{special}: "
                     f"bubble {bubble:.4f} (expected {want_bubble:.4f}), peak {peak} ({want_peak})")
    return joined(f"{NAMES[kind]}: valid, bubble and peak no worse than expected on {len(cases)} "
                  f"cases: ", shown)


def _placement_hint(kind: str, table, placement) -> str:
    if kind == "interleaved":
        return (" Virtual stages go round-robin: stage s on rank s mod p, so rank r holds "
                "stages r, r + p, r + 2p, ...")
    if kind == "zb_v":
        return (" In a V, rank r holds stage r and stage 2p-1-r: the second chunk runs back "
                "down the ranks, so rank 0 holds the first stage and the last.")
    return ""


def _too_idle(kind: str) -> str:
    return {"interleaved": "A rank that waits in the steady state started its first backward "
                           "with too few forwards done: count the forwards a rank runs before "
                           "its first backward.",
            "zb_h1": "Where a rank would wait for a gradient, it should run a W it held back; "
                     "a rank that defers no W idles as 1F1B does.",
            "zb_v": "Keep every rank busy: when no F or B is ready, a W is."}[kind]


def _too_full(kind: str) -> str:
    return {"interleaved": "A rank runs more forwards before its first backward than the "
                           "schedule needs: each extra one is held until its backward.",
            "zb_h1": "A rank keeps too many W waiting, or warms up with too many forwards: "
                     "activations are held from F to W.",
            "zb_v": "Stop starting forwards while a rank holds the cap."}[kind]


# ---------------------------------------------------------------------------------------------
# The graded prediction: interleaved 1F1B's bubble and peak, before the replay shows them

def interleaved_prediction_cases(seed: int | None) -> list[tuple[int, int, int]]:
    """The visible cases, or three drawn from ``seed``: p up to 16, v up to 4, m a multiple of
    p with m >= 2p."""
    if seed is None:
        return list(VISIBLE["prediction"])
    rng = random.Random(seed)
    out = []
    for _ in range(3):
        p, v = rng.randint(2, 16), rng.randint(2, 4)
        out.append((p, p * rng.randint(2, 8), v))
    return out


def grade_prediction(predict_interleaved, seed: int | None = None) -> str:
    """``predict_interleaved(p, m, v) -> (bubble, peak)`` equal to the expected figures on
    every case (bubble relative 1e-9; peak exactly)."""
    from distlab.checks.ranks import call_each
    cases = interleaved_prediction_cases(seed)
    answers = call_each(predict_interleaved, cases,
                        names=[f"predict_interleaved{case}" for case in cases])
    shown = []
    for (p, m, v), got in zip(cases, answers):
        call = f"predict_interleaved({p}, {m}, {v})"
        try:
            bubble, peak = (float(x) for x in got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.120}: return (bubble, peak), two "
                              f"numbers.") from None
        want_bubble, want_peak = expected_figures("interleaved", p, m, v)
        if not math.isclose(bubble, want_bubble, rel_tol=1e-9):
            raise CheckFailed(f"{call}: bubble {bubble:.6g}, expected {want_bubble:.6g}. "
                              + _bubble_hint(bubble, want_bubble, p, m))
        if peak != want_peak:
            raise CheckFailed(f"{call}: peak {peak:g}, expected {want_peak} stage-microbatches "
                              f"on the busiest rank. " + _peak_hint(peak, want_peak, p, v))
        shown.append(f"p={p}, m={m}, v={v}: bubble {bubble:.4f}, peak {peak:g}")
    return joined(f"predict_interleaved: your bubble and peak equal the expected figures on "
                  f"{len(cases)} cases: ", shown)


def _bubble_hint(got: float, want: float, p: int, m: int) -> str:
    if math.isclose(got, (p - 1) / m, rel_tol=1e-9):
        return ("That is 1F1B's bubble without virtual stages: with v stages per rank, how long "
                "does one stage's forward take, and how many of them fill the ramp?")
    if math.isclose(got, want / (1 + want), rel_tol=1e-9):
        return ("That is the idle share of the whole step (Lab 5's convention); the contract "
                "asks for idle time over compute time (PTD-P's).")
    return ("The bubble is the idle time summed over the ranks over their compute time; count "
            "the ramp up and down in stage-times of 1/v of a rank's forward and backward.")


def _peak_hint(got: float, want: int, p: int, v: int) -> str:
    if math.isclose(got * v, want):
        return ("That is in whole microbatches (stage-microbatches / v); the contract counts "
                "stage-microbatches.")
    if got == want - 1:
        return ("One short: while rank 0 runs its first steady-state forward, none of its "
                "warm-up microbatches has been released yet.")
    return "Count what rank 0 holds when its first backward starts: its warm-up, plus one."


# The course code these exercises may not use (distlab.checks.course_code): the course's tables,
# the greedy scheduler behind its V, the figures the checks grade against, and torch's tables.
from distlab.checks.course_code import CourseCode, names  # noqa: E402
TABLES_SHIPPED = (names("distlab.labs.pipeline.tables", "interleaved_1f1b", "zb_h1", "zb_v",
                        "greedy_table", "_ready")
                  + names(__name__, "formula_figures"))
# torch's own tables, which the lab's comparison cell reads (so the handout keeps them): handed
# in as an answer they would be a copy, not a schedule written
TORCH_TABLES = (names("distlab.labs.pipeline.torch_tables", "torch_table", "torch_schedule",
                      "from_torch")
                + names("torch.distributed.pipelining.schedules", "ScheduleInterleaved1F1B",
                        "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble",
                        "ScheduleDualPipeV"))
# Kept course code that returns those tables or figures: the guard sees only an answer's own
# calls, so a call through it (expected_figures -> formula_figures in the judge, -> torch_table in
# a handout) would look like the course's. The expected figures, and the tables stored for the
# visible case (the course's and torch's, which Section 3 runs), handed in are copies too.
THROUGH_COURSE = (names(__name__, "expected_figures", "_torch_figures")
                  + names("distlab.labs.pipeline.on_ranks", "stored_problem",
                          "stored_torch_tables", "_stored_table")
                  + names("distlab.checks.lab11_executor", "_stored_problem"))
# (distlab.checks.lab11 serves the checks: the judge serves a lab's checks from labNN alone)
COURSE_CODE = dict.fromkeys(["check_interleaved_1f1b", "check_zb_h1", "check_zb_v",
                             "check_interleaved_prediction"],
                            CourseCode(forbidden=TABLES_SHIPPED,
                                       watched=TORCH_TABLES + THROUGH_COURSE))
