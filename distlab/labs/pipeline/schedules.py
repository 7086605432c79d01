"""The schedules on paper: per stage, the order of its forwards and backwards (naive, GPipe,
1F1B), a replay that times any per-rank table of actions as early as their inputs allow (Lab 5's
one stage per rank; Lab 11's virtual stages and backward split into B and W), and the bytes a
stage boundary moves against tensor parallelism's."""
from __future__ import annotations

import dataclasses

from distlab.labs.pipeline.stages import Event

SCHEDULES = ("naive", "gpipe", "1f1b")


def schedule_order(kind: str, num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """Per stage, the order in which it runs its ops ``("F", i)`` / ``("B", i)``.

    naive: one forward and one backward of the whole batch (microbatch 0).
    gpipe: ``F0..F(m-1)`` then ``B0..B(m-1)``.
    1f1b:  stage ``s`` warms up with ``min(p - s - 1, m)`` forwards, then alternates one forward
           and one backward, and cools down with the remaining backwards.
    """
    p, m = num_stages, num_microbatches
    if kind == "naive":
        return [[("F", 0), ("B", 0)] for _ in range(p)]
    if kind == "gpipe":
        return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]
    if kind == "1f1b":
        orders = []
        for s in range(p):
            warm = min(p - s - 1, m)
            ops = [("F", i) for i in range(warm)]
            for i in range(m - warm):
                ops += [("F", warm + i), ("B", i)]
            ops += [("B", i) for i in range(m - warm, m)]
            orders.append(ops)
        return orders
    raise ValueError(f"unknown schedule {kind!r}: choose one of {SCHEDULES}")


def simulate(kind: str, num_stages: int, num_microbatches: int, *, t_fwd: float = 1.0,
             t_bwd: float = 2.0) -> list[Event]:
    """Times of every op when each stage runs ``schedule_order`` as early as its inputs allow:
    ``F(s, i)`` waits for ``F(s-1, i)``, ``B(s, i)`` for ``B(s+1, i)`` (the last stage's for its own
    ``F(s, i)``). Naive runs the whole batch as one op of ``m`` times the microbatch cost."""
    scale = num_microbatches if kind == "naive" else 1
    return replay(schedule_order(kind, num_stages, num_microbatches), t_fwd=scale * t_fwd,
                  t_bwd=scale * t_bwd, name=f"schedule {kind}")


@dataclasses.dataclass
class StageEvent(Event):
    """An ``Event`` of a table with virtual stages or a split backward: ``rank`` runs ``stage``;
    ``kind`` is ``"F"``, ``"B"`` or ``"W"``."""
    stage: int = 0


class Replay(list):
    """What ``replay`` returns: its events (a list, as Lab 5 reads it) and what they tell.

    ``bubble``: idle time over compute time, summed over the ranks (PTD-P's convention,
    Narayanan et al. 2021, sec. 2.2: ``(p-1)/m`` for 1F1B); ``step_share``: idle over the ranks'
    whole time (Lab 5's ``(p-1)/(m+p-1)``); ``peak``: per rank, the most stage-microbatches whose
    activations it held at once; ``span``: the step's length."""

    def __init__(self, events, num_ranks: int, released: dict):
        super().__init__(events)
        self.num_ranks = num_ranks
        self.span = max((e.end for e in events), default=0.0) - min((e.start for e in events),
                                                                     default=0.0)
        self.busy = sum(e.end - e.start for e in events)
        self.idle = num_ranks * self.span - self.busy
        self.bubble = self.idle / self.busy if self.busy else 0.0
        self.step_share = self.idle / (num_ranks * self.span) if self.span else 0.0
        self.peak = _peak_held(events, num_ranks, released)


def _peak_held(events, num_ranks: int, released: dict) -> dict[int, int]:
    """Per rank, the most activations held at once: +1 at each F's start, -1 at the end of the
    action that releases it (``released[(stage, i)]``: its W, or its B when W is not split)."""
    peaks = {}
    for rank in range(num_ranks):
        marks = [(e.start, 1) for e in events if e.rank == rank and e.kind == "F"]
        marks += [(e.end, -1) for e in events if e.rank == rank and e.kind != "F"
                  and released.get((_stage_of(e), e.mb)) == e.kind]
        alive = peak = 0
        for _, step in sorted(marks):   # ties: a release before a start
            alive += step
            peak = max(peak, alive)
        peaks[rank] = peak
    return peaks


def _stage_of(event) -> int:
    return getattr(event, "stage", event.rank)


def _actions(orders) -> tuple[list[list[tuple[str, int, int]]], bool]:
    """Every action as ``(op, i, stage)``, and whether the table is Lab 5's ``(op, i)`` form."""
    lab5 = all(len(a) == 2 for order in orders for a in order)
    table = []
    for rank, order in enumerate(orders):
        row = []
        for action in order:
            op, i, *rest = action
            if op not in ("F", "B", "W"):
                raise ValueError(f"rank {rank} has the action {action!r}: an op is 'F', 'B' or "
                                 "'W' (forward, backward, weights' gradient)")
            row.append((op, i, rest[0] if rest else rank))
        table.append(row)
    return table, lab5


def _placement(table, placement) -> list[int]:
    """The rank of each stage: ``placement`` checked against the table, or read from it."""
    where: dict[int, int] = {}
    for rank, row in enumerate(table):
        for op, i, s in row:
            if where.setdefault(s, rank) != rank:
                raise ValueError(f"stage {s} has actions on rank {where[s]} and on rank {rank}: "
                                 "a stage lives on one rank; give each stage's actions to it")
    if placement is None:
        missing = sorted(set(range(max(where, default=-1) + 1)) - set(where))
        if missing:
            raise ValueError(f"stages {missing} have no actions in the table: every stage from 0 "
                             "to the last runs its microbatches")
        return [where[s] for s in range(len(where))]
    for s, rank in where.items():
        if s >= len(placement) or placement[s] != rank:
            raise ValueError(f"stage {s}'s actions are on rank {rank}, but the placement puts it "
                             f"on {'no rank' if s >= len(placement) else placement[s]}: "
                             "move them or change the placement")
    return list(placement)


