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

import os
import random

import torch

import distlab
from distlab.checks.stored import load as load_stored
from distlab.checks.assertions import CheckFailed, assert_close, recording
from distlab.checks.common import DesignRuns
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.ranks import call_each
from distlab.checks.lab05_messages import assert_equal_split, course_value, deadlock_advice
from distlab.checks.lab05_order import _check_alternation, _check_microbatches, one_f_one_b_order  # noqa: F401
from distlab.labs.pipeline import (Event, PipeSpec, ScheduleRun, grad_error, partition_layers,
                                   reference_step, run_schedules)
from distlab.runtime.per_rank import reference

LAB = "05_pipeline_parallel"
# What the ranks import beyond torch.distributed (distlab/checks/__init__.py): about half, 0.3 s.
RANK_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)
VISIBLE = PipeSpec(num_layers=6, hidden=32, batch=8, seed=505)
# Hidden tests' width: a stage's activations are then KiBs, so that moving them outside the
# collective record crosses more than the record's allowance for headers (distlab.checks.crossed).
HIDDEN_WIDTH = 256
ATOL, RTOL = 1e-5, 1e-4  # float32 sums taken in another order (per microbatch, then accumulated)
TIMEOUT = 30  # seconds; a correct step takes well under one


PARTITION_CASES = [(8, 2), (8, 4), (7, 2), (10, 4), (5, 4), (4, 4), (13, 3)]
# The visible tests' stage cuts: VISIBLE's layers on the visible tests' world sizes.
VISIBLE_CUTS = [(VISIBLE.num_layers, 2), (VISIBLE.num_layers, 4)]
# The lab's measured section: torch.distributed.pipelining's schedules on this model, stored.
MEASURED = PipeSpec(num_layers=8, hidden=512, batch=256, seed=0)
LIBRARY = {"torch GPipe": "ScheduleGPipe", "torch 1F1B": "Schedule1F1B"}
LIBRARY_M, LIBRARY_P = 4, 2


def make_references() -> dict:
    """The visible case: input, target, loss and every parameter's gradient of the whole model;
    the layer ranges of the visible partitions and stage cuts; and the library's runs of the lab's
    measured section (``stored_library_runs``)."""
    from distlab.checks.lab05_design import design_set   # the prediction's and design's values
    x, target = VISIBLE.data()
    loss, grads = reference_step(VISIBLE)
    return {"visible": {"seed": VISIBLE.seed, "x": x, "target": target,
                        "loss": torch.tensor(loss),
                        **{f"grad.{name}": g for name, g in grads.items()}},
            "partition": {"seed": VISIBLE.seed,
                          **{_cut_key(n, p): torch.tensor(partition_layers(n, p))
                             for n, p in PARTITION_CASES + VISIBLE_CUTS}},
            "library": _library_set(),
            "design": design_set()}


def _cut_key(num_layers: int, num_stages: int) -> str:
    return f"L{num_layers}_p{num_stages}"


def _expected_partition(num_layers: int, num_stages: int,
                        stored: dict | None = None) -> list[tuple[int, int]]:
    """The course's layer ranges: stored for the visible cases (a student's handout has no
    ``partition_layers``), computed for others (in the judge, which has it). Stored cuts serve
    hidden cases too: a cut depends on the layers and stages, not on the seed. ``stored``: the
    set, when a check reads it for many cases."""
    stored = load_stored(LAB, "partition") if stored is None else stored
    if _cut_key(num_layers, num_stages) not in stored:
        return course_value(partition_layers, num_layers, num_stages,
                       what=f"{num_layers} layers on {num_stages} stages",
                       stored="layers and world sizes " + ", ".join(
                           f"({n}, {p})" for n, p in PARTITION_CASES + VISIBLE_CUTS))
    stored = stored[_cut_key(num_layers, num_stages)]
    return [(int(a), int(b)) for a, b in stored.tolist()]


