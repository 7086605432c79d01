"""distlab.grading.worker_server: each student's grading worker forked from one process per run.

The server imports what a worker imports (torch, nbgrader's stack) once; what keeps students apart
is that it holds nothing of any student when it forks: no thread, no answer (a lab's checks module,
its references), no course folder. Every grading run of more than one student forks its workers this
way: the suite's shared run (tests/test_grader.py, the attacks), the classmate attack of
tests/test_judge.py (graded together; the victim alone is graded by a cold worker),
tests/test_grade_resume.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from distlab.grading.worker_server import WorkerServer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_server_imports_no_lab_s_checks_and_starts_no_thread():
    # What the server holds is in every worker, and in every kernel forked from a worker's
    # kernels' server: a lab's checks module (its references) there would hand the answers to
    # the student's code; a thread would make the fork unsafe.
    seen = json.loads(_python("""
        import importlib, json, sys, threading
        from distlab.grading.imports import skip_slow_imports
        skip_slow_imports()
        from distlab.grading import worker
        for name in worker.START_MODULES:
            importlib.import_module(name)
        # What a run's preload may name (WorkerServer.preload): PyTorch's modules only
        from distlab.grading.warm_kernels import _import_extras
        _import_extras(["torch._dynamo", "torch.distributed.pipelining", "distlab.checks.lab01"])
        print(json.dumps({"checks": sorted(m for m in sys.modules
                                           if m.startswith(("distlab.checks.lab", "distlab.labs"))),
                          "threads": threading.active_count(), "torch": "torch" in sys.modules,
                          "nbgrader": "nbgrader" in sys.modules,
                          "preloaded": "torch.distributed.pipelining" in sys.modules}))
    """))
    assert seen == {"checks": [], "threads": 1, "torch": True, "nbgrader": True,
                    "preloaded": True}


def test_a_forked_worker_shows_the_cold_worker_s_command_line():
    # ps, an instructor, and tests/submissions/classmate.py's attacker find a student's worker
    # by its command line: a forked one writes the cold one's over the server's, cut to fit.
    title = [sys.executable, "-m", "distlab.grading.worker", "/work/students/alice", "alice"]
    shown = _python("""
        import json, sys
        from distlab.grading.worker_server import _set_title
        title = json.loads(sys.argv[1])
        with open("/proc/self/cmdline", "rb") as f:
            before = len(f.read())
        _set_title(title)
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
        _set_title(["x" * 20000])   # longer than the room: cut, never past it
        with open("/proc/self/cmdline", "rb") as f:
            cut = f.read()
        print(json.dumps([shown.decode(), before, len(shown), len(cut), cut.count(b"x")]))
    """, json.dumps(title), " " * 1000)
    text, before, after, cut, xs = json.loads(shown)
    assert text.split("\0")[:len(title)] == title
    assert before == after == cut and xs == before - 1


def test_a_worker_forked_by_the_server_reports_its_exit_and_output(tmp_path, capfd):
    env = dict(os.environ)
    server = WorkerServer(env, cwd=str(tmp_path))
    try:
        rows_r, rows_w = os.pipe()
        # Settings that are not JSON: the worker fails at once, after its (free) imports.
        worker = server.start([str(tmp_path), "s", "{not json", "0", "01_collectives"],
                              str(tmp_path), env, rows_w)
        os.close(rows_w)
        assert worker is not None and worker.pid != server.process.pid
        output = worker.stdout.read().decode()
        assert worker.wait(timeout=300) == 1, output
        assert "JSONDecodeError" in output   # its stderr is the grader's pipe
        assert os.read(rows_r, 100) == b""   # no row, and no other holder of the rows pipe
        os.close(rows_r)
        # Imported in another environment: that worker starts cold, not from this server, and
        # the run says so (a cold worker costs 2 CPU-s more, which no score would show).
        capfd.readouterr()
        assert server.start(["x"] * 5, str(tmp_path), {**env, "OTHER": "1"}, 0) is None
        assert "differs from the worker server's (OTHER)" in capfd.readouterr().err
    finally:
        server.close()
    assert server.process.returncode == 0
    assert server.start(["x"] * 5, str(tmp_path), env, 0) is None   # closed: cold again


def test_every_worker_of_a_run_is_asked_in_the_server_s_environment(monkeypatch, tmp_path):
    # The server starts before the run opens its first gradebook, which puts this interpreter's
    # scripts on PATH (nbgrader runs alembic): a worker asked for after that must still be of
    # the server's environment, else every student's worker starts cold (2 CPU-s each), silently.
    from distlab.grading.course_dir import nbgrader_api
    from distlab.grading.orchestrate import worker_env
    from distlab.grading.settings import GradingSettings
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin"]))
    settings = GradingSettings()
    before = worker_env(settings)
    nbgrader_api(tmp_path)
    assert os.environ["PATH"] != os.pathsep.join(["/usr/bin", "/bin"])   # it changed it here
    assert worker_env(settings) == before
