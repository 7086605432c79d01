"""Durable grading results: what a killed ``distlab grade`` leaves behind, what the next run skips,
and the outputs rebuilt from them.

The main grading process keeps, in the work directory and outside ``students/`` (which the
students' code can write):

    results/<student>.json   one entry per lab: the fingerprint of what was graded, the row, the
                             points per test; written atomically (temp file, fsync, rename) when
                             the student is done, so a kill leaves the old record or the new one
    run.json                 the run's scope (students, labs, shard) and whether it finished
    feedback/<student>/<lab>/<lab>.html
    gradebook.db             an nbgrader gradebook with every recorded (student, lab) of the scope

``--out`` (scores.csv) and gradebook.db are rebuilt from the records after every student and at
the start of a run, so whatever moment a run is killed at, the next one starts from complete,
agreeing outputs. A lab is graded again only when its fingerprint changed (sha256 over the
grading settings, the lab's nbgrader source with its tests, and every file of the submission) or
``--regrade`` names its student.

Sharding (``--shard K/N``) picks the students whose sha256(name) mod N is K; ``distlab merge``
(distlab/merge.py) joins the shards' work directories.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ALL = "*"          # --regrade given without a name: every student
COURSE = "distlab"  # the course id of every gradebook the grader writes
MANIFEST = "run.json"


# ---------------------------------------------------------------------------------------------
# Files that survive a kill

def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that readers (and a run after a kill or a power cut) see the
    old content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_copy(src: Path, dest: Path) -> None:
    """``shutil.copy2`` that never leaves a half-copied ``dest`` behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def _fsync_dir(folder: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Busy(RuntimeError):
    """Another grading run holds the work directory."""


@contextlib.contextmanager
def locked(workdir: Path):
    """Hold ``workdir/.lock`` for the run: two runs writing one work directory would mix their
    records. The lock dies with the process, so a killed run never blocks the next."""
    import fcntl
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another grading run is using {workdir} (it holds {workdir / '.lock'}); "
                       f"wait for it to finish or pass another --workdir.") from None
        for folder in (workdir, workdir / "results", workdir / "feedback"):
            for stale in folder.rglob(".*.tmp"):  # left by a run killed mid-write
                stale.unlink(missing_ok=True)
        yield


# ---------------------------------------------------------------------------------------------
# What to grade

def shard_arg(text: str) -> tuple[int, int]:
    """argparse type of ``--shard K/N``."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected K/N, two whole numbers, e.g. --shard 0/4 for the first of 4 shards"
        ) from None
    if n < 1 or not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"{text}: K must be in 0..N-1 and N at least 1 "
                                         f"(shards are numbered from 0)")
    return k, n


def shard_of(student: str, n: int) -> int:
    """The shard of ``student`` among ``n``: stable across machines and Python runs (unlike
    ``hash``), so every array task agrees on who is whose."""
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n


def in_shard(found: dict[str, list[str]], shard: tuple[int, int] | None) -> dict[str, list[str]]:
    if shard is None:
        return dict(found)
    k, n = shard
    return {s: labs for s, labs in found.items() if shard_of(s, n) == k}


def _digest_tree(h, folder: Path) -> None:
    """Feed every file under ``folder`` to ``h``: its relative name, then its bytes."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        h.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode())
        h.update(data)


def fingerprints(submissions: Path, found: dict[str, list[str]], template: Path,
                 settings: dict) -> dict[str, dict[str, str]]:
    """{student: {lab: sha256}} over the grading settings, the lab's nbgrader source (its tests)
    and the submission's files: equal fingerprints would be graded the same way again."""
    course = {}
    for lab in sorted({lab for labs in found.values() for lab in labs}):
        course[lab] = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        _digest_tree(course[lab], template / "source" / lab)
    result = {}
    for student, labs in found.items():
        result[student] = {}
        for lab in labs:
            h = course[lab].copy()
            _digest_tree(h, submissions / student / lab)
            result[student][lab] = h.hexdigest()
    return result


def plan(current: dict[str, dict[str, str]], records: dict[str, dict],
         regrade: list[str] | None) -> tuple[dict[str, list[str]], list[str]]:
    """({student: labs to grade}, [students skipped]): a lab is graded when its record's
    fingerprint is not ``current``'s, or ``regrade`` names its student (``ALL``: everyone)."""
    regrade = set(regrade or ())
    todo, skipped = {}, []
    for student, labs in current.items():
        done = records.get(student, {}).get("labs", {})
        stale = [lab for lab, fp in labs.items() if done.get(lab, {}).get("fingerprint") != fp]
        if ALL in regrade or student in regrade:
            todo[student] = list(labs)
        elif stale:
            todo[student] = stale
        else:
            skipped.append(student)
    return todo, skipped


