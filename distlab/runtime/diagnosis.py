"""Where each rank is, and why they cannot all finish: the text of hang and crash errors.

The launcher keeps, per rank, the stream of collectives the rank entered and left
(``distlab.runtime.comms``). From it this module finds (1) ranks that disagree about a collective at the
same position of the same group, at once, without waiting for a timeout, (2) ranks waiting on a
rank that has already returned, and (3) when the time is up, what every rank was doing.
"""
from __future__ import annotations

import dataclasses
import math
import signal

from distlab.runtime.comms import POINT_TO_POINT, SAME_SHAPE_OPS, Comm

# Ops that are the same collective under two names (list and tensor flavours).
FAMILY = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
          "all_to_all_single": "all_to_all", "monitored_barrier": "barrier"}


@dataclasses.dataclass
class RankState:
    rank: int
    pid: int | None = None
    comms: list = dataclasses.field(default_factory=list)
    status: str = "starting"  # starting | running | done | error | dead
    exit_status: int | None = None
    _index: "_Index | None" = dataclasses.field(default=None, init=False, repr=False,
                                                 compare=False)

    def indexed(self) -> "_Index":
        """The index of ``comms``, brought up to date: every call a rank enters asks it, and a
        launch records thousands of calls (a sweep), so scanning the list each time was
        quadratic, seconds of the launcher's CPU time."""
        if self._index is None or self._index.comms is not self.comms \
                or self._index.seen > len(self.comms):
            self._index = _Index(self.comms)
        return self._index.update()

    def open_call(self) -> Comm | None:
        """The blocking call this rank is inside, if any (an async op only counts once waited on)."""
        return self.indexed().open_call()

    def count(self, key) -> int:
        return self.indexed().counts.get(key, 0)

    def twin(self, key, seq: int) -> Comm | None:
        """The first call of ``key`` (``_key``) numbered ``seq``."""
        return self.indexed().first.get((key, seq))


class _Index:
    """One rank's record (``comms``, which only grows; a call's ``end`` is set once) indexed:
    calls per key, the first call per (key, seq), and the blocking calls that were open when
    indexed, the only ones that can be open now."""

    def __init__(self, comms: list):
        self.comms, self.seen = comms, 0
        self.counts: dict = {}
        self.first: dict = {}
        self.open: list[int] = []
        self.threaded = False      # a call made off the main thread (an async save's writer)

    def update(self) -> "_Index":
        for i in range(self.seen, len(self.comms)):
            comm = self.comms[i]
            key = _key(comm)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.first.setdefault((key, comm.seq), comm)
            if comm.end is None and not comm.async_op:
                self.open.append(i)
            self.threaded = self.threaded or comm.threaded
        self.seen = len(self.comms)
        return self

    def open_call(self) -> Comm | None:
        while self.open and self.comms[self.open[-1]].end is not None:
            self.open.pop()              # returned: the latest open one is before it
        return self.comms[self.open[-1]] if self.open else None


def _key(comm: Comm) -> tuple:
    if comm.op in POINT_TO_POINT:
        return (comm.op.lstrip("i"), comm.peer)
    return ("collective", comm.group, comm.group_name)


def _signature(comm: Comm) -> tuple:
    shapes = tuple(comm.shapes) if comm.op in SAME_SHAPE_OPS else ()
    return FAMILY.get(comm.op, comm.op), shapes, comm.dtype if comm.op in SAME_SHAPE_OPS else ""


def _short(comm: Comm) -> str:
    shapes = ", ".join(str(list(s)) for s in comm.shapes)
    return f"{comm.op} #{comm.seq}" + (f" on {shapes}" if shapes else "")


def find_mismatch(states: list[RankState], new: Comm) -> str | None:
    """Compare the call a rank just entered with its counterparts on the other ranks."""
    if new.op in POINT_TO_POINT:
        return _p2p_mismatch(states, new)
    for other in states:
        if other.rank == new.rank or other.rank not in new.group:
            continue
        twin = other.twin(_key(new), new.seq)
        if twin is not None and _signature(twin) != _signature(new):
            first, second = sorted([new, twin], key=lambda c: c.rank)
            return (f"rank {first.rank} is in {_short(first)} {first.dtype}, rank {second.rank} in "
                    f"{_short(second)} {second.dtype}. Every rank of a group must call the same "
                    f"collectives in the same order, with the same shapes and dtypes.")
    return None


def _wire(comm: Comm) -> tuple:
    """What a send or receive moves: its elements and dtype. The transport matches bytes, not
    shapes, so a 0-d tensor received into shape [1] is a correct message (torch 2.11's own
    pipelining sends one so); a different count or dtype is not."""
    return sum(math.prod(s) for s in comm.shapes), comm.dtype


