"""Lab 7's open design exercise (called from ``distlab.checks.lab07``, which the judge serves):
``place_mesh(shape, per_node, sent) -> layout``, the global rank at each (pp, dp, tp) coordinate
of a mesh whose ranks sit on nodes of ``per_node`` consecutive ranks, given what each rank of the
row-major numbering sends per step on each axis (``sent``, by exercise 5's formulas, handed over
so that a mistake in the prediction does not cost the design too), graded on a scale of two tests
(``common.design_scale``):

- the first trains the lab's small transformer on the student's layout with the student's TP
  plan, on real ranks (``distlab.labs.mesh_traffic``): the losses must equal single-process
  training's, and the bytes the ranks send in one step on collectives whose ranks are not all on
  one node (a send counts when its two ranks are on different nodes) may not exceed the least
  any layout reaches, by the prediction's formulas (``lab07_prediction``). On these problems the
  best order of the dimensions reaches that least (``grade_placement``). It then grades the
  scale's problem at the best order's bytes (``lab07_scale.grade_scale``);
- the second grades the scale's problem at the bar, halfway from the best order's bytes to the
  least of every placement (``lab07_scale``).

The run's visible problem is the lab's 8-rank mesh on 2 nodes of 4, its budget, bytes per rank
and losses stored in ``data/07_3d_parallelism/placement.pt``; hidden problems draw another mesh
and seed, their budget computed in the judge. A hidden mesh has 4 ranks on 2 nodes of 2, two of its axes larger
than 1: one of the two must cross nodes, and which one is the decision the visible problem grades
(on 8 ranks the outermost axis alone crosses). Both placements the lab's planted mistakes make
(TP across nodes; DP across nodes rather than PP) send more than the budget there as on 8 ranks,
at half the ranks' cost (``tests/test_lab07.py``).

The least is ``least_crossing``: the least, by the formulas, of every way to put the mesh's
coordinates on the nodes (not only the six row-major orders of the dimensions: 35 placements for
8 ranks on 2 nodes of 4, 3 for 4 ranks on 2 nodes of 2, 105 for 8 ranks on 4 nodes of 2),
computed in the judge (``bench/mesh_placements.py`` searches every mesh of 4 to 8 ranks and node
size over a grid of model sizes for where it is below the best order's).

Cost: the first test's problem is one run of ``CHECK_CFG.steps`` steps, the bytes the last
step's; the scale's problem is counted on its call table, without ranks."""
from __future__ import annotations

import itertools
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
# Two steps: the second is the first after set-up (the first builds the pipeline and gathers once
# more), the one whose bytes are graded, and its loss shows the first update. A third step checks
# nothing the second does not, and cost the 8 ranks about 0.4 of their 5 CPU-s (the 4 ranks 0.15
# of 2.4; medians of three runs each, alternated, load average 12-14).
CHECK_CFG = TinyConfig(steps=2)


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


def _calls(shape: MeshShape, cfg: TinyConfig) -> list[tuple[tuple, float]]:
    """(the coordinates a call involves, the bytes all its ranks send in one step), by the
    formulas: each TP and DP group's collectives, and each pair of neighbouring stages' sends
    (activations forward, their gradients back), as ``cross_node_bytes`` counts them."""
    sizes, rank_at = (shape.pp, shape.dp, shape.tp), megatron_layout(shape)
    cells = list(itertools.product(*map(range, sizes)))
    sent = {c: formula_traffic(shape, cfg, rank_at[c[0]][c[1]][c[2]]) for c in cells}  # by stage
    calls = []
    for i, axis in ((1, "dp"), (2, "tp")):
        for c in cells:
            if c[i] == 0:                                  # the group along ``axis`` through c
                group = tuple(c[:i] + (k,) + c[i + 1:] for k in range(sizes[i]))
                calls.append((group, sum(sent[g][axis] for g in group)))
    for c in cells:
        if c[0] + 1 < shape.pp:
            nxt = (c[0] + 1, *c[1:])
            per_direction = [sent[s]["pp"] / ((s[0] > 0) + (s[0] < shape.pp - 1)) for s in (c, nxt)]
            calls.append(((c, nxt), sum(per_direction)))
    return calls


def _placements(cells: list, per_node: int):
    """Every way to put ``cells`` on nodes of ``per_node`` (which node is which does not matter):
    lists of nodes, each a tuple of cells."""
    if not cells:
        yield []
        return
    first, rest = cells[0], cells[1:]
    for others in itertools.combinations(rest, per_node - 1):
        left = [c for c in rest if c not in others]
        for nodes in _placements(left, per_node):
            yield [(first, *others), *nodes]


