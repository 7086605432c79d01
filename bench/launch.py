"""Launch latency: ``distlab.run`` of a trivial function against ``torch.multiprocessing.spawn``
of the same work (init a gloo group, all-reduce one number, tear down), side by side in one run.

    python bench/launch.py [--repeats 5]

Prints the median wall time per launch for 2 and 4 ranks, and the speed-up.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distlab


def trivial(rank: int, world_size: int) -> float:
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(rank: int, world_size: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    trivial(rank, world_size)
    dist.destroy_process_group()


def time_distlab(world_size: int) -> float:
    start = time.perf_counter()
    distlab.run(trivial, world_size)
    return time.perf_counter() - start


def time_spawn(world_size: int) -> float:
    start = time.perf_counter()
    mp.spawn(_spawned, args=(world_size, _free_port()), nprocs=world_size, join=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    distlab.warm_up().wait_ready()
    distlab.run(trivial, 2)  # the zygote is started once per session, not per launch
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}, python {sys.version.split()[0]}")
    print(f"median of {args.repeats} launches (init gloo group + one all-reduce + teardown)\n")
    print(f"| ranks | distlab.run | mp.spawn | speed-up |")
    print(f"|------:|------------:|---------:|---------:|")
    for world_size in (2, 4):
        ours = statistics.median(time_distlab(world_size) for _ in range(args.repeats))
        theirs = statistics.median(time_spawn(world_size) for _ in range(args.repeats))
        print(f"| {world_size} | {ours:.3f} s | {theirs:.3f} s | {theirs / ours:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