def _p2p_mismatch(states: list[RankState], new: Comm) -> str | None:
    if new.peer is None or not 0 <= new.peer < len(states):
        return None
    want = "recv" if new.op.lstrip("i") == "send" else "send"
    twin = states[new.peer].twin((want, new.rank), new.seq)
    if twin is not None and _wire(twin) != _wire(new):
        sender, receiver = (new, twin) if want == "recv" else (twin, new)
        return (f"rank {sender.rank} sends {list(sender.shapes[0]) if sender.shapes else []} "
                f"{sender.dtype} ({_short(sender)}) but rank {receiver.rank} receives into "
                f"{list(receiver.shapes[0]) if receiver.shapes else []} {receiver.dtype} "
                f"({_short(receiver)}). A receive buffer must hold exactly the message's "
                f"elements, of its dtype.")
    return None


def find_orphan_wait(states: list[RankState]) -> str | None:
    """A rank blocked on a peer that already returned, and so will never join: a certain hang."""
    for state in states:
        call = state.open_call() if state.status == "running" else None
        if call is None:
            continue
        peers = [call.peer] if call.op in POINT_TO_POINT else list(call.group)
        for peer in peers:
            if peer is None or peer == state.rank or states[peer].status != "done":
                continue
            if call.op in POINT_TO_POINT:
                want = ("recv" if call.op.lstrip("i") == "send" else "send", state.rank)
                if call.op.lstrip("i") == "send" or states[peer].count(want) >= call.seq:
                    continue  # a blocking send may still drain; a matching send already happened
            elif states[peer].count(_key(call)) >= call.seq:
                continue
            return (f"rank {state.rank} waits in {call.describe()}, but rank "
                    f"{peer} has already returned from your function without "
                    f"{'sending it' if call.op in POINT_TO_POINT else 'calling it'}.")
    return None


# Collectives in which every member needs every other member's contribution before it returns.
ALL_WAIT = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"}


def _waits_on(states: list[RankState], state: RankState) -> set[int] | None:
    """The ranks this blocked rank still needs something from, or None if it may yet progress
    (not blocked, blocked in a send that the backend may buffer, or in a rooted collective)."""
    call = state.open_call() if state.status == "running" else None
    if call is None or state.indexed().threaded:   # another thread may go on
        return None
    if call.op == "recv":
        peer = states[call.peer] if call.peer is not None and call.peer < len(states) else None
        if peer is None or peer.count(("send", state.rank)) >= call.seq:
            return None
        return {call.peer}
    if FAMILY.get(call.op, call.op) in ALL_WAIT:
        missing = {r for r in call.group if r != state.rank and states[r].count(_key(call)) < call.seq}
        return missing or None
    return None


def find_deadlock(states: list[RankState]) -> str | None:
    """Ranks blocked waiting on each other in a cycle can never move: say so at once.

    Each rank's events arrive in order, so what the launcher sees of a rank is a prefix of what it
    did. A rank blocked in a recv (or an all-member collective) whose counterpart the peer has not
    issued, where that peer is itself blocked the same way, is stuck for good.
    """
    waits = {s.rank: _waits_on(states, s) for s in states}
    stuck = {r for r, w in waits.items() if w is not None}
    changed = True
    while changed:  # keep only ranks all of whose awaited peers are stuck too
        changed = False
        for r in list(stuck):
            if not waits[r] <= stuck:
                stuck.discard(r)
                changed = True
    if not stuck:
        return None
    lines = [f"rank {r} waits in {states[r].open_call().describe()} for rank(s) "
             f"{', '.join(map(str, sorted(waits[r])))}" for r in sorted(stuck)]
    return "; ".join(lines) + ". Each waits for the other, so none can go on (a deadlock)."


def describe(state: RankState) -> str:
    """One line per rank: what it was doing when everything stopped."""
    if state.status == "done":
        return f"rank {state.rank}: returned its result"
    if state.status == "starting":
        return f"rank {state.rank}: still joining the process group (your function had not started)"
    if state.status == "dead":
        return f"rank {state.rank}: {exit_text(state.exit_status)}" + _last(state)
    if not state.comms:
        return f"rank {state.rank}: running your function, no collective called yet"
    return f"rank {state.rank}: " + _last(state).removeprefix("; ")


def _last(state: RankState) -> str:
    call = state.open_call()
    if call is not None:
        return f"; in {call.describe()}, entered and never returned"
    pending = [c for c in state.comms if c.async_op and c.end is None]
    if pending:
        return f"; {len(pending)} async op(s) not waited on or not completed, first {pending[0].describe()}"
    last = state.comms[-1] if state.comms else None
    return f"; last call {last.describe()} returned" if last else ""


def exit_text(status: int | None) -> str:
    import os
    if status is None:
        return "its process ended"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"its process was killed by {name}"
    return f"its process exited with code {os.WEXITSTATUS(status)}"


def hint_for(states: list[RankState]) -> str:
    blocked = [s.open_call() for s in states if s.status == "running" and s.open_call()]
    if blocked and all(c.op.lstrip("i") == "recv" for c in blocked):
        return ("Every waiting rank is receiving and none is sending: order the point-to-point "
                "calls so each recv has a send on its peer (e.g. even ranks send first), or use "
                "isend/irecv and wait on both.")
    if any(s.status == "running" and not s.comms for s in states):
        return "A rank that never reaches a collective is busy in your own code (an endless loop?)."
    return ("Check that every rank calls the same collectives in the same order, and that "
            "nothing waits for a message that is never sent.")
