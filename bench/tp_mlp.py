"""Tensor-parallel MLP step time: dense vs hand-written TP vs DTensor TP, on 1, 2 and 4 ranks.

    python bench/tp_mlp.py                      # default shape, gloo on CPU (NCCL where GPUs)
    python bench/tp_mlp.py --hidden 1024 --steps 10

Prints one table: median forward+backward milliseconds of the slowest rank, one thread per rank
(one core standing in for one device). Also prints the per-block communication from the Megatron
formula for the same shape. No assertions: read the numbers.
"""
from __future__ import annotations

import argparse

from distlab.labs.tables import format_table
from distlab.labs.tensor_parallel import megatron_comm_bytes, ring_bytes_per_rank, timing_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=None, help="default 4 * hidden")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    ffn = args.ffn or 4 * args.hidden
    timing_table(None, tuple(args.world_sizes), args.batch, args.seq, args.hidden, ffn, args.steps)
    formula = megatron_comm_bytes(args.batch, args.seq, args.hidden)
    print("\nper block, per rank (nccl-tests message bytes; ring bytes each rank sends at p=2 and p=4):")
    ring = {p: {v: ring_bytes_per_rank(phases, p) for v, phases in formula.items()} for p in (2, 4)}
    print(format_table([{"variant": v, "pass": ph,
                         "collectives": ", ".join(f"{op} {n} B" for op, n in ops.items()),
                         "ring B (p=2)": f"{ring[2][v][ph]:.0f}", "ring B (p=4)": f"{ring[4][v][ph]:.0f}"}
                        for v, phases in formula.items() for ph, ops in phases.items()]))


if __name__ == "__main__":
    main()
