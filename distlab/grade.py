"""Autograde a folder of submissions: ``distlab grade SUBMISSIONS_DIR``.

SUBMISSIONS_DIR is laid out as nbgrader's ``submitted`` folder: ``<student>/<lab>/<lab>.ipynb``
(any subset of labs per student). For each student, in a course directory of their own under the
work directory (default ``./grading``), the grader

1. copies the course's gradebook template (``nbgrader generate_assignment`` of every lab, made once
   per run from ``solutions/``) and the student's submission;
2. notes locked cells the student edited or deleted (nbgrader restores them before grading; the
   scores CSV names them in its ``flags`` column);
3. runs ``nbgrader autograde`` in a worker process with a per-cell time limit (``--timeout``) and a
   per-notebook budget (``--notebook-timeout``: later cells get only what is left), and kills the
   worker and everything it started if even that fails (``--notebook-timeout`` + a margin);
4. runs ``nbgrader generate_feedback``: the HTML shows each test's result and message but not the
   code of hidden tests, nor tracebacks into them.

Students are graded ``--jobs`` at a time. The scores go to ``scores.csv`` (``--out``): ``student,
lab, score, max_score``, one column per test with its status (pass, fail, error, hang, crash,
timeout, not-done, missing), then ``flags`` and the feedback file.

Checks in test cells read two settings from the environment, which this command sets for the
kernels it starts: ``DISTLAB_BACKEND`` (``--backend``: gloo, nccl, auto, or both = gloo and, where
there are enough GPUs, NCCL too, each compared with the same references) and
``DISTLAB_RANK_TIMEOUT`` (``--rank-timeout``: the ``distlab.run`` timeout after which hung ranks are
killed and the test fails with the launcher's diagnosis).

Two nbgrader rules are softened for distributed code: rank output and library warnings go to
stderr, and nbgrader scores a test cell zero when it wrote to stderr, so stderr is turned into
stdout before scoring (a check fails by raising, never by printing).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "grader" / "nbgrader_config.py"
ENV_BACKEND, ENV_RANK_TIMEOUT = "DISTLAB_BACKEND", "DISTLAB_RANK_TIMEOUT"
STATUSES = ("pass", "fail", "error", "hang", "crash", "timeout", "not-done", "missing")


# ---------------------------------------------------------------------------------------------
# Settings that checks read (set by the grader; a student's defaults otherwise)

def rank_timeout() -> float:
    """Seconds a check's ``distlab.run`` waits before declaring the ranks hung."""
    return float(os.environ.get(ENV_RANK_TIMEOUT, "60"))


def backends(world_size: int) -> list[str]:
    """The backends each check runs on: ``DISTLAB_BACKEND`` (default auto); "both" is gloo plus
    NCCL where every rank can have a GPU."""
    choice = os.environ.get(ENV_BACKEND, "auto")
    if choice != "both":
        return [choice]
    import torch
    return ["gloo"] + (["nccl"] if torch.cuda.device_count() >= world_size else [])


def run_each_backend(fn, world_size: int, *args) -> list:
    """[(backend, results)] of ``distlab.run(fn, world_size, *args)`` on each of ``backends()``."""
    import distlab
    return [(b, distlab.run(fn, world_size, *args, backend=b, timeout=rank_timeout()))
            for b in backends(world_size)]


# ---------------------------------------------------------------------------------------------
# nbgrader pieces named in grader/nbgrader_config.py

class NotebookBudget:
    """``Execute.timeout_func``: each cell may take ``per_cell`` seconds, and all cells of a
    notebook together ``per_notebook``; once that is spent every later cell gets 1 second
    (nbclient reads 0 as "no limit"). ``reset()`` starts a new notebook's budget."""

    def __init__(self, per_cell: float, per_notebook: float):
        self.per_cell, self.per_notebook = per_cell, per_notebook
        self.started: float | None = None

    def reset(self) -> None:
        self.started = None

    def __call__(self, cell) -> int:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        left = self.per_notebook - (now - self.started)
        return max(1, int(min(self.per_cell, left)))


