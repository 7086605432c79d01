"""Graded checks of lab 05, pipeline parallelism.

Each check runs the student's step function on real ranks, one stage per rank (``distlab.labs.pipeline.
run_schedules``), and compares every stage's gradients and the last stage's loss with the plain
single-process step of the same model and batch. Visible tests use the stored reference set
``VISIBLE`` (``data/05_pipeline_parallel/``); hidden tests pass ``seed=fresh_seed()`` and other
depths, world sizes and microbatch counts, and the reference is recomputed on the spot.
The schedule itself is checked from the events the stages recorded: one forward and one backward
per microbatch on every rank, GPipe's forwards all before its backwards, and 1F1B holding at most
min(p - s, m) microbatches' activations at once on stage s, alternating forward and backward after
its warm-up.
"""
from __future__ import annotations

import random

import torch

import distlab
from distlab.checks.stored import load as load_stored
from distlab.checks.assertions import CheckFailed, assert_close
from distlab.labs.pipeline import PipeSpec, ScheduleRun, partition_layers, reference_step, run_schedules

LAB = "05_pipeline_parallel"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# symbolic_shapes (with sympy, 0.3 s): about half of the ranks import it.
RANK_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)
VISIBLE = PipeSpec(num_layers=6, hidden=32, batch=8, seed=505)
ATOL, RTOL = 1e-5, 1e-4  # float32 sums taken in another order (per microbatch, then accumulated)
TIMEOUT = 30  # seconds; a correct step takes well under one


def make_references() -> dict:
    """The visible case: input, target, loss and every parameter's gradient of the whole model."""
    x, target = VISIBLE.data()
    loss, grads = reference_step(VISIBLE)
    return {"visible": {"seed": VISIBLE.seed, "x": x, "target": target,
                        "loss": torch.tensor(loss),
                        **{f"grad.{name}": g for name, g in grads.items()}}}


def _reference(spec: PipeSpec) -> tuple[float, dict[str, torch.Tensor]]:
    if spec != VISIBLE:
        return reference_step(spec)
    stored = load_stored(LAB, "visible")
    x, target = spec.data()
    # The stored inputs must be the ones the ranks draw, or the comparison means nothing.
    assert_close(x, stored["x"], what="the visible test's input batch (stored vs drawn)")
    assert_close(target, stored["target"], what="the visible test's target (stored vs drawn)")
    return stored["loss"].item(), {k.removeprefix("grad."): v for k, v in stored.items()
                                   if k.startswith("grad.")}


def _spec(seed, num_layers, batch) -> PipeSpec:
    if seed is None:
        return VISIBLE
    return PipeSpec(num_layers=num_layers, hidden=VISIBLE.hidden, batch=batch, seed=seed)


# ----------------------------------------------------------------------------- task 1


def check_partition(partition, *, seed: int | None = None) -> None:
    """``partition(num_layers, num_stages)`` must return ``num_stages`` ``(start, stop)`` pairs
    that cover ``range(num_layers)`` in order, each non-empty, sizes as equal as possible."""
    cases = [(8, 2), (8, 4), (7, 2), (10, 4), (5, 4), (4, 4), (13, 3)]
    if seed is not None:
        rng = random.Random(seed)
        cases = [(p * rng.randint(1, 6) + rng.randint(0, p - 1), p)
                 for p in (rng.randint(2, 8) for _ in range(12))]
    for num_layers, p in cases:
        what = f"partition({num_layers}, {p})"
        got = partition(num_layers, p)
        try:
            got = [(int(a), int(b)) for a, b in got]
        except (TypeError, ValueError):
            raise CheckFailed(f"{what} returned {got!r}: expected a list of (start, stop) pairs.")
        if len(got) != p:
            raise CheckFailed(f"{what} returned {len(got)} ranges: expected one per stage, {p}.")
        expected = partition_layers(num_layers, p)
        bounds = [a for a, _ in got] + [got[-1][1]]
        if bounds[0] != 0 or bounds[-1] != num_layers or any(got[s][1] != got[s + 1][0]
                                                             for s in range(p - 1)):
            raise CheckFailed(f"{what} returned {got}: the ranges must start at 0, end at "
                              f"{num_layers} and each begin where the previous one stops.")
        sizes = [b - a for a, b in got]
        if sorted(sizes) != sorted(b - a for a, b in expected):
            raise CheckFailed(f"{what} returned stage sizes {sizes}: expected sizes as equal as can "
                              f"be, e.g. {[b - a for a, b in expected]} ({num_layers} = {p} x "
                              f"{num_layers // p} + {num_layers % p} extra layers).")


