"""``run(fn, world_size, *args)``: call ``fn(rank, world_size, *args)`` on fresh ranks.

Every lab cell that touches several ranks goes through here::

    out = distlab.run(fn, 4, x)            # a list: out[r] is what rank r returned
    out.comms[r]                           # rank r's torch.distributed calls (distlab.Comm)

How: a *zygote* process (``distlab.runtime.zygote``) imports torch once and forks the ranks of every run
in milliseconds. ``fn`` travels by cloudpickle, so a function defined in a notebook cell, a lambda
or a closure all work, and because the zygote is a fresh interpreter, a lab exported to a script
with no ``__main__`` guard works too. The launcher hosts the rendezvous store on a port the OS
picks, so two runs, or two notebooks, never collide.

Failures never hang the caller: an exception on any rank stops all ranks and is raised here as
``RankError`` naming the rank and carrying its traceback; a rank that dies raises ``RankCrashed``;
ranks that disagree about a collective, wait on a rank that has returned, or are still running
after ``timeout`` seconds are killed and ``HangError`` says, rank by rank, where each one was.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) ``fn`` runs in this process on the existing
group, and every process gets the list of all ranks' results::

    torchrun --standalone --nproc-per-node=2 my_lab.py
"""
from __future__ import annotations

import atexit
import codecs
import itertools
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection

import cloudpickle
import torch

from distlab.runtime import zygote as _zygote
from distlab.runtime.comms import SAME_SHAPE_OPS
from distlab.runtime.diagnosis import (RankState, describe, exit_text, find_deadlock, find_mismatch,
                               find_orphan_wait, hint_for)
from distlab.runtime.devices import pick_backend
from distlab.runtime.outcome import (DistributedError, HangError, RankCrashed, RankError,
                                     Results)
from distlab.runtime.rank import Task
from distlab.runtime.torchrun import run_in_process


# What a rank's error says when a peer's connection dropped under it (gloo, NCCL).
PEER_LOST = ("Connection reset", "Connection closed", "Broken pipe", "Socket closed",
             "connection closed", "Connection refused", "NCCL communicator was aborted")


# Set by the grader's judge (``distlab.grading.judge``) in its own process, whose ranks run a student's
# code: nothing they send is then read with pickle.loads, which runs whatever the data names.
_distrust = False
_zygote_env: dict[str, str] = {}
_rank_cwd: str | None = None
_rank_env: dict[str, str] = {}


def distrust_ranks(confine: list[str] = (), hide: list[str] = (), cwd: str | None = None) -> None:
    """From now on read ranks' messages and results with ``distlab.runtime.safe_pickle`` only, start ranks
    in ``cwd``, and confine the zygote and its ranks: writes only to the ``confine`` folders, no
    reads in the ``hide`` ones (``distlab.grading.sandbox``)."""
    global _distrust, _rank_cwd
    _distrust, _rank_cwd = True, cwd
    if cwd:  # where the ranks may write: their home, caches and temporary files go there too
        # (torch writes caches while importing; a denied write there breaks later imports)
        _rank_env.update(HOME=cwd, TMPDIR=cwd, MPLCONFIGDIR=cwd, XDG_CACHE_HOME=cwd)
        _zygote_env.update(_rank_env)
    if confine:
        _zygote_env["DISTLAB_CONFINE"] = os.pathsep.join(confine)
        _zygote_env["DISTLAB_HIDE"] = os.pathsep.join(hide)
    if _zygote_handle is not None:  # started before: it is not confined
        _zygote_handle.close()


def _loads(data: bytes):
    if _distrust:
        from distlab.runtime.safe_pickle import loads_message
        return loads_message(data)
    return pickle.loads(data)


def _recv(conn: Connection):
    return _loads(conn.recv_bytes())


def _load_result(data: bytes):
    if _distrust:
        from distlab.runtime.safe_pickle import loads_value
        return loads_value(data)
    return cloudpickle.loads(data)


