"""Each lab against the grading budget: seconds and CPU-seconds of a full answer and of an untouched
notebook, and each test's share, on the machine it runs on (issue 45; CONTRIBUTING.md, "The grading
budget").

    .venv/bin/python bench/grading_budget.py                         # every lab of the course
    .venv/bin/python bench/grading_budget.py --labs 07_3d_parallelism 08_sharded_data_parallel
    .venv/bin/python bench/grading_budget.py --from-workdir grading  # read an earlier run's records

Two students are graded with ``python -m distlab.cli grade --jobs 1`` (as the budget is stated: one
notebook at a time): ``full``, the lab's reference answers (tests/submissions' ``solved``), and
``untouched``, the student notebook as handed out. Each row comes from the run's records
(``results/<student>.json``: what the worker measured over each notebook, its kernel, its judge and
ranks included); the worker's own start (interpreter, imports, the judge's zygote, the kernels'
server), paid once per student and not per lab, is taken out of the first lab's and shown on its own
row. A test's share is its cell's CPU-seconds (the kernel's work, the judge's check and its ranks)
over the notebook's; what is not in a test cell is the notebook's own cost (kernel start, the
answer cells, nbgrader's autograde and the feedback HTML).

Wall seconds on a shared machine are inflated by the other work: the 1-minute load average is
printed before and after (compare rows only at similar loads; CPU-seconds vary much less).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

BUDGET_S = 6.0        # wall seconds per lab for a full answer at --jobs 1 on an idle 2-core machine
SAMPLES = ("full", "untouched")
TOP_TESTS = 4         # the costliest tests named in a row; the rest summed as "other tests"


def write_samples(folder: Path, labs: list[str]) -> None:
    """The two students: every lab's reference answers, every lab as handed out."""
    import submissions
    for lab in labs:
        submissions.write(submissions.solved(lab), folder, "full", lab)
        submissions.write(submissions.student(lab), folder, "untouched", lab)


def grade(folder: Path, work: Path, labs: list[str], extra: list[str]) -> float:
    """Wall seconds of one ``distlab grade --jobs 1`` run of ``folder`` into ``work``."""
    command = [sys.executable, "-m", "distlab.cli", "grade", str(folder), "--jobs", "1",
               "--workdir", str(work), "--out", str(work / "scores.csv"), *extra,
               *[a for lab in labs for a in ("--lab", lab)]]
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"distlab grade exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def lab_costs(work: Path) -> tuple[dict, dict]:
    """({(student, lab): {"seconds", "cpu_seconds", "tests": {test: cost}, "score", "max"}},
    {student: the worker's start}) from the run's records, the start taken out of its lab."""
    costs, starts = {}, {}
    for path in sorted((work / "results").glob("*.json")):
        record = json.loads(path.read_text())
        for lab, entry in record["labs"].items():
            seconds, cpu = entry["seconds"], entry.get("cpu_seconds") or 0.0
            start = entry.get("worker_start")
            if start:
                starts[record["student"]] = start
                seconds, cpu = seconds - start["seconds"], cpu - (start["cpu_seconds"] or 0.0)
            costs[(record["student"], lab)] = {
                "seconds": seconds, "cpu_seconds": cpu, "tests": entry.get("test_costs", {}),
                "score": entry["row"]["score"], "max": entry["row"]["max_score"]}
    return costs, starts


def shares(cost: dict) -> str:
    """The costliest tests' shares of the notebook's CPU-seconds, the rest summed."""
    total = cost["cpu_seconds"] or 1e-9
    tests = sorted(cost["tests"].items(), key=lambda kv: -(kv[1].get("cpu_seconds") or 0))
    named = [f"{name.removeprefix('test_')} {(c.get('cpu_seconds') or 0) / total:.0%}"
             for name, c in tests[:TOP_TESTS]]
    rest = sum(c.get("cpu_seconds") or 0 for _, c in tests[TOP_TESTS:])
    if rest:
        named.append(f"{len(tests) - TOP_TESTS} other tests {rest / total:.0%}")
    inside = sum(c.get("cpu_seconds") or 0 for c in cost["tests"].values())
    named.append(f"outside tests {max(total - inside, 0) / total:.0%}")
    return ", ".join(named)


def lab_budget(lab: str) -> float:
    """BUDGET_S, or the lab's own where its checks module states one (``GRADING_BUDGET_S``, with
    why beside it: CONTRIBUTING.md, "The grading budget")."""
    import importlib
    module = importlib.import_module(f"distlab.checks.lab{lab[:2]}")
    return float(getattr(module, "GRADING_BUDGET_S", BUDGET_S))


def table(costs: dict, starts: dict, labs: list[str]) -> None:
    print("| lab | full s | full CPU-s | points | untouched s | untouched CPU-s | "
          f"within its budget ({BUDGET_S:g} s unless stated) | the full answer's CPU by test |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    totals = dict.fromkeys(("fs", "fc", "us", "uc"), 0.0)
    for lab in labs:
        full, blank = costs.get(("full", lab)), costs.get(("untouched", lab))
        if full is None or blank is None:
            print(f"| {lab} | not graded |  |  |  |  |  |  |")
            continue
        points = f"{full['score']:g}/{full['max']:g}" if full["max"] is not None else "?"
        budget = lab_budget(lab)
        within = (("yes" if full["seconds"] <= budget else f"NO (+{full['seconds'] - budget:.1f} s)")
                  + ("" if budget == BUDGET_S else f" (its own {budget:g} s)"))
        print(f"| {lab} | {full['seconds']:.1f} | {full['cpu_seconds']:.1f} | {points} | "
              f"{blank['seconds']:.1f} | {blank['cpu_seconds']:.1f} | {within} | {shares(full)} |")
        for key, value in zip(totals, (full["seconds"], full["cpu_seconds"], blank["seconds"],
                                       blank["cpu_seconds"])):
            totals[key] += value
    print(f"| all {len(labs)} labs | {totals['fs']:.1f} | {totals['fc']:.1f} |  | "
          f"{totals['us']:.1f} | {totals['uc']:.1f} |  |  |")
    for student in SAMPLES:
        start = starts.get(student)
        if start:
            print(f"| worker start ({student}: once per student, not per lab) | "
                  f"{start['seconds']:.1f} | {start['cpu_seconds']:.1f} |  |  |  |  |  |")


def main() -> None:
    from distlab.course.notebooks import labs as course_labs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", default=course_labs(), metavar="LAB")
    parser.add_argument("--grade-args", default="--backend gloo",
                        help="more `distlab grade` options (default: %(default)s)")
    parser.add_argument("--from-workdir", type=Path, metavar="DIR",
                        help="print the table of an earlier run's records (students named full "
                             "and untouched, as this script writes them) instead of grading")
    args = parser.parse_args()
    print(f"{len(args.labs)} labs; {os.cpu_count()} CPUs; load average before: "
          f"{os.getloadavg()[0]:.1f}; distlab grade --jobs 1 {args.grade_args}\n")
    if args.from_workdir:
        costs, starts = lab_costs(args.from_workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="gb-") as tmp:  # short: sockets live under it
            folder, work = Path(tmp) / "submitted", Path(tmp) / "work"
            write_samples(folder, args.labs)
            wall = grade(folder, work, args.labs, args.grade_args.split())
            costs, starts = lab_costs(work)
        print(f"graded {2 * len(args.labs)} notebooks in {wall:.0f} s\n")
    table(costs, starts, args.labs)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}; the budget: {BUDGET_S:g} s wall per lab "
          f"for a full answer at --jobs 1 on an idle 2-core machine")


if __name__ == "__main__":
    main()
