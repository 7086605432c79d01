"""Lab 6's open design exercise (called from ``distlab.checks.lab06``, which the judge serves):
``plan_buckets(sizes, ready, alpha, bandwidth) -> [layers per bucket]``, a bucket plan for a
data-parallel backward, graded by its properties:

- on paper (``distlab.labs.timelines.buckets``): the seconds the step waits after backward for the
  last all-reduce, on a scale of two graded cells: ``test_plan_buckets`` at the hinted designs'
  figure (the better of one bucket, one bucket per layer, and the last bucket one layer: what the
  hints' questions lead to), ``test_plan_buckets_bar`` at a bar halfway from there to the bound,
  the least any plan of contiguous buckets reaches;
- on real ranks (2, gloo, the first cell only): the plan run as one flat all-reduce per bucket,
  its collective record (one all-reduce per bucket, of the bucket's bytes) and the averaged
  gradients against the single-process ones.

Both cells grade one plan: the first asks ``plan_buckets`` for it, the second takes it
(``_RUNS``, a ``common.DesignRuns``), on the same problem (a hidden one: the first cell's seed).

The visible problem is the lab's DP model with t_layer, alpha and B measured on the stored naive DP
trace (``problem_from_timeline``), stored with its budget in ``data/06_timelines/buckets.pt``;
hidden problems draw other sizes and speeds from the seed, their budget computed in the judge."""
from __future__ import annotations

import itertools
import random

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import DesignRuns, design_scale
from distlab.checks.ranks import run_each_backend
from distlab.labs.timelines.buckets import (BucketProblem, bucketed_dp_grads, exposed,
                                            problem_for, problem_from_timeline, replay_buckets)
from distlab.labs.timelines.runs import Spec, _data, _mlp_stack
from distlab.runtime.per_rank import reference

LAB = "06_timelines"
WORLD = 2


def _best_exposed(problem: BucketProblem) -> float:
    """The least exposed time over every plan of contiguous buckets (2^(L-1) of them)."""
    layers, best = len(problem.sizes), float("inf")
    for cuts in itertools.product((False, True), repeat=layers - 1):
        plan, n = [], 1
        for cut in cuts:
            if cut:
                plan.append(n)
                n = 0
            n += 1
        best = min(best, exposed(problem, plan + [n]))
    return best


def hinted_exposed(problem: BucketProblem) -> float:
    """What the hints lead to, at its best: both extremes (Hint 1) and the last bucket one layer
    alone, the rest one bucket (Hint 2)."""
    layers = len(problem.sizes)
    plans = [[layers], [1] * layers] + ([[layers - 1, 1]] if layers > 1 else [])
    return min(exposed(problem, plan) for plan in plans)


def bars(problem: BucketProblem) -> dict[str, float]:
    """The scale: the hinted designs' wait, the bar halfway from it to the bound, the bound."""
    return design_scale(hinted_exposed(problem), _best_exposed(problem))


def bucket_set(timeline) -> dict:
    """The visible problem, measured on the stored naive DP ``timeline``, and its scale."""
    problem = problem_from_timeline(timeline, Spec())
    return {"seed": Spec().seed, "sizes": torch.tensor(problem.sizes),
            "ready": torch.tensor(problem.ready, dtype=torch.float64),
            "alpha": torch.tensor(problem.alpha, dtype=torch.float64),
            "bandwidth": torch.tensor(problem.bandwidth, dtype=torch.float64),
            **{key: torch.tensor(value, dtype=torch.float64) for key, value in bars(problem).items()}}


def visible_problem() -> tuple[Spec, BucketProblem, dict[str, float]]:
    from distlab.checks.stored import load
    stored = load(LAB, "buckets")
    problem = BucketProblem(tuple(stored["sizes"].tolist()), tuple(stored["ready"].tolist()),
                            stored["alpha"].item(), stored["bandwidth"].item())
    return Spec(), problem, {key: stored[key].item() for key in ("hinted", "bar", "bound")}


def hidden_problem(seed: int) -> tuple[Spec, BucketProblem, dict[str, float]]:
    """Other sizes and speeds: alpha and a layer's transfer time each 0.2 to 2 backward layers."""
    rng = random.Random(seed)
    spec = Spec(hidden=rng.choice([16, 32, 64]), layers=rng.randint(3, 7), dp_batch=64, seed=seed)
    t_layer = 1e-3 * rng.uniform(0.5, 5)
    layer = 4 * (spec.hidden ** 2 + spec.hidden)
    problem = problem_for(spec, t_layer, t_layer * rng.uniform(0.2, 2),
                          layer / (t_layer * rng.uniform(0.2, 2)))
    return spec, problem, bars(problem)


