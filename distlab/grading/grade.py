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
4. scores each test cell from the judge's record (below), not from what the kernel showed;
5. runs ``nbgrader generate_feedback``: the HTML shows each test's result and message but not the
   code of hidden tests, nor tracebacks into them.

Students are graded ``--jobs`` at a time. The scores go to ``scores.csv`` (``--out``): ``student,
lab, score, max_score``, one column per test with its status (pass, fail, error, hang, crash,
timeout, not-done, not-run, tampered, missing), then ``flags`` and the feedback file.
Each student's rows are recorded in the work directory the moment they are graded, and the CSV and
the combined nbgrader gradebook (``<workdir>/gradebook.db``) are rebuilt from the records, so a
killed run leaves complete outputs and the next run grades only what is not recorded or changed
(``--regrade`` to grade again); ``--shard K/N`` and ``distlab merge`` split a course across
machines (distlab/results.py, distlab/merge.py, grader/slurm/).

A student's code is not trusted (the threat model, each part tested in tests/test_grader_attacks.py):

- Checks run in the judge (``distlab.grading.judge``), in the worker process, never in the kernel: the
  kernel only sends the student's objects. The judge draws hidden tests' seeds itself, runs the
  student's code on ranks of its own zygote and reads what they return without unpickling code.
  A test cell passes only if the judge passed every check the cell calls; one whose checks never
  arrived scores zero as ``tampered``.
- The kernel and the judge's ranks are confined with Landlock (``distlab.grading.sandbox``): they may
  write only the lab's own folder and a scratch folder, and cannot signal or trace the grader.
  The worker reads the result rows back on a pipe that no kernel holds.
- Limits: ``--memory-limit`` on the sum of the student's processes (the largest is killed);
  output per cell (``distlab.grading.execution``: the rest is dropped and the cell interrupted); the
  worker's own log is kept to its tail. A kernel that dies (``os._exit``, a segfault, the memory
  limit) ends that notebook: its later tests score zero as ``not-run``, the run goes on.
- The worker is a child subreaper: whatever the student's code starts is reparented to it and
  killed after each lab, and the worker's whole tree is killed when the student is done.

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
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from distlab import paths
from distlab.checks.ranks import CheckSettings

ENV_HIDE = "DISTLAB_GRADE_HIDE"   # folders a student's code may not read (set for the worker)
STATUSES = ("pass", "fail", "error", "hang", "crash", "timeout", "not-done", "not-run", "tampered",
            "missing")
DEFAULT_MEMORY_GB = 6.0


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
    config = paths.grader() / "nbgrader_config.py"
    return PyFileConfigLoader(config.name, path=str(config.parent)).load_config()


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
    from distlab.grading.course_dir import generate
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


LOG_TAIL = 200_000   # bytes of a worker's own output kept in grading.log (the rest is dropped)


def grade_student(student: str, labs: list[str], submissions: Path, workdir: Path, opts) -> list[dict]:
    """Grade one student's labs in a course directory of their own; one result row per lab.

    The rows come back on a pipe only the worker holds (kernels and ranks start with their
    descriptors closed), never from files the student's code could write."""
    from distlab.grading.sandbox import kill_tree
    _warn_if_unconfined()
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
        (root / f"flags-{lab}.json").write_text(json.dumps(flags[lab]))
    # The student's code may read none of: the grading folders (every student's), the
    # submissions, the scores. Its own folders inside them stay open to it.
    hide = [p for p in (workdir.resolve(), submissions.resolve(), Path(opts.out).resolve())
            if not any(p == q or p in q.parents for q in (paths.root(), Path(sys.prefix).resolve()))]
    checks = CheckSettings(backend=opts.backend, rank_timeout=opts.rank_timeout)
    env = dict(os.environ, **checks.environ(), **{ENV_HIDE: os.pathsep.join(map(str, hide))})
    env.pop("DISTLAB_RANK", None)
    memory = getattr(opts, "memory_limit", DEFAULT_MEMORY_GB) * 2**30
    rows_r, rows_w = os.pipe()
    command = [sys.executable, "-m", "distlab.grading.grade", "_worker", str(root), student,
               str(opts.timeout), str(opts.notebook_timeout), str(memory), str(rows_w), *labs]
    limit = len(labs) * (opts.notebook_timeout + 120)
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, pass_fds=[rows_w])
    os.close(rows_w)
    log = _LogTail(proc.stdout, root / "grading.log")
    received = _read_rows(rows_r, time.monotonic() + limit)
    killed = proc.poll() is None and len(received) < len(labs)
    kill_tree(proc.pid)  # whatever is left of the student's processes goes with the worker
    proc.wait()
    log.finish()
    rows = []
    for lab in labs:
        row = next((r for r in received if r.get("lab") == lab), None)
        if row is None:
            why = f"grading killed after {limit:g} s" if killed else \
                f"grading failed (exit {proc.returncode}); see {root / 'grading.log'}"
            row = {"student": student, "lab": lab, "score": 0.0, "max_score": None, "tests": {},
                   "messages": {}, "flags": [why], "feedback": ""}
        row["flags"] = flags[lab] + row["flags"]
        rows.append(row)
    return rows


