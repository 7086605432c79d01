"""Lab 5's prediction and its open design exercise (called from ``distlab.checks.lab05``, which
the judge serves).

- The prediction: the bytes stage ``s`` of ``p`` sends in one step of a ``(b, h)`` float32 batch
  (its formula is the student's to find: it is in ``_boundary_bytes``'s body, which a handout
  leaves out).
- The design exercise: a schedule that holds at most ``k`` microbatches on every stage. Graded by
  its properties: the gradients (``distlab.checks.lab05``), the microbatches in flight on each
  stage (measured from the events the stages recorded), the bytes each rank sent, and the bubble
  of the order the stages actually ran, replayed on paper (t_f = 1, t_b = 2, messages free:
  ``distlab.labs.pipeline.replay``), on a scale of two tests: the first at the bubble of the
  lab's Hint 3 (1F1B with its warm-up capped at k - 1 forwards, on the same p, m, k), the
  second at a bar halfway from it to the bound no schedule beats
  (``distlab.labs.pipeline_bubble.budget_bound``, derived in the lab). The course's solution
  reaches the bar (tests/test_lab05.py); the hint's design alone does not where the two differ.

Visible tests read their expected values from ``data/05_pipeline_parallel/design.pt`` (a
student's handout has neither formula); hidden ones compute them in the judge.
"""
from __future__ import annotations

import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import design_scale
from distlab.checks.lab05_messages import course_value
from distlab.checks.ranks import call_each
from distlab.labs.pipeline import measured_bubble, recorded_orders, replay
from distlab.labs.pipeline_bubble import budget_bound, idle_per_stage

LAB = "05_pipeline_parallel"
SEED = 505
ELEMENT = 4   # float32
# The visible design cases (p, m, k) and the shape of their batch (VISIBLE: b = 8, h = 32).
DESIGN_CASES = [(4, 8, 2), (4, 4, 3)]
VISIBLE_SHAPE = (8, 32)
# The lab's measured section: 2 ranks, batch 256, width 512, m = 4 (lab05.MEASURED).
MEASURED_CASE = dict(rank=0, world_size=2, batch=256, hidden=512, num_microbatches=4)


def traffic_cases(seed: int) -> list[dict]:
    """The prediction's cases: the measured section's and, drawn from ``seed``, every kind of
    stage (first, middle, last) on 2 to 8 ranks with 1 to 16 microbatches."""
    rng = random.Random(seed)
    cases = [MEASURED_CASE, dict(MEASURED_CASE, rank=1)]
    for _ in range(8):
        p = rng.randint(2, 8)
        m = rng.choice([1, 2, 4, 8, 16])
        cases.append(dict(rank=rng.randrange(p), world_size=p, batch=m * rng.randint(1, 64),
                          hidden=rng.choice([32, 256, 512, 4096]), num_microbatches=m))
    return cases


def _boundary_bytes(rank, world_size, batch, hidden, num_microbatches) -> int:
    """The prediction's expected value: the bytes stage ``rank`` sends in one step."""
    # Its (b, h) output forward unless it is the last stage, the (b, h) gradient of its input
    # back unless it is the first; microbatching cuts each into m messages of (b/m, h) and
    # changes nothing in the sum (Huang et al. 2019, sec. 2.2; Narayanan et al. 2021, sec. 2.2).
    return batch * hidden * ELEMENT * ((rank < world_size - 1) + (rank > 0))


def _capped_order(p: int, m: int, k: int) -> list[list[tuple[str, int]]]:
    """The budget's schedule (Hint 3's design): each stage's order of ("F", i) and ("B", i),
    every microbatch once each way, never more than k microbatches alive on a stage."""
    orders = []
    for s in range(p):
        w = min(k - 1, p - s - 1, m)
        ops = [("F", i) for i in range(w)]
        for i in range(m - w):
            ops += [("F", w + i), ("B", i)]
        orders.append(ops + [("B", i) for i in range(m - w, m)])
    return orders


def _budget(p: int, m: int, k: int) -> float:
    return measured_bubble(replay(_capped_order(p, m, k)), p)


