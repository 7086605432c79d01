"""The rank records on which Lab 1's ``bus_factor`` is checked (served by ``distlab.checks.lab01``):
a ring all-reduce's on each world size, and two other algorithms' where a table's 2(n-1)/n is
wrong. Each case has a short name too, for the line a passing check shows."""
from __future__ import annotations

import torch

from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.ranks import rank_timeout
from distlab.runtime.comms import Comm


def sends_record(n: int, sizes: list[int], peers: list[int]) -> list[Comm]:
    """Rank 0's record of float32 sends of ``sizes`` bytes to ``peers``, in a group of ``n``."""
    return [Comm(rank=0, seq=i, op="isend", group=tuple(range(n)), shapes=[[b // 4]],
                 dtype="torch.float32", bytes=b, peer=p) for i, (b, p) in enumerate(zip(sizes, peers))]


def ring_records(n: int, numel: int) -> list[Comm]:
    """Rank 0's sends in a ring all-reduce of ``numel`` float32 elements: 2(n-1) chunks to rank 1,
    chunk (0 - s) mod n in the reduce-scatter phase, (1 - s) mod n in the all-gather phase."""
    chunks = [len(c) for c in torch.tensor_split(torch.arange(numel), n)]
    order = [(-s) % n for s in range(n - 1)] + [(1 - s) % n for s in range(n - 1)]
    return sends_record(n, [4 * chunks[c] for c in order], [1 % n] * len(order))


def bus_factor_cases(world_sizes, numel: int, ring=None) -> list[tuple[str, str, list[Comm]]]:
    """(what, its short name, rank's record) on which ``bus_factor`` is checked: a ring
    all-reduce's record on each world size (the student's ``ring`` run on ranks when given and it
    runs, sending no more than its record says, else a correct ring's), then two other
    algorithms' records, where the ring's 2(n-1)/n is wrong."""
    from distlab.labs.collectives import ring_record
    nbytes = numel * 4
    cases = []
    for n in world_sizes:
        comms, short = None, f"a ring, {n} ranks"
        what = f"the record a ring all-reduce makes on {n} ranks"
        if ring is not None:
            try:
                comms = ring_record(ring, world_size=n, numel=numel, timeout=rank_timeout(), check=lambda
                                    out: assert_crossed_as_recorded(out, "ring_all_reduce"))["comms"]
                what, short = f"your ring_all_reduce's record on {n} ranks", f"your ring, {n} ranks"
            except Exception:  # noqa: BLE001  (Exercise 2 unanswered or failing: graded there)
                what += (" (your ring_all_reduce did not run, or sent outside its record, so the "
                         "check built the record of a correct one)")
        cases.append((what, short, comms if comms is not None else ring_records(n, numel)))
    n = 4
    cases.append(("the record of rank 0 of a direct all-reduce on 4 ranks (it sends its whole "
                  "tensor to each other rank)", "direct, 4 ranks",
                  sends_record(n, [nbytes] * (n - 1), [1, 2, 3])))
    cases.append(("the record of rank 1 of reduce-then-broadcast on 4 ranks (it sends its "
                  "tensor to rank 0 once)", "reduce-then-broadcast", sends_record(n, [nbytes], [0])))
    return cases
