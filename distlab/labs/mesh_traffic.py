"""What each axis of Lab 7's mesh run sends, measured, and where its ranks sit on nodes.

A rank's traffic comes from two records: the collective record (``out.comms``) holds what went
through ``torch.distributed``'s Python functions (FSDP's all-gathers and reduce-scatters, the
pipeline's sends); DTensor's collectives (tensor parallelism) are functional collectives, which it
does not see, so ``FunctionalCollectives`` counts those while the rank trains, each with the time
it was issued so a step's window can select them.

Bytes *sent* by a rank, as Lab 1 counts them for a ring over ``k`` ranks: an all-reduce of ``S``
bytes sends ``2(k-1)/k * S``, an all-gather or reduce-scatter of an ``S``-byte whole buffer
``(k-1)/k * S``, a send ``S``; a receive sends nothing (its sender counted the message).
"""
from __future__ import annotations

import time

from distlab.labs.functional_collectives import FunctionalCollectives
from distlab.labs.mesh import (MeshRun, MeshShape, TinyConfig, check_batch_fits, megatron_plan,
                               reference_losses, train_on_mesh)

AXES = ("pp", "dp", "tp")
# op -> the share of the whole buffer one rank of a ring of k sends
_RING = {"all_reduce": lambda k: 2 * (k - 1) / k,
         "all_gather": lambda k: (k - 1) / k, "reduce_scatter": lambda k: (k - 1) / k,
         "all_to_all": lambda k: (k - 1) / k, "send": lambda k: 1.0}


def traced_mesh_rank(rank: int, world_size: int, shape: MeshShape, layout, cfg: TinyConfig,
                     seed: int, plan_fn=megatron_plan, last_step_only: bool = False) -> dict:
    """Rank body: ``train_on_mesh`` on ``layout`` (None: row-major), DTensor's collectives
    counted ("functional"); the collective record holds the rest. ``last_step_only``: counted in
    the last step alone, the one a check grades (``cross_node_bytes``'s default): the counting
    dispatch mode slows every op it sees, a fifth of an 8-rank run's CPU time over every step."""
    seen = FunctionalCollectives()
    if last_step_only:
        result = train_on_mesh(rank, world_size, shape, plan_fn, cfg, seed, layout=layout,
                               last_step=seen)
    else:
        with seen:
            result = train_on_mesh(rank, world_size, shape, plan_fn, cfg, seed, layout=layout)
    result["functional"] = seen.calls
    return result


def _kind(op: str) -> str | None:
    for kind in _RING:
        if op.startswith(kind) or op == "i" + kind:
            return kind
    return None


def step_calls(comms, functional, window) -> list[tuple[tuple, str, int]]:
    """(ranks the message involves, op kind, bytes sent) of one rank's calls in ``window``
    (``(start, end)`` perf_counter seconds): a send involves the sender and its peer."""
    start, end = window
    calls = []
    for c in comms:
        kind = _kind(c.op)
        if kind and start <= c.start <= end:
            ranks = (c.rank, c.peer) if kind == "send" else tuple(c.group)
            calls.append((ranks, kind, c.bytes))
    calls += [(ranks, _kind(op), nbytes) for t, ranks, op, nbytes in functional if start <= t <= end]
    return [(ranks, kind, round(_RING[kind](len(ranks)) * nbytes)) for ranks, kind, nbytes in calls]


def _axis_of(ranks: tuple, groups: dict) -> str:
    """The axis whose group holds every rank of a call (a send's pair lies in its PP group)."""
    for axis in AXES:
        if set(ranks) <= set(groups[axis]):
            return axis
    return "other"


def groups_of(layout, rank: int) -> dict[str, tuple]:
    """{axis: the global ranks of ``rank``'s group along it} in ``layout`` ((pp, dp, tp) -> rank)."""
    import torch
    grid = torch.as_tensor(layout)
    where = [int(i) for i in (grid == rank).nonzero()[0]]
    out = {}
    for i, axis in enumerate(AXES):
        index = list(where)
        index[i] = slice(None)
        out[axis] = tuple(int(r) for r in grid[tuple(index)].flatten())
    return out


def axis_traffic(result: dict, comms, rank: int, layout, step: int = -1) -> dict[str, int]:
    """{axis: bytes ``rank`` sent on it} in step ``step`` of a traced run (the last by default:
    the first also builds the pipeline and gathers once more)."""
    groups = groups_of(layout, rank)
    out = dict.fromkeys(AXES + ("other",), 0)
    for ranks, _, sent in step_calls(comms, result["functional"], result["step_windows"][step]):
        out[_axis_of(ranks, groups)] += sent
    return out


