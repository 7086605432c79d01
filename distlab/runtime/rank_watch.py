"""Watching one ``distlab.run``: fork the ranks from the zygote, hand them the task, relay their
output (``[rank r]`` lines), and follow their reports until every rank returned, or stop them all
the moment one raised, died, hung or disagreed with the others about a collective, with a
diagnosis of where each rank was (``distlab.runtime.diagnosis``)."""
from __future__ import annotations

import codecs
import os
import selectors
import signal
import socket
import time
from multiprocessing.connection import Connection

from distlab.runtime import wire
from distlab.runtime import zygote as _zygote
from distlab.runtime.comms import SAME_SHAPE_OPS
from distlab.runtime.diagnosis import (RankState, describe, exit_text, find_deadlock, find_mismatch,
                                       find_orphan_wait, hint_for)
from distlab.runtime.outcome import HangError, RankCrashed, RankError, Results
from distlab.runtime.stuck import Budget, Joining, stuck_after
from distlab.runtime.zygote_client import ZygoteHandle

# What a rank's error says when a peer's connection dropped under it (gloo, NCCL).
PEER_LOST = ("Connection reset", "Connection closed", "Broken pipe", "Socket closed",
             "connection closed", "Connection refused", "NCCL communicator was aborted")


class RankWatch:
    """One run: fork the ranks, feed them the task, watch them until all return or one fails.

    ``loads`` reads the ranks' messages and ``load_result`` their results: pickle for a launcher
    that trusts its ranks, ``distlab.runtime.safe_pickle`` for one that runs a student's code."""

    def __init__(self, zygote: ZygoteHandle, run_id: int, world_size: int, backend: str,
                 timeout: float, loads, load_result, store: str = "its rendezvous store",
                 killer=None):
        self.store = store
        self.killer = killer     # distlab.runtime.kill.Killer: a rank to kill from outside
        self.zygote, self.world_size, self.backend, self.timeout = zygote, world_size, backend, timeout
        self.run_id, self.loads, self.load_result = run_id, loads, load_result
        self.states = [RankState(rank) for rank in range(world_size)]
        self.results: list = [None] * world_size
        self.partial = [""] * world_size
        # Incremental decoders: a UTF-8 character may be split between two reads.
        self.decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(world_size)]
        self.selector = selectors.DefaultSelector()
        self.conns: list[Connection] = []
        self.outs: list[socket.socket] = []
        self.pids: list[int] = []

    def _recv(self, conn: Connection):
        return self.loads(conn.recv_bytes())

    def go(self, payloads: list[bytes]) -> Results:
        """``payloads[r]``: rank r's pickled task (each rank gets its own inputs only)."""
        start = time.perf_counter()
        try:
            self._start(payloads)
            self._watch(start + self.timeout)
            # Every rank has returned and waits for the close: their sockets are still open.
            wire_ranks = self.zygote.count_wire(self.run_id, self.pids)
        except BaseException:
            self._kill()
            raise
        finally:
            self._close()
        out = Results(self.results)
        out.comms = [state.comms for state in self.states]
        out.backend, out.seconds = self.backend, time.perf_counter() - start
        out.wire = wire.RunWire(ranks=wire_ranks, total=None)
        return out

    def _start(self, payloads: list[bytes]) -> None:
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
        for conn, payload in zip(self.conns, payloads):
            conn.send_bytes(payload)

    def _watch(self, deadline: float) -> None:
        open_outs = set(range(self.world_size))
        # A busy machine slows ranks down without them being stuck: past the deadline, ranks
        # that still compute get more time, until one of them has used ``timeout`` seconds of
        # CPU time (an endless loop) or the wall clock passes SLACK x the deadline.
        # Under the grader (DISTLAB_STUCK_AFTER), ranks that are stuck are stopped sooner.
        budget = Budget(self.timeout, deadline, cpu_in_calls=self.backend == "gloo",
                        stuck_after=stuck_after())
        joining = Joining(deadline - self.timeout, self.store)
        while not (all(s.status == "done" for s in self.states) and not open_outs):
            now = time.perf_counter()
            stuck = joining.check(self.states, now)
            if stuck is not None:
                self._fail(HangError, stuck)
            if now >= budget.probe_at:
                # A watcher the busy machine kept waiting has reports to read first: judged on
                # old ones, ranks that have moved on look as if they still waited.
                self._serve(open_outs, timeout=0.0, rounds=100)
                if all(s.status == "done" for s in self.states) and not open_outs:
                    break
                verdict = budget.probe(self.states, time.perf_counter())
                if verdict is not None:
                    self._fail(HangError, f"{budget.headline(time.perf_counter())}: {verdict}")
            left = budget.probe_at - time.perf_counter()
            self._serve(open_outs, timeout=min(max(left, 0.0), 1.0))
        self._flush_partial()

    def _serve(self, open_outs: set, timeout: float, rounds: int = 1) -> None:
        """Read what is ready (waiting up to ``timeout`` for something), for up to ``rounds``
        rounds or until nothing more is."""
        for _ in range(rounds):
            ready = self.selector.select(timeout=timeout)
            for key, _ in ready:
                kind, rank = key.data
                if kind == "out":
                    if not self._read_output(rank):
                        self.selector.unregister(self.outs[rank])
                        open_outs.discard(rank)
                elif kind == "ctrl":
                    self._read_control(rank)
                else:
                    self._read_zygote()
            if not ready:
                return

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
            message = self._recv(self.conns[rank])
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
            if self.killer is not None:
                self.killer.note(rank, comm, self.pids[rank])
            mismatch = find_mismatch(self.states, comm)
            if mismatch:
                self._fail(HangError, "the ranks disagree about a collective: " + mismatch, hint="")
            self._check_stuck()
        elif kind == "exit":
            index, end = message[1], message[2]
            if 0 <= index < len(state.comms):   # a report out of order is dropped, not a crash
                state.comms[index].end = end
        elif kind == "result":
            self.results[rank] = self.load_result(message[1])
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
                            self._recv(conn)
                    except (EOFError, OSError):
                        self.states[rank].status = "error"
                        self._rank_died(other, f"\nRank {rank} then failed with {symptom}")
            time.sleep(0.02)

    def _read_zygote(self) -> None:
        try:
            message, _ = _zygote.recv(self.zygote.sock, self.loads)
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
                message, _ = _zygote.recv(self.zygote.sock, self.loads)
            except OSError:
                break
            self.zygote.note(message)
        self.zygote.sock.settimeout(None)
        state.exit_status = self.zygote.exits.get((self.run_id, rank))
        call = state.open_call()
        why = ""
        if self.killer is not None and self.killer.aftermath(rank):
            aftermath = self.killer.aftermath(rank) + aftermath   # killed: not a mismatch
        elif call is not None and (call.op in SAME_SHAPE_OPS or call.op in ("send", "recv")):
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
                    message = self._recv(conn)
                    if message[0] == "ready" and self.states[rank].status == "starting":
                        self.states[rank].status = "running"
                    elif message[0] == "enter":
                        self.states[rank].comms.append(message[1])
                    elif message[0] == "exit" and 0 <= message[1] < len(self.states[rank].comms):
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
