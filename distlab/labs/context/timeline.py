"""A profiler timeline of one ring-attention forward on every rank (Lab 6's view): the K/V
transfers to the neighbours (gloo's send and recv, in the communication row) under the block
computations (the compute row), inside a named range "ring forward".

On gloo an isend/irecv runs on gloo's own threads: its span lasts from the call until the message
is through, while the rank's main thread goes on computing the current block. A ring whose
transfer hides under its compute shows each step's send/recv spans ending before that step's
matrix products do; where they stick out, the rank waits (Liu et al. §3: a block of s/p tokens
must be large enough for its compute, ~(s/p)², to cover its transfer, ~s/p).
"""
from __future__ import annotations

import torch

import dataclasses

from distlab.labs.context.traffic import qkv_chunk
from distlab.labs.tables import format_table
from distlab.labs.timelines.trace import Span, load_trace

TIMELINE = dict(world_size=4, seq_len=2048, batch=1, heads=4, head_dim=32)   # s/p = 512
TRANSFERS = ("send", "recv", "isend", "irecv", "send_recv")


def ring_step(rank: int, world_size: int, ring_attention, seq_len: int, batch: int, heads: int,
              head_dim: int):
    """Build this rank's chunk; return ``step()``: one forward of ``ring_attention`` on it."""
    import os
    from torch.profiler import record_function
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")    # the profiler's own log is not the lesson
    q, k, v = qkv_chunk(rank, world_size, seq_len, batch, heads, head_dim)

    def step():
        with record_function("ring forward"), torch.no_grad():
            ring_attention(q, k, v)
    return step


def profile_ring(ring_attention, world_size: int = TIMELINE["world_size"],
                 seq_len: int = TIMELINE["seq_len"], batch: int = TIMELINE["batch"],
                 heads: int = TIMELINE["heads"], head_dim: int = TIMELINE["head_dim"],
                 show: bool = True):
    """Profile one forward of ``ring_attention`` (yours) on every rank after one unrecorded
    warm-up, draw the lanes (Lab 6's ``plot``) and print ``transfer_table``; returns the
    Profile (None while ``ring_attention`` is a stub: a timeline of another function would not
    be yours to read)."""
    import distlab
    from distlab.labs.timelines.profiling import profile_ranks
    try:
        prof = profile_ranks(ring_step, world_size, ring_attention, seq_len, batch, heads,
                             head_dim, steps=1, warmup=1, backend="gloo",
                             label=f"one ring-attention forward, {world_size} ranks, s = {seq_len}")
    except distlab.RankError as err:
        if err.exc_type != "NotImplementedError":
            raise
        print("ring_attention is not written yet (Exercise 2): no timeline to draw.")
        return None
    prof = dataclasses.replace(prof, timeline=with_compute_under_transfers(prof))
    if show:
        import matplotlib.pyplot as plt
        from distlab.labs.timelines.views import plot
        _, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * world_size))
        plot(prof.timeline, ax=ax)
        plt.show()
        print(format_table(transfer_table(prof.timeline)))
    return prof


def with_compute_under_transfers(prof):
    """The profile's timeline with each rank's compute read again: gloo stamps an isend/irecv
    on the calling thread from the call until the message is through, so Lab 6's reader counts
    the operators the thread runs meanwhile as inside the transfer and leaves them out of the
    compute row. Here they are the point: the outermost operators of every thread (not c10d's),
    inside "ring forward", are the compute."""
    spans = [s for s in prof.timeline.spans if s.kind != "compute"]
    for rank, trace in enumerate(prof.traces):
        forward = prof.timeline.of(rank, "range", "ring forward")
        events = [e for e in load_trace(trace)["traceEvents"] if e.get("ph") == "X" and "ts" in e]
        mark = [e for e in events if e.get("name") == "ring forward"]
        if not forward or not mark:
            continue
        shift = forward[0].start - mark[0]["ts"] * 1e-6       # the trace's clock -> the timeline's
        ops = sorted((e for e in events if e.get("cat") == "cpu_op"
                      and not e["name"].startswith("c10d::")), key=lambda e: (e["ts"], -e["dur"]))
        ends: dict = {}                                          # thread -> end of its open op
        for e in ops:
            start, end = e["ts"] * 1e-6 + shift, (e["ts"] + e["dur"]) * 1e-6 + shift
            if start >= ends.get(e.get("tid"), float("-inf")) and \
                    forward[0].start <= start and end <= forward[0].end:
                spans.append(Span(rank, "compute", e["name"], start, end))
                ends[e.get("tid")] = end
    return dataclasses.replace(prof.timeline, spans=spans)


def transfer_table(timeline) -> list[dict]:
    """Per rank: the point-to-point spans (count, bytes, ms), the compute inside "ring forward"
    (ms), and the forward's length (ms)."""
    rows = []
    for r in range(timeline.world_size):
        forward = timeline.of(r, "range", "ring forward")
        lo, hi = (forward[0].start, forward[0].end) if forward else (0.0, float("inf"))
        moves = [s for s in timeline.of(r, "comm") if s.op in TRANSFERS]
        compute = [s for s in timeline.of(r, "compute") if lo <= s.start and s.end <= hi]
        rows.append({"rank": r, "transfers": len(moves),
                     "bytes": f"{sum(s.bytes for s in moves):,}",
                     "transfer ms": round(sum(s.duration for s in moves) * 1e3, 2),
                     "compute ms": round(sum(s.duration for s in compute) * 1e3, 2),
                     "forward ms": round((hi - lo) * 1e3, 2) if forward else None})
    return rows
