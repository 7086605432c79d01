"""Lab 12: how long a checkpoint stops training, a blocking ``dcp.save`` beside ``dcp.async_save``
(FSDP2 on gloo, the state of a 4 x 256 x 1024 float32 model with AdamW: 25 MB a save).

    .venv/bin/python bench/lab12_checkpoint.py [--world-size 2] [--steps 12] [--save-every 4]

Per mode, on the slowest rank: the median stall per save (the save call; for async also any wait
on the save before), the median training step (an async write slows the steps it overlaps on a
busy machine), the wait for the last save at the end, the whole run. The machine's load average
is printed beside: the figures mean little without it.
"""
from __future__ import annotations

import argparse
import os

from distlab.labs.checkpoint.stall import format_stalls, measure_stalls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()
    before = os.getloadavg()[0]
    rows = measure_stalls(args.world_size, args.steps, args.save_every)
    print(f"world size {args.world_size}, {args.steps} steps, a save every {args.save_every}; "
          f"{os.cpu_count()} cores, load average {before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    print(format_stalls(rows))


if __name__ == "__main__":
    main()
