"""Lab 5's prediction and its open design exercise (called from ``distlab.checks.lab05``, which
the judge serves).

- The prediction: the bytes stage ``s`` of ``p`` sends in one step of a ``(b, h)`` float32 batch.
  Each boundary carries the activation forward and its gradient back, one ``(b/m, h)`` message
  per microbatch: ``b*h*4`` bytes per direction, whatever ``m`` (Huang et al. 2019, sec. 2.2;
  Narayanan et al. 2021, sec. 2.2). Stage 0 sends only forward, the last stage only backward.
- The design exercise: a schedule that holds at most ``k`` microbatches on every stage. Graded by
  its properties: the gradients (``distlab.checks.lab05``), the microbatches in flight on each
  stage (measured from the events the stages recorded), the bytes each rank sent, and the bubble
  of the order the stages actually ran, replayed on paper (t_f = 1, t_b = 2, messages free:
  ``distlab.labs.pipeline.replay``) against a budget: the bubble of 1F1B with its warm-up capped
  at k - 1 forwards, on the same p, m, k (what the course's schedule reaches; yours may beat it).

Visible tests read their expected values from ``data/05_pipeline_parallel/design.pt`` (a
student's handout has neither formula); hidden ones compute them in the judge.
"""
from __future__ import annotations

import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.labs.pipeline import measured_bubble, recorded_orders, replay
from distlab.labs.pipeline_bubble import idle_per_stage

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
    """Bytes stage ``rank`` sends in one step: its ``(b, h)`` output forward unless it is the
    last stage, the ``(b, h)`` gradient of its input back unless it is the first; microbatching
    cuts each into m messages of ``(b/m, h)`` and changes nothing in the sum."""
    return batch * hidden * ELEMENT * ((rank < world_size - 1) + (rank > 0))


def _capped_order(p: int, m: int, k: int) -> list[list[tuple[str, int]]]:
    """1F1B with stage s's warm-up capped at min(k - 1, p - s - 1, m) forwards: the budget's
    schedule, never more than k microbatches alive on a stage."""
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


def grade_traffic(predict, seed: int | None = None) -> None:
    cases = traffic_cases(SEED if seed is None else seed)
    expected = (_stored()["traffic"].tolist() if seed is None
                else [_boundary_bytes(**case) for case in cases])
    for case, want in zip(cases, expected):
        call = "predict_sent_bytes(" + ", ".join(f"{k}={v}" for k, v in case.items()) + ")"
        try:
            got = predict(**case)
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


def bubble_budget_of(world_size: int, num_microbatches: int, max_in_flight: int,
              visible: bool) -> float:
    """The bubble budget of a case: stored for visible cases, computed (in the judge) else."""
    key = f"budget.{_key(world_size, num_microbatches, max_in_flight)}"
    stored = _stored() if visible else {}
    return float(stored[key]) if key in stored else _budget(world_size, num_microbatches,
                                                            max_in_flight)


def _sent(world_size, num_microbatches, max_in_flight, batch, hidden, visible) -> list[int]:
    key = f"sent.{_key(world_size, num_microbatches, max_in_flight)}"
    stored = _stored() if visible else {}
    if key in stored:
        return stored[key].tolist()
    return [_boundary_bytes(r, world_size, batch, hidden, num_microbatches)
            for r in range(world_size)]


def grade_schedule_properties(run, *, world_size: int, num_microbatches: int, max_in_flight: int,
                     batch: int, hidden: int, visible: bool) -> str:
    """The schedule's memory, traffic and bubble (its gradients are checked before); returns the
    line the test cell prints."""
    p, m, k, name = world_size, num_microbatches, max_in_flight, run.name
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
    bubble, budget = measured_bubble(events, p), bubble_budget_of(p, m, k, visible)
    ran = "; ".join(f"stage {s}: {''.join(op for op, _ in order)}" for s, order in enumerate(orders))
    if bubble > budget + 1e-9:
        idle = idle_per_stage(events, p)
        raise CheckFailed(
            f"{name}: the order your stages ran ({ran}), replayed on paper (forward 1 unit, "
            f"backward 2, messages free), idles {bubble:.3f} of the step; the budget for p = {p}, "
            f"m = {m}, max_in_flight = {k} is {budget:.3f}. Idle units per stage: "
            + ", ".join(f"{s}: {v:g}" for s, v in idle.items())
            + ". A stage idles while it waits for its first gradient: within the cap, what could "
            "it run before that arrives?")
    return (f"{name} (p = {p}, m = {m}, at most {k} in flight): bubble on paper {bubble:.3f} "
            f"<= budget {budget:.3f}; in flight per stage "
            + "/".join(str(run.in_flight[r]) for r in sorted(run.in_flight)))


def budgets_table() -> str:
    """The visible design cases' budgets, as stored (the lab prints them before the exercise)."""
    stored = _stored()
    return "\n".join(f"p = {p}, m = {m}, max_in_flight = {k}: bubble budget "
                     f"{float(stored[f'budget.{_key(p, m, k)}']):.3f} of the step (on paper)"
                     for p, m, k in DESIGN_CASES)