def _timeline(problem: BucketProblem, plan) -> str:
    return "; ".join(f"bucket {k}: {b} B, {s * 1e3:.3f}..{e * 1e3:.3f} ms"
                     for k, (s, e, b) in enumerate(replay_buckets(problem, plan)))


def _scale(waited: float, scale: dict) -> str:
    return (f"waits {waited * 1e3:.3f} ms after backward; the hinted designs wait "
            f"{scale['hinted'] * 1e3:.3f} ms, the bar is {scale['bar'] * 1e3:.3f} ms, no plan of "
            f"contiguous buckets waits less than {scale['bound'] * 1e3:.3f} ms")


# The plan both tests grade, by submitted function and visible or hidden: the first test asks for
# it, the bar's test takes it (``common.DesignRuns``; a hidden problem's first seed serves both).
_RUNS = DesignRuns()


def _planned(plan_buckets, seed: int | None) -> tuple:
    """The student's plan for the problem of ``seed``, and its wait on paper: (spec, problem,
    scale, the call as the student reads it, plan, waited)."""
    spec, problem, scale = visible_problem() if seed is None else hidden_problem(seed)
    scale = {key: reference(value) for key, value in scale.items()}
    call = (f"plan_buckets(sizes={list(problem.sizes)}, ready=[{', '.join(f'{r:.6f}' for r in problem.ready)}], "
            f"alpha={problem.alpha:.3g}, bandwidth={problem.bandwidth:.3g})")
    plan = plan_buckets(list(problem.sizes), list(problem.ready), problem.alpha, problem.bandwidth)
    try:
        waited = exposed(problem, plan)
    except ValueError as err:
        raise CheckFailed(f"{call} returned an unusable plan: {err}") from None
    return spec, problem, scale, call, [int(n) for n in plan], waited


def grade_bucket_plan(plan_buckets, seed: int | None = None, level: str = "hinted") -> str:
    """``level`` "hinted": the wait at most the hinted designs' and the plan run on ranks;
    "bar": the first test's plan (``_RUNS``), its wait at most the bar (the ranks ran in the
    first cell)."""
    spec, problem, scale, call, plan, waited = _RUNS.run(
        plan_buckets, (seed is None,), lambda: _planned(plan_buckets, seed),
        first=level == "hinted")
    budget = scale[level]
    if waited > budget * (1 + 1e-9) + 1e-12:
        further = ("" if level == "hinted" else " The hinted designs are not the best a plan "
                   "can do here: which cut, moved by one layer, shortens the wait, and how would "
                   "you know you have tried them all?")
        raise CheckFailed(
            f"{call} returned {plan}: the step {_scale(waited, scale)} (backward ends at "
            f"{problem.ready[-1] * 1e3:.3f} ms; {_timeline(problem, plan)}). This test's budget "
            f"is the {'hinted designs' if level == 'hinted' else 'bar'}: "
            f"{budget * 1e3:.3f} ms. Each bucket pays alpha once; a bucket that waits for late "
            f"layers hides nothing: where should the cuts go?{further}")
    if level == "bar":
        return f"plan {plan}: the step {_scale(waited, scale)}: within the bar"
    starts = [sum(plan[:k]) for k in range(len(plan))]
    want = [sum(problem.sizes[a:a + n]) for a, n in zip(starts, plan)]
    model = _mlp_stack(spec)
    model(_data(spec, spec.dp_batch, spec.hidden)).square().mean().backward()
    expected = reference({name: p.grad for name, p in model.named_parameters()})
    for backend, out in run_each_backend(bucketed_dp_grads, WORLD, spec, plan):
        for rank in range(WORLD):
            got = [c.bytes for c in out.comms[rank] if c.op == "all_reduce"]
            if got != want:
                raise CheckFailed(f"plan {plan} on rank {rank} ({backend}): all-reduces of {got} "
                                  f"bytes, expected one per bucket, {want}.")
            for name, grad in expected.items():
                assert_close(out[rank][name], grad, what=f"averaged gradient of {name}",
                             rank=rank)
    return (f"plan {plan}: the step {_scale(waited, scale)}; on {WORLD} ranks, {len(plan)} "
            f"all-reduces of {want} bytes, gradients equal to the single-process ones")