# ----------------------------------------------------------------------------- tasks 2-4


def _run(fn, name, world_size, spec, m) -> ScheduleRun:
    try:
        return run_schedules({name: (fn, m)}, world_size, spec, timeout=TIMEOUT)[name]
    except distlab.HangError as err:
        raise CheckFailed(
            f"{name} did not finish on {world_size} ranks: the ranks are waiting on each other.\n"
            f"{err}\nA pipeline deadlocks when a stage waits (recv) for a message that the other "
            "stage will only send after it has itself received something: check, for each pair "
            "of neighbouring stages, that every recv has a matching send issued before the "
            "sender blocks.") from err


def _check_grads(run: ScheduleRun, spec: PipeSpec, m: int) -> None:
    loss, ref = _reference(spec)
    for rank, grads in enumerate(run.grads):
        for name, grad in grads.items():
            what = f"{run.name}: gradient of {name} (stage {rank})"
            if grad is None:
                raise CheckFailed(f"{what} on rank {rank} is None: backward never reached this "
                                  f"stage's parameters. Did rank {rank} call backward on its output?")
            hint = ""
            if m > 1 and torch.allclose(grad, ref[name] * m, atol=ATOL * m, rtol=RTOL):
                hint = (f"Your gradient is {m} x the expected one: scale each microbatch's loss "
                        f"by 1/{m}, so that the {m} backward passes add up to the batch mean.")
            assert_close(grad, ref[name], what=what, rank=rank, atol=ATOL, rtol=RTOL, hint=hint)
    if not isinstance(run.loss, (float, int)):
        raise CheckFailed(f"{run.name} returned {run.loss!r} on the last rank "
                          f"({len(run.grads) - 1}): expected the batch loss as a float (loss.item()).")
    assert_close(torch.tensor(float(run.loss)), torch.tensor(loss), rank=len(run.grads) - 1,
                 what=f"{run.name}: batch loss returned by the last stage", atol=ATOL, rtol=RTOL,
                 hint="With microbatches, return the sum of the scaled microbatch losses.")


def _check_microbatches(run: ScheduleRun, m: int) -> None:
    for rank in range(run.num_stages):
        for kind, word in (("F", "forward"), ("B", "backward")):
            got = sorted(e.mb for e in run.events if e.rank == rank and e.kind == kind)
            if got != list(range(m)):
                raise CheckFailed(
                    f"{run.name}: rank {rank} ran {len(got)} {word} pass(es) of its stage, "
                    f"expected {m}, one per microbatch. Split x and target into {m} microbatches "
                    f"(x.chunk({m})) and call the stage once per microbatch.")


def check_naive(fn, *, world_size: int = 2, seed: int | None = None, num_layers: int = 6,
                batch: int = 8) -> ScheduleRun:
    """``fn(rank, world_size, stage, x, target)``: one step of the whole batch; every stage's
    gradients and the loss equal the single-process step."""
    spec = _spec(seed, num_layers, batch)
    run = _run(fn, "naive_step", world_size, spec, None)
    _check_grads(run, spec, 1)
    _check_microbatches(run, 1)
    return run