@functools.lru_cache(maxsize=None)
def _warn_if_unconfined() -> None:
    from distlab.runtime.landlock import landlock_abi
    if landlock_abi() == 0:
        print("warning: this Linux kernel has no Landlock (needs 5.13+ with landlock among its "
              "LSMs): students' code is NOT confined and could change files outside its folder "
              "(other submissions, the scores). Grade on a machine with Landlock, or check "
              "the outputs.", file=sys.stderr)


def _read_rows(fd: int, deadline: float) -> list[dict]:
    """The worker's result rows (JSON lines) until it closes the pipe or the deadline passes."""
    import select
    data = bytearray()
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([pipe], [], [], min(left, 5.0))[0]:
                continue
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            data += chunk
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a kill
    return rows


class _LogTail:
    """Keep the last LOG_TAIL bytes of a worker's output (a flood must not fill the disk)."""

    def __init__(self, stream, path: Path):
        import threading
        self.stream, self.path, self.tail, self.dropped = stream, path, bytearray(), 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.stream.read1(1 << 16), b""):
            self.tail += chunk
            if len(self.tail) > LOG_TAIL:
                self.dropped += len(self.tail) - LOG_TAIL
                del self.tail[:len(self.tail) - LOG_TAIL]

    def finish(self) -> None:
        self.thread.join(timeout=10)
        head = f"[{self.dropped} earlier bytes dropped]\n".encode() if self.dropped else b""
        self.path.write_bytes(head + bytes(self.tail))


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
    if ename == "NotRun":
        return "not-run", message
    if ename in ("CellTimeoutError", "TimeoutError"):
        return "timeout", message
    if "NotImplementedError" in message:
        return "not-done", message
    return "error", message


def _worker(argv: list[str]) -> int:
    root, student, per_cell, per_notebook, memory_limit, rows_fd, *labs = argv
    from distlab.grading import execution
    from distlab.grading import sandbox
    from distlab.runtime import landlock
    from distlab.grading.judge import Judge
    from distlab.grading.course_dir import nbgrader_api

    root = Path(root)
    os.set_inheritable(int(rows_fd), False)  # no kernel or rank may write rows of its own
    sandbox.become_subreaper()  # orphans of the student's code come back here to be killed
    sandbox.die_with_parent()   # and this worker goes with a grader that is killed outright
    folders = _private_folders(root)
    hide = [p for p in os.environ.get(ENV_HIDE, "").split(os.pathsep) if p]
    judge = Judge(folders["judge"], folders["judge_scratch"], confine=landlock.landlock_abi() > 0,
                  hide=hide)
    execution.JUDGE = judge
    limit = int(float(memory_limit))
    watch = sandbox.MemoryWatch(os.getpid(), limit, on_kill=_note_memory_kill)
    budget = NotebookBudget(float(per_cell), float(per_notebook))
    config = load_config()
    config.Execute.timeout = int(float(per_cell))
    config.Execute.timeout_func = budget
    api = nbgrader_api(root, config=config)
    with watch, os.fdopen(int(rows_fd), "w") as rows_out:
        for lab in labs:
            budget.reset()
            judge.reset()
            lab_dir = root / "autograded" / student / lab
            _write_kernelspec(folders, lab_dir, judge.address, hide)
            row = _grade_lab(api, root, student, lab, judge)
            _kill_leftovers(keep=_judge_zygote_pid())
            rows_out.write(json.dumps(row) + "\n")
            rows_out.flush()
    judge.close()
    shutil.rmtree(folders["judge"], ignore_errors=True)
    return 0


