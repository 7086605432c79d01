"""Pipeline parallelism (lab 5): stages, measured schedules, the bubble, and a schedule simulator.

A model of ``L`` equal blocks is cut into ``p`` contiguous *stages*, one per rank. Stage ``s``
receives its input activation from rank ``s-1`` and sends its output to rank ``s+1``; in backward
the gradient of the stage's output comes from ``s+1`` and the gradient of its input goes to ``s-1``.
Only stage boundaries communicate: one ``(b, h)`` activation forward and one ``(b, h)`` gradient
backward per microbatch (``b*s*h`` elements for a transformer with sequence length ``s``).

With ``m`` equal microbatches, forward time ``t_f`` and backward time ``t_b`` per microbatch and
stage, GPipe and 1F1B both take ``(m + p - 1)(t_f + t_b)`` for work worth ``m (t_f + t_b)``, so each
rank idles for the *bubble fraction* ``(p - 1) / (m + p - 1)``. 1F1B does not shrink the bubble; it
bounds the microbatches whose activations a stage holds at once to ``p - s`` instead of ``m``.

What lives here:
- the model (``make_model``, ``PipeSpec``) and its split (``partition_layers``, ``stage_layers``);
- ``TimedStage``: a stage module that records, per microbatch, when its forward and its backward
  started and ended, and how many activation bytes autograd holds (``Event``, ``peak_in_flight``);
- ``run_schedules``: runs step functions (yours, or ``library_step`` for
  ``torch.distributed.pipelining``) on real ranks and returns grads, events and timings;
- ``bubble_fraction``, ``plot_schedule``, ``schedule_table``: the bubble and the Gantt chart;
- ``schedule_order``, ``simulate``, ``schedule_explorer``: the same schedules on paper.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from distlab.labs.activation_memory import ActivationMeter
from distlab.runtime.devices import device as rank_device

# ----------------------------------------------------------------------------- the model


class Block(nn.Module):
    """A residual MLP block, ``x + gelu(x W^T + c)``: the unit the pipeline cuts between."""

    def __init__(self, hidden: int):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x):  # (b, h) -> (b, h)
        return x + F.gelu(self.lin(x))


def make_model(num_layers: int, hidden: int, seed: int) -> nn.Sequential:
    """``num_layers`` blocks drawn from ``seed``: the same weights on every rank that builds it."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(*[Block(hidden) for _ in range(num_layers)])
    with torch.no_grad():
        for p in model.parameters():  # scale 1/sqrt(h) keeps activations O(1) at any depth
            p.copy_(torch.randn(p.shape, generator=gen) / hidden ** 0.5)
    return model