def _key(p: int, m: int, k: int) -> str:
    return f"p{p}_m{m}_k{k}"


def design_set() -> dict:
    """The visible cases' expected values, for ``data/<lab>/design.pt``."""
    traffic = [_boundary_bytes(**case) for case in traffic_cases(SEED)]
    b, h = VISIBLE_SHAPE
    out = {"seed": SEED, "traffic": torch.tensor(traffic, dtype=torch.int64)}
    for p, m, k in DESIGN_CASES:
        out[f"budget.{_key(p, m, k)}"] = torch.tensor(_budget(p, m, k), dtype=torch.float64)
        out[f"sent.{_key(p, m, k)}"] = torch.tensor([_boundary_bytes(r, p, b, h, m)
                                                     for r in range(p)], dtype=torch.int64)
    return out


def _stored() -> dict:
    from distlab.checks.stored import load
    return load(LAB, "design")


def grade_traffic(predict, seed: int | None = None) -> str:
    cases = traffic_cases(SEED if seed is None else seed)
    expected = (_stored()["traffic"].tolist() if seed is None
                else [course_value(lambda c=case: _boundary_bytes(**c),
                                what=f"the cases drawn from seed={seed}",
                                stored="the ten cases of check_predicted_traffic(predict_sent_bytes)")
                      for case in cases])
    answers = []
    calls = ["predict_sent_bytes(" + ", ".join(f"{k}={v}" for k, v in case.items()) + ")"
             for case in cases]
    got_each = call_each(predict, cases, names=calls)   # every case in one launch
    for k, (case, want, call) in enumerate(zip(cases, expected, calls)):
        got = got_each[k]   # a case that raised raises here, after the cases before it
        try:
            got = int(got)
        except (TypeError, ValueError) as err:
            raise CheckFailed(f"{call} did not return a whole number of bytes: {err}")
        if got != want:
            b, h, m = case["batch"], case["hidden"], case["num_microbatches"]
            hint = (" The number of microbatches changes how many messages go, not how many "
                    "bytes." if got == want * m or got * m == want else "")
            raise CheckFailed(
                f"{call} returned {got}, the formula gives {want}. One (b, h) float32 tensor is "
                f"b*h*4 = {b * h * ELEMENT} bytes; count which directions stage {case['rank']} "
                f"of {case['world_size']} sends in (activations forward, gradients back).{hint}")
        answers.append(got)
    return (f"predict_sent_bytes: all {len(cases)} cases ({'fixed' if seed is None else 'drawn'}; "
            f"first, middle and last stages of 2 to 8, m from 1 to 16) equal the formula; the "
            f"measured section's rank 0 and rank 1: {answers[0]} and {answers[1]} bytes")


VISIBLE_DESIGN = ", ".join(f"world_size={p}, num_microbatches={m}, max_in_flight={k}"
                           for p, m, k in DESIGN_CASES)


def bubble_budget_of(world_size: int, num_microbatches: int, max_in_flight: int,
                     visible: bool) -> float:
    """The hinted design's bubble for a case: stored for visible cases, computed (in the judge)
    else."""
    key = f"budget.{_key(world_size, num_microbatches, max_in_flight)}"
    stored = _stored() if visible else {}
    if key in stored:
        return float(stored[key])
    return course_value(_budget, world_size, num_microbatches, max_in_flight,
                     what=f"world_size={world_size}, num_microbatches={num_microbatches}, "
                          f"max_in_flight={max_in_flight}",
                     stored=VISIBLE_DESIGN)


def figures(p: int, m: int, k: int, visible: bool) -> dict[str, float]:
    """The bubbles a student's is shown beside: the hinted design's, the bar and the bound."""
    return design_scale(bubble_budget_of(p, m, k, visible), budget_bound(p, m, k))


