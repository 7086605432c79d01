"""Running schedules on real ranks, one stage per rank: the student's step functions or
``torch.distributed.pipelining``'s (``library_step``), with gradients, events, timings, activation
memory and bytes sent per rank (``ScheduleRun``), and a table of them."""
from __future__ import annotations

import copy
import dataclasses
import functools
import time

import torch
import torch.distributed as dist

from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.model import PipeSpec, partition_layers, reference_step, stage_layers
from distlab.labs.pipeline.stages import Event, TimedStage, measured_bubble, peak_in_flight, theoretical_bubble
from distlab.labs.tables import residue
from distlab.runtime.devices import device as rank_device

def library_step(schedule: str):
    """A step function that runs ``torch.distributed.pipelining``'s ``schedule`` ("ScheduleGPipe",
    "Schedule1F1B", ...) on the same stage, with the same signature as the hand-written ones."""
    return functools.partial(_library_step, schedule)


def _library_step(schedule, rank, world_size, stage, x, target, num_microbatches):
    from torch.distributed import pipelining
    key = (schedule, num_microbatches)
    if getattr(stage, "_library", (None,))[0] != key:
        # Built once per stage: the first step infers shapes with an extra forward and backward,
        # which a warm-up step absorbs; later steps reuse the buffers.
        pstage = pipelining.PipelineStage(stage, rank, world_size, x.device)
        # scale_grads=True divides the summed microbatch grads by m, matching loss_fn's mean
        stage._library = (key, getattr(pipelining, schedule)(
            pstage, n_microbatches=num_microbatches, loss_fn=loss_fn, scale_grads=True))
    sched = stage._library[1]
    if rank == 0:
        sched.step(x)
    elif rank == world_size - 1:
        losses = []
        sched.step(target=target, losses=losses)
        return torch.stack(losses).mean().item()
    else:
        sched.step()
    return None


@dataclasses.dataclass
class ScheduleRun:
    """One schedule measured on real ranks: ``grads[rank]`` (global parameter names), the loss
    returned by the last rank, the events of the timed step on every rank, its wall time, each
    rank's peak activation bytes and the bytes each rank sent (send/isend) during that step."""
    name: str
    num_stages: int
    num_microbatches: int | None
    grads: list[dict[str, torch.Tensor]]
    loss: float | None
    events: list[Event]
    step_time: float
    activation_bytes: list[int]
    sent_bytes: list[int]
    # A run stored with the course (``grads`` left out): the largest difference of its gradients
    # from the single-process step, measured when it was recorded.
    grad_error: float | None = None
    # With several timed steps: each one's wall time and bubble (``events`` and ``step_time``
    # are then the median step's, by time); one step's time alone is noise on a shared CPU.
    step_times: list[float] = dataclasses.field(default_factory=list)
    step_bubbles: list[float] = dataclasses.field(default_factory=list)

    @property
    def bubble(self) -> float:
        return measured_bubble(self.events, self.num_stages)

    @property
    def in_flight(self) -> dict[int, int]:
        return peak_in_flight(self.events)

    @property
    def theory(self) -> float:
        return theoretical_bubble(self.num_stages, self.num_microbatches or 1)


def _call(fn, rank, world_size, stage, x, target, m):
    return fn(rank, world_size, stage, x, target) if m is None else \
        fn(rank, world_size, stage, x, target, m)


def _rank_schedules(rank, world_size, inputs, schedules, warmup, steps=1):
    """On each rank: copy this rank's stage (``inputs``: its layers, and the batch with what the
    stage must not read NaN) once per schedule, run ``warmup`` untimed steps and ``steps``
    timed ones, and return what ``ScheduleRun`` needs (the last step's gradients, every timed
    step's events and times)."""
    device = rank_device()
    layers, x, target = inputs
    layers = layers.to(device)
    x, target = x.to(device), target.to(device)
    results = {}
    for name, (fn, m) in schedules.items():
        stage = TimedStage(copy.deepcopy(layers), rank)
        timed = []
        for step in range(warmup + steps):
            stage.zero_grad(set_to_none=True)
            stage.reset()
            dist.barrier()  # all ranks start the step together
            start = time.perf_counter()
            loss = _call(fn, rank, world_size, stage, x, target, m)
            end = time.perf_counter()
            if step >= warmup:
                timed.append(dict(events=list(stage.events), start=start, end=end,
                                  act=stage.peak_activation_bytes))
        grads = {n: p.grad.detach().cpu() if p.grad is not None else None
                 for n, p in stage.layers.named_parameters()}
        results[name] = dict(grads=grads, loss=loss, steps=timed)
    return results


