"""Lab 12: how long a checkpoint stops training, a blocking ``dcp.save`` beside ``dcp.async_save``
(FSDP2 on gloo, the state of a 4 x 256 x 1024 float32 model with AdamW: 25 MB a save).

    .venv/bin/python bench/lab12_checkpoint.py [--world-size 2] [--steps 12] [--save-every 4]
    python bench/lab12_checkpoint.py --device cuda --world-size 1 --d 2048 --hidden 8192 --blocks 8

``--device cuda``: each rank on a GPU (NCCL), where an asynchronous save's staging is a copy from
the GPU to CPU memory and its write runs on cores the training does not use; the sizes make the
model (``--blocks`` blocks of ``--d`` x ``--hidden``, float32; a checkpoint of 3 x 4 bytes a
parameter with AdamW).

Per mode, on the slowest rank: the median stall per save (the save call; for async also any wait
on the save before), the median training step (an async write slows the steps it overlaps on a
busy machine), the wait for the last save at the end, the whole run. The machine's load average
is printed beside: the figures mean little without it.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

from distlab.labs.checkpoint.stall import BENCH_SPEC, format_stalls, measure_stalls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--d", type=int, default=BENCH_SPEC.d)
    parser.add_argument("--hidden", type=int, default=BENCH_SPEC.hidden)
    parser.add_argument("--blocks", type=int, default=BENCH_SPEC.blocks)
    args = parser.parse_args()
    spec = dataclasses.replace(BENCH_SPEC, device=args.device, d=args.d, hidden=args.hidden,
                               blocks=args.blocks)
    before = os.getloadavg()[0]
    rows = measure_stalls(args.world_size, args.steps, args.save_every, spec)
    print(f"{args.device}, blocks {spec.blocks} x {spec.d} x {spec.hidden} float32; "
          f"world size {args.world_size}, {args.steps} steps, a save every {args.save_every}; "
          f"{os.cpu_count()} cores, load average {before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(format_stalls(rows))


if __name__ == "__main__":
    main()
