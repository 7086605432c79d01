"""Scaling of a tensor-parallel transformer block (attention + MLP) on 1, 2 and 4 ranks.

    python bench/tp_attention.py                          # CPU: gloo, ranks started by distlab.run
    python bench/tp_attention.py --hidden 512 --seq 256   # a bigger block
    torchrun --standalone --nproc-per-node=4 bench/tp_attention.py --hidden 4096 --seq 2048 \
        --heads 32 --kv-heads 8                           # one GPU node: NCCL, same code

Prints one table: median forward+backward milliseconds of the slowest rank for N = 1 (the dense
block), 2 and 4 ranks, the speedup T1/TN, the scaling efficiency T1/(N TN), and rank 0's time inside
all_reduce calls per step. Under torchrun the processes already exist: every N runs on the first N
ranks (a process group of its own) while the others wait, so one launch with --nproc-per-node=4
measures all three. On NCCL "all-reduce ms" is only the launch time (collectives run
asynchronously on the GPU); Lab 6 shows the real timeline. With --plot FILE it also saves the
figure. No assertions: read the numbers.
"""
from __future__ import annotations

import argparse
import os

from distlab.labs.attention import plot_scaling, scaling_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    parser.add_argument("--ffn", type=int, default=None, help="default 4 * hidden")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--plot", metavar="FILE", help="save the step-time/efficiency figure")
    args = parser.parse_args()
    rows = scaling_table(tuple(args.world_sizes), args.batch, args.seq, args.hidden, args.heads,
                         args.kv_heads or args.heads, args.ffn, args.steps)
    if args.plot and os.environ.get("RANK", "0") == "0":
        plot_scaling(rows).savefig(args.plot, dpi=120)
        print(f"figure saved to {args.plot}")


if __name__ == "__main__":
    main()
