"""Wall time of ``distlab grade`` on the sample submissions, serial and with ``--jobs 2``, side by
side in one run.

    python bench/grading.py [--lab 01_collectives] [--jobs 1 2]

The samples are made by code from the lab sources (tests/submissions): the solution, the
untouched student notebook, and the lab's special cases (for Lab 1: a partial answer, a hang in a
collective, a crashing rank, an edited locked test cell). Prints one row per --jobs value.
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import submissions  # noqa: E402  (tests/submissions: the sample submissions, made by code)

from distlab import grade  # noqa: E402


def write_samples(lab: str, folder: Path) -> int:
    samples = {("solution", lab): submissions.solved(lab), ("untouched", lab): submissions.student(lab)}
    samples.update({key: nb for key, (nb, _) in submissions.special_samples().items() if key[1] == lab})
    for (student, _), nb in samples.items():
        submissions.write(nb, folder, student, lab)
    return len(samples)


def time_grading(folder: Path, jobs: int, work: Path) -> tuple[float, list[dict]]:
    out = work / f"scores_{jobs}.csv"
    start = time.perf_counter()
    status = grade.main([str(folder), "--out", str(out), "--jobs", str(jobs), "--workdir",
                         str(work / f"jobs{jobs}"), "--backend", "gloo", "--rank-timeout", "10"])
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"distlab grade exited with {status}")
    with open(out) as f:
        return seconds, list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="01_collectives")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        count = write_samples(args.lab, tmp / "submitted")
        print(f"{count} submissions of {args.lab}\n")
        print("| --jobs | wall time | per submission | scores |")
        print("|-------:|----------:|---------------:|:-------|")
        for jobs in args.jobs:
            seconds, rows = time_grading(tmp / "submitted", jobs, tmp)
            scores = ", ".join(f"{r['student']} {float(r['score']):g}/{float(r['max_score']):g}"
                               for r in sorted(rows, key=lambda r: r["student"]))
            print(f"| {jobs} | {seconds:.1f} s | {seconds / count:.1f} s | {scores} |", flush=True)


if __name__ == "__main__":
    main()
