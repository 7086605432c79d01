"""Lab 7's design exercise: does any placement of a mesh's coordinates on nodes send fewer bytes
across nodes than the best row-major order of the dimensions? Every placement is tried
(``lab07_design.least_crossing``: every way to put the coordinates on nodes of ``per_node``, by
the formulas of exercise 5, counted as the check counts a run's records), on every mesh of 4 to 8
ranks with two or three axes larger than 1, every node size that divides it, and a grid of model
sizes around the lab's (vocabulary, layers, sequence, batch, width).

    python bench/mesh_placements.py              # one row per (mesh, per_node): its best gain
    python bench/mesh_placements.py --all        # every model size where a placement wins
    python bench/mesh_placements.py --scale      # the graded scale's grid (lab07_scale.GRID)

A row reads: the course's order (TP innermost, PP outermost), the best of the six orders, the
least of every placement, and the gain over the best order, for the model size where that gain is
largest. No computation on ranks; a few seconds per mesh.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from distlab.checks.lab07_design import least_crossing  # noqa: E402
from distlab.checks.lab07_scale import order_crossings  # noqa: E402
from distlab.labs.mesh import MeshShape, TinyConfig, check_batch_fits  # noqa: E402

AXES = ("pp", "dp", "tp")
MESHES = [MeshShape(*t) for t in itertools.product((1, 2, 4), repeat=3)
          if 4 <= t[0] * t[1] * t[2] <= 8 and sum(d > 1 for d in t) >= 2]
SIZES = dict(vocab=(32, 128, 384), layers=(2, 3, 5), seq=(8, 16), batch=(8, 16), dim=(32, 64))


def configs(shape: MeshShape):
    for vocab, layers, seq, batch, dim in itertools.product(*SIZES.values()):
        cfg = TinyConfig(vocab=vocab, dim=dim, ffn=2 * dim, layers=layers, seq=seq, batch=batch)
        try:
            check_batch_fits(cfg, shape)
        except ValueError:
            continue
        yield cfg


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every model size where a placement wins")
    parser.add_argument("--scale", action="store_true",
                        help="the models of the graded scale's grid, with their gains")
    args = parser.parse_args(argv)
    if args.scale:
        return scale_grid()
    print(f"{'mesh':<18} {'nodes':>5} {'tried':>6} {'course order':>13} {'best order':>11} "
          f"{'any placement':>14} {'gain':>6}  model size of the largest gain")
    for shape in MESHES:
        for per_node in [k for k in range(2, shape.world_size) if shape.world_size % k == 0]:
            best = (0.0, None)
            for cfg in configs(shape):
                orders = order_crossings(shape, per_node, cfg)
                least, tried = least_crossing(shape, per_node, cfg)
                gain = 1 - least / min(orders.values())
                row = (gain, cfg, orders[AXES], min(orders.values()), least, tried)
                if args.all and gain > 1e-12:
                    _print(shape, per_node, row)
                best = max(best, row, key=lambda r: r[0])
            if best[1] is not None and not args.all:
                _print(shape, per_node, best)
            elif not args.all:
                print(f"{str(shape):<18} {per_node:>5}  no placement beats the best order on any size")


def scale_grid() -> None:
    """Every model of ``lab07_scale.GRID`` on its mesh and nodes whose least is at least
    ``MIN_GAIN`` below the best order's: the models a hidden case draws from."""
    from distlab.checks import lab07_scale as S
    print(f"{'model':<58} {'best order':>11} {'bar':>10} {'bound':>10} {'gain':>6}")
    count = 0
    for cfg in S._grid_models(0):
        hinted, bound = S._figures(cfg)
        if bound <= hinted * (1 - S.MIN_GAIN):
            count += 1
            print(f"{S.problem_line(cfg).split(', ', 1)[1]:<58} {hinted:>11,.0f} "
                  f"{(hinted + bound) / 2:>10,.0f} {bound:>10,.0f} {1 - bound / hinted:>6.1%}")
    print(f"{count} models gain at least {S.MIN_GAIN:.0%} ({S.SHAPE} on nodes of {S.PER_NODE})")


def _print(shape: MeshShape, per_node: int, row) -> None:
    gain, cfg, course, best_order, least, tried = row
    print(f"{str(shape):<18} {per_node:>5} {tried:>6} {course:>13.0f} {best_order:>11.0f} "
          f"{least:>14.0f} {gain:>6.1%}  vocab {cfg.vocab}, {cfg.layers} layers, seq {cfg.seq}, "
          f"batch {cfg.batch}, dim {cfg.dim}")


if __name__ == "__main__":
    main()