def _note_memory_kill(event) -> None:
    """Why the kernel died, for the cell it died in (distlab.grading.execution reads the notes)."""
    from distlab.grading import execution
    execution.DEATH_NOTES.append(
        f"its processes used more than the grader's memory limit of {event.limit / 2**30:.1f} GiB "
        f"({event.total / 2**30:.1f} GiB; the largest, {event.command[:80]!r}, was killed)")


def _judge_zygote_pid() -> int | None:
    """The judge's own zygote (kept between labs: it costs seconds to start)."""
    from distlab.runtime import launch
    handle = launch._zygote_handle
    return handle.proc.pid if handle is not None and handle.alive() else None


def _kill_leftovers(keep: int | None) -> None:
    """Kill everything the lab's kernel left behind (orphans were reparented to this worker)."""
    import psutil
    from distlab.grading.sandbox import kill_tree
    for child in psutil.Process().children():
        if child.pid != keep:
            kill_tree(child.pid)


def _private_folders(root: Path) -> dict[str, Path]:
    """Folders of the worker: the judge's socket and the kernel spec (the student's code may not
    write there) and the scratch folders the kernel and the judge's ranks may write."""
    # The judge's socket: a short path of its own (a Unix socket path holds at most 107 bytes,
    # which a deep work directory or a long student name would pass).
    short = "/tmp" if os.path.isdir("/tmp") else None
    folders = {"judge": Path(tempfile.mkdtemp(prefix="distlab-judge-", dir=short)),
               "jupyter": root / "jupyter", "kernel_scratch": root / "scratch" / "kernel",
               "judge_scratch": root / "scratch" / "judge"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    os.environ["JUPYTER_PATH"] = str(folders["jupyter"])
    # jupyter_client writes each kernel's connection file to a temporary folder: the kernel must
    # be able to read it, so it is the kernel's scratch folder (the judge's ranks get their own).
    for name in ("TMPDIR", "JUPYTER_RUNTIME_DIR", "MPLCONFIGDIR"):
        os.environ[name] = str(folders["kernel_scratch"])
    return folders


def _write_kernelspec(folders: dict[str, Path], lab_dir: Path, judge_address: str,
                      hide: list[str]) -> None:
    """The kernel nbgrader starts ("python3", found first on JUPYTER_PATH): it may write only the
    lab's folder and its scratch folder, read nothing in ``hide`` (the grading folders, all
    submissions, the scores) but those, and is told where the judge listens."""
    from distlab.checks.messenger import ENV
    scratch = folders["kernel_scratch"]
    argv = [sys.executable, "-m", "distlab.runtime.landlock", "--write", str(lab_dir), "--write", str(scratch),
            *[arg for folder in hide for arg in ("--hide", folder)],
            "--", sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    env = {ENV: judge_address, "HOME": str(scratch), "TMPDIR": str(scratch), "JUPYTER_PATH": "",
           "MPLCONFIGDIR": str(scratch / "matplotlib"), "IPYTHONDIR": str(scratch / "ipython"),
           "XDG_CACHE_HOME": str(scratch / "cache")}
    spec = folders["jupyter"] / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "env": env, "display_name": "Python 3 (graded)", "language": "python",
        "interrupt_mode": "signal"}))


