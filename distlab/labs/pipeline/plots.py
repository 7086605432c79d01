"""Gantt charts of pipeline schedules, measured (``plot_runs``) or simulated
(``plot_simulations``, ``schedule_explorer``): one lane per rank, forwards light, backwards dark."""
from __future__ import annotations

from distlab.labs.pipeline.runs import ScheduleRun
from distlab.labs.pipeline.schedules import SCHEDULES, simulate
from distlab.labs.pipeline.stages import Event, measured_bubble, peak_in_flight, theoretical_bubble

def plot_schedule(events: list[Event], *, title: str = "", ax=None, unit: str = "ms"):
    """A Gantt chart of ``events``: one lane per rank (rank 0 on top), forwards light, backwards
    dark, each bar labelled with its microbatch. Measured times are shown in ms from the first
    event; simulated ones (``unit="step"``) as given."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len({e.rank for e in events})))
    t0 = min(e.start for e in events)
    scale = 1e3 if unit == "ms" else 1.0
    colors = {"F": "#8ecae6", "B": "#1d5f8a"}
    for e in events:
        left, width = (e.start - t0) * scale, (e.end - e.start) * scale
        ax.barh(e.rank, width, left=left, height=0.8, color=colors[e.kind], edgecolor="white",
                linewidth=0.5)
        ax.text(left + width / 2, e.rank, str(e.mb), ha="center", va="center", fontsize=7,
                color="black" if e.kind == "F" else "white", clip_on=True)
    ranks = sorted({e.rank for e in events})
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(unit if unit == "ms" else "time (forward = 1)")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=["forward", "backward"], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize=7, frameon=False)
    return ax


def plot_runs(runs: dict[str, ScheduleRun]):
    """One measured Gantt chart per schedule, stacked, titled with measured vs theoretical bubble."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, squeeze=False,
                             figsize=(10, 1.2 + 1.0 * len(runs) * max(r.num_stages for r in runs.values()) / 2))
    for ax, run in zip(axes[:, 0], runs.values()):
        plot_schedule(run.events, ax=ax, title=(
            f"{run.name}: p={run.num_stages}, m={run.num_microbatches or 1}, step "
            f"{run.step_time * 1e3:.1f} ms, bubble {run.bubble:.2f} measured vs {run.theory:.2f} theory"))
    fig.tight_layout()
    return fig

def plot_simulations(kinds, num_stages: int, num_microbatches: int, t_bwd: float = 2.0):
    """Simulated Gantt charts of several schedules for the same ``p`` and ``m``, stacked."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(kinds), 1, squeeze=False,
                             figsize=(10, 0.8 + 0.5 * num_stages * len(kinds)))
    for ax, kind in zip(axes[:, 0], kinds):
        events = simulate(kind, num_stages, num_microbatches, t_bwd=t_bwd)
        m = 1 if kind == "naive" else num_microbatches
        plot_schedule(events, ax=ax, unit="step", title=(
            f"{kind} (simulated): p={num_stages}, m={m}, bubble {measured_bubble(events):.3f} = "
            f"(p-1)/(m+p-1) = {theoretical_bubble(num_stages, m):.3f}; microbatches in flight per "
            f"stage {list(peak_in_flight(events).values())}"))
    fig.tight_layout()
    return fig



def schedule_explorer():
    """An ipywidgets panel: pick the schedule, p, m and the backward/forward cost ratio; it
    redraws the simulated Gantt chart and prints its bubble against ``(p-1)/(m+p-1)`` and the
    microbatches in flight per stage."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    def show(kind, p, m, ratio):
        events = simulate(kind, p, m, t_fwd=1.0, t_bwd=ratio)
        mm = 1 if kind == "naive" else m
        fig, ax = plt.subplots(figsize=(10, 0.6 + 0.45 * p))
        plot_schedule(events, ax=ax, unit="step", title=(
            f"{kind}: p={p}, m={mm}: bubble {measured_bubble(events, p):.3f}, "
            f"(p-1)/(m+p-1) = {theoretical_bubble(p, mm):.3f}, in flight per stage "
            f"{list(peak_in_flight(events).values())}"))
        plt.show()

    return w.interactive(
        show, kind=w.Dropdown(options=SCHEDULES, value="1f1b", description="schedule"),
        p=w.IntSlider(value=4, min=2, max=8, description="stages p"),
        m=w.IntSlider(value=8, min=1, max=16, description="micro m"),
        ratio=w.FloatSlider(value=2.0, min=0.5, max=3.0, step=0.5, description="t_b / t_f"))
