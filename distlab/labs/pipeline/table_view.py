"""A schedule table on paper, as Lab 11 shows it: replayed with unit times (a stage of ``v`` per
rank takes ``1/v`` of a rank's forward, backward or weights' gradient), its figures in one line
and its timeline as a chart (one lane per rank; F light, B dark, W grey; each bar its microbatch,
with the stage where a rank holds several)."""
from __future__ import annotations

from distlab.labs.pipeline.compare import messages
from distlab.labs.pipeline.schedules import Replay, replay
from distlab.labs.pipeline.validity import table_problem

COLORS = {"F": "#8ecae6", "B": "#1d5f8a", "W": "#9a9a9a"}


def replay_table(table, placement: list[int], num_microbatches: int, name: str = "table") -> Replay:
    """``replay`` of a table checked first (``validity.table_problem``): a ValueError says what
    is wrong, on which rank, and what to do. The W of a table that has none is not required."""
    ops = "FBW" if any(a[0] == "W" for row in table for a in row if isinstance(a, tuple)) else "FB"
    problem = table_problem(table, placement, num_microbatches, ops)
    if problem:
        raise ValueError(f"{name}: {problem}")
    v = len(placement) // (max(placement) + 1)
    return replay(table, t_fwd=1 / v, t_bwd=1 / v, t_wgt=1 / v, placement=placement, name=name)


def table_summary(table, placement: list[int], num_microbatches: int, name: str = "table") -> str:
    """One line: the bubble (idle over compute), the peak activations per rank (in
    stage-microbatches) and the messages one step sends."""
    r = replay_table(table, placement, num_microbatches, name)
    peaks = "/".join(str(r.peak[k]) for k in sorted(r.peak))
    return (f"{name}: bubble {r.bubble:.4f} of the compute, step {r.span:g} (a rank's forward = "
            f"1), peak activations per rank {peaks} stage-microbatches, "
            f"{messages(table, placement)} messages per step")


def plot_table(table, placement: list[int], num_microbatches: int, *, title: str = "", ax=None):
    """The replayed timeline of ``table``: one lane per rank, rank 0 on top."""
    import matplotlib.pyplot as plt
    r = replay_table(table, placement, num_microbatches, title or "table")
    p = len(table)
    several = len(placement) > p
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.6 + 0.45 * p))
    for e in r:
        ax.barh(e.rank, e.end - e.start, left=e.start, height=0.8, color=COLORS[e.kind],
                edgecolor="white", linewidth=0.5)
        label = f"{e.mb}" + (f"/{e.stage}" if several else "")
        ax.text((e.start + e.end) / 2, e.rank, label, ha="center", va="center", fontsize=6,
                color="black" if e.kind == "F" else "white", clip_on=True)
    ax.set_yticks(range(p), [f"rank {k}" for k in range(p)])
    ax.invert_yaxis()
    ax.set_xlabel("time (a rank's forward = 1)" + ("; bars: microbatch/stage" if several else
                                                    "; bars: microbatch"))
    ax.set_title(f"{title}: bubble {r.bubble:.4f}, peak {max(r.peak.values())}", fontsize=10,
                 loc="left")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()],
              labels=["F", "B (whole backward where no W)", "W"], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return ax