# ---------------------------------------------------------------------------------------------
# Records

def load_records(workdir: Path) -> dict[str, dict]:
    """{student: record} of ``workdir/results``. A record that does not parse (edited by hand)
    counts as absent: its student is graded again."""
    records = {}
    for path in sorted((workdir / "results").glob("*.json")):
        try:
            record = json.loads(path.read_text())
            records[record["student"]] = record
        except (ValueError, KeyError, TypeError):
            print(f"warning: {path} is not a grading record; its student will be graded again")
    return records


def save_record(workdir: Path, record: dict) -> None:
    atomic_write(workdir / "results" / f"{record['student']}.json", json.dumps(record, indent=1))


def points_per_test(row: dict, tests: dict[str, float]) -> dict[str, float]:
    """Points per test of ``row`` (``tests``: {test: max points}). nbgrader gives a code test its
    full points or none, and the row's status says which; a row's own ``points`` wins."""
    given = row.get("points") or {}
    points = {t: float(given.get(t, top if row["tests"].get(t) == "pass" else 0.0))
              for t, top in tests.items()}
    if row["tests"] and abs(sum(points.values()) - row["score"]) > 1e-6:
        # The gradebook would disagree with the CSV: say so rather than hide it.
        print(f"warning: {row['student']}/{row['lab']}: the tests' points add up to "
              f"{sum(points.values()):g}, the score is {row['score']:g}; gradebook.db keeps the "
              f"tests' points", file=sys.stderr)
    return points


def read_manifest(workdir: Path) -> dict | None:
    path = workdir / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def write_manifest(workdir: Path, scope: dict[str, list[str]], shard, complete: bool,
                   **extra) -> None:
    manifest = {"shard": list(shard) if shard else None, "students": scope,
                "complete": complete, **extra}
    atomic_write(workdir / MANIFEST, json.dumps(manifest, indent=1))


def scope_rows(records: dict[str, dict], scope: dict[str, list[str]], workdir: Path) -> list[dict]:
    """The recorded rows of ``scope`` ({student: labs}), feedback paths made absolute."""
    rows = []
    for student, labs in scope.items():
        entries = records.get(student, {}).get("labs", {})
        for lab in labs:
            if lab in entries:
                row = dict(entries[lab]["row"])
                row["feedback"] = str(workdir / row["feedback"]) if row["feedback"] else ""
                rows.append(row)
    return rows


def scope_points(records: dict[str, dict], scope: dict[str, list[str]]) -> dict:
    """{(student, lab): {test: points}} of every recorded lab in ``scope``."""
    return {(s, lab): records[s]["labs"][lab]["points"] for s, labs in scope.items()
            for lab in labs if lab in records.get(s, {}).get("labs", {})}


