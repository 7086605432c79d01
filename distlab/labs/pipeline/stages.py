"""Pipeline stages that record their own schedule, and what the records tell: per microbatch,
when each stage's forward and backward ran (``Event``), how many microbatches a stage held at
once (``peak_in_flight``) and the idle share of the step (``measured_bubble``) against
``theoretical_bubble``."""
from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn as nn

from distlab.labs.activation_memory import ActivationMeter

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


def measured_bubble(events: list[Event], num_ranks: int | None = None) -> float:
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

