"""Communication share of lab 6's runs, measured from torch.profiler traces and predicted by the
formulas of labs 1-5, plus the overlap of data-parallel all-reduces with backward.

    python bench/timelines.py                  # 2 ranks, default sizes
    python bench/timelines.py --world-size 4 --steps 5 --hidden 512

Prints two tables (no assertions): per run, bytes per step by formula and in the trace, compute,
predicted and measured communication time and share (rank 0, median step); per rank, the
fraction of communication hidden under compute.
"""
from __future__ import annotations

import argparse
import dataclasses

from distlab.checks.lab06 import reference_comm_share, reference_overlap_fraction
from distlab.labs.timelines.views import overlap_table
from distlab.labs.timelines.runs import Spec, link_model, predicted_vs_measured, profile_all


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=Spec.hidden)
    parser.add_argument("--layers", type=int, default=Spec.layers)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    spec = dataclasses.replace(Spec(), hidden=args.hidden, layers=args.layers)
    runs = profile_all(args.world_size, spec, steps=args.steps, backend=args.backend)
    alpha, bandwidth = link_model(args.world_size)
    print(f"\nall-reduce fit on {args.world_size} ranks: alpha = {alpha * 1e6:.0f} us, "
          f"B = {bandwidth / 1e9:.3f} GB/s\n")
    predicted_vs_measured(runs, reference_comm_share, alpha, bandwidth, spec)
    print()
    overlap_table({name: runs[name].timeline for name in ("DP naive", "DP overlapped")},
                  reference_overlap_fraction)


if __name__ == "__main__":
    main()
