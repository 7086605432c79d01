"""Lab 7's graded prediction (called from ``distlab.checks.lab07``, which the judge serves):
``predict_traffic(shape, cfg, rank) -> {"tp", "pp", "dp"}``, the bytes one rank of the lab's mesh
run sends per training step on each axis, against ``formula_traffic``, section 3's table applied
to the small transformer (``tests/test_lab07.py`` checks it against the bytes the run's records
hold). Visible cases are the lab's two meshes at its size, stored in
``data/07_3d_parallelism/traffic.pt`` (a handout has no formula); hidden ones draw other sizes
and meshes from the seed and compute them in the judge."""
from __future__ import annotations

import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.ranks import call_each
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values
from distlab.labs.mesh import MeshShape, TinyConfig, check_batch_fits

AXES = ("tp", "pp", "dp")
FLOAT32 = 4
TP_CALLS = 6     # per block and micro-batch: o and down in forward; q, k, v and up in backward
VISIBLE = ((MeshShape(pp=2, dp=2, tp=2), TinyConfig()), (MeshShape(pp=1, dp=2, tp=2), TinyConfig()))


def _stage_elements(shape: MeshShape, cfg: TinyConfig, stage: int) -> int:
    """Parameter elements of one stage on one TP rank (before FSDP shards them)."""
    h, f, t = cfg.dim, cfg.ffn, shape.tp
    blocks = (stage + 1) * cfg.layers // shape.pp - stage * cfg.layers // shape.pp
    # two norms (weight, bias), q k v o without bias (split over TP), up with its bias (split),
    # down split by its input features, its bias whole on every TP rank
    block = 4 * h + (4 * h * h + h * f + f + f * h) // t + h
    first = cfg.vocab * h if stage == 0 else 0
    last = 2 * h + cfg.vocab * h if stage == shape.pp - 1 else 0
    return blocks * block + first + last


def formula_traffic(shape: MeshShape, cfg: TinyConfig, rank: int) -> dict[str, float]:
    """Bytes ``rank`` sends in one training step (after the first) on each axis."""
    stage = shape.coords(rank)[0]
    t, p, d = shape.tp, shape.pp, shape.dp
    m = 2 if p > 1 else 1                                   # micro-batches per pipeline
    act = cfg.batch // (d * m) * cfg.seq * cfg.dim * FLOAT32   # one micro-batch's activation
    blocks = (stage + 1) * cfg.layers // p - stage * cfg.layers // p
    directions = (stage < p - 1) + (stage > 0)              # activations forward, gradients back
    weights = _stage_elements(shape, cfg, stage) * FLOAT32
    return {"tp": m * blocks * TP_CALLS * 2 * (t - 1) / t * act,
            "pp": m * directions * act,
            "dp": 2 * (d - 1) / d * weights}                 # one all-gather, one reduce-scatter


def mesh_traffic_cases(seed: int | None) -> list[tuple[MeshShape, TinyConfig, int]]:
    """(shape, cfg, rank): every rank of the lab's two meshes (visible), or of two meshes and
    model sizes drawn from ``seed`` (hidden)."""
    if seed is None:
        return [(shape, cfg, r) for shape, cfg in VISIBLE for r in range(shape.world_size)]
    rng, cases = random.Random(seed), []
    while len(cases) < 2:
        shape = MeshShape(*rng.choice([(2, 2, 2), (2, 1, 4), (1, 2, 4), (2, 4, 1), (1, 4, 2),
                                       (1, 2, 2)]))
        dim = rng.choice([32, 64])
        cfg = TinyConfig(vocab=rng.choice([32, 48]), dim=dim, heads=4, ffn=rng.choice([2, 4]) * dim,
                         layers=rng.randint(max(2, shape.pp), 5), seq=rng.choice([4, 8, 16]),
                         batch=8 * rng.randint(1, 2))
        try:
            check_batch_fits(cfg, shape)
        except ValueError:
            continue
        cases.append((shape, cfg))
    return [(shape, cfg, r) for shape, cfg in cases for r in range(shape.world_size)]


def traffic_set() -> dict:
    """The visible cases' bytes per axis, for ``data/<lab>/traffic.pt``."""
    return {"seed": 0, "expected": torch.tensor(
        [[formula_traffic(*case)[a] for a in AXES] for case in mesh_traffic_cases(None)],
        dtype=torch.float64)}


def grade_traffic_prediction(predict, seed: int | None = None) -> str:
    todo = mesh_traffic_cases(seed)
    expected = expected_values("07_3d_parallelism", "traffic", "expected", seed, todo,
                               lambda case: [formula_traffic(*case)[a] for a in AXES])
    calls = [f"predict_traffic({shape}, {cfg}, rank={rank})" for shape, cfg, rank in todo]
    answers = call_each(predict, todo, names=calls)   # every case in one launch
    for (shape, cfg, rank), call, got, want in zip(todo, calls, answers, expected):
        try:
            got = [float(got[a]) for a in AXES]
        except (TypeError, KeyError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.200}: expected a dict of bytes with the "
                              f"keys {list(AXES)}.") from None
        for axis, g, w in zip(AXES, got, want):
            if abs(g - w) > 1e-6 * max(w, 1.0):
                raise CheckFailed(
                    f"{call}: you predict {g:.0f} bytes on {axis}, the formulas give {w:.0f} "
                    f"(rank {rank} sits at (pp, dp, tp) = {shape.coords(rank)}). Count per "
                    f"step, in float32, what this rank sends as a ring member: all-reduce "
                    f"2(k-1)/k of the buffer, all-gather and reduce-scatter (k-1)/k of the whole "
                    f"buffer, a send all of it.")
    return _traffic_line(todo, answers)


def _traffic_line(todo, answers) -> str:
    """What a pass verified: per mesh, the bytes the student predicts for its busiest rank."""
    meshes = {}
    for (shape, cfg, rank), got in zip(todo, answers):
        sent = [float(got[a]) for a in AXES]
        if sum(sent) >= sum(meshes.get((shape, cfg), (0, [0.0]))[1]):
            meshes[(shape, cfg)] = (rank, sent)
    shown = [f"{shape}, rank {rank} (the most): " + ", ".join(f"{a} {v:,.0f}" for a, v in
                                                              zip(AXES, sent))
             for (shape, _), (rank, sent) in meshes.items()]
    return joined(f"predict_traffic: the bytes per axis of every rank of {len(meshes)} meshes ("
                  f"{len(todo)} ranks) equal the formulas' (relative 1e-6); ", shown,
                  " bytes per step")
