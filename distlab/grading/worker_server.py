"""Grading workers forked from one process per grading run that has imported what they import.

A worker started as ``python -m distlab.grading.worker ...`` imports torch, jupyter_client and
nbgrader's stack before it grades: about 2 CPU-s, once per student (a class of 200 pays it 200
times). The orchestration (``distlab.grading.orchestrate``) therefore starts one ``WorkerServer``
per run, a fresh interpreter that imports the worker's ``START_MODULES`` once, holds nothing of any
student (no course folder, no gradebook, no engine, no thread, no answer: the checks modules of
the labs are imported by each worker itself, after its kernels' server is forked), and forks a
worker for each student. A fork is what the worker's command would have become:
- a process of its own per student, in a session of its own, its working folder the student's
  course folder (first on ``sys.path``, as for ``python -m``), its environment the one the
  orchestration built, its stdin empty, its stdout and stderr the orchestration's pipe, and no
  descriptor of the server's but its rows pipe; its own random numbers (Python's ``random``
  reseeds at every fork; numpy's global generator is reseeded here if it was imported);
- the same ``worker.main``, so the same sandbox: its kernels Landlock-confined, its subreaper,
  its limits, its judge; nothing a worker makes exists before the fork, so no student's state
  can be inherited by another's worker;
- its command line (``/proc/PID/cmdline``, what ``ps`` shows) the cold worker's, written over
  this server's (which has room for it), so an instructor still sees whose worker it is;
- a grandchild of the server: the middle process waits for it and writes its exit status on a
  pipe of the orchestration's (``ServedWorker`` is the Popen it reads), and each dies with its
  parent, so a grader killed outright still takes every worker with it.

Where forking is not possible (a server that died, more than one thread), the worker starts cold,
with one line on stderr saying why. ``DISTLAB_FORK_WORKERS=0`` starts every worker cold.
"""
from __future__ import annotations

import functools
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from distlab.grading.json_lines import Client, answer, requests

ENV = "DISTLAB_FORK_WORKERS"
TITLE_ROOM = 4096   # bytes of this server's command line that a forked worker's title may fill
REPLY_TIMEOUT = 120.0   # seconds a fork may take on a loaded machine before the worker starts cold


class WorkerServer:
    """The orchestration's end: ``start(args, cwd, env, rows_fd)`` -> a ``ServedWorker``, or None
    (start that worker cold). ``env`` is every worker's environment: the server imports in it."""

    def __init__(self, env: dict[str, str], cwd: str):
        mine, theirs = socket.socketpair()
        self.env = env
        # The padding is room for each worker's own command line (``_set_title``).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "distlab.grading.worker_server", str(theirs.fileno()),
             " " * TITLE_ROOM], env=env, cwd=cwd, pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.client = Client(mine, REPLY_TIMEOUT)   # the run's threads share it

    @classmethod
    def wanted(cls) -> bool:
        return os.environ.get(ENV, "1") != "0" and sys.platform.startswith("linux")

    def start(self, args: list[str], cwd: str, env: dict[str, str],
              rows_fd: int) -> "ServedWorker | None":
        """A worker running ``worker.main(args)`` (``args[3]`` becomes its end of ``rows_fd``)."""
        if env != self.env:   # imported in another environment: what it read there may differ
            changed = sorted(k for k in {*env, *self.env} if env.get(k) != self.env.get(k))
            print(f"distlab grade: this worker's environment differs from the worker server's "
                  f"({', '.join(changed)}); it starts as a fresh interpreter", file=sys.stderr)
            return None
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            reply = self.client.ask({"args": args, "cwd": str(cwd), "env": env},
                                    [rows_fd, out_w, status_w])
        finally:
            os.close(out_w)
            os.close(status_w)
        if "pid" in reply:
            return ServedWorker(reply["pid"], out_r, status_r)
        os.close(out_r)
        os.close(status_r)
        print(f"distlab grade: the worker server could not fork a worker ({reply['error']}); it "
              f"starts as a fresh interpreter", file=sys.stderr)
        return None

    def preload(self, names) -> None:
        """Have the server import ``names`` (PyTorch modules: what the run's labs' ranks import)
        before it forks a worker: every student's kernels' server, forked from the worker,
        finds them imported. Its reply is read before the next request's."""
        if names:
            self.client.tell({"preload": list(names)})

    def close(self, now: bool = False) -> None:
        """Stop serving; the server is reaped (its CPU time, its workers' too, counts as the
        run's: ``RUSAGE_CHILDREN``). ``now``: killed first, for a server that forked no worker
        (it would finish its imports before it reads that the socket closed)."""
        self.client.close()
        if now:
            self.process.kill()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ServedWorker:
    """What the orchestration uses of a ``subprocess.Popen`` (pid, stdout, poll, wait) for a
    worker the server forked: its exit status comes on ``status_fd`` from its parent."""

    def __init__(self, pid: int, out_fd: int, status_fd: int):
        self.pid, self.returncode = pid, None
        self.stdout = os.fdopen(out_fd, "rb")
        self._status = status_fd

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            text = os.read(self._status, 64)
            os.close(self._status)
            # Nothing: its parent was killed before it could say (with the server).
            self.returncode = int(text) if text.strip() else -signal.SIGKILL
        return self.returncode


