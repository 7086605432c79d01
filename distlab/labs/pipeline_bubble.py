"""The pipeline bubble counted per stage, and the course's two ways of stating it.

With p equal stages, m microbatches, a forward of t_f and a backward of t_b, a flushed schedule
(GPipe, 1F1B) lasts (m + p - 1)(t_f + t_b) and every stage computes m(t_f + t_b) of it, so every
stage idles (p - 1)(t_f + t_b): p - 1 forward slots and p - 1 backward slots (Narayanan et al.
2021, sec. 2.2; with t_b = 2 t_f that is 3(p - 1) forward units, not 2(p - 1)). Two conventions:

- the idle share of the *step*, (p - 1) / (m + p - 1) (GPipe, Huang et al. 2019, sec. 2.3), as
  Labs 5 and 7 state the bubble;
- the idle time relative to the *compute*, (p - 1) / m (Megatron-LM's PTD-P paper, Narayanan et
  al. 2021, sec. 2.2), the factor by which the compute time is stretched: 1 + (p-1)/m, as Lab 7's
  step-time estimate adds it.

They are the same idle time over different denominators: b_step = b_compute / (1 + b_compute).
"""
from __future__ import annotations


def idle_per_stage(events, num_stages: int) -> dict[int, float]:
    """Per stage, the time it did not compute between the step's first start and last end
    (``events`` as ``distlab.labs.pipeline.simulate`` or a measured run records them)."""
    start = min(e.start for e in events)
    span = max(e.end for e in events) - start
    busy = {s: 0.0 for s in range(num_stages)}
    for e in events:
        busy[e.rank] += e.end - e.start
    return {s: span - b for s, b in busy.items()}


def bubble_of_step(num_stages: int, num_microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of the whole step (Lab 5's convention)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def bubble_of_compute(num_stages: int, num_microbatches: int) -> float:
    """(p - 1) / m: idle time over compute time (PTD-P's convention)."""
    return (num_stages - 1) / num_microbatches


def step_share_from_compute_ratio(ratio: float) -> float:
    """Convert (p - 1)/m (idle over compute) into the idle share of the step: r / (1 + r)."""
    return ratio / (1 + ratio)


def bubble_accounting(num_stages: int, num_microbatches: int, t_fwd: float = 1.0,
                      t_bwd: float = 2.0) -> str:
    """The counting of idle units, in words and numbers, for the lab to print."""
    p, m = num_stages, num_microbatches
    idle, busy = (p - 1) * (t_fwd + t_bwd), m * (t_fwd + t_bwd)
    return (f"p = {p}, m = {m}, t_f = {t_fwd:g}, t_b = {t_bwd:g}: every stage idles "
            f"(p-1)(t_f+t_b) = {idle:g} units and computes m(t_f+t_b) = {busy:g}; the step lasts "
            f"{idle + busy:g}.\n"
            f"  bubble as a share of the step (Lab 5): (p-1)/(m+p-1) = {bubble_of_step(p, m):.3f}\n"
            f"  bubble relative to compute (PTD-P): (p-1)/m = {bubble_of_compute(p, m):.3f}"
            f"  -> r/(1+r) = {step_share_from_compute_ratio(bubble_of_compute(p, m)):.3f} of the step")


def budget_bound(num_stages: int, num_microbatches: int, max_in_flight: int) -> float:
    """The least bubble any schedule can have with at most k = ``max_in_flight`` microbatches
    alive on a stage (forward 1 unit, backward 2, messages free; the units cancel).

    Two floors on the step's span: every flushed pipeline's (m + p - 1)(t_f + t_b) (the last
    stage starts after p - 1 forwards, its last backward still crosses p - 1 stages back); and
    stage 0's: it holds each microbatch from its forward's start until its backward ends, at
    least p(t_f + t_b) (the forward through every stage, the backward all the way back), and with
    k alive at once, some k-th of its m microbatches follow one another: ceil(m / k) p (t_f + t_b).
    Every stage computes m(t_f + t_b) of that span."""
    p, m, k = num_stages, num_microbatches, max_in_flight
    span = max(m + p - 1, -(-m // k) * p)          # in units of t_f + t_b
    return 1.0 - m / span