def _library_set() -> dict:
    """``torch.distributed.pipelining``'s GPipe and 1F1B on ``MEASURED`` (2 ranks, m = 4, one
    warm-up step): events, times, memory, bytes and gradient error, as tensors. Runs are
    measurements, not reproducible: the stored set is kept (``differences`` then finds nothing)
    unless DISTLAB_RERECORD=1 or it is missing, and is then measured afresh on this machine."""
    if os.environ.get("DISTLAB_RERECORD") != "1":
        try:
            return {"seed": MEASURED.seed, **load_stored(LAB, "library")}
        except (FileNotFoundError, ValueError):
            pass
    from distlab.labs.pipeline import library_step
    runs = run_schedules({name: (library_step(s), LIBRARY_M) for name, s in LIBRARY.items()},
                         LIBRARY_P, MEASURED, warmup=1)
    check_library_matches(runs, MEASURED)
    out = {"seed": MEASURED.seed}
    for name, run in runs.items():
        out.update({
            f"{name}.events": torch.tensor([[e.rank, e.mb, "FB".index(e.kind), e.start, e.end]
                                            for e in run.events], dtype=torch.float64),
            f"{name}.step_time": torch.tensor(run.step_time, dtype=torch.float64),
            f"{name}.loss": torch.tensor(run.loss, dtype=torch.float64),
            f"{name}.activation_bytes": torch.tensor(run.activation_bytes),
            f"{name}.sent_bytes": torch.tensor(run.sent_bytes),
            f"{name}.grad_error": torch.tensor(grad_error(run, MEASURED), dtype=torch.float64)})
    return out


def stored_library_runs() -> dict[str, ScheduleRun]:
    """``torch.distributed.pipelining``'s GPipe and 1F1B (``library_step``) on the lab's measured
    model, 2 ranks, m = 4, as the course's machine recorded them when the references were made
    (gradients left out: each run carries its largest gradient error instead). A student's handout
    has no ``library_step``: it would answer Exercises 3 and 4."""
    stored = load_stored(LAB, "library")
    runs = {}
    for name in LIBRARY:
        events = [Event(rank=int(r), mb=int(mb), kind="FB"[int(k)], start=float(s), end=float(e))
                  for r, mb, k, s, e in stored[f"{name}.events"].tolist()]
        runs[name] = ScheduleRun(
            name=name, num_stages=LIBRARY_P, num_microbatches=LIBRARY_M, grads=[],
            loss=stored[f"{name}.loss"].item(), events=events,
            step_time=stored[f"{name}.step_time"].item(),
            activation_bytes=stored[f"{name}.activation_bytes"].tolist(),
            sent_bytes=stored[f"{name}.sent_bytes"].tolist(),
            grad_error=stored[f"{name}.grad_error"].item())
    return runs


