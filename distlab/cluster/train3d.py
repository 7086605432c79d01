"""Lab 7's 3-D run, on a laptop or across the nodes of a cluster: a PP x DP x TP mesh with TP
inside a node, its losses checked against single-process training, its traffic per axis and its
step time printed.

    python -m distlab.cluster.train3d                       # 8 local ranks: TP=2, PP=2, DP=2
    torchrun --standalone --nproc-per-node=4 -m distlab.cluster.train3d --pp 2
    sbatch --nodes=2 cluster/slurm/train3d.sbatch             # srun + torchrun, one agent a node

The model, the mesh and the training are Lab 7's (``distlab.labs.mesh``): TP by DTensor's
``parallelize_module`` with the Megatron plan, DP by FSDP2's ``fully_shard``, PP by
``torch.distributed.pipelining``'s 1F1B with two micro-batches. The mesh is (pp, dp, tp) with TP
innermost, and torchrun numbers ranks node by node, so a TP group is ``--tp`` consecutive ranks
of one node (``--tp`` must divide the processes per node; default: all of them), and DP and PP
span the nodes. ``--pp`` defaults to 2 where the nodes pair up. Every rank starts from the
single-process model's weights and sees its share of the same batches, so the losses equal
single-process training's up to the order of float additions (``LOSS_ATOL + LOSS_RTOL*|loss|``);
a run whose losses differ exits with status 1.
"""
from __future__ import annotations

import argparse
import statistics
import time

from distlab.cluster.group import SettingsError, choose_backend, guarded, launch, placement, \
    printer
from distlab.cluster.traffic import axis_groups, per_axis
from distlab.labs.mesh import (LOSS_ATOL, LOSS_RTOL, MeshRun, MeshShape, TinyConfig,
                               check_batch_fits, megatron_plan, reference_losses)
from distlab.labs.mesh_traffic import traced_mesh_rank

AXES = ("pp", "dp", "tp")


def train_rank(rank: int, world_size: int, shape: MeshShape, cfg: TinyConfig, seed: int) -> dict:
    """Rank body: Lab 7's traced mesh run with the Megatron plan (DTensor's collectives counted,
    as (group, op, bytes)); the collective record (``out.comms``) holds the rest."""
    result = traced_mesh_rank(rank, world_size, shape, None, cfg, seed)
    result["functional"] = [(ranks, op, nbytes) for _, ranks, op, nbytes in result["functional"]]
    return result