def _grade_lab(api, root: Path, student: str, lab: str, judge) -> dict:
    """nbgrader autograde, then the judge's record overrides what the kernel showed, then
    feedback; one result row."""
    import nbformat
    from nbgrader.utils import is_grade
    row = {"student": student, "lab": lab, "score": 0.0, "max_score": None, "tests": {},
           "messages": {}, "points": {}, "flags": [], "feedback": ""}
    graded = api.autograde(lab, student, force=True, create=True)
    if not graded["success"]:
        last = [line for line in (graded.get("error") or "").splitlines() if line.strip()][-1:]
        row["flags"].append("nbgrader autograde failed: " + " ".join(last)[-300:])
    nb_path = root / "autograded" / student / lab / f"{lab}.ipynb"
    nb = nbformat.read(nb_path, as_version=4) if nb_path.exists() else None
    cells = {c.metadata.nbgrader["grade_id"]: c for c in (nb.cells if nb else [])
             if c.cell_type == "code" and is_grade(c)}
    overrides = _score_tests(root, student, lab, cells, judge, row)
    if nb is not None:
        _annotate(nb, cells, overrides, _read_flags(root, lab))
        nbformat.write(nb, nb_path)
    feedback = api.generate_feedback(lab, student, force=True) if graded["success"] else graded
    html = root / "feedback" / student / lab / f"{lab}.html"
    if html.exists():
        row["feedback"] = str(html)
    elif feedback.get("success") is False:
        row["flags"].append("feedback not generated")
    return row


def _score_tests(root: Path, student: str, lab: str, cells: dict, judge, row: dict) -> dict:
    """Fill the row's per-test status, message and score. A test cell with checks passes only if
    the judge passed every check the cell calls; where the kernel showed otherwise, the test is
    set to zero in the gradebook. Returns {test: message} for the tests the judge overrode."""
    from nbgrader.api import Gradebook
    from distlab.grading.judge import review
    overrides = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "distlab") as gb:
        notebook = next(n for n in gb.find_assignment(lab).notebooks if n.name == lab)
        tests = [g for g in notebook.grade_cells if g.cell_type == "code"]
        row["max_score"] = float(sum(g.max_score for g in tests))
        try:
            grades = {g.name: g for g in gb.find_submission_notebook(lab, lab, student).grades}
        except Exception:
            grades = {}
        for test in tests:
            grade = grades.get(test.name)
            score = float(grade.score or 0) if grade is not None else 0.0
            cell = cells.get(test.name)
            if cell is None:
                status, message = "missing", "not graded"
            else:
                status, message = _status(cell, score, float(test.max_score))
                verdict = review(cell.source, judge.verdicts.get(test.name, []))
                # Missing checks matter only where the kernel claimed success; a cell that never
                # got to its checks (a dead kernel, a timeout) keeps the status it has.
                if verdict is not None and verdict[0] != "pass" and \
                        (verdict[0] != "tampered" or score > 0):
                    status, message = verdict
                    if score > 0:
                        overrides[test.name] = message
                        grade.manual_score = 0.0
                    score = 0.0
            row["tests"][test.name] = status
            row["messages"][test.name] = message[:2000]
            row["points"][test.name] = score
            row["score"] += score
        gb.db.commit()
    return overrides


def _read_flags(root: Path, lab: str) -> list[str]:
    path = root / f"flags-{lab}.json"
    return json.loads(path.read_text()) if path.exists() else []


def _annotate(nb, cells: dict, overrides: dict, flags: list[str]) -> None:
    """What the grader decided that the kernel's outputs don't show, written into the autograded
    notebook so the feedback carries it."""
    from nbformat.v4 import new_markdown_cell, new_output
    for test, message in overrides.items():
        cells[test].outputs.append(new_output("error", ename="GraderVerdict", evalue=message,
                                              traceback=[f"GraderVerdict: {message}"]))
    if flags:
        lines = "\n".join(f"- {flag}: nbgrader restored the original cell before grading."
                           for flag in flags)
        nb.cells.insert(0, new_markdown_cell(f"**The grader noticed:**\n\n{lines}"))


# ---------------------------------------------------------------------------------------------
# Scores

