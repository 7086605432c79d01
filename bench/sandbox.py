"""Cost of one MemoryWatch poll (distlab.grading.sandbox) over a zygote-like family of processes.

    .venv/bin/python bench/sandbox.py [--ranks 19] [--private-mb 50] [--polls 20]

A process imports torch and forks `--ranks` children that each touch `--private-mb` MB of their
own, the way the zygote forks ranks (torch's pages shared copy-on-write). The watch's root is
that process's parent, so all of them are watched. Prints the milliseconds of: listing the
descendants; a poll when their RSS sum is under the limit (the common case: no PSS read); a
poll when the RSS sum is over the limit but the PSS sum is under (steady state: PSS re-read
every `refresh` seconds per process, estimated in between); reading every PSS (what a poll
pays when the estimate crosses the limit, and once per process per `refresh` seconds).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from distlab.grading import sandbox

FAMILY = """
import os, sys, time
import torch
children = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        mine = b"x" * (int(sys.argv[2]) << 20)
        time.sleep(600)
        os._exit(0)
    children.append(pid)
time.sleep(2)
print("ready", flush=True)
time.sleep(600)
"""


def timed(fn, polls: int) -> float:
    times = []
    for _ in range(polls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=19)
    parser.add_argument("--private-mb", type=int, default=50)
    parser.add_argument("--polls", type=int, default=20)
    args = parser.parse_args()
    launcher = subprocess.Popen([sys.executable, "-c",
                                 "import subprocess, sys; subprocess.run(sys.argv[1:])",
                                 sys.executable, "-c", FAMILY, str(args.ranks),
                                 str(args.private_mb)], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline() == "ready\n"
        family = sandbox.descendants(launcher.pid)
        rss = sum(sandbox._rss(p) for p in family)
        pss = sum(sandbox._pss(p) for p in family)
        under = sandbox.MemoryWatch(launcher.pid, rss + (1 << 30))
        between = sandbox.MemoryWatch(launcher.pid, (rss + pss) // 2)
        between.poll()   # first measure of every process, as a long-running watch has done
        rows = [("list descendants", timed(lambda: sandbox.descendants(launcher.pid), args.polls)),
                ("poll, RSS sum under limit", timed(under.poll, args.polls)),
                ("poll, PSS under < limit < RSS sum", timed(between.poll, args.polls)),
                ("read every PSS", timed(lambda: [sandbox._pss(p) for p in family], args.polls))]
        assert not under.events and not between.events
        print(f"{len(family)} processes (torch + {args.ranks} forks with {args.private_mb} MB each): "
              f"RSS sum {rss >> 20} MiB, PSS sum {pss >> 20} MiB; median of {args.polls}")
        for name, ms in rows:
            print(f"  {name:<36} {ms:8.2f} ms")
        w = between
        busy = rows[2][1] / w.interval + rows[3][1] / w.refresh   # ms of work per second
        print(f"  => a watch over the RSS limit costs ~{busy / 10:.1f}% of a core "
              f"(interval {w.interval} s, refresh {w.refresh} s); under it "
              f"~{rows[1][1] / under.interval / 10:.1f}%")
    finally:
        sandbox.kill_tree(launcher.pid)
        launcher.wait()


if __name__ == "__main__":
    main()