def cross_node_bytes(result: dict, comms, rank: int, per_node: int, step: int = -1) -> int:
    """Bytes ``rank`` sent in step ``step`` on calls whose ranks are not all on one node (nodes of
    ``per_node`` consecutive ranks)."""
    return sum(sent for ranks, _, sent in step_calls(comms, result["functional"],
                                                     result["step_windows"][step])
               if len({r // per_node for r in ranks}) > 1)


def megatron_layout(shape: MeshShape) -> list:
    """The layout ``init_device_mesh`` builds for ``shape``: layout[pp][dp][tp] = the global rank
    it gives those coordinates (nested lists of shape (pp, dp, tp), every rank once)."""
    import torch
    return torch.arange(shape.world_size).reshape(shape.pp, shape.dp, shape.tp).tolist()


def stage_layout(shape: MeshShape, per_node: int, sent: list) -> list:
    """The course's answer to Lab 7's ``place_mesh(shape, per_node, sent)``: layout[pp][dp][tp] =
    the global rank at those coordinates, each stage's ranks consecutive, the axis on which that
    stage sends more inside (``sent[r]``: bytes per step of rank r on "tp", "pp", "dp")."""
    import torch
    per_stage, layout = shape.dp * shape.tp, []
    for stage in range(shape.pp):
        mine = sent[stage * per_stage]
        grid = torch.arange(per_stage).reshape(shape.dp, shape.tp)
        if mine["dp"] > mine["tp"]:
            grid = torch.arange(per_stage).reshape(shape.tp, shape.dp).T
        layout.append((grid + stage * per_stage).tolist())
    return layout


def traced_run(shape: MeshShape, plan_fn=megatron_plan, layout=None,
               cfg: TinyConfig = TinyConfig(), seed: int = 0):
    """The mesh run with ``plan_fn``'s TP plan on ``layout`` (None: row-major), traced:
    ``distlab.run``'s results, with the collective record in ``.comms``."""
    import distlab
    return distlab.run(traced_mesh_rank, shape.world_size, shape, layout, cfg, seed, plan_fn,
                       timeout=300)


def traced_mesh_run(shape: MeshShape, plan_fn=megatron_plan, cfg: TinyConfig = TinyConfig(),
                    seed: int = 0) -> MeshRun:
    """``run_mesh``'s training, traced: its ``MeshRun`` (losses beside one process) with the
    traced results in ``.traced``. One run of 8 ranks costs seconds of CPU time, so Lab 7 reads
    both its loss table and its traffic table from the same run."""
    check_batch_fits(cfg, shape)
    start = time.perf_counter()
    out = traced_run(shape, plan_fn, cfg=cfg, seed=seed)
    seconds = time.perf_counter() - start
    last = next(r for r in out if r["losses"] is not None)
    return MeshRun(shape, last["losses"], reference_losses(cfg, seed), list(out), seconds,
                   traced=out)


def layout_of(out, shape: MeshShape) -> list:
    """The layout a run used, read from its ranks' coordinates: layout[pp][dp][tp] = rank."""
    import torch
    grid = torch.zeros(shape.pp, shape.dp, shape.tp, dtype=torch.int64)
    for rank, result in enumerate(out):
        grid[tuple(result["coords"])] = rank
    return grid.tolist()


def predicted_traffic_table(out, shape: MeshShape, predict, cfg: TinyConfig = TinyConfig()) -> str:
    """Per rank and axis: ``predict(shape, cfg, rank)`` beside the bytes the traced run ``out``
    sent in its last step."""
    layout = layout_of(out, shape)
    lines = [f"{shape}, bytes sent in the last step, predicted / measured:",
             f"  {'rank':>4}  {'(pp, dp, tp)':<13}" + "".join(f"{a:>18}" for a in ("tp", "pp", "dp"))]
    for rank in range(shape.world_size):
        got, want = axis_traffic(out[rank], out.comms[rank], rank, layout), predict(shape, cfg, rank)
        lines.append(f"  {rank:>4}  {str(out[rank]['coords']):<13}" + "".join(
            f"{float(want[a]):>9.0f} / {got[a]:<6d}" for a in ("tp", "pp", "dp")))
    return "\n".join(lines)


__all__ = ["traced_mesh_rank", "traced_run", "traced_mesh_run", "predicted_traffic_table",
           "layout_of", "step_calls", "axis_traffic", "groups_of", "cross_node_bytes",
           "megatron_layout", "AXES"]