def write_scores(rows: list[dict], out: Path) -> None:
    """``student, lab, score, max_score``, one status column per test (in lab order), flags, feedback.
    Written atomically: a run killed at any moment leaves the previous complete CSV."""
    import io
    from distlab.grading.records import atomic_write
    tests: list[str] = []
    for row in rows:
        tests += [t for t in row["tests"] if t not in tests]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["student", "lab", "score", "max_score", *tests, "flags", "feedback"])
    for row in sorted(rows, key=lambda r: (r["student"], r["lab"])):
        writer.writerow([row["student"], row["lab"], f"{row['score']:g}",
                         "" if row["max_score"] is None else f"{row['max_score']:g}",
                         *[row["tests"].get(t, "") for t in tests],
                         "; ".join(row["flags"]), row["feedback"]])
    atomic_write(out, text.getvalue())


def collect_feedback(rows: list[dict], workdir: Path) -> None:
    """Copy each feedback HTML to ``<workdir>/feedback/<student>/<lab>/<lab>.html`` (nbgrader's
    layout, ready to hand back) and point the rows at the copies, relative to ``workdir`` (so a
    work directory can move, e.g. from a cluster's shard to the merged one)."""
    from distlab.grading.records import atomic_copy
    for row in rows:
        rel = Path("feedback") / row["student"] / row["lab"] / f"{row['lab']}.html"
        if row["feedback"]:
            atomic_copy(Path(row["feedback"]), workdir / rel)
            row["feedback"] = str(rel)
        else:  # no feedback this time: an older one would contradict the new scores
            (workdir / rel).unlink(missing_ok=True)


def parse_args(argv):
    from distlab.grading import records as results
    p = argparse.ArgumentParser(
        prog="distlab grade",
        description="Autograde SUBMISSIONS_DIR/<student>/<lab>/<lab>.ipynb with nbgrader, on real "
                    "torch.distributed ranks; write scores and per-student feedback.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--out", type=Path,
                   help="scores CSV (default ./scores.csv; with --shard, inside its --workdir)")
    p.add_argument("--jobs", type=_at_least_one, default=1, help="students graded at once (default 1)")
    p.add_argument("--backend", choices=["gloo", "nccl", "auto", "both"], default="auto",
                   help="backend of the checks' ranks; both = gloo and NCCL where GPUs allow")
    p.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="seconds for all cells of one notebook (default 900)")
    p.add_argument("--memory-limit", type=float, default=DEFAULT_MEMORY_GB, metavar="GB",
                   help=f"memory of one student's processes before the largest is killed "
                        f"(default {DEFAULT_MEMORY_GB:g})")
    p.add_argument("--rank-timeout", type=float, default=60,
                   help="seconds before a check's ranks count as hung (default 60)")
    p.add_argument("--workdir", type=Path,
                   help="nbgrader course folders, results of each student, feedback, gradebook.db "
                        "(default ./grading; with --shard K/N, ./grading-shard-K-of-N)")
    p.add_argument("--lab", action="append", dest="labs", help="grade only this lab (repeatable)")
    p.add_argument("--regrade", action="append", nargs="?", const=results.ALL, metavar="STUDENT",
                   help="grade STUDENT again although the work directory has their results for "
                        "this submission (repeatable); without a name (put it after "
                        "SUBMISSIONS_DIR): everyone")
    p.add_argument("--shard", type=results.shard_arg, metavar="K/N",
                   help="grade only the students with sha256(name) mod N == K (K from 0); "
                        "join the shards' work directories with `distlab merge`")
    return p.parse_args(argv)


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of students, 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from distlab.grading import records as results
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
    known = [lab for lab in paths.labs() if not args.labs or lab in args.labs]
    found, warnings = discover(args.submissions, known)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not found:
        print(f"distlab grade: no submissions in {args.submissions} (labs: {', '.join(known)}).",
              file=sys.stderr)
        return 1
    unknown = sorted(set(args.regrade or ()) - {results.ALL} - set(found))
    if unknown:
        print(f"distlab grade: --regrade {unknown[0]}: no submissions from {unknown[0]!r} in "
              f"{args.submissions} (a student is a folder name there; --regrade without a name "
              f"goes after SUBMISSIONS_DIR).", file=sys.stderr)
        return 2
    k, n = args.shard or (0, 1)
    default = Path(f"grading-shard-{k}-of-{n}" if args.shard else "grading")
    workdir = (args.workdir or default).resolve()
    out = args.out or (workdir / "scores.csv" if args.shard else Path("scores.csv"))
    args.out = out   # the workers hide the scores from students' code: they need the real path
    try:
        with results.locked(workdir):
            return _grade_run(args, found, workdir, out)
    except results.Busy as exc:
        print(f"distlab grade: {exc}", file=sys.stderr)
        return 2


