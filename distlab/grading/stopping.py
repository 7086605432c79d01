"""Stopping a grading run cleanly: Ctrl-C, ``kill`` or Slurm's time limit drop the queued
students and kill the running workers; what was recorded stays."""
from __future__ import annotations

import contextlib
import signal
import threading
import time


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