def _make_preprocessors():
    from nbconvert.preprocessors import Preprocessor
    from nbgrader import utils
    from traitlets import Bool

    class StderrAsStdout(Preprocessor):
        """After execution: stderr streams become stdout, so that warnings and rank output do not
        zero a test (nbgrader scores any test cell that wrote to stderr as failed)."""

        enabled = Bool(True)  # nbconvert preprocessors are off unless enabled

        def preprocess_cell(self, cell, resources, index):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream" and output.get("name") == "stderr":
                    output["name"] = "stdout"
            return cell, resources

    class FeedbackWithoutHiddenTests(Preprocessor):
        """For feedback: drop hidden-test code from test cells and cut their errors' tracebacks
        (which quote the failing line) to the exception's name and message."""

        enabled = Bool(True)

        begin, end = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

        def preprocess_cell(self, cell, resources, index):
            if cell.cell_type != "code" or not utils.is_grade(cell):
                return cell, resources
            lines, inside, had_hidden = [], False, False
            for line in cell.source.splitlines():
                if line.strip() == self.begin:
                    inside = had_hidden = True
                elif line.strip() == self.end:
                    inside = False
                elif not inside:
                    lines.append(line)
            if had_hidden:
                lines.append("# (hidden tests ran here; their results are below)")
            cell.source = "\n".join(lines)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename')}: {output.get('evalue')}"]
            return cell, resources

    return StderrAsStdout, FeedbackWithoutHiddenTests


_PREPROCESSORS: dict = {}


def __getattr__(name: str):
    # The preprocessors import nbgrader, which checks running in a student's kernel never need.
    if name in ("StderrAsStdout", "FeedbackWithoutHiddenTests"):
        if not _PREPROCESSORS:
            _PREPROCESSORS.update(zip(("StderrAsStdout", "FeedbackWithoutHiddenTests"),
                                      _make_preprocessors()))
        return _PREPROCESSORS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_config():
    """The course's nbgrader config (grader/nbgrader_config.py) as a traitlets Config."""
    from traitlets.config.loader import PyFileConfigLoader
    return PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()


# ---------------------------------------------------------------------------------------------
# Discovering, preparing and grading submissions

def discover(folder: Path, known: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """{student: [lab, ...]} for every ``<student>/<lab>/<lab>.ipynb``; and warnings."""
    found, warnings = {}, []
    for student_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for lab_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if not (lab_dir / f"{lab_dir.name}.ipynb").is_file():
                warnings.append(f"{lab_dir}: no {lab_dir.name}.ipynb inside; skipped")
            elif lab_dir.name not in known:
                warnings.append(f"{lab_dir}: {lab_dir.name!r} is not a lab of this course; skipped")
            else:
                found.setdefault(student_dir.name, []).append(lab_dir.name)
    return found, warnings


def prepare_template(workdir: Path, labs: list[str]) -> Path:
    """A course directory with every lab's source, release and gradebook entries."""
    from distlab.notebooks import generate
    template = workdir / "template"
    shutil.rmtree(template, ignore_errors=True)
    template.mkdir(parents=True)
    generate(labs, template)
    return template


def locked_cell_flags(release_nb: Path, submitted_nb: Path) -> list[str]:
    """Locked cells of the released notebook that the submission edited or deleted."""
    import nbformat
    from nbgrader.utils import compute_checksum, is_locked
    release = nbformat.read(release_nb, as_version=4)
    try:
        submitted = nbformat.read(submitted_nb, as_version=4)
    except Exception as exc:  # not a notebook at all: nbgrader will fail it too
        return [f"unreadable notebook ({type(exc).__name__})"]
    theirs = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in submitted.cells}
    flags = []
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade_id") or not is_locked(cell):
            continue
        mine = theirs.get(meta["grade_id"])
        if mine is None:
            flags.append(f"deleted locked cell {meta['grade_id']}")
        elif compute_checksum(mine) != meta.get("checksum"):
            flags.append(f"edited locked cell {meta['grade_id']}")
    return flags