def check_gpipe(fn, *, world_size: int = 2, num_microbatches: int = 4, seed: int | None = None,
                num_layers: int = 6, batch: int = 8) -> ScheduleRun:
    """``fn(rank, world_size, stage, x, target, num_microbatches)``: all forwards, then all
    backwards, gradients accumulated over microbatches, equal to the single-process step."""
    spec, m = _spec(seed, num_layers, batch), num_microbatches
    run = _run(fn, "gpipe_step", world_size, spec, m)
    _check_grads(run, spec, m)
    _check_microbatches(run, m)
    for rank in range(world_size):
        last_f = max(e.end for e in run.events if e.rank == rank and e.kind == "F")
        first_b = min(e.start for e in run.events if e.rank == rank and e.kind == "B")
        if first_b < last_f:
            raise CheckFailed(f"gpipe_step: rank {rank} started a backward before its last "
                              "forward ended. GPipe runs all m forwards first, then all backwards.")
    return run


def check_1f1b(fn, *, world_size: int = 2, num_microbatches: int = 4, seed: int | None = None,
               num_layers: int = 6, batch: int = 8) -> ScheduleRun:
    """``fn(rank, world_size, stage, x, target, num_microbatches)``: the 1F1B schedule; gradients
    equal the single-process step; stage s never holds more than min(p - s, m) microbatches'
    activations (measured: forward started, backward not yet finished), and after its
    min(p - s - 1, m) warm-up forwards it alternates one forward and one backward."""
    spec, m = _spec(seed, num_layers, batch), num_microbatches
    run = _run(fn, "one_f_one_b_step", world_size, spec, m)
    _check_grads(run, spec, m)
    _check_microbatches(run, m)
    for rank, alive in run.in_flight.items():
        bound = min(world_size - rank, m)
        if alive > bound:
            raise CheckFailed(
                f"one_f_one_b_step: stage {rank} (rank {rank}) held the activations of {alive} "
                f"microbatches at once; 1F1B holds at most min(p - s, m) = {bound} on stage {rank} "
                f"(PipeDream-Flush, Narayanan et al. 2021, sec. 2.2). Run only "
                f"min(p - s - 1, m) = {min(world_size - rank - 1, m)} warm-up forwards on stage "
                f"{rank}, then alternate one forward and one backward.")
    for rank in range(world_size):
        _check_alternation(run, rank, world_size, m)
    return run


def one_f_one_b_order(stage: int, world_size: int, m: int) -> str:
    """1F1B's order of passes on ``stage``: w = min(p - s - 1, m) warm-up forwards, m - w
    (forward, backward) pairs, w cool-down backwards, e.g. 'FFFBFBBB' on stage 0 of 3, m = 4."""
    w = min(world_size - stage - 1, m)
    return "F" * w + "FB" * (m - w) + "B" * w


def _check_alternation(run: ScheduleRun, rank: int, world_size: int, m: int) -> None:
    got = "".join(e.kind for e in sorted((e for e in run.events if e.rank == rank),
                                         key=lambda e: e.start))
    expected = one_f_one_b_order(rank, world_size, m)
    if got != expected:
        w = min(world_size - rank - 1, m)
        raise CheckFailed(
            f"one_f_one_b_step: stage {rank} (rank {rank}) ran its passes in the order {got} "
            f"(F forward, B backward); 1F1B runs {w} warm-up forward(s), then must alternate one "
            f"forward and one backward, then {w} cool-down backward(s): {expected}.")


def check_library_matches(runs: dict[str, ScheduleRun], spec: PipeSpec) -> None:
    """Every run (the hand-written ones and ``torch.distributed.pipelining``'s) has the
    single-process gradients."""
    for run in runs.values():
        _check_grads(run, spec, run.num_microbatches or 1)


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB5_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_partition", "check_naive", "check_gpipe", "check_1f1b"],
    CourseCode(forbidden=LAB5_SHIPPED))
# Graded on values handed in (the runs of torch's own pipelining library, made by the lab, not an answer): no course code runs on the judge's ranks for
# these, so there is nothing for a guard to notice.
GRADED_ON_VALUES = ("check_library_matches",)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