def run_schedules(schedules: dict, world_size: int, spec: PipeSpec = PipeSpec(), *,
                  bounds: list[tuple[int, int]] | None = None, warmup: int = 0, steps: int = 1,
                  timeout: float = 60, check=None) -> dict[str, ScheduleRun]:
    """Run each schedule on ``world_size`` ranks, one stage per rank, in a single launch.

    ``schedules`` maps a name to ``(step_fn, num_microbatches)``; ``step_fn(rank, world_size,
    stage, x, target[, num_microbatches])`` runs one training step on its rank (the
    ``num_microbatches`` argument is left out when it is None) and returns the loss on the last
    rank. ``stage`` is this rank's ``TimedStage``; ``x`` and ``target`` have the whole batch's
    shape on every rank, but only stage 0 gets ``x``'s values and only the last stage
    ``target``'s (elsewhere they are NaN: a stage reads only what its position gives it).

    ``bounds``: the ``(start, stop)`` layers of every stage, e.g. your ``partition(L, p)``;
    computed here, never on the ranks, which receive them as data. Without them,
    ``partition_layers``'s (not in a student's handout of Lab 5: pass your own).
    ``steps`` timed steps follow ``warmup`` untimed ones; the run keeps the median step's
    events and time, and every step's time and bubble (``step_times``, ``step_bubbles``).
    ``check(out)``, if given, sees the ranks' results first (a grader's: that their records
    account for what crossed, before the sent bytes are read from them).
    """
    import distlab
    bounds = _checked_bounds(bounds if bounds is not None else
                             partition_layers(spec.num_layers, world_size),
                             spec.num_layers, world_size)
    out = distlab.run(_rank_schedules, world_size, _stage_inputs(spec, world_size, bounds),
                      schedules, warmup, steps, timeout=timeout)
    if check is not None:
        check(out)
    return {name: _schedule_run(name, m, out, world_size) for name, (_, m) in schedules.items()}


