"""Lab 7's open design exercise (called from ``distlab.checks.lab07``, which the judge serves):
``place_mesh(shape, per_node) -> layout``, the global rank at each (pp, dp, tp) coordinate of a
mesh whose ranks sit on nodes of ``per_node`` consecutive ranks, graded by its properties on a
real run with the student's TP plan (``distlab.labs.mesh_traffic``):

- the losses of the lab's small transformer trained on that layout equal single-process
  training's;
- the bytes the ranks send, in one step, on collectives whose ranks are not all on one node (a
  send counts when its two ranks are on different nodes) stay within a budget: the least any
  layout reaches, the course's placement's by the prediction's formulas (``lab07_prediction``).

The visible problem is the lab's 8-rank mesh on 2 nodes of 4, its budget and losses stored in
``data/07_3d_parallelism/placement.pt``; hidden problems draw another mesh and seed, their budget
computed in the judge. A hidden mesh has 4 ranks on 2 nodes of 2, two of its axes larger than 1:
one of the two must cross nodes, and which one is the decision the visible problem grades (on 8
ranks the outermost axis alone crosses). Both placements the lab's planted mistakes make (TP
across nodes; DP across nodes rather than PP) send more than the budget there as on 8 ranks, at
half the ranks' cost (``tests/test_lab07.py``)."""
from __future__ import annotations

import random

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.lab07_prediction import formula_traffic
from distlab.labs.mesh import (LOSS_ATOL, LOSS_RTOL, MeshShape, TinyConfig, mesh_shares,
                              reference_losses)
from distlab.runtime.per_rank import PerRank, reference
from distlab.labs.mesh_traffic import (AXES, axis_traffic, cross_node_bytes, groups_of,
                                       megatron_layout, traced_mesh_rank)

VISIBLE = (MeshShape(pp=2, dp=2, tp=2), 4)
HIDDEN_TRIPLES = ((2, 2, 1), (2, 1, 2), (1, 2, 2))     # (pp, dp, tp) on 4 ranks, nodes of 2
HIDDEN_PER_NODE = 2
SEED = 707


def _spanning(layout, rank: int, per_node: int) -> list[str]:
    """The axes along which ``rank``'s group has ranks on more than one node."""
    return [axis for axis, group in groups_of(layout, rank).items()
            if len({r // per_node for r in group}) > 1]


def _budget(shape: MeshShape, per_node: int, cfg: TinyConfig) -> float:
    """Bytes per step across nodes of the course's placement, by the formulas: every rank's bytes
    on each axis whose group spans more than one node."""
    layout = megatron_layout(shape)
    return sum(formula_traffic(shape, cfg, rank)[axis] for rank in range(shape.world_size)
               for axis in _spanning(layout, rank, per_node))


def placement_set() -> dict:
    """The visible problem's budget and single-process losses, for ``data/<lab>/placement.pt``."""
    shape, per_node = VISIBLE
    return {"seed": SEED, "budget": torch.tensor(_budget(shape, per_node, TinyConfig()),
                                                 dtype=torch.float64),
            "losses": reference_losses(TinyConfig(), SEED)}


def placement_budget() -> float:
    """The visible problem's budget, as stored: bytes per step that may cross nodes."""
    from distlab.checks.stored import load
    return load("07_3d_parallelism", "placement")["budget"].item()


def _problem(seed: int | None):
    """(shape, per_node, cfg, seed, budget, losses); hidden: a mesh of 4 ranks and another seed."""
    if seed is None:
        from distlab.checks.stored import load
        return (*VISIBLE, TinyConfig(), SEED, placement_budget(),
                load("07_3d_parallelism", "placement")["losses"])
    shape, cfg = MeshShape(*random.Random(seed).choice(HIDDEN_TRIPLES)), TinyConfig()
    per_node = HIDDEN_PER_NODE
    return shape, per_node, cfg, seed, _budget(shape, per_node, cfg), reference_losses(cfg, seed)


def _layout(got, shape: MeshShape, call: str) -> list:
    """The layout as nested lists of ints, after checking it places every rank once."""
    try:
        grid = torch.as_tensor(got, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{call} returned {got!r:.200}: expected nested lists of ranks, "
                          f"layout[pp][dp][tp] = rank.") from None
    want = (shape.pp, shape.dp, shape.tp)
    if tuple(grid.shape) != want:
        raise CheckFailed(f"{call} returned a layout of shape {tuple(grid.shape)}; expected "
                          f"{want}: layout[pp][dp][tp] = the rank at those coordinates.")
    if sorted(grid.flatten().tolist()) != list(range(shape.world_size)):
        raise CheckFailed(f"{call} returned {grid.tolist()}: every rank 0..{shape.world_size - 1} "
                          f"must appear exactly once.")
    return grid.tolist()


def grade_placement(place_mesh, plan_fn, seed: int | None = None) -> str:
    from distlab.checks.ranks import run_each_backend
    shape, per_node, cfg, run_seed, budget, losses = _problem(seed)
    call = f"place_mesh({shape!r}, per_node={per_node})"
    layout = _layout(place_mesh(shape, per_node), shape, call)
    losses = reference(losses)
    shares = PerRank(mesh_shares(shape, cfg, run_seed, layout))   # stage and rows, not the seed
    for backend, out in run_each_backend(traced_mesh_rank, shape.world_size, shape, layout, cfg,
                                         shares, plan_fn):
        got = next(r["losses"] for r in out if r["losses"] is not None)
        assert_close(got, losses, what=f"the loss of each step on your layout {layout} ({backend}) "
                     f"vs single-process training", atol=LOSS_ATOL, rtol=LOSS_RTOL)
        crossed = sum(cross_node_bytes(out[r], out.comms[r], r, per_node)
                      for r in range(shape.world_size))
        if crossed > budget * (1 + 1e-9):
            by_axis = {a: 0 for a in AXES}
            for r in range(shape.world_size):
                sent = axis_traffic(out[r], out.comms[r], r, layout)
                for axis in _spanning(layout, r, per_node):
                    by_axis[axis] += sent[axis]
            spans = ", ".join(f"{a} {b} bytes" for a, b in by_axis.items() if b)
            nodes = ", ".join(f"{n}-{n + per_node - 1}" for n in range(0, shape.world_size, per_node))
            raise CheckFailed(
                f"{call} = {layout}: in one step the ranks sent {crossed} bytes on groups that "
                f"span nodes ({spans}); the budget is {budget:.0f} bytes. Nodes hold ranks "
                f"{nodes}. Which axis sends the most per step, and which the least? Keep the "
                f"heavy ones inside a node.")
    return (f"layout {layout}: losses equal single-process training's; {crossed} bytes per step "
            f"cross nodes (budget {budget:.0f}: the course's placement, TP innermost and PP "
            f"outermost, and the least of the six orders of the dimensions)")