def mesh_shape(where, tp: int | None, pp: int | None) -> MeshShape:
    """PP x DP x TP for these ranks; a SettingsError that says what fits when they do not."""
    tp = tp or where.per_node
    pp = pp or (2 if where.nodes % 2 == 0 and where.world_size % (2 * tp) == 0 else 1)
    if tp < 1 or pp < 1 or where.world_size % (tp * pp):
        fits = [d for d in range(1, where.world_size + 1) if where.world_size % d == 0]
        raise SettingsError(
            f"world size {where.world_size} does not fit the mesh: TP={tp} x PP={pp} = "
            f"{tp * pp} ranks per data-parallel replica must divide it ({where.describe()}). "
            f"Choose --tp and --pp whose product is one of {fits}, or start a multiple of "
            f"{tp * pp} processes.")
    if where.per_node % tp:
        raise SettingsError(
            f"TP={tp} does not fit in a node of {where.per_node} processes: a TP group must lie "
            f"inside one node (its all-reduces run every layer, on NVLink), so --tp must divide "
            f"the processes per node.")
    return MeshShape(pp=pp, dp=where.world_size // (tp * pp), tp=tp)


def model_config(shape: MeshShape, steps: int) -> TinyConfig:
    """Lab 7's tiny model, grown where the mesh needs it: heads for TP, layers for PP, a batch
    that splits into DP shares of two micro-batches."""
    need = shape.dp * (2 if shape.pp > 1 else 1)
    cfg = TinyConfig(heads=max(4, shape.tp), layers=max(2, shape.pp),
                     batch=need * -(-8 // need), steps=steps)
    try:
        check_batch_fits(cfg, shape)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if cfg.dim % cfg.heads:
        raise SettingsError(f"TP={shape.tp} needs {cfg.heads} heads, which do not divide the "
                            f"model's width {cfg.dim}: use a smaller --tp")
    return cfg


def traffic_table(results: list, comms: list, shape: MeshShape, where, steps: int) -> str:
    """Per axis: its degree, whether its groups cross nodes, calls and MB per step (the
    busiest rank's; receives are the senders' bytes)."""
    rows = {}
    for rank, (result, record) in enumerate(zip(results, comms)):
        groups = axis_groups(shape.coords, shape.world_size, rank, AXES)
        calls = [(c.group, c.op, c.bytes) for c in record] + list(result["functional"])
        for axis, counted in per_axis(calls, groups).items():
            best = rows.setdefault(axis, {"calls": 0, "bytes": 0, "nodes": set()})
            best["calls"] = max(best["calls"], counted["calls"])
            best["bytes"] = max(best["bytes"], counted["bytes"])
            if axis in groups:
                best["nodes"].add(len({where.node_of(r) for r in groups[axis]}))
    lines = [f"{'axis':<6}{'degree':>7}  {'groups':<14}{'calls/step':>11}{'MB/step':>10}   "
             f"(the busiest rank; set-up included)"]
    for axis in AXES + ("other",):
        row = rows.get(axis)
        if row is None or (axis == "other" and not row["calls"]):
            continue
        degree = getattr(shape, axis, "-")
        span = "across nodes" if max(row["nodes"], default=1) > 1 else "within a node"
        lines.append(f"{axis:<6}{degree:>7}  {span:<14}{row['calls'] / steps:>11.1f}"
                     f"{row['bytes'] / steps / 1e6:>10.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.cluster.train3d",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=None,
                        help="tensor-parallel degree (default: the processes per node)")
    parser.add_argument("--pp", type=int, default=None,
                        help="pipeline stages (default 2 where the nodes pair up, else 1)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="auto", help="auto (NCCL on GPUs), gloo or nccl")
    parser.add_argument("--nproc", type=int, default=8, help="ranks to start without torchrun")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="without torchrun: ranks per pretend node (default --tp, or 2)")
    args = parser.parse_args(argv)
    where = placement(args.nproc, args.nproc_per_node or args.tp or 2)
    shape = mesh_shape(where, args.tp, args.pp)
    cfg = model_config(shape, args.steps)
    backend = choose_backend(args.backend, where)
    if printer():
        print(f"distlab.cluster.train3d: {where.describe()}, backend {backend}; mesh {shape}: TP "
              f"inside a node, DP and PP across; {cfg.steps} steps of Lab 7's model")
    try:
        megatron_plan()
    except NotImplementedError as exc:
        raise SettingsError(f"the tensor-parallel plan is missing: {exc}") from None
    start = time.perf_counter()
    out = launch(train_rank, where, backend, shape, cfg, args.seed)
    seconds = time.perf_counter() - start
    if not printer():
        return 0
    results = list(out)
    losses = next(r["losses"] for r in results if r["losses"] is not None)
    run = MeshRun(shape, losses, reference_losses(cfg, args.seed), results, seconds)
    print(run.table())
    print(traffic_table(results, out.comms, shape, where, cfg.steps))
    slowest = [max(r["step_seconds"][i] for r in results) for i in range(cfg.steps)]
    print(f"step time (the slowest rank): first {slowest[0] * 1e3:.1f} ms (builds the "
          f"pipeline, FSDP's first gathers), then median "
          f"{statistics.median(slowest[1:] or slowest) * 1e3:.1f} ms")
    tolerance = LOSS_ATOL + LOSS_RTOL * run.reference.abs()
    if bool(((run.losses - run.reference).abs() <= tolerance).all()):
        print(f"losses equal single-process training's (within {LOSS_ATOL:g} + "
              f"{LOSS_RTOL:g} x |loss|)")
        return 0
    print(f"losses DIFFER from single-process training's by up to {run.max_error:.2e}")
    return 1


if __name__ == "__main__":
    raise SystemExit(guarded("distlab.cluster.train3d", main))
