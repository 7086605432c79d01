"""Gradient buckets on a timeline (Lab 6's design exercise): a data-parallel backward produces
the gradients of its layers last to first; a bucket's all-reduce can start once its last
gradient is ready and the previous bucket's all-reduce is done (one link, as on the lab's
timelines). Whatever of the last all-reduce runs past the end of backward is **exposed**: the
step waits for it (section 4 of Lab 6).

The model, on paper: layer ``L-1-j`` (the ``j``-th backward) is ready at ``(j+1) * t_layer``; an
all-reduce of S bytes takes ``alpha + S / B`` (Lab 1's fit). ``problem_from_timeline`` measures
``t_layer``, ``alpha`` and ``B`` on a naive DP timeline: the backward range over the layers, and a
two-point fit of the median all-reduce times of its two message sizes (weights and biases).

``bucketed_dp_grads`` runs a plan on real ranks: each bucket's gradients all-reduced as one flat
tensor, in backward order, averaged; the plan arrives as data."""
from __future__ import annotations

import dataclasses
import statistics

import torch
import torch.distributed as dist

from distlab.labs.timelines.runs import Spec, _data, _mlp_stack
from distlab.runtime.devices import device as rank_device


@dataclasses.dataclass(frozen=True)
class BucketProblem:
    """``sizes[j]``: bytes of the gradients of the ``j``-th layer backward reaches (the last layer
    first); ``ready[j]``: seconds after backward starts when they are complete (increasing);
    ``alpha`` seconds and ``bandwidth`` bytes/s: an all-reduce of S bytes takes alpha + S/B."""
    sizes: tuple[int, ...]
    ready: tuple[float, ...]
    alpha: float
    bandwidth: float


def layer_bytes(spec: Spec) -> tuple[int, ...]:
    """Bytes of each layer's gradients (a ``Linear(h, h)``: weight and bias, float32), in the order
    backward produces them (all layers are the same size here)."""
    return (4 * (spec.hidden * spec.hidden + spec.hidden),) * spec.layers


def problem_for(spec: Spec, t_layer: float, alpha: float, bandwidth: float) -> BucketProblem:
    return BucketProblem(layer_bytes(spec), tuple(t_layer * (j + 1) for j in range(spec.layers)),
                         alpha, bandwidth)


def problem_from_timeline(timeline, spec: Spec, rank: int = 0) -> BucketProblem:
    """The lab's problem, measured on a naive DP ``timeline`` of ``spec``'s model."""
    backward = statistics.median(s.end - s.start for s in timeline.of(rank, "range", "backward"))
    by_size: dict[int, list[float]] = {}
    for s in timeline.of(rank, "comm"):
        if s.op == "all_reduce":
            by_size.setdefault(s.bytes, []).append(s.end - s.start)
    (small, t_small), (large, t_large) = sorted((b, statistics.median(t)) for b, t in by_size.items())
    inverse_bw = max(t_large - t_small, 1e-12) / (large - small)   # seconds per byte
    alpha = max(t_small - small * inverse_bw, 0.0)
    return problem_for(spec, backward / spec.layers, alpha, 1 / inverse_bw)


def _checked_plan(plan, layers: int) -> list[int]:
    try:
        plan = [int(n) for n in plan]
    except (TypeError, ValueError):
        raise ValueError(f"plan={plan!r:.100}: expected a list of layer counts, one per bucket, "
                         f"e.g. [2, 2] for {layers} = 4 layers in two buckets") from None
    if not plan or any(n < 1 for n in plan) or sum(plan) != layers:
        raise ValueError(f"plan={plan}: expected positive layer counts that add up to the "
                         f"{layers} layers, in backward order (the last layer's bucket first)")
    return plan


def replay_buckets(problem: BucketProblem, plan) -> list[tuple[float, float, int]]:
    """(start, end, bytes) of each bucket's all-reduce, on paper: ``plan[k]`` layers in bucket k,
    buckets in backward order."""
    plan = _checked_plan(plan, len(problem.sizes))
    out, first, free = [], 0, 0.0
    for n in plan:
        last = first + n - 1
        nbytes = sum(problem.sizes[first:last + 1])
        start = max(problem.ready[last], free)
        free = start + problem.alpha + nbytes / problem.bandwidth
        out.append((start, free, nbytes))
        first = last + 1
    return out


def exposed(problem: BucketProblem, plan) -> float:
    """Seconds the step waits after backward for the plan's last all-reduce."""
    return max(0.0, replay_buckets(problem, plan)[-1][1] - problem.ready[-1])


def bucketed_dp_grads(rank: int, world_size: int, spec: Spec, plan: list[int]) -> dict:
    """On each rank: ``spec``'s DP model on this rank's rows, backward, then each bucket of
    ``plan`` all-reduced as one flat tensor (last layer first) and averaged; the gradients."""
    model = _mlp_stack(spec).to(rank_device())
    x = _data(spec, spec.dp_batch, spec.hidden).chunk(world_size)[rank].to(rank_device())
    model(x).square().mean().backward()
    layers = [list(block[0].parameters()) for block in reversed(model)]   # backward order
    first = 0
    for n in plan:
        params = [p for layer in layers[first:first + n] for p in layer]
        flat = torch.cat([p.grad.reshape(-1) for p in params])               # (bucket numel,)
        dist.all_reduce(flat)
        flat /= world_size
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
        first += n
    return {name: p.grad.cpu() for name, p in model.named_parameters()}
