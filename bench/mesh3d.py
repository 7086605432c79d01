"""Step time of Lab 7's small transformer on device meshes of every shape up to 8 ranks, beside
its single-process loss, on real ranks (gloo on CPU, NCCL where each rank has a GPU).

    python bench/mesh3d.py                       # the default TinyConfig, 6 steps
    python bench/mesh3d.py --steps 10 --dim 64 --layers 4

Each layout (PP x DP x TP) is one ``distlab.run``: the table reports the median over steps 2..n
of the slowest rank's step time (step 1 includes building the pipeline and FSDP's first
all-gathers), the parameter elements one rank stores, and the largest difference between the mesh
run's losses and single-process training's. On a machine with fewer cores than ranks the ranks
share cores, so this measures the overhead of each axis's machinery on a toy model, not speed-up.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from distlab.labs.mesh import MeshShape, TinyConfig, dense_elements, run_mesh  # noqa: E402

LAYOUTS = [MeshShape(1, 1, 1), MeshShape(1, 2, 1), MeshShape(1, 1, 2), MeshShape(2, 1, 1),
           MeshShape(1, 2, 2), MeshShape(2, 2, 1), MeshShape(2, 1, 2), MeshShape(2, 2, 2)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    cfg = TinyConfig(dim=args.dim, ffn=2 * args.dim, layers=args.layers, batch=args.batch,
                     steps=args.steps)
    print(f"{cfg}; dense model {dense_elements(cfg)} parameter elements; {os.cpu_count()} CPU cores")
    print(f"{'layout':22s} {'ranks':>5s} {'step ms (median)':>17s} {'elements/rank':>14s} "
          f"{'max |dloss|':>12s}")
    for shape in LAYOUTS:
        run = run_mesh(shape, cfg=cfg, seed=0)
        slowest = [max(r["step_seconds"][i] for r in run.results) for i in range(cfg.steps)]
        ms = 1e3 * statistics.median(slowest[1:] or slowest)
        print(f"{str(shape):22s} {shape.world_size:5d} {ms:17.1f} "
              f"{max(r['elements'] for r in run.results):14d} {run.max_error:12.1e}")


if __name__ == "__main__":
    main()
