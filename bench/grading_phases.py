"""Where one notebook's grading time goes: a breakdown per phase of ``distlab grade``.

    .venv/bin/python bench/grading_phases.py                          # Lab 1: reference, untouched
    .venv/bin/python bench/grading_phases.py --lab 03_tensor_parallel_mlp --cells  # a row per cell
    .venv/bin/python bench/grading_phases.py --run-all    # teaching cells run too, as before

For each sample (the lab's reference answers, then the untouched student notebook) it runs the real
grading path (``orchestrate.grade_run``: template, course folder, the worker process, nbgrader, the
judge, feedback) with the worker started through this script, which times the worker's phases from
the inside without changing what they do:

    worker start        interpreter, imports, sandbox, the judge and its socket (to nbgrader's call)
    autograde pre       nbgrader's autograde before execution (its preprocessors, the gradebook read)
    kernel start        the graded kernel: Landlock wrapper, interpreter, ipykernel, until cell 1
    solution cells      each code cell that is not a test, as the kernel ran it
    test cells          each test cell, split into
      kernel + sending    the cell's time outside the judge (the kernel's own work, pickling, the
                          socket round trip)
      judge: ranks        the check's ranks (``Launcher.run``: zygote fork, rendezvous, the code)
      judge: comparing    the rest of the judge's handling (unpacking, references, comparisons)
    kernel shutdown     after the last cell, until nbgrader's Execute returns
    autograde post      nbgrader's preprocessors after execution (the gradebook write: SaveAutoGrades)
    scoring             the judge's record into the notebook (``distlab.grading.scoring``)
    feedback HTML       ``nbgrader generate_feedback`` (preprocessors and the HTML export)
    worker exit         the judge's close, leftovers killed, until the row is back
    orchestration       template copy, course folder, scores CSV, gradebook merge (outside the worker)

Wall times on a shared machine: the 1-minute load average is printed with each table.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVENTS_ENV = "DISTLAB_BENCH_PHASES"   # where the worker shim appends its timed events (JSON lines)
RUN_ALL_ENV = "DISTLAB_BENCH_RUN_ALL"  # set: the worker shim runs the teaching cells too (--run-all)
RUNS_ENV = "DISTLAB_BENCH_RUNS"        # set: an event per run of the judge's ranks (--runs)


# -- inside the worker: time the phases by wrapping the methods that run them ----------------------
def _wrap(owner, name: str, on_enter, on_exit):
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        token = on_enter(*args)
        try:
            return inner(*args, **kwargs)
        finally:
            on_exit(token, *args)
    setattr(owner, name, wrapped)


def _worker(argv: list[str]) -> int:
    from distlab.grading.imports import skip_slow_imports
    skip_slow_imports()  # as the worker does first (the imports below would come before it)
    import psutil
    from nbconvert.exporters import HTMLExporter
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.utils import is_grade

    from distlab.grading import execution, judge as judge_module, worker
    from distlab.runtime.launch import Launcher

    events = open(os.environ[EVENTS_ENV], "a")
    born = psutil.Process().create_time()

    def emit(phase: str, seconds: float, **extra) -> None:
        events.write(json.dumps({"phase": phase, "seconds": seconds, **extra}) + "\n")
        events.flush()

    emit("worker start", time.time() - born)  # interpreter, imports so far
    marks: dict[str, float] = {}
    judged = collections.defaultdict(lambda: {"ranks": 0.0, "judge": 0.0})
    current = {}

    def mark(key):
        return lambda *args: marks.__setitem__(key, time.perf_counter())

    # worker start ends when nbgrader's autograde begins; everything before it is the worker's
    _wrap(worker, "_grade_lab", mark("lab"), lambda *a: None)

    def autograde_enter(*args):
        marks["autograde"] = time.perf_counter()
        emit("worker start", marks["autograde"] - marks.get("main", marks["autograde"]))

    def autograde_exit(_token, *args):
        now = time.perf_counter()
        emit("autograde post", now - marks["execute_end"])
        marks["scoring"] = now
    _wrap(NbGraderAPI, "autograde", autograde_enter, autograde_exit)

    def execute_enter(*args):
        marks["execute"] = marks["last_cell_end"] = time.perf_counter()
        emit("autograde pre", marks["execute"] - marks["autograde"])
        marks["first_cell"] = None

    def execute_exit(_token, *args):
        marks["execute_end"] = time.perf_counter()
        emit("kernel shutdown", marks["execute_end"] - marks["last_cell_end"])
    _wrap(execution.GradedExecute, "preprocess", execute_enter, execute_exit)

    def cell_enter(self, cell, resources, index):
        now = time.perf_counter()
        if cell.cell_type == "code" and marks["first_cell"] is None:
            marks["first_cell"] = now
            emit("kernel start", now - marks["execute"])
        current["cell"] = index
        return now

    def cell_exit(start, self, cell, resources, index):
        if cell.cell_type != "code":
            return
        now = time.perf_counter()
        marks["last_cell_end"] = now
        tags = cell.metadata.get("tags", [])
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if is_grade(cell):
            j = judged.pop(index, {"ranks": 0.0, "judge": 0.0})
            emit("test cell", now - start, cell=index, grade_id=grade_id,
                 ranks=j["ranks"], judge=j["judge"])
        else:
            emit("solution cell", now - start, cell=index, grade_id=grade_id, tags=tags,
                 first_line=cell.source.splitlines()[0][:60] if cell.source else "")
    _wrap(execution.GradedExecute, "preprocess_cell", cell_enter, cell_exit)

    def timed_into(key):
        def enter(*args):
            return time.perf_counter()

        def exit_(start, *args):
            judged[current.get("cell")][key] += time.perf_counter() - start
        return enter, exit_
    _wrap(judge_module.Judge, "_handle", *timed_into("judge"))
    _wrap(Launcher, "run", *timed_into("ranks"))
    if os.environ.get(RUNS_ENV):  # one event per run of the judge's ranks (--runs)
        def run_exit(start, self, fn, world_size, *args, **kwargs):
            emit("rank run", time.perf_counter() - start, cell=current.get("cell"),
                 world_size=world_size, fn=getattr(fn, "__name__", "?"))
        _wrap(Launcher, "run", lambda *a: time.perf_counter(), run_exit)

    def feedback_enter(*args):
        now = time.perf_counter()
        emit("scoring", now - marks["scoring"])
        return now

    def feedback_exit(start, *args):
        marks["feedback_end"] = time.perf_counter()
        emit("feedback HTML", marks["feedback_end"] - start)
    _wrap(NbGraderAPI, "generate_feedback", feedback_enter, feedback_exit)
    html = {}
    _wrap(HTMLExporter, "from_notebook_node", lambda *a: html.__setitem__("t", time.perf_counter()),
          lambda *a: emit("feedback HTML: export", time.perf_counter() - html["t"]))

    if os.environ.get(RUN_ALL_ENV):  # the grader as it was: every cell runs, teaching ones too
        worker._set_teaching = lambda guards, root, lab: guards.teaching.clear()
    marks["main"] = time.perf_counter()
    try:
        return worker.main(argv)
    finally:
        emit("worker exit", time.perf_counter() - marks.get("feedback_end", marks["main"]))
        events.close()


# -- the bench: grade one sample through the real path, with the worker above -----------------------
@contextlib.contextmanager
def _worker_through_this_script():
    real = subprocess.Popen

    def popen(command, *args, **kwargs):
        if list(command[1:3]) == ["-m", "distlab.grading.worker"]:
            command = [command[0], str(Path(__file__).resolve()), "--worker", *command[3:]]
        return real(command, *args, **kwargs)
    subprocess.Popen = popen
    # Started cold, not forked from the run's worker server: its phases are timed from here.
    fork = os.environ.pop("DISTLAB_FORK_WORKERS", None)
    os.environ["DISTLAB_FORK_WORKERS"] = "0"
    try:
        yield
    finally:
        subprocess.Popen = real
        os.environ.pop("DISTLAB_FORK_WORKERS")
        if fork is not None:
            os.environ["DISTLAB_FORK_WORKERS"] = fork


def grade_one(nb, lab: str, tmp: Path, backend: str) -> tuple[float, list[dict]]:
    """Wall seconds of grading ``nb`` as one student's ``lab``, and the worker's events."""
    sys.path.insert(0, str(REPO / "tests"))
    import submissions
    from distlab.grading.orchestrate import grade_run
    from distlab.grading.settings import GradingSettings

    folder, work = tmp / "submitted", tmp / "work"
    submissions.write(nb, folder, "s000", lab)
    events = tmp / "events.jsonl"
    os.environ[EVENTS_ENV] = str(events)
    settings = GradingSettings(backend=backend)
    start = time.perf_counter()
    with _worker_through_this_script(), contextlib.redirect_stdout(sys.stderr):
        grade_run(settings, folder, {"s000": [lab]}, work, work / "scores.csv")
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in events.read_text().splitlines()]
    return wall, rows


def table(title: str, wall: float, rows: list[dict], per_cell: bool) -> None:
    totals = collections.Counter()
    runs = [r for r in rows if r["phase"] == "rank run"]
    rows = [r for r in rows if r["phase"] != "rank run"]
    for r in rows:
        if r["phase"] == "test cell":
            totals["test cells: kernel + sending"] += r["seconds"] - r["judge"]
            totals["test cells: judge, ranks"] += r["ranks"]
            totals["test cells: judge, comparing"] += r["judge"] - r["ranks"]
        else:
            totals[r["phase"] + "s" if r["phase"] == "solution cell" else r["phase"]] += r["seconds"]
    inside = sum(v for k, v in totals.items() if k != "feedback HTML: export")
    totals["orchestration (outside the worker)"] = wall - inside
    print(f"\n### {title}: {wall:.1f} s wall; load average {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} CPUs)\n")
    print("| phase | s | share |\n|---|---:|---:|")
    order = ["worker start", "autograde pre", "kernel start", "solution cells",
             "test cells: kernel + sending", "test cells: judge, ranks",
             "test cells: judge, comparing", "kernel shutdown", "autograde post", "scoring",
             "feedback HTML", "feedback HTML: export", "worker exit",
             "orchestration (outside the worker)"]
    for phase in order:
        share = "" if phase == "feedback HTML: export" else f"{totals[phase] / wall:.0%}"
        print(f"| {phase} | {totals[phase]:.2f} | {share} |")
    if runs:
        print("\n| cell | judge's runs | ranks | s | s per run |\n|---:|---|---:|---:|---:|")
        for key in sorted({(r["cell"], r["fn"], r["world_size"]) for r in runs}):
            took = [r["seconds"] for r in runs if (r["cell"], r["fn"], r["world_size"]) == key]
            print(f"| {key[0]} | {len(took)} x {key[1]} | {key[2]} | {sum(took):.2f} | "
                  f"{sum(took) / len(took):.3f} |")
    if per_cell:
        print("\n| cell | kind | s | judge: ranks | judge: comparing | what |\n"
              "|---:|---|---:|---:|---:|---|")
        for r in rows:
            if r["phase"] == "test cell":
                print(f"| {r['cell']} | test | {r['seconds']:.2f} | {r['ranks']:.2f} | "
                      f"{r['judge'] - r['ranks']:.2f} | {r['grade_id']} |")
            elif r["phase"] == "solution cell":
                what = r["grade_id"] or r["first_line"].replace("|", "/")
                tags = f" [{', '.join(r['tags'])}]" if r["tags"] else ""
                print(f"| {r['cell']} | solution | {r['seconds']:.2f} |  |  | {what}{tags} |")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(_worker(sys.argv[2:]))
    from distlab.grading.imports import skip_slow_imports
    skip_slow_imports()  # as `distlab grade` does
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="01_collectives")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--cells", action="store_true", help="a row per code cell too")
    parser.add_argument("--run-all", action="store_true",
                        help="run the cells tagged teaching too (the grader before it skipped them)")
    parser.add_argument("--runs", action="store_true",
                        help="a row per check function the judge ran on ranks: count and times")
    parser.add_argument("--only", choices=["reference", "untouched"], help="one sample only")
    args = parser.parse_args()
    if args.run_all:
        os.environ[RUN_ALL_ENV] = "1"
    if args.runs:
        os.environ[RUNS_ENV] = "1"
    sys.path.insert(0, str(REPO / "tests"))
    import submissions
    for title, nb in (("reference answers", submissions.solved(args.lab)),
                      ("untouched notebook", submissions.student(args.lab))):
        if args.only and not title.startswith(args.only):
            continue
        title += ", every cell run" if args.run_all else ", teaching cells skipped"
        with tempfile.TemporaryDirectory(prefix="gp-") as tmp:  # short: sockets live under it
            wall, rows = grade_one(nb, args.lab, Path(tmp), args.backend)
        table(f"{args.lab}, {title}", wall, rows, args.cells)


if __name__ == "__main__":
    main()