class Zygote:
    """The launcher's handle on its zygote process (started once, restarted if it died)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, DISTLAB_ZYGOTE="1", PYTHONUNBUFFERED="1", **_zygote_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distlab.runtime.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=self.log, env=env, start_new_session=True)
        theirs.close()
        self.sock = ours
        self.ready = False
        self.exits: dict[tuple[int, int], int] = {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 300) -> None:
        if self.ready:
            return
        message = self._recv(timeout)
        if message is None or message[0] != "ready":
            self.log.seek(0)
            raise DistributedError("distlab could not start its rank launcher process:\n"
                                   + self.log.read().decode(errors="replace")[-3000:]
                                   + "\nRun `distlab doctor` to check the installation.")
        self.ready = True

    def _recv(self, timeout: float):
        self.sock.settimeout(timeout)
        try:
            message, _ = _zygote.recv(self.sock, _loads)
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

    def note(self, message) -> None:
        if message and message[0] == "exit":
            self.exits[(message[1], message[2])] = message[3]

    def drain(self) -> None:
        """Read the exit notices that arrived while nobody listened."""
        self.sock.setblocking(False)
        try:
            while True:
                message, _ = _zygote.recv(self.sock, _loads)
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


_zygote_handle: Zygote | None = None
_run_ids = itertools.count(1)


def warm_up() -> Zygote:
    """Start the zygote now (in the background) so the first ``run`` does not wait for torch."""
    global _zygote_handle
    if _zygote_handle is None or not _zygote_handle.alive():
        _zygote_handle = Zygote()
    return _zygote_handle


@atexit.register
def _shutdown() -> None:
    if _zygote_handle is not None:
        _zygote_handle.close()


def run(fn, world_size: int, *args, backend: str = "auto", timeout: float = 60,
        threads: int | None = None, **kwargs) -> Results:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` fresh ranks; return the
    ranks' return values in rank order (a ``Results`` list with ``.comms``).

    backend: "auto" (NCCL when each rank can have its own GPU, else gloo), "gloo" or "nccl".
    timeout: seconds before hung ranks are killed and ``HangError`` explains where each one was.
    threads: intra-op threads per rank (default: this machine's cores shared among the ranks).
    """
    if os.environ.get("DISTLAB_RANK") == "1":
        raise DistributedError("distlab.run was called inside a rank. Call it from the notebook "
                               "or script, and pass the work as the function it runs.")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_in_process(fn, world_size, args, kwargs, backend)
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    backend = pick_backend(backend, world_size)
    zygote = warm_up()
    zygote.wait_ready()
    zygote.drain()
    zygote.exits.clear()  # notices of earlier runs' ranks are of no further use
    store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                       wait_for_workers=False)
    try:
        call = cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise DistributedError(
            f"distlab.run could not send your function or its arguments to the ranks: {exc}. "
            f"Arguments must be picklable (tensors, numbers, modules, functions).") from exc
    task = Task(call=call, world_size=world_size, backend=backend, store_host="127.0.0.1",
                store_port=store.port, timeout=timeout, cwd=_rank_cwd or os.getcwd(),
                path=list(sys.path), env=dict(os.environ, **_rank_env),
                threads=threads or max(1, (os.cpu_count() or 1) // world_size),
                plain_results=_distrust)
    return _Launch(zygote, world_size, backend, timeout).go(pickle.dumps(task))


class _Launch:
    """One run: fork the ranks, feed them the task, watch them until all return or one fails."""

    def __init__(self, zygote: Zygote, world_size: int, backend: str, timeout: float):
        self.zygote, self.world_size, self.backend, self.timeout = zygote, world_size, backend, timeout
        self.run_id = next(_run_ids)
        self.states = [RankState(rank) for rank in range(world_size)]
        self.results: list = [None] * world_size
        self.partial = [""] * world_size
        # Incremental decoders: a UTF-8 character may be split between two reads.
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(world_size)]
        self.selector = selectors.DefaultSelector()
        self.conns: list[Connection] = []
        self.outs: list[socket.socket] = []
        self.pids: list[int] = []

    def go(self, payload: bytes) -> Results:
        start = time.perf_counter()
        try:
            self._start(payload)
            self._watch(start + self.timeout)
        except BaseException:
            self._kill()
            raise
        finally:
            self._close()
        out = Results(self.results)
        out.comms = [state.comms for state in self.states]
        out.backend, out.seconds = self.backend, time.perf_counter() - start
        return out

    def _start(self, payload: bytes) -> None:
        child_fds = []
        for rank in range(self.world_size):
            ctrl_ours, ctrl_theirs = socket.socketpair()
            out_ours, out_theirs = socket.socketpair()
            self.conns.append(Connection(ctrl_ours.detach()))
            self.outs.append(out_ours)
            child_fds += [ctrl_theirs.detach(), out_theirs.detach()]
        try:
            self.pids = self.zygote.fork(self.run_id, self.world_size, child_fds)
        finally:
            for fd in child_fds:
                os.close(fd)
        for rank, (conn, out) in enumerate(zip(self.conns, self.outs)):
            self.states[rank].pid = self.pids[rank]
            self.selector.register(conn.fileno(), selectors.EVENT_READ, ("ctrl", rank))
            self.selector.register(out, selectors.EVENT_READ, ("out", rank))
        self.selector.register(self.zygote.sock, selectors.EVENT_READ, ("zygote", None))
        for conn in self.conns:
            conn.send_bytes(payload)

    def _watch(self, deadline: float) -> None:
        open_outs = set(range(self.world_size))
        while not (all(s.status == "done" for s in self.states) and not open_outs):
            left = deadline - time.perf_counter()
            if left <= 0:
                self._fail(HangError, f"the ranks did not finish within {self.timeout:g} s")
            for key, _ in self.selector.select(timeout=min(left, 1.0)):
                kind, rank = key.data
                if kind == "out":
                    if not self._read_output(rank):
                        self.selector.unregister(self.outs[rank])
                        open_outs.discard(rank)
                elif kind == "ctrl":
                    self._read_control(rank)
                else:
                    self._read_zygote()
        self._flush_partial()

    def _read_output(self, rank: int) -> bool:
        data = self.outs[rank].recv(1 << 16)
        if not data:
            return False
        text = self.partial[rank] + self.decoders[rank].decode(data)
        *lines, self.partial[rank] = text.split("\n")
        for line in lines:
            print(f"[rank {rank}] {line}", flush=True)
        return True

    def _flush_partial(self) -> None:
        for rank, rest in enumerate(self.partial):
            if rest:
                print(f"[rank {rank}] {rest}", flush=True)
                self.partial[rank] = ""

    def _read_control(self, rank: int) -> None:
        state = self.states[rank]
        try:
            message = _recv(self.conns[rank])
        except (EOFError, OSError):
            self.selector.unregister(self.conns[rank].fileno())
            if state.status not in ("done",):
                self._rank_died(rank)
            return
        kind = message[0]
        if kind == "ready":  # joined the process group; now in the student's function
            state.status = "running"
        elif kind == "enter":
            comm = message[1]
            state.comms.append(comm)
            mismatch = find_mismatch(self.states, comm)
            if mismatch:
                self._fail(HangError, "the ranks disagree about a collective: " + mismatch, hint="")
            self._check_stuck()
        elif kind == "exit":
            index, end = message[1], message[2]
            state.comms[index].end = end
        elif kind == "result":
            self.results[rank] = _load_result(message[1])
            state.status = "done"
            self._check_stuck()
        elif kind == "error":
            _, exc_type, text, tb = message
            state.status = "error"
            if any(mark in text for mark in PEER_LOST):
                self._blame_dead_peer(rank, f"{exc_type}: {text.splitlines()[0][:300]}")
            self._kill()
            self._catch_up()
            self._flush_partial()
            raise RankError(f"rank {rank} raised {exc_type}: {text}\n\n"
                            f"--- traceback on rank {rank} ---\n{tb.rstrip()}\n\n"
                            f"--- the other ranks ---\n" + self._others(rank), rank, exc_type, tb)

    def _blame_dead_peer(self, rank: int, symptom: str) -> None:
        """A rank failing because a peer's connection dropped is a symptom: if a peer died, say
        that instead. Its end-of-file and exit notice arrive within moments."""
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            for other, conn in enumerate(self.conns):
                if other != rank and self.states[other].status in ("starting", "running"):
                    try:
                        while conn.poll(0):
                            _recv(conn)
                    except (EOFError, OSError):
                        self.states[rank].status = "error"
                        self._rank_died(other, f"\nRank {rank} then failed with {symptom}")
            time.sleep(0.02)

    def _read_zygote(self) -> None:
        try:
            message, _ = _zygote.recv(self.zygote.sock, _loads)
        except OSError:
            message = None
        if message is None:
            self.selector.unregister(self.zygote.sock)
            return
        self.zygote.note(message)

    def _rank_died(self, rank: int, aftermath: str = "") -> None:
        state = self.states[rank]
        state.status = "dead"
        deadline = time.perf_counter() + 2.0  # the zygote's exit notice follows the EOF closely
        while (self.run_id, rank) not in self.zygote.exits and time.perf_counter() < deadline:
            if self.zygote.sock.fileno() < 0:
                break
            self.zygote.sock.settimeout(max(0.01, deadline - time.perf_counter()))
            try:
                message, _ = _zygote.recv(self.zygote.sock, _loads)
            except OSError:
                break
            self.zygote.note(message)
        self.zygote.sock.settimeout(None)
        state.exit_status = self.zygote.exits.get((self.run_id, rank))
        call = state.open_call()
        why = ""
        if call is not None and (call.op in SAME_SHAPE_OPS or call.op in ("send", "recv")):
            why = (f"\nIt died inside {call.describe()}. On gloo a rank aborts when the peers' "
                   f"tensors do not match this call (shape or dtype): compare the shapes each "
                   f"rank passes.")
        self._fail(RankCrashed, f"rank {rank} died: {exit_text(state.exit_status)}.{why}{aftermath}",
                   hint="")

    def _check_stuck(self) -> None:
        orphan = find_orphan_wait(self.states)
        if orphan:
            self._fail(HangError, "a rank can never finish: " + orphan)
        deadlock = find_deadlock(self.states)
        if deadlock:
            self._fail(HangError, "the ranks are deadlocked: " + deadlock)

    def _others(self, rank: int) -> str:
        return "\n".join(describe(s) for s in self.states if s.rank != rank)

    def _fail(self, error, headline: str, hint: str | None = None):
        self._kill()
        self._catch_up()
        self._flush_partial()
        lines = "\n".join("  " + describe(s) for s in self.states)
        hint = hint_for(self.states) if hint is None else hint
        raise error(f"{headline}\nEvery rank was stopped. Where each rank was:\n{lines}"
                    + (f"\n{hint}" if hint else ""))

    def _catch_up(self) -> None:
        """Read what the ranks reported before they were stopped, so the diagnosis is current."""
        for rank, conn in enumerate(self.conns):
            try:
                while conn.poll(0):
                    message = _recv(conn)
                    if message[0] == "ready" and self.states[rank].status == "starting":
                        self.states[rank].status = "running"
                    elif message[0] == "enter":
                        self.states[rank].comms.append(message[1])
                    elif message[0] == "exit":
                        self.states[rank].comms[message[1]].end = message[2]
            except (EOFError, OSError):
                pass

    def _kill(self) -> None:
        for pid in self.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _close(self) -> None:
        self.selector.close()
        for conn in self.conns:
            conn.close()  # tells finished ranks to tear down
        for out in self.outs:
            out.close()
