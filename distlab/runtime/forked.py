"""A helper process forked from this one instead of started as a fresh interpreter.

A fresh ``python -m ...`` pays ``import torch`` again: about a second of CPU time. A process that
has imported torch (and run no torch op, started no thread) can fork a helper that has it already:
the grader's worker forks its judge's zygote and its kernels' server this way, once per student.

Forking is safe only while this process has a single thread: a thread holding a lock at the fork
would hold it forever in the child. ``fork_helper`` therefore returns None where there are more,
and the caller starts the helper as a fresh interpreter instead, as it would without this.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
import traceback


def can_fork() -> bool:
    """True while forking is safe here: Linux (a POSIX fork, no macOS fork-without-exec pitfalls)
    and this process's only thread is the caller."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def fork_helper(main, *, keep: tuple[int, ...] = (), env: dict[str, str] | None = None,
                cwd: str | None = None, output: int | None = None,
                new_session: bool = False) -> "ForkedProcess | None":
    """Fork a child that runs ``main()`` and exits with its return value (0 for None, 1 for an
    exception, whose traceback goes to its stderr); None where forking is not safe (``can_fork``).

    The child keeps only ``keep`` of this process's file descriptors (and 0, 1, 2: stdin reads
    nothing; stdout and stderr go to ``output`` if given), so it holds none of the parent's pipes
    or sockets; its environment is ``env``, its working folder ``cwd``, and with ``new_session``
    it leads a session of its own, as ``subprocess.Popen(start_new_session=True)`` would."""
    if not can_fork():
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:
        if new_session:
            os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        if output is not None:
            os.dup2(output, 1)
            os.dup2(output, 2)
        close_all_but(set(keep) | {0, 1, 2})
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            # The parent's temporary folder, cached at its first use: the child's is its own
            # TMPDIR (torch keeps its caches there; a confined child may write nowhere else).
            tempfile.tempdir = None
        # A fresh interpreter's handlers, not the parent's.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        result = main()
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:   # noqa: BLE001 - said on stderr, as a fresh interpreter's crash would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001
                pass
        os._exit(code)   # never the parent's atexit handlers, nor its cleanup


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but ``keep``."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def import_package_from(folder: str) -> None:
    """From now on, ``import distlab`` finds the package in ``folder`` (a student's view of it,
    ``distlab.grading.student_package``): the course modules this process imported so far are
    forgotten, and ``folder`` goes first on sys.path. A helper forked from a process that imported
    the instructor's package calls this before it runs a student's code; so does a fresh one."""
    for name in [n for n in sys.modules if n == "distlab" or n.startswith("distlab.")]:
        del sys.modules[name]
    # First, even before the folder `python -m` puts first (a checkout's root holds distlab too).
    sys.path[:] = [folder, *(p for p in sys.path if p != folder)]
    import importlib
    importlib.invalidate_caches()


class ForkedProcess:
    """What callers use of a ``subprocess.Popen`` (pid, returncode, poll, wait, signals) for a
    child that this process forked, or one that was reparented here (a child subreaper)."""
    stdin = stdout = stderr = None

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            return self._reap(0)
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                import subprocess
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)
        return self.returncode

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:
                # Reaped by someone else here (a kill_tree that reaps what it killed).
                self.returncode = -signal.SIGKILL
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
