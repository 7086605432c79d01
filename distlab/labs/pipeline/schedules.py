"""The schedules on paper: per stage, the order of its forwards and backwards (naive, GPipe,
1F1B), a simulator that times them as early as their inputs allow, and the bytes a stage boundary
moves against tensor parallelism's."""
from __future__ import annotations

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


def replay(orders: list[list[tuple[str, int]]], *, t_fwd: float = 1.0, t_bwd: float = 2.0,
           name: str = "schedule") -> list[Event]:
    """Any schedule on paper: stage ``s`` runs ``orders[s]`` (``("F", i)`` / ``("B", i)``) in that
    order, each op as early as its input allows (as ``simulate``), a forward taking ``t_fwd`` and a
    backward ``t_bwd``, messages free. A RuntimeError names where a stage waits forever."""
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}
    free, nxt, events = [0.0] * p, [0] * p, []
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                op, i = orders[s][nxt[s]]
                dep = ("F", s - 1, i) if op == "F" else ("B", s + 1, i) if s < p - 1 else ("F", s, i)
                if op == "F" and s == 0:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                start = max(free[s], ready)
                free[s] = done[(op, s, i)] = start + (t_fwd if op == "F" else t_bwd)
                events.append(Event(s, i, op, start, free[s]))
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"stage {s} at {orders[s][nxt[s]]}" for s in range(p) if nxt[s] < len(orders[s]))
            raise RuntimeError(f"{name} deadlocks: {stuck}")
    return events


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