def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over a (micro)batch. With ``m`` equal microbatches the full-batch loss
    is the mean of the ``m`` microbatch losses, so each microbatch's backward starts from
    ``loss_fn(y_i, t_i) / m``."""
    return F.mse_loss(y, target)


@dataclasses.dataclass(frozen=True)
class PipeSpec:
    """One pipeline problem: a model of ``num_layers`` blocks of width ``hidden`` and a batch of
    ``batch`` rows, all drawn from ``seed``."""
    num_layers: int = 8
    hidden: int = 64
    batch: int = 16
    seed: int = 0

    def model(self) -> nn.Sequential:
        return make_model(self.num_layers, self.hidden, self.seed)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The input batch and the regression target, both ``(batch, hidden)``."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.hidden, generator=gen)
        return x, torch.randn(self.batch, self.hidden, generator=gen)


def reference_step(spec: PipeSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """The single-process computation every schedule must match: the loss of the whole batch and
    the gradient of every parameter, keyed ``"<layer>.lin.weight"`` like ``model.named_parameters()``."""
    model = spec.model()
    x, target = spec.data()
    loss = loss_fn(model(x), target)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def partition_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges, one per stage, as equal as can be: the first
    ``num_layers % num_stages`` stages take one layer more."""
    if num_layers < num_stages:
        raise ValueError(f"{num_layers} layers cannot fill {num_stages} stages: "
                         "every stage needs at least one layer.")
    base, extra = divmod(num_layers, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def stage_layers(model: nn.Sequential, stage: int, num_stages: int) -> nn.Sequential:
    """The blocks of ``stage``, keeping their global indices as names, so that the stage's
    ``named_parameters()`` read ``"5.lin.weight"`` exactly as in the whole model."""
    start, stop = partition_layers(len(model), num_stages)[stage]
    return nn.Sequential(collections.OrderedDict((str(i), model[i]) for i in range(start, stop)))


# ----------------------------------------------------------------------------- measured events


@dataclasses.dataclass
class Event:
    """One forward (``kind="F"``) or backward (``"B"``) of microbatch ``mb`` on ``rank``; times in
    seconds on ``time.perf_counter`` (measured) or in abstract units (simulated)."""
    rank: int
    mb: int
    kind: str
    start: float
    end: float


class _BackwardStarts(torch.autograd.Function):
    """Identity on the stage output; its backward runs first in the stage's backward."""

    @staticmethod
    def forward(ctx, y, stage, mb):
        ctx.stage, ctx.mb = stage, mb
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        ctx.stage._bwd_start[ctx.mb] = time.perf_counter()
        return grad, None, None


class _BackwardEnds(torch.autograd.Function):
    """Identity on the stage input; its backward runs last. The extra ``anchor`` input requires
    grad, so this node is in the graph even on stage 0, whose input does not."""

    @staticmethod
    def forward(ctx, x, anchor, stage, mb):
        ctx.stage, ctx.mb = stage, mb
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        stage, mb = ctx.stage, ctx.mb
        stage.events.append(Event(stage.rank, mb, "B", stage._bwd_start.pop(mb), time.perf_counter()))
        return grad, None, None, None


class TimedStage(nn.Module):
    """A pipeline stage that records its own schedule.

    Call it like the layers it wraps: ``y = stage(a)``, once per microbatch, in microbatch order
    (forward ``i`` is microbatch ``i``). It appends to ``stage.events`` an ``Event`` for each
    forward and, when ``backward`` later flows through ``y``, one for that microbatch's backward
    (from the gradient reaching ``y`` to the gradient of ``a`` being ready). ``peak_activation_bytes``
    is the most activation memory autograd held at once on this stage.
    """

    def __init__(self, layers: nn.Sequential, rank: int):
        super().__init__()
        self.layers, self.rank = layers, rank
        self._anchor = torch.zeros((), requires_grad=True)
        self.reset()

    def reset(self):
        """Forget recorded events (e.g. after a warm-up step)."""
        self.events: list[Event] = []
        self._bwd_start: dict[int, float] = {}
        self._forwards = 0
        self._meter = ActivationMeter(self.parameters())

    @property
    def peak_activation_bytes(self) -> int:
        return self._meter.peak

    def forward(self, x):  # (b, h) -> (b, h)
        mb, start = self._forwards, time.perf_counter()
        self._forwards += 1
        x = _BackwardEnds.apply(x, self._anchor, self, mb)
        with self._meter.hooks():
            y = self.layers(x)
        y = _BackwardStarts.apply(y, self, mb)
        self.events.append(Event(self.rank, mb, "F", start, time.perf_counter()))
        return y


def peak_in_flight(events: list[Event]) -> dict[int, int]:
    """Per rank, the most microbatches alive at once: started forward, backward not yet finished.
    Each holds its activations for backward, so this bounds the stage's activation memory."""
    peaks = {}
    for rank in sorted({e.rank for e in events}):
        # +1 at each forward start, -1 at each backward end; ties: finish before start
        marks = sorted((e.start, 1) if e.kind == "F" else (e.end, -1)
                       for e in events if e.rank == rank)
        alive = peak = 0
        for _, step in marks:
            alive += step
            peak = max(peak, alive)
        peaks[rank] = peak
    return peaks


def bubble_fraction(events: list[Event], num_ranks: int | None = None) -> float:
    """The share of rank-time spent not computing: ``1 - sum_r busy_r / (p * span)``, with
    ``span`` from the first event start to the last event end over all ranks."""
    if not events:
        raise ValueError("no events: the step recorded no forward or backward")
    p = num_ranks or len({e.rank for e in events})
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (p * span)


def theoretical_bubble(num_stages: int, num_microbatches: int) -> float:
    """``(p - 1) / (m + p - 1)``: idle share of a flushed pipeline with equal stages."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


# ----------------------------------------------------------------------------- running on ranks


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

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.events, self.num_stages)

    @property
    def in_flight(self) -> dict[int, int]:
        return peak_in_flight(self.events)

    @property
    def theory(self) -> float:
        return theoretical_bubble(self.num_stages, self.num_microbatches or 1)


def _call(fn, rank, world_size, stage, x, target, m):
    return fn(rank, world_size, stage, x, target) if m is None else \
        fn(rank, world_size, stage, x, target, m)


def _rank_schedules(rank, world_size, spec, schedules, warmup):
    """On each rank: build this rank's stage of ``spec``'s model once per schedule, run
    ``warmup`` untimed steps and one timed step, and return what ``ScheduleRun`` needs."""
    device = rank_device()
    layers = stage_layers(spec.model(), rank, world_size).to(device)
    x, target = (t.to(device) for t in spec.data())
    results = {}
    for name, (fn, m) in schedules.items():
        stage = TimedStage(copy.deepcopy(layers), rank)
        for _ in range(warmup + 1):
            stage.zero_grad(set_to_none=True)
            stage.reset()
            dist.barrier()  # all ranks start the step together
            start = time.perf_counter()
            loss = _call(fn, rank, world_size, stage, x, target, m)
            end = time.perf_counter()
        grads = {n: p.grad.detach().cpu() if p.grad is not None else None
                 for n, p in stage.layers.named_parameters()}
        results[name] = dict(grads=grads, loss=loss, events=stage.events, start=start, end=end,
                             act=stage.peak_activation_bytes)
    return results


def run_schedules(schedules: dict, world_size: int, spec: PipeSpec = PipeSpec(), *,
                  warmup: int = 0, timeout: float = 60) -> dict[str, ScheduleRun]:
    """Run each schedule on ``world_size`` ranks, one stage per rank, in a single launch.

    ``schedules`` maps a name to ``(step_fn, num_microbatches)``; ``step_fn(rank, world_size,
    stage, x, target[, num_microbatches])`` runs one training step on its rank (the
    ``num_microbatches`` argument is left out when it is None) and returns the loss on the last
    rank. ``stage`` is this rank's ``TimedStage``; ``x`` and ``target`` are the whole batch on
    every rank (stage 0 reads ``x``, the last stage ``target``).
    """
    import distlab
    out = distlab.run(_rank_schedules, world_size, spec, schedules, warmup, timeout=timeout)
    runs = {}
    for name, (_, m) in schedules.items():
        per_rank = [out[r][name] for r in range(world_size)]
        sent = [sum(c.bytes for c in out.comms[r] if c.op in ("send", "isend")
                    and per_rank[r]["start"] <= c.start <= per_rank[r]["end"])
                for r in range(world_size)]
        runs[name] = ScheduleRun(
            name=name, num_stages=world_size, num_microbatches=m,
            grads=[r["grads"] for r in per_rank], loss=per_rank[-1]["loss"],
            events=[e for r in per_rank for e in r["events"]],
            step_time=max(r["end"] for r in per_rank) - min(r["start"] for r in per_rank),
            activation_bytes=[r["act"] for r in per_rank], sent_bytes=sent)
    return runs


def grad_error(run: ScheduleRun, spec: PipeSpec) -> float:
    """The largest absolute difference between ``run``'s gradients and the single-process ones."""
    _, ref = reference_step(spec)
    return max((g - ref[n]).abs().max().item() if g is not None else float("inf")
               for grads in run.grads for n, g in grads.items())


def schedule_table(runs: dict[str, ScheduleRun], spec: PipeSpec | None = None) -> str:
    """One row per schedule: step time, bubble (measured and theory), peak microbatches in flight
    per rank, peak activation memory and bytes sent on rank 0, and, given ``spec``, the largest
    gradient error against the single-process step."""
    head = (f"{'schedule':<14}{'p':>3}{'m':>4}{'step ms':>10}{'bubble':>9}{'theory':>9}"
            f"{'in flight':>11}{'act KiB r0':>12}{'sent KiB r0':>13}"
            + (f"{'max |dgrad|':>13}" if spec else ""))
    rows = [head, "-" * len(head)]
    for run in runs.values():
        flight = run.in_flight
        rows.append(f"{run.name:<14}{run.num_stages:>3}{run.num_microbatches or 1:>4}"
                    f"{run.step_time * 1e3:>10.1f}{run.bubble:>9.2f}{run.theory:>9.2f}"
                    f"{'/'.join(str(flight[r]) for r in sorted(flight)):>11}"
                    f"{run.activation_bytes[0] / 1024:>12.0f}{run.sent_bytes[0] / 1024:>13.0f}"
                    + (f"{grad_error(run, spec):>13.1e}" if spec else ""))
    return "\n".join(rows)


# ----------------------------------------------------------------------------- drawing


def plot_schedule(events: list[Event], *, title: str = "", ax=None, unit: str = "ms"):
    """A Gantt chart of ``events``: one lane per rank (rank 0 on top), forwards light, backwards
    dark, each bar labelled with its microbatch. Measured times are shown in ms from the first
    event; simulated ones (``unit="step"``) as given."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len({e.rank for e in events})))
    t0 = min(e.start for e in events)
    scale = 1e3 if unit == "ms" else 1.0
    colors = {"F": "#8ecae6", "B": "#1d5f8a"}
    for e in events:
        left, width = (e.start - t0) * scale, (e.end - e.start) * scale
        ax.barh(e.rank, width, left=left, height=0.8, color=colors[e.kind], edgecolor="white",
                linewidth=0.5)
        ax.text(left + width / 2, e.rank, str(e.mb), ha="center", va="center", fontsize=7,
                color="black" if e.kind == "F" else "white", clip_on=True)
    ranks = sorted({e.rank for e in events})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(unit if unit == "ms" else "time (forward = 1)")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=["forward", "backward"], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize=7, frameon=False)
    return ax


def plot_runs(runs: dict[str, ScheduleRun]):
    """One measured Gantt chart per schedule, stacked, titled with measured vs theoretical bubble."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, squeeze=False,
                             figsize=(10, 1.2 + 1.0 * len(runs) * max(r.num_stages for r in runs.values()) / 2))
    for ax, run in zip(axes[:, 0], runs.values()):
        plot_schedule(run.events, ax=ax, title=(
            f"{run.name}: p={run.num_stages}, m={run.num_microbatches or 1}, step "
            f"{run.step_time * 1e3:.1f} ms, bubble {run.bubble:.2f} measured vs {run.theory:.2f} theory"))
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- simulation

