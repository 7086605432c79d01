"""The launcher's side of the zygote (``distlab.runtime.zygote``): start it, ask it to fork ranks,
and collect the exit notices it sends as its ranks end."""
from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time

from distlab.runtime import zygote as _zygote
from distlab.runtime.forked import ForkedProcess, fork_helper
from distlab.runtime.outcome import DistributedError

STARTUP_NOTICE = 10.0   # seconds between reports on a zygote that is still starting


def _waiting_on(pid: int) -> str:
    """What the process is blocked in, as /proc tells it (its state and kernel wait channel)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or "?"
    except OSError:
        return "its state is unknown"
    return f"process state {state}, waiting in {wchan}"


class ZygoteHandle:
    """A launcher's handle on its zygote process. ``env``: what the zygote (and so every rank it
    forks) adds to this process's environment, e.g. where to confine itself; ``loads``: how its
    messages are read."""

    def __init__(self, env: dict[str, str], loads=pickle.loads, fork: bool = False, spawn=None):
        """``fork``: fork the zygote from this process, which has imported torch, where that is
        safe (``distlab.runtime.forked``), instead of starting a fresh interpreter: the grader's
        worker does, since a fresh one imports torch again, a second of CPU for every student.
        ``spawn(env, socket_fd, log_fd) -> pid | None``: have another process fork it (the
        grader's kernel server, which holds no answer), reparented here."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, DISTLAB_ZYGOTE="1", PYTHONUNBUFFERED="1", **env)
        fd = theirs.fileno()
        self.proc = fork_helper(lambda: _zygote.main(fd), keep=(fd,), env=env,
                                output=self.log.fileno(), new_session=True) if fork else None
        if self.proc is None and spawn is not None:
            pid = spawn(env, fd, self.log.fileno())
            self.proc = ForkedProcess(pid) if pid else None
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "distlab.runtime.zygote", str(fd)],
                pass_fds=[fd], stdin=subprocess.DEVNULL, stdout=self.log,
                stderr=self.log, env=env, start_new_session=True)
        theirs.close()
        self.sock, self.loads = ours, loads
        self.ready = False
        self.exits: dict[tuple[int, int], int] = {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 300) -> None:
        """Wait until the zygote has imported torch. A line on stderr every STARTUP_NOTICE
        seconds says it is still starting; a zygote that used no CPU time over such an interval
        is stuck (a lock, a full disk, a filesystem that does not answer) and fails at once."""
        if self.ready:
            return
        from distlab.runtime.stuck import cpu_seconds
        start, used = time.monotonic(), cpu_seconds(self.proc.pid)
        while True:
            left = timeout - (time.monotonic() - start)
            message = self._recv(min(left, STARTUP_NOTICE))
            if message is not None or not self.alive() or left <= STARTUP_NOTICE:
                break
            now = cpu_seconds(self.proc.pid)
            waited = time.monotonic() - start
            if used is not None and now is not None and now - used < 0.005 * STARTUP_NOTICE:
                raise DistributedError(
                    f"distlab's rank launcher process (pid {self.proc.pid}) has not started in "
                    f"{waited:.0f} s and used no CPU time in the last {STARTUP_NOTICE:g} s: it "
                    f"waits for something ({_waiting_on(self.proc.pid)}). Run `distlab doctor`.")
            print(f"distlab.run: the rank launcher is still starting (importing torch) after "
                  f"{waited:.0f} s; the machine is busy", file=sys.stderr, flush=True)
            used = now
        if message is None or message[0] != "ready":
            self.log.seek(0)
            raise DistributedError("distlab could not start its rank launcher process:\n"
                                   + self.log.read().decode(errors="replace")[-3000:]
                                   + "\nRun `distlab doctor` to check the installation.")
        self.ready = True

    def _recv(self, timeout: float):
        self.sock.settimeout(timeout)
        try:
            message, _ = _zygote.recv(self.sock, self.loads)
        except (socket.timeout, OSError):
            return None
        return message

    def fork(self, run_id: int, world_size: int, fds: list[int]) -> list[int]:
        _zygote.send(self.sock, ("fork", run_id, world_size), fds)
        while True:
            message = self._recv(60)
            if message is None:
                raise DistributedError("the rank launcher process stopped answering")
            if message[0] == "forked" and message[1] == run_id:
                return message[2]
            self.note(message)

    def count_wire(self, run_id: int, pids: list[int]):
        """The TCP bytes each of ``pids`` (a run's ranks) has sent and received, counted by the
        zygote in its network (``distlab.runtime.wire.count``): a list of ``Wire``, or None."""
        from distlab.runtime.wire import Wire
        _zygote.send(self.sock, ("count", run_id, list(pids)))
        while True:
            message = self._recv(60)
            if message is None:
                raise DistributedError("the rank launcher process stopped answering")
            if message[0] == "counted" and message[1] == run_id:
                return None if message[2] is None else [Wire(*w) for w in message[2]]
            self.note(message)

    def note(self, message) -> None:
        if message and message[0] == "exit":
            self.exits[(message[1], message[2])] = message[3]

    def drain(self) -> None:
        """Read the exit notices that arrived while nobody listened."""
        self.sock.setblocking(False)
        try:
            while True:
                message, _ = _zygote.recv(self.sock, self.loads)
                if message is None:
                    break
                self.note(message)
        except (BlockingIOError, OSError):
            pass
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        try:
            self.sock.close()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()