def _sent(world_size, num_microbatches, max_in_flight, batch, hidden, visible) -> list[int]:
    key = f"sent.{_key(world_size, num_microbatches, max_in_flight)}"
    stored = _stored() if visible else {}
    if key in stored:
        return stored[key].tolist()
    return [course_value(_boundary_bytes, r, world_size, batch, hidden, num_microbatches,
                      what=f"world_size={world_size}, num_microbatches={num_microbatches}, "
                          f"max_in_flight={max_in_flight}",
                      stored=VISIBLE_DESIGN)
            for r in range(world_size)]


def _comparison(bubble: float, fig: dict[str, float]) -> str:
    return (f"bubble on paper {bubble:.3f}; Hint 3's design {fig['hinted']:.3f}, "
            f"the bar {fig['bar']:.3f}, the bound {fig['bound']:.3f}")


def grade_schedule_properties(run, *, world_size: int, num_microbatches: int, max_in_flight: int,
                              batch: int, hidden: int, visible: bool, level: str = "hinted") -> str:
    """The schedule's memory, traffic and bubble (its gradients are checked before), the bubble
    against ``level``: "hinted" (Hint 3's design) or "bar"; returns the line the test cell
    prints."""
    p, m, k, name = world_size, num_microbatches, max_in_flight, run.name
    case = f"p = {p}, m = {m}, max_in_flight = {k}"
    for rank, alive in sorted(run.in_flight.items()):
        if alive > k:
            raise CheckFailed(
                f"{name}: stage {rank} (rank {rank}) held the activations of {alive} microbatches "
                f"at once (forward started, backward not yet finished); the budget is "
                f"max_in_flight = {k} on every stage (p = {p}, m = {m}). With {k} microbatches "
                f"alive, stage {rank} must finish a backward before it starts another forward.")
    for rank, (got, want) in enumerate(zip(run.sent_bytes, _sent(p, m, k, batch, hidden,
                                                                 visible))):
        if got != want:
            raise CheckFailed(
                f"{name}: rank {rank} sent {got} bytes with send/isend in the step; a stage sends "
                f"exactly its activations forward and its input's gradients back, {want} bytes "
                f"here. Send each microbatch's output and input gradient once, nothing else.")
    orders = recorded_orders(run.events, p)
    try:
        events = replay(orders)
    except RuntimeError as err:
        raise CheckFailed(f"{name}: the order your stages ran cannot be replayed ({err}): stage s "
                          "must handle microbatches in the order stage s-1 sent them.") from None
    bubble, fig = measured_bubble(events, p), figures(p, m, k, visible)
    limit = fig[level]
    ran = "; ".join(f"stage {s}: {''.join(op for op, _ in order)}" for s, order in enumerate(orders))
    if bubble > limit + 1e-9:
        idle = idle_per_stage(events, p)
        where = ("Hint 3's design reaches it" if level == "hinted" else
                 "halfway from Hint 3's design to the bound; the course's schedule "
                 "reaches it")
        raise CheckFailed(
            f"{name} ({case}): the order your stages ran ({ran}), replayed on paper (forward "
            f"1 unit, backward 2, messages free): {_comparison(bubble, fig)}. This test's limit "
            f"is the {'budget' if level == 'hinted' else 'bar'}, {limit:.3f} ({where}). Idle "
            "units per stage: " + ", ".join(f"{s}: {v:g}" for s, v in idle.items())
            + ". Which stage's waits set the step's length, and what is it waiting for?")
    return (f"{name} ({case}): {_comparison(bubble, fig)}: within the "
            f"{'budget' if level == 'hinted' else 'bar'}; in flight per stage "
            + "/".join(str(run.in_flight[r]) for r in sorted(run.in_flight))
            + f" (cap {k}); each rank sent its boundary's bytes")


def budgets_table() -> str:
    """The visible design cases' figures, as stored (the lab prints them before the exercise):
    Hint 3's design (the first test's budget), the bar (the second's) and the bound."""
    lines = []
    for p, m, k in DESIGN_CASES:
        fig = figures(p, m, k, visible=True)
        lines.append(f"p = {p}, m = {m}, max_in_flight = {k}: bubble budget {fig['hinted']:.3f}, "
                     f"bar {fig['bar']:.3f}, bound {fig['bound']:.3f} (of the step, on paper)")
    return "\n".join(lines)