def _dependency(op: str, i: int, s: int, last: int):
    """The action ``(op, i, s)`` waits for (None: it waits for nothing)."""
    if op == "F":
        return None if s == 0 else ("F", i, s - 1)
    if op == "B":
        return ("F", i, s) if s == last else ("B", i, s + 1)
    return ("B", i, s)


def replay(orders, *, t_fwd: float = 1.0, t_bwd: float = 2.0, t_wgt: float = 0.0,
           placement=None, name: str = "schedule") -> Replay:
    """Any schedule on paper: rank ``r`` runs ``orders[r]`` in that order, each action as early as
    its input allows, messages free. A RuntimeError names where a rank waits forever, or an
    action a table runs twice.

    An action is ``(op, i)`` (Lab 5: one stage per rank, stage ``r`` on rank ``r``) or
    ``(op, i, s)``: op ``"F"``, ``"B"`` or ``"W"`` of microbatch ``i`` on stage ``s``, stage ``s``
    on rank ``placement[s]`` (by default the rank whose list holds its actions; virtual stages put
    several on one rank). ``F(s, i)`` waits for ``F(s-1, i)``; ``B(s, i)`` for ``B(s+1, i)`` (the
    last stage's for its own ``F(s, i)``); ``W(s, i)`` for ``B(s, i)``.

    ``B`` is the whole backward when the table has no ``W`` of that stage and microbatch (it costs
    ``t_bwd + t_wgt``), and only the input's gradient when it has one (``B`` costs ``t_bwd``,
    ``W``, the weights' gradient, ``t_wgt``). Lab 5 times ``t_bwd = 2``, ``t_wgt = 0``.

    Activations held (``Replay.peak``): a microbatch's activations on a stage are held from the
    start of its ``F`` to the end of its ``W`` (of its ``B`` when ``W`` is not split off); a
    release and a start at the same instant do not overlap. They are counted in
    stage-microbatches: with ``v`` stages per rank, each is ``1/v`` of a rank's layers.
    """
    table, lab5 = _actions(orders)
    # Lab 5's form: stage r on rank r, even where a rank's list is empty (it deadlocks, as before)
    where = list(range(len(table))) if lab5 and placement is None else _placement(table, placement)
    last, p = len(where) - 1, len(table)
    split = {(i, s) for row in table for op, i, s in row if op == "W"}
    cost = {"F": t_fwd, "W": t_wgt}
    done: dict[tuple[str, int, int], float] = {}
    free, nxt, events = [0.0] * p, [0] * p, []
    while any(nxt[r] < len(table[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while nxt[r] < len(table[r]):
                action = op, i, s = table[r][nxt[r]]
                dep = _dependency(op, i, s, last)
                if dep is not None and dep not in done:
                    break
                if action in done:
                    raise RuntimeError(f"{name} runs {_show(action, lab5)} twice (rank {r}): "
                                       "each action runs once")
                start = max(free[r], done[dep] if dep else 0.0)
                took = cost.get(op, t_bwd + (0.0 if (i, s) in split else t_wgt))
                free[r] = done[action] = start + took
                events.append(StageEvent(r, i, op, start, free[r], stage=s) if not lab5
                              else Event(r, i, op, start, free[r]))
                nxt[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{name} deadlocks: " + ", ".join(
                _stuck(table[r][nxt[r]], r, last, lab5) for r in range(p) if nxt[r] < len(table[r])))
    released = {(s, i): "W" if (i, s) in split else "B" for row in table for _, i, s in row}
    return Replay(events, p, released)


def _show(action, lab5: bool) -> str:
    return repr(action[:2]) if lab5 else repr(action)


def _stuck(action, rank: int, last: int, lab5: bool) -> str:
    if lab5:
        return f"stage {rank} at {_show(action, lab5)}"
    return f"rank {rank} at {action!r}, waiting for {_dependency(*action, last)!r}"


def recorded_orders(events: list[Event], num_stages: int) -> list[list[tuple[str, int]]]:
    """Per stage, the order in which a measured run's stages ran their passes (by start time):
    what ``replay`` times on paper."""
    return [[(e.kind, e.mb) for e in sorted((e for e in events if e.rank == s),
                                            key=lambda e: e.start)]
            for s in range(num_stages)]



def boundary_traffic(batch: int, seq: int, hidden: int, layers_per_stage: int, tp: int,
                     bytes_per_element: int = 2) -> str:
    """Bytes one microbatch moves per rank, per stage, forward + backward: pipeline parallelism
    sends one ``(b, s, h)`` activation forward and one gradient back across each stage boundary;
    Megatron tensor parallelism all-reduces a ``(b, s, h)`` tensor twice per layer forward and
    twice backward, each ring all-reduce moving ``2 (t-1)/t`` of it per rank."""
    act = batch * seq * hidden * bytes_per_element
    pp = 2 * act
    tp_bytes = 4 * layers_per_stage * 2 * (tp - 1) / tp * act
    return (f"one (b={batch}, s={seq}, h={hidden}) activation: {act / 2**20:.1f} MiB\n"
            f"PP, per stage boundary (1 forward + 1 backward message): {pp / 2**20:8.1f} MiB\n"
            f"TP={tp}, per rank, {layers_per_stage} layers (4 all-reduces each): "
            f"{tp_bytes / 2**20:8.1f} MiB  ({tp_bytes / pp:.0f} x PP)")