SCHEDULES = ("naive", "gpipe", "1f1b")


def schedule_order(kind: str, num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """Per stage, the order in which it runs its ops ``("F", i)`` / ``("B", i)``.

    naive: one forward and one backward of the whole batch (microbatch 0).
    gpipe: ``F0..F(m-1)`` then ``B0..B(m-1)``.
    1f1b:  stage ``s`` warms up with ``min(p - s - 1, m)`` forwards, then alternates one forward
           and one backward, and cools down with the remaining backwards.
    """
    p, m = num_stages, num_microbatches
    if kind == "naive":
        return [[("F", 0), ("B", 0)] for _ in range(p)]
    if kind == "gpipe":
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]
    if kind == "1f1b":
        orders = []
        for s in range(p):
            warm = min(p - s - 1, m)
            ops = [("F", i) for i in range(warm)]
            for i in range(m - warm):
                ops += [("F", warm + i), ("B", i)]
            ops += [("B", i) for i in range(m - warm, m)]
            orders.append(ops)
        return orders
    raise ValueError(f"unknown schedule {kind!r}: choose one of {SCHEDULES}")


def simulate(kind: str, num_stages: int, num_microbatches: int, *, t_fwd: float = 1.0,
             t_bwd: float = 2.0) -> list[Event]:
    """Times of every op when each stage runs ``schedule_order`` as early as its inputs allow:
    ``F(s, i)`` waits for ``F(s-1, i)``, ``B(s, i)`` for ``B(s+1, i)`` (the last stage's for its own
    ``F(s, i)``). Naive runs the whole batch as one op of ``m`` times the microbatch cost."""
    p = num_stages
    scale = num_microbatches if kind == "naive" else 1
    orders = schedule_order(kind, p, num_microbatches)
    done: dict[tuple[str, int, int], float] = {}
    free, nxt, events = [0.0] * p, [0] * p, []
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                op, i = orders[s][nxt[s]]
                dep = ("F", s - 1, i) if op == "F" else ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if op == "F" and s == 0:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                start = max(free[s], ready)
                free[s] = done[(op, s, i)] = start + scale * (t_fwd if op == "F" else t_bwd)
                events.append(Event(s, i, op, start, free[s]))
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"stage {s} at {orders[s][nxt[s]]}" for s in range(p) if nxt[s] < len(orders[s]))
            raise RuntimeError(f"schedule {kind} deadlocks: {stuck}")
    return events


