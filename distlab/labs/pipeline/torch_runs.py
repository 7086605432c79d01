"""torch's own multi-stage schedules run for real on the course's model: each rank builds a
``PipelineStage`` for each of its stages and calls the schedule's ``step`` once, so that their
gradients can be set beside an executor's on the same model, batch and placement.

``torch_grads(names, p, m)`` runs every schedule of ``names`` (``torch_tables.TORCH_SCHEDULES``,
two stages per rank) in one launch of ``p`` ranks and returns, per name, the loss and every
parameter's gradient by its name in the whole model. ``scale_grads=True`` divides the summed
microbatch gradients by ``m``: with ``loss_fn``'s mean per microbatch that is the batch's mean.
"""
from __future__ import annotations

import copy

import torch

from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.model import PipeSpec, partition_layers, stage_layers


def _torch_on_rank(rank, world_size, names, layers, x, target, placements, m):
    """Rank body: per schedule, this rank's ``PipelineStage``s and one ``step``."""
    import torch.distributed as dist
    from torch.distributed import pipelining
    results = {}
    for name in names:
        placement, S = placements[name], len(placements[name])
        mine = sorted(layers[name])
        stages = [pipelining.PipelineStage(layers[name][s], s, S, torch.device("cpu"))
                  for s in mine]
        schedule = getattr(pipelining, name)(stages, n_microbatches=m, loss_fn=loss_fn,
                                             scale_grads=True)
        losses: list = []
        args = (x,) if 0 in mine else ()
        kwargs = dict(target=target, losses=losses) if S - 1 in mine else {}
        schedule.step(*args, **kwargs)
        grads = {n: p.grad for s in mine for n, p in layers[name][s].named_parameters()}
        results[name] = dict(loss=torch.stack(losses).mean().item() if losses else None,
                             grads=grads)
        dist.barrier()
    return results


def torch_grads(names, num_ranks: int, num_microbatches: int, spec: PipeSpec = PipeSpec(), *,
                dtype: torch.dtype = torch.float64, timeout: float = 120) -> dict:
    """Each torch schedule of ``names`` on ``num_ranks`` ranks, two stages each, placed as the
    schedule places them, run once on ``spec``'s model and batch in ``dtype``: per name, ``loss``
    (the mean of the microbatches' losses: the batch's) and ``grads`` by global name."""
    import distlab
    from distlab.labs.pipeline.torch_tables import torch_schedule
    from distlab.runtime.per_rank import PerRank
    p, m = num_ranks, num_microbatches
    model, (x, target) = spec.model().to(dtype), spec.data()
    placements = {}
    for name in names:
        mapping = torch_schedule(name, p, m, 2).stage_index_to_group_rank
        placements[name] = [mapping[s] for s in range(2 * p)]
    layers = [{} for _ in range(p)]
    bounds = partition_layers(spec.num_layers, 2 * p)
    for name, placement in placements.items():
        for r in range(p):
            layers[r][name] = copy.deepcopy({s: stage_layers(model, s, 2 * p, bounds)
                                             for s in range(2 * p) if placement[s] == r})
    out = distlab.run(_torch_on_rank, p, list(names), PerRank(layers), x.to(dtype),
                      target.to(dtype), placements, m, timeout=timeout)
    return {name: dict(loss=out[placements[name][-1]][name]["loss"],
                       grads={n: g for r in range(p) for n, g in out[r][name]["grads"].items()})
            for name in names}
