"""What one rank does, in the process the zygote forked for it.

Protocol on the control connection (``multiprocessing.connection.Connection``), rank -> launcher:
``("ready",)`` once in the process group, ``("enter", Comm)`` / ``("exit", index, end)`` for every
torch.distributed call, then ``("result", bytes)`` or ``("error", type, message, traceback)``.
Launcher -> rank: the pickled ``Task`` first; closing the connection later means "all ranks are
done, tear down".
Everything the rank prints, from Python or from C++, goes to the output socket, which is the
rank's fd 1 and fd 2.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import threading
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection


@dataclasses.dataclass
class Task:
    """What a rank needs to know. ``call`` is ``cloudpickle.dumps((fn, args, kwargs))``, unpickled
    only after the rank has taken the caller's cwd and sys.path, so that functions from the
    caller's own modules import, and a failure to unpickle is reported like any other error."""
    call: bytes
    world_size: int
    backend: str
    store_path: str   # the run's rendezvous: a torch.distributed.FileStore (see Launcher.run)
    timeout: float
    cwd: str
    path: list
    env: dict
    threads: int
    plain_results: bool = False  # results as torch.save data, for a launcher that trusts no pickle
    guard: object = None         # a call_guard.Guard: the course code a graded answer may not use


def _dump_result(value, plain: bool) -> bytes:
    if plain:
        from distlab.runtime.safe_pickle import dumps_value
        return dumps_value(value)
    import cloudpickle
    return cloudpickle.dumps(value)


def _redirect_output(out_fd: int) -> None:
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)


def _close_output() -> None:
    """Flush and close the output socket so the launcher has every line before the result."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


def _isolate(rank: int, task: Task) -> str | None:
    """A rank of a confined zygote (one that runs a student's code) gets a Landlock domain of
    its own, nested in the zygote's: it writes only a folder of its own and the run's
    rendezvous store, and reads what the zygote's allow-list names but no other rank's folder.
    Its own domain also keeps it from other ranks' /proc entries (their memory, descriptors) and
    signals. So ranks have no channel between them but the network, where the kernel counts
    every byte (``distlab.runtime.wire``), and the store, whose growth is counted. Returns the
    rank's folder (None: not confined)."""
    if not os.environ.get("DISTLAB_CONFINE"):
        return None
    import tempfile
    from distlab.runtime.landlock import confine
    own = tempfile.mkdtemp(prefix=f"rank{rank}-", dir=task.cwd)
    # No capabilities to drop (~1 ms of calls): this zygote's confinement emptied every set, the
    # bounding one included, before it forked the rank.
    confine([own, task.store_path], **confined_reads(), drop_capabilities=False)
    return own


def confined_reads() -> dict:
    """``confine``'s readable and hidden folders for a confined zygote and its ranks, as the
    launcher named them: DISTLAB_READ (absent: reads anywhere; empty: only the writable folders)
    but not DISTLAB_HIDE. One reading for both, so a rank finds the zygote's work on them done."""
    readable, hidden = (os.environ.get(k) for k in ("DISTLAB_READ", "DISTLAB_HIDE"))
    return dict(readable=None if readable is None else [r for r in readable.split(os.pathsep) if r],
                hidden=hidden.split(os.pathsep) if hidden else [])


def _setup(rank: int, task: Task, own: str | None = None) -> None:
    os.chdir(own or task.cwd)
    sys.path[:] = task.path
    os.environ.update(task.env)
    if own:   # caches and temporary files in the rank's own folder, the one it may write
        os.environ.update(HOME=own, TMPDIR=own, MPLCONFIGDIR=own, XDG_CACHE_HOME=own)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(task.world_size),
                      LOCAL_WORLD_SIZE=str(task.world_size), DISTLAB_RANK="1")
    import torch
    # Ranks share the machine's cores; more threads than cores would only thrash.
    torch.set_num_threads(task.threads)


def _init_group(rank: int, task: Task) -> None:
    import torch
    import torch.distributed as dist
    store = dist.FileStore(task.store_path, task.world_size)
    store.set_timeout(timedelta(seconds=task.timeout + 30))
    kwargs = {}
    if task.backend == "nccl":
        torch.cuda.set_device(rank)
        kwargs["device_id"] = torch.device("cuda", rank)
    # The group's own timeout is longer than the launcher's, so the launcher's diagnosis comes first.
    dist.init_process_group(task.backend, store=store, rank=rank, world_size=task.world_size,
                            timeout=timedelta(seconds=task.timeout + 30), **kwargs)


def main(rank: int, ctrl_fd: int, out_fd: int) -> int:
    os.setsid()  # its own process group: the launcher can kill the rank and all it started
    _redirect_output(out_fd)
    conn = Connection(ctrl_fd)
    lock = threading.Lock()

    def report(*message) -> None:
        with lock:
            conn.send(message)

    try:
        task: Task = pickle.loads(conn.recv_bytes())
    except EOFError:
        return 0
    code = _run_task(rank, task, report)
    try:  # wait until every rank is done: a peer may still be talking to this rank
        conn.recv_bytes()
    except (EOFError, OSError):
        pass
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def _call_guarded(rank: int, task: Task, report):
    """Unpickle the call and make it, under the task's guard (``distlab.runtime.call_guard``):
    a student's object that is, subclasses or calls a guarded course implementation turns the
    rank's result into ``CourseCodeUsed``, whatever the call returned or raised."""
    import cloudpickle
    from distlab.runtime.call_guard import watching
    with watching(task.guard) as watch:
        try:
            fn, args, kwargs = cloudpickle.loads(task.call)
            _init_group(rank, task)
            report("ready")
            value = fn(rank, task.world_size, *args, **kwargs)
        except Exception:
            if watch is None or watch.verdict() is None:
                raise
            value = None
    verdict = watch.verdict() if watch is not None else None
    if verdict is not None:
        raise verdict
    return value


def _run_task(rank: int, task: Task, report) -> int:
    """Set up, join the group, call the function; report its result or its exception."""
    from distlab.runtime.comms import Recorder
    try:
        _setup(rank, task, _isolate(rank, task))
        Recorder(rank, lambda kind, comm, index: report(kind, comm) if kind == "enter"
                 else report(kind, index, comm.end)).install()
        value = _call_guarded(rank, task, report)
        try:
            from distlab.runtime.devices import to_cpu
            payload = _dump_result(to_cpu(value), task.plain_results)
        except Exception as exc:
            raise TypeError(f"rank {rank} returned a {type(value).__name__}, which cannot be sent "
                            f"back to the launcher ({exc}). Return tensors, numbers, lists or "
                            f"dicts of them.") from exc
        _close_output()
        report("result", payload)
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        # Start the traceback at the student's code, not at this launcher frame.
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        _close_output()
        report("error", type(exc).__name__, str(exc), text)
        return 1
