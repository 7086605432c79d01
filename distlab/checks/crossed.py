"""The bytes that crossed against the record: what a rank's collective record (kept inside the
rank, so skippable) must account for of what the kernel counted leaving it (``out.wire``,
``distlab.runtime.wire``, counted outside the rank).

A check on *how* a student communicated reads ``out.comms``. A rank can move data without a
record (a ``ProcessGroup``'s own ``allreduce``, functional collectives, a group it makes and
destroys, the rendezvous store's set and get) and then add a few messages that look right. Its
bytes still cross the network or grow the store (a file), so a check that grades the record
calls ``assert_crossed_as_recorded(out)`` first: every rank's counted bytes must be within what
its record's calls can have sent. The student can inflate the
count (send more than needed) but cannot hide from it.

The bound per recorded call is the collective's bytes on the wire for gloo's algorithms (a
ring's 2(n-1)/n for all-reduce, and for reduce-scatter, which gloo computes as an all-reduce of
the whole buffer; (n-1)/n for all-gather; the whole buffer otherwise), plus gloo's headers,
measured on this course's runs (``bench/wire_overhead.py`` prints them): 104 B per send on the
sender and 48 B per receive; 584 B x (n-1) per rank for an n-rank all-reduce or reduce-scatter
(1,752 B at 4 ranks, 4,088 B at 8), and for the list form ``dist.reduce_scatter`` a further
578 B x n(n-1).
"""
from __future__ import annotations

from distlab.checks.assertions import CheckFailed, verified
from distlab.runtime.wire import MAX_SEGMENT

P2P_SENDS = {"send", "isend"}
P2P_RECEIVES = {"recv", "irecv"}
P2P_HEADER = 160            # bytes of gloo's framing per message, sender and receiver together
COLLECTIVE_HEADER = 2048    # bytes of gloo's framing per collective call, per rank, at least
HEADER_PER_PEER = 640       # ... and per other rank of the group (584 B measured)
REDUCE_SCATTER_LIST = 640   # dist.reduce_scatter's own framing, per ordered pair of ranks (578 B)
RUN_SLACK = 512             # what joining the group sends (at most 24 B measured), with room
# What a run writes into its rendezvous store (a file: out.wire.store), per rank: joining the
# default group (208-256 B measured at 2-8 ranks) and each further group (193-241 B).
STORE_JOIN, STORE_PER_GROUP = 288, 256


def _wire_factor(op: str, n: int) -> float:
    """Bytes on the wire per byte of the record's ``bytes`` for one rank, at most, on gloo."""
    if n <= 1:
        return 0.0
    if op == "all_reduce" or op.startswith("reduce_scatter"):   # gloo: reduce-scatter = all-reduce
        return 2 * (n - 1) / n
    if op.startswith("all_gather"):
        return (n - 1) / n
    if op.startswith("all_to_all"):
        return 1.0
    return float(n - 1)      # broadcast, reduce, gather, scatter: the root may send n-1 copies


def header_allowance(op: str, n: int) -> int:
    """Bytes of gloo's framing one rank may send for one collective call on ``n`` ranks."""
    extra = REDUCE_SCATTER_LIST * n * (n - 1) if op == "reduce_scatter" else 0
    return max(COLLECTIVE_HEADER, HEADER_PER_PEER * (n - 1)) + extra


def recorded_bound(comms, world_size: int) -> int:
    """The most bytes a rank whose record is ``comms`` can have sent over the network."""
    bound = RUN_SLACK
    for c in comms:
        if c.op in P2P_SENDS:
            bound += c.bytes + P2P_HEADER
        elif c.op in P2P_RECEIVES:
            bound += P2P_HEADER
        else:
            n = len(c.group) if c.group else world_size
            bound += _wire_factor(c.op, n) * c.bytes + header_allowance(c.op, n)
    return int(bound)


def assert_crossed_as_recorded(out, what: str = "your function") -> None:
    """Fail unless every rank's bytes counted by the kernel (``out.wire``) are within what its
    collective record can have sent. Where the kernel's counters cannot be read (not Linux, under
    torchrun) nothing is asserted: the record alone is then graded. Nor under NCCL, whose data
    leaves by the GPUs' own links and whose TCP bytes (its bootstrap) the bounds here, gloo's,
    do not describe: a grader that runs ``--backend both`` checks the gloo run."""
    wire = getattr(out, "wire", None)
    if wire is None or wire.ranks is None or getattr(out, "backend", "gloo") != "gloo":
        return
    world_size = len(out)
    bounds = [recorded_bound(out.comms[r], world_size) for r in range(world_size)]
    for rank, (counted, bound) in enumerate(zip(wire.ranks, bounds)):
        if counted.sent > bound:
            raise CheckFailed(_message(what, f"rank {rank}", counted.sent, bound))
    # On the ranks' own network every byte is counted, also on sockets closed before the end.
    # A segment the kernel sent again (a busy machine: mostly tail-loss probes) is counted
    # again; it repeats at most one segment of one recorded transfer.
    together = sum(bounds) + getattr(wire, "retransmitted", 0) * largest_segment(out.comms)
    if wire.total is not None and wire.total > together:
        raise CheckFailed(_message(what, "the ranks together", wire.total, together))
    if wire.store is not None and wire.store > store_bound(out.comms, world_size):
        raise CheckFailed(
            f"{what}: the ranks wrote {wire.store:,} bytes into their rendezvous store, more than "
            f"joining their groups takes (at most {store_bound(out.comms, world_size):,}): the "
            f"store is not a channel for the exercise's data. Communicate only as the exercise "
            f"says.")
    busiest = max(range(world_size), key=lambda r: wire.ranks[r].sent / max(bounds[r], 1))
    verified(f"bytes on the wire: rank {busiest} sent {wire.ranks[busiest].sent:,}, within the "
             f"{bounds[busiest]:,} its recorded collectives can send")


def largest_segment(comms) -> int:
    """The most one retransmitted TCP segment of an honest run can repeat: the largest recorded
    transfer (gloo sends a call's data in messages no larger) with its framing, at most a
    loopback segment. Allowing ``MAX_SEGMENT`` for each instead let one or two retransmissions
    on a busy machine hide a small exchange made outside the record."""
    largest = max((c.bytes for rank in comms for c in rank), default=0)
    return min(MAX_SEGMENT, largest + COLLECTIVE_HEADER)


def store_bound(comms, world_size: int) -> int:
    """The most a run's store grows by joining the default group and every group its record
    uses (each distinct group counted once more, for a check that made it for the student)."""
    groups = {c.group for rank in comms for c in rank if c.group}
    return world_size * (STORE_JOIN + STORE_PER_GROUP * len(groups))


def _message(what: str, who: str, counted: int, bound: int) -> str:
    return (f"{what}: {who} sent {counted:,} bytes over the network, but the collective record "
            f"accounts for at most {bound:,}: {counted - bound:,} bytes crossed outside it. Only "
            f"torch.distributed's functions (dist.send, dist.isend, dist.all_reduce, ...) are "
            f"recorded; a ProcessGroup's own methods, functional collectives or a group made and "
            f"destroyed inside the function are not. Communicate only as the exercise says.")