class Run:
    """One grading run's durable state: records, then scores CSV and gradebook rebuilt from them."""

    def __init__(self, workdir: Path, out: Path, scope: dict[str, list[str]], shard,
                 current: dict[str, dict[str, str]], write_csv):
        self.workdir, self.out, self.scope, self.shard = workdir, out, scope, shard
        self.current, self.write_csv = current, write_csv
        self.records = load_records(workdir)
        self.tests = gradebook_tests(workdir / "template" / "gradebook.db")

    def start(self) -> None:
        """Mark the run unfinished and make the outputs whole (a killed run may have left its last
        record without its CSV line or gradebook entry)."""
        write_manifest(self.workdir, self.scope, self.shard, complete=False)
        ensure_structure(self.workdir / "gradebook.db", self.workdir / "template")
        self.publish(None)

    def record(self, student: str, rows: list[dict], seconds: float) -> None:
        """Make ``student``'s rows durable, then rewrite the CSV and their gradebook entries."""
        record = self.records.get(student) or {"student": student, "labs": {}}
        for row in rows:
            record["labs"][row["lab"]] = {
                "fingerprint": self.current[student][row["lab"]], "row": row,
                "points": points_per_test(row, self.tests.get(row["lab"], {})),
                "seconds": round(seconds / len(rows), 2),  # this lab's share of the student's time
                "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        save_record(self.workdir, record)
        self.records[student] = record
        self.publish({student})

    def publish(self, students: set[str] | None) -> None:
        """Rewrite the CSV; bring the gradebook in line for ``students`` (None: everyone)."""
        self.write_csv(scope_rows(self.records, self.scope, self.workdir), self.out)
        points = scope_points(self.records, self.scope)
        sync_gradebook(self.workdir / "gradebook.db", points, students)

    def finish(self, complete: bool) -> None:
        write_manifest(self.workdir, self.scope, self.shard, complete=complete)

    def missing(self) -> list[str]:
        """Students of the scope with a lab not recorded."""
        return [s for s, labs in self.scope.items()
                if set(labs) - set(self.records.get(s, {}).get("labs", {}))]


# ---------------------------------------------------------------------------------------------
# The combined nbgrader gradebook

def _gradebook(db: Path):
    from nbgrader.api import Gradebook
    return Gradebook(f"sqlite:///{db}", COURSE)


def gradebook_tests(db: Path) -> dict[str, dict[str, float]]:
    """{lab: {test: max points}} of the code grade cells (the autograded tests) in ``db``."""
    with _gradebook(db) as gb:
        return {a.name: {g.name: float(g.max_score) for nb in a.notebooks for g in nb.grade_cells
                         if g.cell_type == "code"} for a in gb.assignments}


def ensure_structure(db: Path, template: Path) -> None:
    """Give gradebook ``db`` the assignments of the template course ``template`` as they are
    now: copied when ``db`` is new, regenerated for a lab whose tests changed (that lab's old
    entries go; its students' fingerprints changed too, so they are graded again)."""
    if not db.exists():
        atomic_copy(template / "gradebook.db", db)
        return
    mine, theirs = gradebook_tests(db), gradebook_tests(template / "gradebook.db")
    changed = [lab for lab in theirs if mine.get(lab) != theirs[lab]]
    if not changed:
        return
    from distlab.grading.course_dir import nbgrader_api
    with _gradebook(db) as gb:
        for lab in changed:
            if lab in mine:
                gb.remove_assignment(lab)
    with tempfile.TemporaryDirectory(prefix="distlab-gradebook-") as tmp:
        api = nbgrader_api(Path(tmp), db=db)
        for lab in changed:
            shutil.copytree(template / "source" / lab, Path(tmp) / "source" / lab)
            result = api.generate_assignment(lab, force=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader could not add {lab} to {db}:\n{result['error']}")


def _gradebook_points(gb, students: set[str] | None) -> dict:
    """{(student, lab): {test: auto score}} of the submissions in ``gb`` (of ``students``)."""
    have = {}
    for assignment in gb.assignments:
        for sub in assignment.submissions:
            if students is None or sub.student.id in students:
                have[(sub.student.id, assignment.name)] = {
                    g.name: g.auto_score for nb in sub.notebooks for g in nb.grades
                    if g.cell_type == "code"}
    return have


def _add_submission(gb, student: str, lab: str, points: dict[str, float]) -> None:
    import warnings
    from sqlalchemy.exc import SAWarning
    gb.update_or_create_student(student)
    with warnings.catch_warnings():  # nbgrader's own add_submission trips SQLAlchemy's autoflush
        warnings.simplefilter("ignore", SAWarning)
        submission = gb.add_submission(lab, student)
    for nb in submission.notebooks:
        for grade in nb.grades:
            if grade.name in points:
                grade.auto_score, grade.needs_manual_grade = points[grade.name], False
    gb.db.commit()


def sync_gradebook(db: Path, wanted: dict, students: set[str] | None = None) -> None:
    """Make gradebook ``db`` hold exactly ``wanted`` ({(student, lab): {test: points}}), for
    ``students`` only if given. Each student's entries are redone whole where they differ, so a
    kill between nbgrader's commits is repaired by the next sync."""
    if students is not None:
        wanted = {key: points for key, points in wanted.items() if key[0] in students}
    with _gradebook(db) as gb:
        have = _gradebook_points(gb, students)
        for student, lab in have:
            if have[(student, lab)] != wanted.get((student, lab)):
                gb.remove_submission(lab, student)
        for (student, lab), points in wanted.items():
            if have.get((student, lab)) != points:
                _add_submission(gb, student, lab, points)
        if students is None:
            keep = {student for student, _ in wanted}
            for extra in [s.id for s in gb.students if s.id not in keep]:
                gb.remove_student(extra)


# ---------------------------------------------------------------------------------------------
# Stopping a run

def timed(fn, *args):
    """(fn(*args), seconds it took)."""
    start = time.monotonic()
    return fn(*args), time.monotonic() - start


@contextlib.contextmanager
def stop_workers_on_interrupt(pool):
    """Ctrl-C or SIGTERM (``kill``, Slurm's time limit): drop the queued students and kill the
    running workers, which sit in sessions of their own that the signal never reaches; then let
    KeyboardInterrupt through. What was recorded stays, and the next run goes on from it."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        _kill_children()
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _kill_children() -> None:
    import psutil
    procs = psutil.Process().children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)