def _schedule_run(name: str, m: int | None, out, world_size: int) -> ScheduleRun:
    """One schedule's ``ScheduleRun`` from every rank's timed steps: the median step by time."""
    per_rank = [out[r][name] for r in range(world_size)]
    steps = []
    for k in range(len(per_rank[0]["steps"])):
        step = [r["steps"][k] for r in per_rank]
        start, end = min(s["start"] for s in step), max(s["end"] for s in step)
        events = [e for s in step for e in s["events"]]
        steps.append(dict(time=end - start, events=events, act=[s["act"] for s in step],
                          sent=[sum(c.bytes for c in out.comms[r] if c.op in ("send", "isend")
                                    and step[r]["start"] <= c.start <= step[r]["end"])
                                for r in range(world_size)]))
    median = sorted(steps, key=lambda s: s["time"])[(len(steps) - 1) // 2]
    return ScheduleRun(
        name=name, num_stages=world_size, num_microbatches=m,
        grads=[r["grads"] for r in per_rank], loss=per_rank[-1]["loss"],
        events=median["events"], step_time=median["time"], activation_bytes=median["act"],
        sent_bytes=median["sent"], step_times=[s["time"] for s in steps],
        step_bubbles=[measured_bubble(s["events"], world_size) for s in steps])


def _stage_inputs(spec: PipeSpec, world_size: int, bounds: list[tuple[int, int]]):
    """What each rank gets, made here (never from the seed on the ranks): its stage's layers,
    and the batch's shape with only what its stage reads: ``x`` on the first stage, ``target``
    on the last, NaN elsewhere. A rank cannot run the whole model, nor see the other end."""
    from distlab.runtime.per_rank import PerRank
    model, (x, target) = spec.model(), spec.data()
    blind = torch.full_like(x, float("nan"))
    return PerRank([(stage_layers(model, r, world_size, bounds),
                     x if r == 0 else blind, target if r == world_size - 1 else blind)
                    for r in range(world_size)])


def _checked_bounds(bounds, num_layers: int, world_size: int) -> list[tuple[int, int]]:
    """``bounds`` as plain ``(start, stop)`` pairs, or a ValueError saying what is wrong."""
    try:
        bounds = [(int(a), int(b)) for a, b in bounds]
    except (TypeError, ValueError):
        raise ValueError(f"bounds={bounds!r}: expected a list of (start, stop) pairs, one per "
                         f"stage, as partition({num_layers}, {world_size}) returns.") from None
    if (len(bounds) != world_size or bounds[0][0] != 0 or bounds[-1][1] != num_layers
            or any(a >= b for a, b in bounds)
            or any(bounds[s][1] != bounds[s + 1][0] for s in range(world_size - 1))):
        raise ValueError(f"bounds={bounds}: expected {world_size} non-empty ranges, one per "
                         f"stage, from 0 to {num_layers}, each beginning where the previous one "
                         f"stops. Check your partition({num_layers}, {world_size}).")
    return bounds


def grad_error(run: ScheduleRun, spec: PipeSpec | None = None,
               reference: dict[str, torch.Tensor] | None = None) -> float:
    """The largest absolute difference between ``run``'s gradients and ``reference`` (name ->
    gradient), by default the single-process ones of ``spec``; a stored run's own figure."""
    if run.grad_error is not None:
        return run.grad_error
    ref = reference if reference is not None else reference_step(spec)[1]
    return max((g - ref[n]).abs().max().item() if g is not None else float("inf")
               for grads in run.grads for n, g in grads.items())


def schedule_table(runs: dict[str, ScheduleRun], spec: PipeSpec | None = None, *,
                   baseline: str | None = None) -> str:
    """One row per schedule: step time, bubble (measured and theory), peak microbatches in flight
    per rank, peak activation memory and bytes sent on rank 0, and the largest gradient error:
    given ``spec``, against the single-process step; given ``baseline`` (a run's name, e.g.
    ``"naive"``: the whole batch layer after layer, the single-process arithmetic), against that
    run's gradients. A stored run shows the error measured when it was recorded."""
    reference = None
    if baseline is not None:
        reference = {n: g for grads in runs[baseline].grads for n, g in grads.items()}
    elif spec is not None:
        reference = reference_step(spec)[1]
    errors = reference is not None
    if errors:
        # A difference that is rounding shows as its bound (in the gradients' own precision,
        # against their largest |value|): its digits would differ from CPU to CPU.
        scale = max(g.abs().max().item() for g in reference.values())
        eps = max(torch.finfo(g.dtype).eps for g in reference.values())
    spread = any(len(run.step_times) > 1 for run in runs.values())
    time_w, bubble_w = (20, 18) if spread else (10, 9)
    head = (f"{'schedule':<14}{'p':>3}{'m':>4}{'step ms':>{time_w}}{'bubble':>{bubble_w}}"
            f"{'theory':>9}"
            f"{'in flight':>11}{'act KiB r0':>12}{'sent KiB r0':>13}"
            + (f"{'max |dgrad|':>13}" if errors else ""))
    rows = [head, "-" * len(head)]
    for run in runs.values():
        flight = run.in_flight
        rows.append(f"{run.name:<14}{run.num_stages:>3}{run.num_microbatches or 1:>4}"
                    f"{_spread(run.step_time * 1e3, [t * 1e3 for t in run.step_times], '.1f'):>{time_w}}"
                    f"{_spread(run.bubble, run.step_bubbles, '.2f'):>{bubble_w}}{run.theory:>9.2f}"
                    f"{'/'.join(str(flight[r]) for r in sorted(flight)):>11}"
                    f"{run.activation_bytes[0] / 1024:>12.0f}{run.sent_bytes[0] / 1024:>13.0f}"
                    + (f"{residue(grad_error(run, spec, reference), scale, eps):>13}"
                       if errors else ""))
    return "\n".join(rows)


def _spread(median: float, values: list[float], fmt: str) -> str:
    """``median`` alone for one step; with several, ``median (min-max)``: the spread says how
    much of a difference between two schedules is noise."""
    if len(values) <= 1:
        return format(median, fmt)
    return f"{median:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