# Options that change what a grading gives: a recorded result made with others is graded again.
_NOT_SETTINGS = {"submissions", "out", "jobs", "workdir", "labs", "regrade", "shard"}


def _grade_run(args, found: dict[str, list[str]], workdir: Path, out: Path) -> int:
    """Grade ``found`` (the shard's part of it) in ``workdir``, skipping what is recorded there."""
    from concurrent.futures import as_completed
    from distlab.grading import records as results
    start, submissions = time.monotonic(), args.submissions.resolve()
    scope = results.in_shard(found, args.shard)
    # Every shard makes the same template from all the labs found, so their gradebooks agree.
    template = prepare_template(workdir, sorted({lab for ls in found.values() for lab in ls}))
    settings = {k: str(v) for k, v in sorted(vars(args).items()) if k not in _NOT_SETTINGS}
    current = results.fingerprints(submissions, scope, template, settings)
    run = results.Run(workdir, out, scope, args.shard, current, write_scores)
    todo, skipped = results.plan(current, run.records, args.regrade)
    shard = f" (shard {args.shard[0]}/{args.shard[1]} of {len(found)})" if args.shard else ""
    print(f"grading {sum(map(len, todo.values()))} notebooks of {len(todo)} students{shard}, "
          f"{args.jobs} at a time, backend {args.backend}; {len(skipped)} students already graded")
    for student in skipped:
        print(f"  {student:<16} skipped: graded before, submission unchanged (--regrade {student} "
              f"grades again)")
    run.start()
    failed = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool, \
                results.stop_workers_on_interrupt(pool):
            futures = {pool.submit(results.timed, grade_student, s, ls, submissions, workdir,
                                   args): s for s, ls in todo.items()}
            for future in as_completed(futures):
                if not _record(futures[future], future, workdir, run):
                    failed.append(futures[future])
    except KeyboardInterrupt:
        print(f"distlab grade: interrupted; {len(scope) - len(run.missing())} of {len(scope)} "
              f"students are recorded in {workdir / 'results'} and {out}. Run the same command "
              f"again to grade the rest.", file=sys.stderr)
        return 130
    run.finish(complete=not failed)
    print(f"wrote {out}, {workdir / 'gradebook.db'} and feedback under {workdir / 'feedback'} "
          f"in {time.monotonic() - start:.0f} s")
    if failed:
        print(f"distlab grade: grading failed for {', '.join(failed)} (not recorded); run the same "
              f"command again to retry them.", file=sys.stderr)
    return 1 if failed else 0


def _record(student: str, future, workdir: Path, run) -> bool:
    """Print and record one student's rows; False if grading them raised."""
    try:
        rows, seconds = future.result()
    except Exception as exc:  # a grader bug: the other students still get graded
        print(f"  {student:<16} grading raised {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    for row in rows:
        tests = " ".join(f"{t}={s}" for t, s in row["tests"].items())
        flag = f"  [{'; '.join(row['flags'])}]" if row["flags"] else ""
        print(f"  {student:<16} {row['lab']:<24} {row['score']:g}/{row['max_score'] or 0:g}  {tests}{flag}")
    collect_feedback(rows, workdir)
    run.record(student, rows, seconds)
    return True


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        sys.exit(_worker(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
