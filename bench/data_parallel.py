"""Step time of data-parallel gradient synchronisation: naive / bucketed / overlapped / DDP.

    .venv/bin/python bench/data_parallel.py [--world-size 2] [--steps 10] [--bucket-kib 256]

Runs the lab 2 solution's own implementations (its solution cells, executed from
solutions/02_data_parallel/02_data_parallel.py) and DDP on the benchmark MLP (6 x Linear(256, 256),
float32, 1.58 MB of gradients) and prints, per strategy, the median step time of the slowest rank,
the collectives and bytes per step (out.comms for the lab's code; a recording comm hook for DDP,
whose reducer issues its all-reduces from C++).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from distlab.course.solutions import solution_functions
from distlab.labs.data_parallel import BENCH_SETUP, compare_step_times, format_step_times

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bucket-kib", type=int, default=256)
    args = parser.parse_args()
    ns = solution_functions("02_data_parallel", ("all_reduce_gradients", "bucketed_all_reduce",
                                                      "OverlappedAllReduce"))
    rows = compare_step_times(ns["all_reduce_gradients"], ns["bucketed_all_reduce"],
                              ns["OverlappedAllReduce"], world_size=args.world_size,
                              steps=args.steps, bucket_bytes=args.bucket_kib * 1024)
    print(f"world size {args.world_size}, {rows[0]['param_bytes']:,} bytes of gradients, "
          f"buckets of {args.bucket_kib} KiB, batch {BENCH_SETUP.batch}, {args.steps} timed steps")
    print(format_step_times(rows))


if __name__ == "__main__":
    main()