def _reference(spec: PipeSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """The single-process step of a hidden test's ``spec``, computed in the judge (and marked:
    no rank may receive it)."""
    return reference(reference_step(spec))


def _expected(spec: PipeSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and gradients a step of ``spec`` must give: stored for the visible test (a
    student's handout has no reference step), computed for hidden ones."""
    if spec != VISIBLE:
        return course_value(_reference, spec, what=f"seed={spec.seed} ({spec.num_layers} layers, "
                       f"batch {spec.batch})", stored=f"the model and batch of seed {VISIBLE.seed} "
                       f"(no seed argument), on 2 or 4 ranks")
    stored = load_stored(LAB, "visible")
    x, target = spec.data()
    # The stored inputs must be the ones the ranks get, or the comparison means nothing.
    with recording():   # not the student's figures: kept out of the passing line
        assert_close(x, stored["x"], what="the visible test's input batch (stored vs drawn)")
        assert_close(target, stored["target"], what="the visible test's target (stored vs drawn)")
    return reference((stored["loss"].item(), {k.removeprefix("grad."): v for k, v in stored.items()
                                              if k.startswith("grad.")}))


def _spec(seed, num_layers, batch) -> PipeSpec:
    if seed is None:
        return VISIBLE
    return PipeSpec(num_layers=num_layers, hidden=HIDDEN_WIDTH, batch=batch, seed=seed)


# ----------------------------------------------------------------------------- task 1


def check_partition(partition, *, seed: int | None = None) -> str:
    """``partition(num_layers, num_stages)`` must return ``num_stages`` ``(start, stop)`` pairs
    that cover ``range(num_layers)`` in order, each non-empty, sizes as equal as possible."""
    cases = PARTITION_CASES
    if seed is not None:
        rng = random.Random(seed)
        cases = [(p * rng.randint(1, 6) + rng.randint(0, p - 1), p)
                 for p in (rng.randint(2, 8) for _ in range(12))]
    answers = {}
    got_each = call_each(partition, cases)   # every case in one launch, not one a call
    stored = load_stored(LAB, "partition")
    for k, (num_layers, p) in enumerate(cases):
        what = f"partition({num_layers}, {p})"
        got = got_each[k]   # a case that raised raises here, after the cases before it
        try:
            got = [(int(a), int(b)) for a, b in got]
        except (TypeError, ValueError):
            raise CheckFailed(f"{what} returned {got!r}: expected a list of (start, stop) pairs.")
        if len(got) != p:
            raise CheckFailed(f"{what} returned {len(got)} ranges: expected one per stage, {p}.")
        expected = _expected_partition(num_layers, p, stored)
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
        answers[num_layers, p] = got
    (L, p), got = max(answers.items(), key=lambda c: (c[0][0] % c[0][1] > 0, c[0]))  # uneven, largest
    return (f"partition: {len(cases)} cuts, each into p contiguous ranges covering range(L), sizes as equal "
            f"as can be; e.g. your partition({L}, {p}) = {got}: sizes {'/'.join(str(b - a) for a, b in got)} "
            f"for {L}/{p} = {L / p:.3g}")


# ----------------------------------------------------------------------------- tasks 2-4


def _run(fn, name, world_size, spec, m) -> ScheduleRun:
    # The stage cut is computed here and reaches the ranks as data: the ranks that run a
    # student's step hold the student's package, without partition_layers.
    bounds = _expected_partition(spec.num_layers, world_size)
    try:
        return run_schedules({name: (fn, m)}, world_size, spec, bounds=bounds, timeout=TIMEOUT,
                             check=lambda out: assert_crossed_as_recorded(out, name))[name]
    except distlab.HangError as err:
        raise CheckFailed(f"{name} did not finish on {world_size} ranks: the ranks are waiting "
                          f"on each other.\n{err}\n{deadlock_advice(str(err))}") from err


def _check_grads(run: ScheduleRun, spec: PipeSpec, m: int) -> None:
    loss, ref = _expected(spec)
    for rank, grads in enumerate(run.grads):
        for name, grad in grads.items():
            what = f"{run.name}: gradient of {name} (stage {rank})"
            if grad is None:
                raise CheckFailed(f"{what} on rank {rank} is None: backward never reached this "
                                  f"stage's parameters. Did rank {rank} call backward on its output?")
            try:
                assert_close(grad, ref[name], what=what, rank=rank, atol=ATOL, rtol=RTOL)
            except CheckFailed:   # the hint is looked for on a failure only
                if not (m > 1 and isinstance(grad, torch.Tensor) and grad.shape == ref[name].shape
                        and torch.allclose(grad, ref[name] * m, atol=ATOL * m, rtol=RTOL)):
                    raise
                assert_close(grad, ref[name], what=what, rank=rank, atol=ATOL, rtol=RTOL,
                             hint=f"Your gradient is {m} x the expected one: scale each microbatch's "
                                  f"loss by 1/{m}, so that the {m} backward passes add up to the batch mean.")
    if not isinstance(run.loss, (float, int)):
        raise CheckFailed(f"{run.name} returned {run.loss!r} on the last rank "
                          f"({len(run.grads) - 1}): expected the batch loss as a float (loss.item()).")
    assert_close(torch.tensor(float(run.loss)), torch.tensor(loss), rank=len(run.grads) - 1,
                 what=f"{run.name}: batch loss returned by the last stage", atol=ATOL, rtol=RTOL,
                 hint="With microbatches, return the sum of the scaled microbatch losses.")


def check_naive(fn, *, world_size: int = 2, seed: int | None = None, num_layers: int = 6,
                batch: int = 8) -> ScheduleRun:
    """``fn(rank, world_size, stage, x, target)``: one step of the whole batch; every stage's
    gradients and the loss equal the single-process step."""
    spec = _spec(seed, num_layers, batch)
    run = _run(fn, "naive_step", world_size, spec, None)
    _check_grads(run, spec, 1)
    _check_microbatches(run, 1, spec.batch)
    return run


def check_gpipe(fn, *, world_size: int = 2, num_microbatches: int = 4, seed: int | None = None,
                num_layers: int = 6, batch: int = 8) -> ScheduleRun:
    """``fn(rank, world_size, stage, x, target, num_microbatches)``: all forwards, then all
    backwards, gradients accumulated over microbatches, equal to the single-process step."""
    spec, m = _spec(seed, num_layers, batch), num_microbatches
    assert_equal_split(spec.batch, m)
    run = _run(fn, "gpipe_step", world_size, spec, m)
    _check_grads(run, spec, m)
    _check_microbatches(run, m, spec.batch)
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
    assert_equal_split(spec.batch, m)
    run = _run(fn, "one_f_one_b_step", world_size, spec, m)
    _check_grads(run, spec, m)
    _check_microbatches(run, m, spec.batch)
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


# ----------------------------------------------------------------------------- prediction, design


def check_predicted_traffic(predict_sent_bytes, *, seed: int | None = None) -> str:
    """``predict_sent_bytes(rank, world_size, batch, hidden, num_microbatches)``: the bytes the
    stage sends in one step, against the formula (``lab05_design``) on fixed and fresh cases.
    Returns the line the test cell prints."""
    from distlab.checks.lab05_design import grade_traffic
    return grade_traffic(predict_sent_bytes, seed)


_RUNS = DesignRuns()   # the two design tests grade one run (one hidden problem, not two)


def _design_run(fn, world_size, num_microbatches, max_in_flight, seed, num_layers, batch, level):
    import functools
    from distlab.checks.lab05_design import grade_schedule_properties
    m = num_microbatches

    def measure():
        spec = _spec(seed, num_layers, batch)
        assert_equal_split(spec.batch, m)
        step = functools.partial(fn, max_in_flight=max_in_flight)
        return spec, _run(step, "budget_step", world_size, spec, m)
    spec, run = _RUNS.run(fn, (world_size, m, max_in_flight, seed, num_layers, batch), measure,
                          first=level == "hinted")
    _check_grads(run, spec, m)
    _check_microbatches(run, m, spec.batch)
    return grade_schedule_properties(run, world_size=world_size, num_microbatches=m,
                                     max_in_flight=max_in_flight, batch=spec.batch,
                                     hidden=spec.hidden, visible=spec == VISIBLE, level=level)


def check_memory_budget(fn, *, world_size: int = 4, num_microbatches: int = 8,
                        max_in_flight: int = 2, seed: int | None = None, num_layers: int = 6,
                        batch: int = 8) -> str:
    """The open design exercise, its first test: ``fn(rank, world_size, stage, x, target,
    num_microbatches, max_in_flight)``, a schedule of the student's own. Graded by its properties
    on real ranks: single-process gradients, at most ``max_in_flight`` microbatches alive on every
    stage, the boundary's bytes and no more, and a bubble (its recorded order replayed on paper)
    within Hint 3's design's. Returns the test cell's line: the bubble beside the figures."""
    return _design_run(fn, world_size, num_microbatches, max_in_flight, seed, num_layers, batch,
                       "hinted")


def check_bubble_bar(fn, *, world_size: int = 4, num_microbatches: int = 8,
                     max_in_flight: int = 2, seed: int | None = None, num_layers: int = 6,
                     batch: int = 8) -> str:
    """The open design exercise, its second test: as ``check_memory_budget``, with the bubble
    within the bar, halfway from Hint 3's design to the bound no schedule beats
    (``distlab.labs.pipeline_bubble.budget_bound``)."""
    return _design_run(fn, world_size, num_microbatches, max_in_flight, seed, num_layers, batch,
                       "bar")


def design_budgets() -> str:
    """The design exercise's visible budgets, for the lab to print (stored)."""
    from distlab.checks.lab05_design import budgets_table
    return budgets_table()


def check_library_matches(runs: dict[str, ScheduleRun], spec: PipeSpec) -> None:
    """Every run (the hand-written ones and ``torch.distributed.pipelining``'s) has the
    single-process gradients."""
    for run in runs.values():
        _check_grads(run, spec, run.num_microbatches or 1)


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB5_SHIPPED, CourseCode, names  # noqa: E402
# The prediction's formula and the design budget's schedule are answers too.
DESIGN = names("distlab.checks.lab05_design", "_boundary_bytes", "_capped_order")
COURSE_CODE = dict.fromkeys([
    "check_partition", "check_naive", "check_gpipe", "check_1f1b", "check_predicted_traffic",
    "check_memory_budget", "check_bubble_bar"],
    CourseCode(forbidden=LAB5_SHIPPED + DESIGN))
# Graded on values handed in (runs of torch's pipelining, made by the lab): nothing to guard.
GRADED_ON_VALUES = ("check_library_matches",)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
