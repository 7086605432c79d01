"""The hang diagnosis reads each rank's record through an index (``RankState.indexed``) that it
brings up to date as calls arrive: it must answer what a scan of the whole record answers, at
every point of a launch (calls entered, returned, appended after a query)."""
from __future__ import annotations

import random

from distlab.runtime.comms import POINT_TO_POINT, Comm
from distlab.runtime.diagnosis import RankState, _key

OPS = ("send", "recv", "isend", "irecv", "all_reduce", "barrier", "all_gather")


def scanned_open_call(state: RankState):
    return next((c for c in reversed(state.comms) if c.end is None and not c.async_op), None)


def scanned_count(state: RankState, key) -> int:
    return sum(1 for c in state.comms if _key(c) == key)


def scanned_twin(state: RankState, key, seq):
    return next((c for c in state.comms if _key(c) == key and c.seq == seq), None)


def random_call(rank: int, rng: random.Random, seqs: dict) -> Comm:
    op = rng.choice(OPS)
    peer = rng.choice([0, 2]) if op in POINT_TO_POINT else None
    group = (0, 1, 2) if rng.random() < 0.5 else (1, 2)
    comm = Comm(rank, 0, op, group, [(4,)], "float32", 16, peer=peer,
                async_op=op.startswith("i") or rng.random() < 0.1)
    key = _key(comm)
    seqs[key] = seqs.get(key, 0) + 1
    comm.seq = seqs[key]
    return comm


def test_the_index_answers_what_a_scan_answers_throughout_a_launch():
    rng = random.Random(0)
    state, seqs = RankState(1, status="running"), {}
    keys = [("send", 0), ("recv", 2), ("collective", (0, 1, 2), ""), ("collective", (1, 2), "")]
    for _ in range(600):
        if rng.random() < 0.6:
            state.comms.append(random_call(1, rng, seqs))     # as the launcher appends them
        open_ones = [c for c in state.comms if c.end is None]
        if open_ones and rng.random() < 0.5:
            rng.choice(open_ones).end = 1.0                   # returned, in any order
        assert state.open_call() is scanned_open_call(state)
        for key in keys:
            assert state.count(key) == scanned_count(state, key)
            seq = rng.randint(1, 5)
            assert state.twin(key, seq) is scanned_twin(state, key, seq)
    assert len(state.comms) > 300 and any(c.end is None for c in state.comms)


def test_a_replaced_record_is_indexed_afresh():
    state = RankState(0)
    state.comms.append(Comm(0, 1, "all_reduce", (0, 1), [(2,)], "float32", 8))
    assert state.count(("collective", (0, 1), "")) == 1 and state.open_call() is state.comms[0]
    state.comms = [Comm(0, 1, "send", (0, 1), [(2,)], "float32", 8, peer=1, end=2.0)]
    assert state.count(("collective", (0, 1), "")) == 0 and state.count(("send", 1)) == 1
    assert state.open_call() is None
