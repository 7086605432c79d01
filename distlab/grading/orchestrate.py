"""The orchestration of a grading run: which students and labs to grade (shards, resume), a worker
process per student (``distlab.grading.worker``) ``--jobs`` at a time, each student's rows recorded
the moment they come back (``distlab.grading.records``), progress, and a clean stop on Ctrl-C."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from distlab import paths
from distlab.grading import records, selection
from distlab.grading.intake import locked_cell_flags, prepare_template
from distlab.grading.progress import Progress
from distlab.grading.scoring import collect_feedback, write_scores
from distlab.grading.settings import GradingSettings
from distlab.grading.student_package import rank_imports
from distlab.grading.stopping import stop_workers_on_interrupt, timed
from distlab.grading.worker_server import WorkerServer

LOG_TAIL = 200_000   # bytes of a worker's own output kept in grading.log (the rest is dropped)


def grade_run(settings: GradingSettings, submissions: Path, found: dict[str, list[str]],
              workdir: Path, out: Path, jobs: int = 1, shard=None, regrade=None,
              tail=None) -> int:
    """Grade ``found`` (the shard's part of it) in ``workdir``, ``jobs`` students at a time,
    skipping what is recorded there; 0 when every student was graded. ``tail()``: called once,
    when fewer students are left than ``jobs`` (a core is free from then on), to start what
    comes after grading (the similarity report)."""
    start, submissions = time.monotonic(), submissions.resolve()
    settings = dataclasses.replace(settings, hide=hidden_folders(workdir, submissions, out))
    scope = selection.in_shard(found, shard)
    server = _worker_server(settings, workdir, len(scope))
    try:
        return _grade_scope(settings, submissions, found, scope, workdir, out, jobs, shard,
                            regrade, server, start, tail)
    except BaseException:
        if server is not None:
            server.close(now=True)   # a failed start (the template, the views): not waited for
        raise
    finally:
        if server is not None:
            server.close()


def _worker_server(settings: GradingSettings, workdir: Path, students: int):
    """One process that imports what every worker imports, once for the run, and forks each
    student's worker (distlab.grading.worker_server); started before the run's threads, and
    before the template and the views are copied, so that its imports (3 s) take the other core
    meanwhile instead of delaying the first student. A run of one student starts its worker cold
    instead (the server would cost what a worker's start does)."""
    if students < 2 or not WorkerServer.wanted():
        return None
    return WorkerServer(worker_env(settings), cwd=str(workdir))


def _grade_scope(settings, submissions, found, scope, workdir, out, jobs, shard, regrade,
                 server, start, tail) -> int:
    """``grade_run`` once the worker server is started."""
    # Every shard makes the same template from all the labs found, so their gradebooks agree.
    template = prepare_template(workdir, sorted({lab for ls in found.values() for lab in ls}))
    # Students' code runs with their handout's package, never the instructor's (one per lab).
    graded = sorted({lab for labs in scope.values() for lab in labs})
    views = student_views(workdir, graded)
    settings = dataclasses.replace(settings, views=str(views))
    if server is not None:
        # What the labs' ranks import of PyTorch, imported once for the run, not by every
        # student's kernels' server (1.1-1.5 CPU-s each): forked, they find it imported.
        server.preload(dict.fromkeys(m for lab in graded for m in rank_imports(views / lab)))
    current = selection.lab_fingerprints(submissions, scope, template, settings.fingerprint())
    run = records.Run(workdir, out, scope, shard, current, write_scores)
    todo, skipped = selection.plan(current, run.records, regrade)
    where = f" (shard {shard[0]}/{shard[1]} of {len(found)})" if shard else ""
    total = sum(map(len, todo.values()))
    print(f"grading {total} notebooks of {len(todo)} students{where}, "
          f"{jobs} at a time, backend {settings.backend}; {len(skipped)} students already graded")
    for student in skipped:
        print(f"  {student:<16} skipped: graded before, submission unchanged (--regrade {student} "
              f"grades again)")
    run.start()
    progress = Progress(total)
    failed = []
    if not todo and server is not None:
        server.close(now=True)   # nothing to grade: its imports are not waited for
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool, stop_workers_on_interrupt(pool):
            # The students with the most labs first: one started last would keep a worker
            # busy alone at the end of the run while the others have nothing left to take.
            order = sorted(todo, key=lambda s: -len(todo[s]))
            futures = {pool.submit(timed, grade_student, s, todo[s], submissions, workdir,
                                   settings, server): s for s in order}
            left = len(futures)
            tail = _start_tail(tail, left, jobs)
            for future in as_completed(futures):
                student, left = futures[future], left - 1
                progress.clear()
                if not _record(student, future, workdir, run):
                    failed.append(student)
                progress.done(len(todo[student]))
                tail = _start_tail(tail, left, jobs)
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


def _start_tail(tail, left: int, jobs: int):
    """Call ``tail()`` once fewer students are left than ``jobs`` (a core is free from then
    on, until the run ends); what is still to call: ``tail``, or None once called."""
    if tail is not None and left < jobs:
        tail()
        return None
    return tail


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
        print(f"  {student:<16} {row['lab']:<24} {row['score']:g}/{row['max_score'] or 0:g}  "
              f"{tests}{flag}", flush=True)
    collect_feedback(rows, workdir)
    run.record(student, rows, seconds)
    return True


def student_views(workdir: Path, labs: list[str]) -> Path:
    """Make (or reuse) the student package of each lab graded, in ``workdir/views/<lab>``."""
    from distlab.grading.student_package import view
    for lab in labs:
        view(workdir, lab)
    return (workdir / "views").resolve()


def hidden_folders(workdir: Path, submissions: Path, out: Path) -> tuple[str, ...]:
    """What a student's code may not read: the grading folders (every student's), the
    submissions, the scores (its own folders inside them stay open to it), and the instructor's
    part of the course: every folder of the course root but the package and the reference data
    (the solutions, the grader's configuration, build/, tests/, .git/), since code that copies a
    lab's solution at grading time would be graded as the student's own (a checkout's course;
    an installed one is inside the package). A folder that holds the package, the data or the
    interpreter, which the code needs, stays open."""
    needed = (paths.PACKAGE, paths.data().resolve(), Path(sys.prefix).resolve())
    course = paths.root().resolve()
    instructors = [p for p in course.iterdir() if p.is_dir() and not p.is_symlink()]
    if any(q == course or q in course.parents for q in needed):
        # An installed course lives inside the package (site-packages/distlab/course_files):
        # hiding its folders would leave the folders above them unlistable, and Python lists
        # the folders it imports from. Its solutions stay readable; grade from a checkout.
        instructors = []
    return tuple(str(p) for p in (workdir.resolve(), submissions.resolve(), out.resolve(),
                                  *instructors)
                 if not any(p == q or p in q.parents for q in (*needed, course)))


def worker_env(settings: GradingSettings) -> dict[str, str]:
    """Every worker's environment (the same for all the students of a run, whenever it is
    asked: the worker server, started first, forks only workers of its own environment)."""
    from distlab.grading.course_dir import scripts_on_path
    env = dict(os.environ, **settings.checks().environ())
    env.pop("DISTLAB_RANK", None)
    # As it is once this process has opened a gradebook (nbgrader_api), which the template and
    # the records do after the server has started.
    env["PATH"] = scripts_on_path(env.get("PATH", ""))
    # The kernels start no rank launcher on `import distlab` (distlab/__init__.py): a notebook
    # that calls distlab.run starts one then, and most never do outside the judge.
    env["DISTLAB_WARM_UP"] = "0"
    return env


def grade_student(student: str, labs: list[str], submissions: Path, workdir: Path,
                  settings: GradingSettings, server: WorkerServer | None = None) -> list[dict]:
    """Grade one student's labs in a course directory of their own; one result row per lab:
    in a worker forked by the run's ``server``, or started cold.

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
    env = worker_env(settings)
    rows_r, rows_w = os.pipe()
    args = [str(root), student, settings.to_json(), str(rows_w), *labs]
    limit = len(labs) * (settings.notebook_timeout + 120)
    proc = server.start(args, str(root), env, rows_w) if server is not None else None
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", "distlab.grading.worker", *args], cwd=root,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                pass_fds=[rows_w])
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
              "LSMs): students' code is NOT confined and could read or change files outside its "
              "folder (other submissions, the scores, any copy of the course's solutions). Grade "
              "on a machine with Landlock, or check the outputs.", file=sys.stderr)


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