def crossing(calls, node_of: dict) -> float:
    """Bytes per step on calls whose coordinates sit on more than one node."""
    return sum(nbytes for group, nbytes in calls if len({node_of[c] for c in group}) > 1)


def least_crossing(shape: MeshShape, per_node: int, cfg: TinyConfig) -> tuple[float, int]:
    """(the least bytes per step across nodes of any placement, by the formulas; how many
    placements were tried): every placement of the coordinates on nodes, not only the orders of
    the dimensions."""
    calls, best, count = _calls(shape, cfg), float("inf"), 0
    cells = list(itertools.product(range(shape.pp), range(shape.dp), range(shape.tp)))
    for nodes in _placements(cells, per_node):
        count += 1
        best = min(best, crossing(calls, {c: n for n, node in enumerate(nodes) for c in node}))
    return best, count


SENT_AXES = ("tp", "pp", "dp")


def sent_rows(shape: MeshShape, cfg: TinyConfig) -> torch.Tensor:
    """(ranks, 3) float64: what each rank of the row-major numbering sends per step on tp, pp and
    dp, by the formulas: the ``sent`` a check hands ``place_mesh``."""
    return torch.tensor([[formula_traffic(shape, cfg, r)[a] for a in SENT_AXES]
                         for r in range(shape.world_size)], dtype=torch.float64)


def sent_dicts(rows: torch.Tensor) -> list[dict[str, float]]:
    """``sent`` as the student reads it: one {"tp", "pp", "dp"} dict of bytes per rank."""
    return [dict(zip(SENT_AXES, row)) for row in rows.tolist()]


def placement_set() -> dict:
    """The visible problem's budget, bytes per rank and single-process losses, for
    ``data/<lab>/placement.pt``."""
    shape, per_node = VISIBLE
    return {"seed": SEED, "budget": torch.tensor(least_crossing(shape, per_node, TinyConfig())[0],
                                                 dtype=torch.float64),
            "sent": sent_rows(shape, TinyConfig()), "losses": reference_losses(TinyConfig(), SEED)}


def placement_budget() -> float:
    """The visible problem's budget, as stored: bytes per step that may cross nodes."""
    from distlab.checks.stored import load
    return load("07_3d_parallelism", "placement")["budget"].item()


def _problem(seed: int | None):
    """(shape, per_node, cfg, seed, budget, losses, sent); hidden: a mesh of 4 ranks and another
    seed. The stored losses are the lab's run's, ``TinyConfig().steps`` of them: the check's run
    makes the same batches' first ``CHECK_CFG.steps`` (``tests/test_lab07.py``)."""
    cfg = CHECK_CFG
    if seed is None:
        from distlab.checks.stored import load
        stored = load("07_3d_parallelism", "placement")
        return (*VISIBLE, cfg, SEED, placement_budget(), stored["losses"][:cfg.steps],
                stored["sent"])
    shape, per_node = MeshShape(*random.Random(seed).choice(HIDDEN_TRIPLES)), HIDDEN_PER_NODE
    budget = least_crossing(shape, per_node, cfg)[0]
    return shape, per_node, cfg, seed, budget, reference_losses(cfg, seed), sent_rows(shape, cfg)


def sent_note(shape: MeshShape, what: str) -> str:
    """How a verdict names the ``sent`` it handed over."""
    return f"sent=<the bytes per step of each of the {shape.world_size} ranks of {what}>"


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
    """The first test's run: losses and bytes across nodes within the least (the scale's problem
    is ``lab07_scale``'s)."""
    from distlab.checks.ranks import run_each_backend
    shape, per_node, cfg, run_seed, budget, losses, sent = _problem(seed)
    note = sent_note(shape, "the lab's model")
    call = f"place_mesh({shape!r}, per_node={per_node}, {note})"
    layout = _layout(place_mesh(shape, per_node, sent_dicts(sent)), shape, call)
    losses = reference(losses)
    shares = PerRank(mesh_shares(shape, cfg, run_seed, layout))   # stage and rows, not the seed
    # DTensor's collectives counted in the graded (last) step alone: the bytes are that step's
    for backend, out in run_each_backend(traced_mesh_rank, shape.world_size, shape, layout, cfg,
                                         shares, plan_fn, True):
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
    return (f"{shape} on {shape.world_size // per_node} nodes of {per_node}: layout {layout}, "
            f"losses equal single-process training's; {crossed} bytes per step cross nodes "
            f"(budget {budget:.0f}: the least of every placement of the ranks on nodes, which the "
            f"best order of the dimensions reaches here)")
