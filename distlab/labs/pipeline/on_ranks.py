"""What Lab 11's Section 3 shows of an executor on real ranks: the course's tables (stored: a
handout has none) and torch's own tables, run with your ``run_table`` in one launch of 4 ranks on
the stored model; the gradients beside one process's and torch's own schedules' (stored, made by
``torch_runs.torch_grads``); each run's bubble measured beside the replay's; the timelines.

``stored_lab11_set(name)``: ``data/11_pipeline_schedules/<name>.pt`` (``distlab references``).
"""
from __future__ import annotations

import torch

from distlab.labs.stored_sets import load_set
from distlab.labs.pipeline.model import PipeSpec
from distlab.labs.pipeline.schedules import Replay, replay

LAB = "11_pipeline_schedules"
SPEC = PipeSpec(num_layers=8, hidden=16, batch=16, seed=1103)   # the stored case's
P, M = 4, 8
TORCH = ("ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
COURSE = {"interleaved": "interleaved 1F1B (v = 2)", "zb_h1": "ZB-H1", "zb_v": "zero-bubble V"}
OPS = "FBW"


def stored_lab11_set(name: str) -> dict[str, torch.Tensor]:
    return load_set(LAB, name)


def stored_problem():
    """The stored case: the course's tables at p = 4, m = 8 (name -> (table, placement)), the
    model with the stored weights (float64), the batch and target, and one process's loss and
    gradients."""
    stored = stored_lab11_set("executor")
    model = SPEC.model().double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(stored[f"weight.{n}"])
    tables = {name: _stored_table(stored, key) for key, name in COURSE.items()}
    one = (stored["loss"].item(), {k.removeprefix("grad."): v for k, v in stored.items()
                                   if k.startswith("grad.")})
    return tables, model, (stored["x"], stored["target"]), one


def _stored_table(stored: dict, key: str) -> tuple:
    return ([[(OPS[op], i, s) for op, i, s in stored[f"table.{key}.{r}"].tolist()]
             for r in range(P)], stored[f"placement.{key}"].tolist())


def stored_torch_tables() -> dict:
    """torch's tables of ``TORCH`` at p = 4, m = 8 (``torch_tables.torch_table``, stored when the
    references were made), name -> (table, placement), each name prefixed "torch "."""
    stored = stored_lab11_set("executor")
    return {f"torch {name}": _stored_table(stored, f"torch_{name}") for name in TORCH}


def run_on_ranks(run_table, *, timeout: float = 120) -> dict:
    """Your ``run_table`` on the course's three tables and on torch's ``TORCH`` tables (converted,
    ``torch_tables.torch_table``; both stored), p = 4, m = 8, float64, one launch: per name the
    table, its placement, the loss, the gradients and the stages' events."""
    import distlab
    from distlab.labs.pipeline.executor import events_of, table_rank_inputs, tables_on_rank
    from distlab.runtime.per_rank import PerRank
    tables, model, data, _ = stored_problem()
    tables.update(stored_torch_tables())
    layers, xs, targets, rows = table_rank_inputs(tables, SPEC, M, torch.float64, model, data)
    out = distlab.run(tables_on_rank, P, run_table, PerRank(layers), PerRank(xs),
                      PerRank(targets), PerRank(rows),
                      {name: list(pl) for name, (_, pl) in tables.items()}, M, timeout=timeout)
    return {name: dict(table=table, placement=placement,
                       loss=out[placement[-1]][name]["loss"],
                       grads={n: g for r in range(P) for n, g in out[r][name]["grads"].items()},
                       events=[e for r in range(P) for e in events_of(out[r][name]["events"])])
            for name, (table, placement) in tables.items()}


def replayed(run: dict) -> Replay:
    """The run's table on paper, t_F = t_B = t_W per rank's share of the layers (a stage of v
    per rank takes 1/v of it; a B without its W costs B + W)."""
    v = len(run["placement"]) // P
    return replay(run["table"], t_fwd=1 / v, t_bwd=1 / v, t_wgt=1 / v,
                  placement=run["placement"])


def measured(run: dict) -> Replay:
    """The run's own events read as a replay reads its: bubble (idle over compute), span."""
    return Replay(run["events"], P, {})


def torch_stored() -> dict:
    """torch's own schedules run on the stored model (``torch_runs.torch_grads``): per name its
    gradients."""
    stored = stored_lab11_set("torch")
    return {name: {k.split(".", 1)[1]: v for k, v in stored.items()
                   if k.startswith(name + ".") and k != f"{name}.loss"} for name in TORCH}


def gradient_table(runs: dict) -> str:
    """Per run: its loss, its largest gradient difference from one process, and, for torch's
    tables, from torch's own schedule run on the same model; the replay's and the measured
    bubble."""
    _, _, _, (loss, one) = stored_problem()
    theirs = torch_stored()
    head = (f"{'schedule (your run_table)':<36}{'loss - 1 proc':>14}{'grads - 1 proc':>15}"
            f"{'grads - torch':>15}{'bubble: replay':>16}{'measured':>10}")
    rows = [head, "-" * len(head)]
    for name, run in runs.items():
        diff = max((run["grads"][n] - g).abs().max().item() for n, g in one.items())
        key = name.removeprefix("torch ")
        vs = (f"{max((run['grads'][n] - g).abs().max().item() for n, g in theirs[key].items()):.1e}"
              if key in theirs else "-")
        rows.append(f"{name:<36}{abs(run['loss'] - loss):>14.1e}{diff:>15.1e}{vs:>15}"
                    f"{replayed(run).bubble:>16.3f}{measured(run).bubble:>10.2f}")
    return "\n".join(rows)


def timeline_of(run: dict, label: str = ""):
    """The run's events as Lab 6's ``Timeline``: one lane per rank, F, B and W as named ranges
    (forward, backward, weights), on one clock from the first action."""
    from distlab.labs.timelines.trace import Span, Timeline
    t0 = min(e.start for e in run["events"])
    names = {"F": "forward", "B": "backward", "W": "weights"}
    spans = [Span(e.rank, "range", names[e.kind], e.start - t0, e.end - t0)
             for e in run["events"]]
    return Timeline(spans, P, source="run_table on 4 gloo ranks", label=label)


def plot_timelines(runs: dict, names=None):
    """Lab 6's lanes for each run of ``names`` (default: all), stacked, each titled with its
    measured bubble beside the replay's."""
    import matplotlib.pyplot as plt
    from distlab.labs.timelines.views import plot
    names = list(names or runs)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 3.2 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        run = runs[name]
        plot(timeline_of(run), ax=ax, title=f"{name}: bubble measured "
             f"{measured(run).bubble:.2f}, replay {replayed(run).bubble:.3f}")
    fig.tight_layout()
    return fig