# ---------------------------------------------------------------------------------------------
# The server: `python -m distlab.grading.worker_server FD PADDING`

def main(argv: list[str]) -> int:
    return serve_workers(int(argv[0]))


def serve_workers(fd: int) -> int:
    """Import the worker's START_MODULES, then fork a worker for each request on the socket ``fd``
    until it closes; reap them all before returning."""
    import gc
    gc.disable()   # until the imports are done and frozen (freeze_imported)
    from distlab.grading.imports import freeze_imported, skip_slow_imports
    from distlab.grading.sandbox import die_with_parent
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the orchestration stops its workers itself
    skip_slow_imports()
    from distlab.grading import worker
    for name in worker.START_MODULES:
        importlib.import_module(name)
    # What every worker's first feedback page (and autograde) paid again, paid once here
    from distlab.grading.nbgrader_plugins import warm_up_feedback
    warm_up_feedback()
    freeze_imported(collect_after=False)
    from distlab.grading.warm_kernels import _import_extras
    from distlab.runtime.forked import can_fork
    middles: set[int] = set()
    with socket.socket(fileno=fd) as sock:
        for request, fds in requests(sock):
            if "preload" in request:   # PyTorch's modules only (``_import_extras``)
                _import_extras(request["preload"])
                freeze_imported(collect_after=False)
                answer(sock, {"preloaded": True})
                continue
            try:
                if not can_fork() or len(fds) != 3:
                    raise RuntimeError(f"{threading.active_count()} threads, {len(fds)} descriptors")
                pid, middle = _fork_worker(request, *fds)
                middles.add(middle)
                reply = {"pid": pid}
            except Exception as exc:   # noqa: BLE001 - the orchestration starts that one cold
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                for passed in fds:
                    os.close(passed)
            answer(sock, reply)
            middles = {m for m in middles if os.waitpid(m, os.WNOHANG)[0] == 0}
    for middle in middles:   # the run is over: its workers were stopped
        os.waitpid(middle, 0)
    return 0


def _fork_worker(request: dict, rows: int, out: int, status: int) -> tuple[int, int]:
    """(worker's pid, its parent's): the parent, forked from here, forks the worker and writes
    its exit status on ``status``."""
    from distlab.grading.sandbox import die_with_parent
    from distlab.runtime.forked import close_all_but, fork_helper
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read)
            die_with_parent()
            # What `python -m distlab.grading.worker ARGS` would get: its folder, environment,
            # session, empty stdin, output on `out` and no descriptor of ours but its rows pipe.
            worker = fork_helper(functools.partial(_run_worker, request, rows), keep=(rows,),
                                 env=request["env"], cwd=request["cwd"], output=out,
                                 new_session=True)
            os.write(write, str(worker.pid).encode())
            close_all_but({status})
            os.write(status, str(worker.wait()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read()
    if not text:
        os.waitpid(middle, 0)
        raise RuntimeError("the worker could not be forked")
    return int(text), middle


def _run_worker(request: dict, rows: int) -> int | None:
    """In the forked worker: what ``python -m distlab.grading.worker ARGS`` runs, its rows on
    ``rows`` and its command line the cold worker's."""
    if "numpy.random" in sys.modules:   # numpy's global generator: reseeded, as Python's is
        sys.modules["numpy.random"].seed()
    args = [str(a) for a in request["args"]]
    args[3] = str(rows)
    from distlab.grading import worker
    sys.argv = [worker.__file__, *args]
    sys.path[0] = os.getcwd()
    _set_title([sys.executable, "-m", "distlab.grading.worker", *args])
    return worker.main(args)


def _set_title(argv: list[str]) -> None:
    """Write ``argv`` over this process's command line (the memory /proc/PID/cmdline reads, which
    the server's padding made room for), cut to fit; the rest of the room is zeroed."""
    import ctypes
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])   # arg_start, arg_end (fields 48, 49)
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    title = b"\0".join(a.encode() for a in argv)[:room - 1]
    ctypes.memmove(start, title + b"\0" * (room - len(title)), room)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
