"""What Lab 6 shows of a timeline: the lanes of every rank (``plot``), a peek into a raw trace,
and the tables of communication share and overlap."""
from __future__ import annotations

import json
import math
from typing import Callable

from distlab.labs.timelines.trace import KINDS, ROW_OF, Span, Timeline, load_trace

RANGE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868",
                 "weights": "#2A9D8F"}   # Lab 11: the weights' gradient (W) split from B
COMM_COLOURS = {"all_reduce": "#C44E52", "send": "#8172B3", "recv": "#937860",
                "send_recv": "#8172B3", "all_gather": "#DA8BC3", "reduce_scatter": "#CCB974",
                "broadcast": "#64B5CD", "barrier": "#BBBBBB"}


def plot(timeline: Timeline, *, window: tuple[float, float] | None = None, ax=None, title=None):
    """One lane per rank, three rows each: the named ranges, compute, communication; colours by
    range name and by collective. ``window`` = (start, end) seconds limits what is drawn."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lo, hi = window or (0.0, max((s.end for s in timeline.spans), default=1.0))
    n = timeline.world_size
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.9 * n))
    seen: dict[str, str] = {}
    for s in _drawn(timeline):
        if s.end < lo or s.start > hi:
            continue
        y = (n - 1 - s.rank) * 4 + (2 - ROW_OF[s.kind])
        if s.kind == "range":
            key = s.name if s.name in RANGE_COLOURS else "other range"
            colour = RANGE_COLOURS.get(s.name, "#CFCFCF")
        elif s.kind == "compute":
            colour, key = "#8C8C8C", "compute"
        else:
            colour, key = COMM_COLOURS.get(s.op, "#C44E52"), s.op or "comm"
        seen.setdefault(key, colour)
        ax.broken_barh([((s.start - lo) * 1e3, max(s.duration * 1e3, 1e-3))], (y + 0.1, 0.8),
                       facecolors=colour, edgecolor="none")
    for r in range(n):  # step boundaries as thin lines
        for a, b in timeline.steps(r):
            if lo <= a <= hi:
                ax.axvline((a - lo) * 1e3, color="black", lw=0.4, alpha=0.3)
    ticks = [(n - 1 - r) * 4 + 2 - ROW_OF[k] + 0.5 for r in range(n) for k in KINDS]
    ax.set_yticks(ticks, [f"rank {r} {k}" for r in range(n) for k in KINDS], fontsize=8)
    ax.set_xlim(0, (hi - lo) * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_title(title if title is not None else (timeline.label or timeline.source))
    ax.legend(handles=[Patch(color=c, label=k) for k, c in seen.items()], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def _drawn(timeline: Timeline) -> list[Span]:
    """What the lanes show: compute and comm spans, and the outermost ranges other than "step"
    (nested ones, like PyTorch's own "Optimizer.step#SGD.step", would hide their parents)."""
    out = [s for s in timeline.spans if s.kind in ("compute", "comm")]
    for r in range(timeline.world_size):
        end = -math.inf
        for s in timeline.of(r, "range"):
            if s.name != "step" and s.start >= end:
                out.append(s)
                end = s.end
    return out


# ---------------------------------------------------------------------------------------------
# Tables of the lab's measures (the measures are the student's functions, passed in)

def share_table(timeline: Timeline, comm_share: Callable, exposed_comm: Callable) -> list[dict]:
    """Per rank and step: step length, communication share and exposed communication, printed."""
    rows = []
    print(f"{timeline.label or timeline.source}\n{'rank':>4} {'step':>4} {'step ms':>8} "
          f"{'comm share':>11} {'exposed ms':>11}")
    for r in range(timeline.world_size):
        for i, window in enumerate(timeline.steps(r)):
            row = {"rank": r, "step": i, "ms": (window[1] - window[0]) * 1e3,
                   "share": comm_share(timeline, r, window),
                   "exposed_ms": exposed_comm(timeline, r, window) * 1e3}
            rows.append(row)
            print(f"{r:>4} {i:>4} {row['ms']:>8.1f} {row['share']:>11.1%} {row['exposed_ms']:>11.2f}")
    return rows


def peek(trace, names=("gloo:all_reduce", "c10d::allreduce_", "forward", "aten::addmm")) -> None:
    """Print the first raw event of each name in a Kineto trace, as the trace stores it."""
    events = load_trace(trace)["traceEvents"]
    print(f"{len(events)} events; keys of the trace: {sorted(load_trace(trace))}")
    for name in names:
        found = next((e for e in events if e.get("name") == name), None)
        if found is not None:
            print(json.dumps(found, indent=None)[:600])


def overlap_table(timelines: dict, overlap_fraction: Callable) -> dict:
    """``overlap_fraction(timeline, rank)`` for every rank of each named timeline, printed."""
    print(f"{'run':<16}" + "".join(f"{'rank ' + str(r):>9}" for r in range(max(
        t.world_size for t in timelines.values()))))
    out = {}
    for name, tl in timelines.items():
        out[name] = [overlap_fraction(tl, r) for r in range(tl.world_size)]
        print(f"{name:<16}" + "".join(f"{v:>9.1%}" for v in out[name]))
    return out
