"""The zygote: a process that imported torch once and forks fresh ranks on request.

``python -m distlab.runtime.zygote FD`` is started by the launcher (``distlab.runtime.launch``) in a fresh
interpreter, never by re-importing the caller's main script, so a lab exported to a plain script
(no ``if __name__ == "__main__":`` guard) works too. It imports torch and the distributed
libraries the labs use, then waits on the socket FD for requests:

    ("fork", run_id, world_size)  + 2 * world_size file descriptors (control, output per rank)

and answers ("forked", run_id, [pid, ...]) and, as each rank ends, ("exit", run_id, rank, status).
A fork costs milliseconds; a fresh ``import torch`` costs seconds. The zygote itself never runs a
torch op, starts no threads and never touches CUDA, so forking it is safe for OpenMP and for CUDA
in the children.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import sys

from distlab.runtime import wire

MAX_FDS = 512
# Modules the launcher asks the zygote to import besides torch (os.pathsep-separated): the
# grader's judge names the checks modules, which every rank of a check would otherwise import
# afresh, and the PyTorch modules of the labs it grades. Unset: TORCH_EXTRAS.
PRELOAD_ENV = "DISTLAB_ZYGOTE_PRELOAD"
# Where the ranks import distlab from (a student's view, distlab.grading.student_package): the
# grader's judge sets it for the ranks that run a student's code.
PACKAGE_ENV = "DISTLAB_PACKAGE"
# The course code its ranks' guards watch ("module:qualname", space-separated): the grader's
# judge names its labs' (distlab.runtime.call_guard.prepare).
GUARDED_ENV = "DISTLAB_ZYGOTE_GUARDED"
# What every rank needs: torch, its process groups, DDP, and cloudpickle to read its task.
RANK_BASE = ("torch", "torch.distributed", "torch.nn.parallel", "cloudpickle")
# PyTorch's parallel APIs (DTensor, FSDP, pipelining): labs use them on their ranks, and they
# cost about a second of CPU time to import, which no rank should pay on every launch.
TORCH_EXTRAS = ("torch.distributed.tensor", "torch.distributed.tensor.parallel",
                "torch.distributed.tensor.debug", "torch.distributed.pipelining",
                "torch.distributed.fsdp")
# What each rank imports as it runs (distlab.runtime.rank's own lazy imports, and torch.load's,
# which unpickling a tensor calls): ~2 ms of CPU a rank when each imports them afresh.
RANK_RUNTIME = ("distlab.runtime.rank", "distlab.runtime.comms", "distlab.runtime.call_guard",
                "distlab.runtime.devices", "distlab.runtime.safe_pickle",
                "distlab.runtime.landlock", "tempfile", "torch.utils.serialization")


def send(sock: socket.socket, message, fds=()) -> None:
    socket.send_fds(sock, [pickle.dumps(message)], list(fds))


def recv(sock: socket.socket, loads=pickle.loads):
    """One message and the file descriptors that came with it; (None, []) when the peer closed.
    A launcher that does not trust the zygote's process (``distlab.grading.judge``) passes a safe loads."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS)
    if not data:
        return None, fds
    return loads(data), fds


def _preload() -> None:
    for name in RANK_BASE:
        __import__(name)
    named = os.environ.get(PRELOAD_ENV)
    extra = TORCH_EXTRAS if named is None else filter(None, named.split(os.pathsep))
    for name in ("numpy", *RANK_RUNTIME, *extra):
        try:
            __import__(name)
        except Exception:  # an optional extra: the rank imports it itself if it needs it
            pass


def _fork_ranks(sock, run_id: int, world_size: int, fds: list[int], children: dict) -> None:
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _become_rank(sock, rank, fds)
        children[pid] = (run_id, rank)
        pids.append(pid)
    for fd in fds:
        os.close(fd)
    send(sock, ("forked", run_id, pids))


def _become_rank(sock, rank: int, fds: list[int]) -> None:
    """In the forked child: keep this rank's two descriptors, drop the zygote's, run the rank."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        ctrl, out = fds[2 * rank], fds[2 * rank + 1]
        for fd in fds:
            if fd not in (ctrl, out):
                os.close(fd)
        from distlab.runtime import rank as rank_main
        code = rank_main.main(rank, ctrl, out)
    finally:
        os._exit(code)


def _reap(sock, children: dict) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        run_id, rank = children.pop(pid, (None, None))
        if run_id is not None:
            try:
                send(sock, ("exit", run_id, rank, status))
            except OSError:
                pass


def serve(sock: socket.socket) -> None:
    children: dict[int, tuple[int, int]] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    send(sock, ("ready", os.getpid()))
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [], 1.0)
        if wake_r in readable:
            os.read(wake_r, 4096)
        _reap(sock, children)
        if sock in readable:
            message, fds = recv(sock)
            if message is None:  # the launcher is gone: so are its ranks
                for pid in children:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return
            kind, run_id, arg = message
            if kind == "fork":
                _fork_ranks(sock, run_id, arg, fds, children)
            elif kind == "count":   # the ranks' sockets live in this process's network
                counted = wire.count(arg)
                send(sock, ("counted", run_id, None if counted is None
                            else [(w.sent, w.received, w.sockets) for w in counted]))


def _confine_if_asked() -> None:
    """The grader's judge starts its zygote with DISTLAB_CONFINE (folders, os.pathsep-separated):
    every rank forked from here may write only there, read only there and in DISTLAB_READ's
    folders (when set) but not DISTLAB_HIDE's inside them, write no file past DISTLAB_FILE_LIMIT
    bytes, and cannot signal or trace the grader."""
    folders = os.environ.get("DISTLAB_CONFINE")
    if folders:
        from distlab.runtime.landlock import confine
        from distlab.runtime.rank import confined_reads
        confine(folders.split(os.pathsep), **confined_reads(),
                max_file_bytes=int(os.environ.get("DISTLAB_FILE_LIMIT") or 0))


def main(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    package = os.environ.get(PACKAGE_ENV)
    if package:   # a student's view of distlab: its ranks import nothing else of the course
        from distlab.runtime.forked import import_package_from
        import_package_from(package)
    if os.environ.get(wire.OWN_NETWORK_ENV) == "1":
        wire.own_network()   # before confinement, which drops the capabilities it needs
    _confine_if_asked()
    _preload()
    guarded = os.environ.get(GUARDED_ENV)
    if guarded:
        from distlab.runtime.call_guard import prepare
        prepare(guarded.split())
    serve(sock)


if __name__ == "__main__":
    main(int(sys.argv[1]))