def _kill_tree(pid: int) -> None:
    """Kill ``pid`` and every process it started (kernels and ranks run in their own sessions)."""
    import psutil
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def grade_student(student: str, labs: list[str], submissions: Path, workdir: Path, opts) -> list[dict]:
    """Grade one student's labs in a course directory of their own; one result row per lab."""
    root = workdir / "students" / student
    shutil.rmtree(root, ignore_errors=True)
    template = workdir / "template"
    root.mkdir(parents=True)
    shutil.copy2(template / "gradebook.db", root / "gradebook.db")
    flags = {}
    for lab in labs:
        shutil.copytree(template / "source" / lab, root / "source" / lab)
        shutil.copytree(submissions / student / lab, root / "submitted" / student / lab)
        flags[lab] = locked_cell_flags(template / "release" / lab / f"{lab}.ipynb",
                                       root / "submitted" / student / lab / f"{lab}.ipynb")
    env = dict(os.environ, **{ENV_BACKEND: opts.backend, ENV_RANK_TIMEOUT: str(opts.rank_timeout)})
    env.pop("DISTLAB_RANK", None)
    command = [sys.executable, "-m", "distlab.grade", "_worker", str(root), student,
               str(opts.timeout), str(opts.notebook_timeout), *labs]
    limit = len(labs) * (opts.notebook_timeout + 120)
    log = open(root / "grading.log", "w")
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    killed = False
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        killed = True
        _kill_tree(proc.pid)
    finally:
        log.close()
    rows = []
    for lab in labs:
        result_file = root / f"result-{lab}.json"
        if result_file.exists():
            row = json.loads(result_file.read_text())
        else:
            why = f"grading killed after {limit} s" if killed else \
                f"grading failed (exit {proc.returncode}); see {root / 'grading.log'}"
            row = {"student": student, "lab": lab, "score": 0.0, "max_score": None, "tests": {},
                   "messages": {}, "flags": [why], "feedback": ""}
        row["flags"] = flags[lab] + row["flags"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# The worker: nbgrader autograde + feedback for one student, in its own process

def _status(cell, score: float, max_score: float) -> tuple[str, str]:
    """(status, message) of an executed test cell."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if score >= max_score and not errors:
        return "pass", ""
    if not errors:
        return ("missing", "the cell did not run") if cell.get("execution_count") is None \
            else ("fail", "no error, but not full marks")
    ename, evalue = errors[-1].get("ename", ""), str(errors[-1].get("evalue", ""))
    message = f"{ename}: {evalue}".strip()
    if ename == "CheckFailed":
        return "fail", message
    if ename == "HangError":
        return "hang", message
    if ename == "RankCrashed" or ename == "DeadKernelError":
        return "crash", message
    if ename in ("CellTimeoutError", "TimeoutError"):
        return "timeout", message
    if "NotImplementedError" in message:
        return "not-done", message
    return "error", message


def _worker(argv: list[str]) -> int:
    root, student, per_cell, per_notebook, *labs = argv
    import nbformat
    from nbgrader.api import Gradebook
    from nbgrader.utils import is_grade
    from distlab.notebooks import nbgrader_api

    root = Path(root)
    budget = NotebookBudget(float(per_cell), float(per_notebook))
    config = load_config()
    config.Execute.timeout = int(float(per_cell))
    config.Execute.timeout_func = budget
    api = nbgrader_api(root, config=config)
    for lab in labs:
        budget.reset()
        graded = api.autograde(lab, student, force=True, create=True)
        feedback = api.generate_feedback(lab, student, force=True) if graded["success"] else graded
        row = {"student": student, "lab": lab, "score": 0.0, "max_score": None, "tests": {},
               "messages": {}, "flags": [], "feedback": ""}
        if not graded["success"]:
            last = [line for line in (graded.get("error") or "").splitlines() if line.strip()][-1:]
            row["flags"].append("nbgrader autograde failed: " + " ".join(last)[-300:])
        nb_path = root / "autograded" / student / lab / f"{lab}.ipynb"
        cells = {}
        if nb_path.exists():
            nb = nbformat.read(nb_path, as_version=4)
            cells = {c.metadata.nbgrader["grade_id"]: c for c in nb.cells
                     if c.cell_type == "code" and is_grade(c)}
        with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "distlab") as gb:
            assignment = gb.find_assignment(lab)
            notebook = next(n for n in assignment.notebooks if n.name == lab)
            tests = [g for g in notebook.grade_cells if g.cell_type == "code"]
            row["max_score"] = float(sum(g.max_score for g in tests))
            try:
                submitted = gb.find_submission_notebook(lab, lab, student)
                scores = {g.name: float(g.score or 0) for g in submitted.grades}
            except Exception:
                scores = {}
        for test in tests:
            score = scores.get(test.name, 0.0)
            if test.name in cells:
                status, message = _status(cells[test.name], score, float(test.max_score))
            else:
                status, message = "missing", "not graded"
            row["tests"][test.name] = status
            row["messages"][test.name] = message[:2000]
            row["score"] += score
        html = root / "feedback" / student / lab / f"{lab}.html"
        if html.exists():
            row["feedback"] = str(html)
        elif feedback.get("success") is False:
            row["flags"].append("feedback not generated")
        (root / f"result-{lab}.json").write_text(json.dumps(row, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------
# Scores

def write_scores(rows: list[dict], out: Path) -> None:
    """``student, lab, score, max_score``, one status column per test (in lab order), flags, feedback."""
    tests: list[str] = []
    for row in rows:
        tests += [t for t in row["tests"] if t not in tests]
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "lab", "score", "max_score", *tests, "flags", "feedback"])
        for row in sorted(rows, key=lambda r: (r["student"], r["lab"])):
            writer.writerow([row["student"], row["lab"], f"{row['score']:g}",
                             "" if row["max_score"] is None else f"{row['max_score']:g}",
                             *[row["tests"].get(t, "") for t in tests],
                             "; ".join(row["flags"]), row["feedback"]])


def collect_feedback(rows: list[dict], workdir: Path) -> None:
    """Copy each feedback HTML to ``<workdir>/feedback/<student>/<lab>/<lab>.html`` (nbgrader's
    layout, ready to hand back) and point the rows at the copies."""
    for row in rows:
        if row["feedback"]:
            dest = workdir / "feedback" / row["student"] / row["lab"] / f"{row['lab']}.html"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(row["feedback"], dest)
            row["feedback"] = str(dest)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="distlab grade",
        description="Autograde SUBMISSIONS_DIR/<student>/<lab>/<lab>.ipynb with nbgrader, on real "
                    "torch.distributed ranks; write scores and per-student feedback.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--out", type=Path, default=Path("scores.csv"), help="scores CSV (default ./scores.csv)")
    p.add_argument("--jobs", type=int, default=1, help="students graded at once (default 1)")
    p.add_argument("--backend", choices=["gloo", "nccl", "auto", "both"], default="auto",
                   help="backend of the checks' ranks; both = gloo and NCCL where GPUs allow")
    p.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="seconds for all cells of one notebook (default 900)")
    p.add_argument("--rank-timeout", type=float, default=60,
                   help="seconds before a check's ranks count as hung (default 60)")
    p.add_argument("--workdir", type=Path, default=Path("grading"),
                   help="nbgrader course folders, autograded notebooks, feedback (default ./grading)")
    p.add_argument("--lab", action="append", dest="labs", help="grade only this lab (repeatable)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from distlab.notebooks import labs as course_labs
    if not args.submissions.is_dir():
        print(f"distlab grade: {args.submissions} is not a folder. Expected SUBMISSIONS_DIR/"
              f"<student>/<lab>/<lab>.ipynb.", file=sys.stderr)
        return 2
    if args.backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            print("distlab grade: --backend nccl needs GPUs and this machine has none; "
                  "use --backend gloo, auto or both.", file=sys.stderr)
            return 2
    known = [lab for lab in course_labs() if not args.labs or lab in args.labs]
    found, warnings = discover(args.submissions, known)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not found:
        print(f"distlab grade: no submissions in {args.submissions} (labs: {', '.join(known)}).",
              file=sys.stderr)
        return 1
    start = time.monotonic()
    workdir = args.workdir.resolve()
    labs = sorted({lab for ls in found.values() for lab in ls})
    print(f"grading {sum(map(len, found.values()))} notebooks of {len(found)} students "
          f"({', '.join(labs)}), {args.jobs} at a time, backend {args.backend}")
    prepare_template(workdir, labs)
    rows: list[dict] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(grade_student, s, ls, args.submissions.resolve(), workdir, args): s
                   for s, ls in found.items()}
        for future, student in futures.items():
            for row in future.result():
                rows.append(row)
                tests = " ".join(f"{t}={s}" for t, s in row["tests"].items())
                flag = f"  [{'; '.join(row['flags'])}]" if row["flags"] else ""
                print(f"  {student:<16} {row['lab']:<24} {row['score']:g}/{row['max_score'] or 0:g}  {tests}{flag}")
    collect_feedback(rows, workdir)
    write_scores(rows, args.out)
    print(f"wrote {args.out} and feedback under {workdir / 'feedback'} in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        sys.exit(_worker(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