def plot_simulations(kinds, num_stages: int, num_microbatches: int, t_bwd: float = 2.0):
    """Simulated Gantt charts of several schedules for the same ``p`` and ``m``, stacked."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(kinds), 1, squeeze=False,
                             figsize=(10, 0.8 + 0.5 * num_stages * len(kinds)))
    for ax, kind in zip(axes[:, 0], kinds):
        events = simulate(kind, num_stages, num_microbatches, t_bwd=t_bwd)
        m = 1 if kind == "naive" else num_microbatches
        plot_schedule(events, ax=ax, unit="step", title=(
            f"{kind} (simulated): p={num_stages}, m={m}, bubble {bubble_fraction(events):.3f} = "
            f"(p-1)/(m+p-1) = {theoretical_bubble(num_stages, m):.3f}; microbatches in flight per "
            f"stage {list(peak_in_flight(events).values())}"))
    fig.tight_layout()
    return fig


def boundary_traffic(batch: int, seq: int, hidden: int, layers_per_stage: int, tp: int,
                     bytes_per_element: int = 2) -> str:
    """Bytes one microbatch moves per rank, per stage, forward + backward: pipeline parallelism
    sends one ``(b, s, h)`` activation forward and one gradient back across each stage boundary;
    Megatron tensor parallelism all-reduces a ``(b, s, h)`` tensor twice per layer forward and
    twice backward, each ring all-reduce moving ``2 (t-1)/t`` of it per rank."""
    act = batch * seq * hidden * bytes_per_element
    pp = 2 * act
    tp_bytes = 4 * layers_per_stage * 2 * (tp - 1) / tp * act
    return (f"one (b={batch}, s={seq}, h={hidden}) activation: {act / 2**20:.1f} MiB\n"
            f"PP, per stage boundary (1 forward + 1 backward message): {pp / 2**20:8.1f} MiB\n"
            f"TP={tp}, per rank, {layers_per_stage} layers (4 all-reduces each): "
            f"{tp_bytes / 2**20:8.1f} MiB  ({tp_bytes / pp:.0f} x PP)")


def schedule_explorer():
    """An ipywidgets panel: pick the schedule, p, m and the backward/forward cost ratio; it
    redraws the simulated Gantt chart and prints its bubble against ``(p-1)/(m+p-1)`` and the
    microbatches in flight per stage."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def show(kind, p, m, ratio):
        events = simulate(kind, p, m, t_fwd=1.0, t_bwd=ratio)
        mm = 1 if kind == "naive" else m
        fig, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * p))
        plot_schedule(events, ax=ax, unit="step", title=(
            f"{kind}: p={p}, m={mm}: bubble {bubble_fraction(events, p):.3f}, "
            f"(p-1)/(m+p-1) = {theoretical_bubble(p, mm):.3f}, in flight per stage "
            f"{list(peak_in_flight(events).values())}"))
        plt.show()

    return w.interactive(
        show, kind=w.Dropdown(options=SCHEDULES, value="1f1b", description="schedule"),
        p=w.IntSlider(value=4, min=2, max=8, description="stages p"),
        m=w.IntSlider(value=8, min=1, max=16, description="micro m"),
        ratio=w.FloatSlider(value=2.0, min=0.5, max=3.0, step=0.5, description="t_b / t_f"))
