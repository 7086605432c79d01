"""Schedule tables: per rank, the ordered list of actions ``(op, microbatch, stage)`` a schedule
runs (op ``"F"``, ``"B"`` or ``"W"``), for ``replay`` to time on paper and an executor to run.

- ``one_f_one_b``: Lab 5's 1F1B as a table (one stage per rank, whole backwards);
- ``interleaved_1f1b``: 1F1B with ``v`` virtual stages per rank, placed round-robin (stage ``s``
  on rank ``s mod p``), Narayanan et al. 2021 ("PTD-P"), sec. 2.2;
- ``zb_h1``: 1F1B with each backward split into B (input gradient) and W (weights' gradient) and
  some W deferred into the cool-down's idle time, Qi et al. 2023 ("Zero Bubble Pipeline
  Parallelism"), sec. 2.1, ZB-H1;
- ``zb_v``: two stages per rank in a V (stage ``s`` and ``2p-1-s`` on rank ``s``), B and W split,
  under a cap on the activations held (``greedy_table``).

The tables of interleaved 1F1B, ZB-H1 and the V answer Lab 11's exercises: its handout withholds
them (``distlab.checks.lab11_tables.COURSE_CODE``).
"""
from __future__ import annotations

Action = tuple[str, int, int]


def round_robin(num_ranks: int, v: int) -> list[int]:
    """The rank of each of the ``v * p`` stages when virtual stages go round-robin: ``s mod p``,
    so a microbatch visits every rank once per chunk of ``p`` stages."""
    return [s % num_ranks for s in range(v * num_ranks)]


def v_shape(num_ranks: int) -> list[int]:
    """The rank of each of the ``2p`` stages in a V: stage ``s < p`` on rank ``s``, stage
    ``2p-1-s`` on it too, so rank 0 holds the first stage and the last."""
    p = num_ranks
    return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]


def one_f_one_b(num_ranks: int, num_microbatches: int) -> list[list[Action]]:
    """1F1B (Lab 5) as a table: rank ``r`` runs stage ``r``, warms up with ``p - r - 1``
    forwards, alternates one forward and one whole backward, then drains its backwards."""
    p, m = num_ranks, num_microbatches
    table = []
    for r in range(p):
        warm = min(p - r - 1, m)
        row = [("F", i, r) for i in range(warm)]
        for i in range(m - warm):
            row += [("F", warm + i, r), ("B", i, r)]
        table.append(row + [("B", i, r) for i in range(m - warm, m)])
    return table


def interleaved_1f1b(num_ranks: int, num_microbatches: int, v: int) -> list[list[Action]]:
    """Interleaved 1F1B (PTD-P, sec. 2.2): rank ``r`` holds stages ``r, r + p, ..., r + (v-1)p``
    (``round_robin``); F and a whole B of every microbatch on every stage; replayed, the bubble
    and peak of torch's ``ScheduleInterleaved1F1B``. ``m`` must be a multiple of ``p``."""
    # Microbatches go through a rank's chunks in groups of p: its k-th forward is microbatch
    # p (k // vp) + k mod p on chunk (k // p) mod v; its k-th backward the same microbatch on
    # chunk v - 1 - (k // p) mod v (the last chunk's gradients come first). Rank r warms up with
    # (v-1) p + 2 (p - 1 - r) forwards (all of them if fewer), then alternates one forward and
    # one whole backward, then drains.
    p, m = num_ranks, num_microbatches
    if m % p:
        raise ValueError(f"interleaved 1F1B sends microbatches round in groups of p = {p}: "
                         f"num_microbatches = {m} must be a multiple of {p}")
    total = m * v

    def nth(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // p) % v
        return p * (k // (p * v)) + k % p, v - 1 - chunk if backward else chunk

    table = []
    for r in range(p):
        warm = min((v - 1) * p + 2 * (p - 1 - r), total)
        fwd = [("F", i, c * p + r) for i, c in (nth(k, False) for k in range(total))]
        bwd = [("B", i, c * p + r) for i, c in (nth(k, True) for k in range(total))]
        row = fwd[:warm]
        for k in range(total - warm):
            row += [fwd[warm + k], bwd[k]]
        table.append(row + bwd[total - warm:])
    return table


def zb_h1(num_ranks: int, num_microbatches: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023, sec. 2.1): stage ``r`` on rank ``r``, F, B (the input's gradient)
    and W (the weights' gradient) of every microbatch; replayed, ZB-H1's bubble at 1F1B's peak
    activations."""
    # 1F1B's order with each backward split into B then W, and rank r keeping up to r of its W
    # waiting: the later ranks, idle earliest in 1F1B's cool-down, fill it with deferred W. Rank
    # r then holds p - r - 1 + 1 + r = p microbatches at most, 1F1B's peak (rank 0's).
    p, m = num_ranks, num_microbatches
    table = []
    for r in range(p):
        warm = min(p - r - 1, m)
        row = [("F", i, r) for i in range(warm)]
        waiting: list[int] = []

        def backward(i: int, keep: int):
            row.append(("B", i, r))
            waiting.append(i)
            while len(waiting) > keep:
                row.append(("W", waiting.pop(0), r))

        for i in range(m - warm):
            row.append(("F", warm + i, r))
            backward(i, r)
        for i in range(m - warm, m):
            backward(i, r)
        row += [("W", i, r) for i in waiting]
        table.append(row)
    return table


def greedy_table(placement: list[int], num_microbatches: int, cap: int, *, t_fwd: float = 1.0,
                 t_bwd: float = 1.0, t_wgt: float = 1.0, prefer: str = "FBW") -> list[list[Action]]:
    """A table for the stages of ``placement`` (the rank of each), backwards split, holding at
    most ``cap`` stage-microbatches' activations per rank (from the F's start to the W's end, as
    ``replay`` counts them). Below what its method needs (a V: ``cap >= 2p``) it stops and says
    so; ``prefer`` and the times tune the method."""
    # List scheduling: time runs on, and each idle rank starts the first ready action in the
    # order of ops ``prefer``, a forward only while it holds fewer than ``cap``. Among its stages
    # a rank serves first the one nearest the end of the pass: its latest stage for F (forwards
    # run up the stages), its earliest for B and W (backwards run down); each stage takes its
    # microbatches in order. The table records only the order; replay gives it back its times.
    # Greedy fills the cap with first-stage forwards, hence a V's 2p.
    S, m, p = len(placement), num_microbatches, max(placement) + 1
    cost = {"F": t_fwd, "B": t_bwd, "W": t_wgt}
    mine = [[s for s in range(S) if placement[s] == r] for r in range(p)]
    nxt = dict.fromkeys(((op, s) for op in "FBW" for s in range(S)), 0)
    finish: dict[Action, float] = {}
    held, releases = [0] * p, [[] for _ in range(p)]
    free, table, now = [0.0] * p, [[] for _ in range(p)], 0.0
    left = 3 * S * m
    while left:
        started = False
        for r in range(p):
            held[r] -= sum(1 for t in releases[r] if t <= now)   # ties: a release before a start
            releases[r] = [t for t in releases[r] if t > now]
            action = None if free[r] > now else _ready(mine[r], nxt, finish, now, S - 1, m,
                                                       prefer, held[r] < cap)
            if action is None:
                continue
            op, i, s = action
            table[r].append(action)
            nxt[(op, s)] += 1
            finish[action] = free[r] = now + cost[op]
            held[r] += op == "F"
            if op == "W":
                releases[r].append(free[r])
            left, started = left - 1, True
        later = [t for t in free + [t for ts in releases for t in ts] if t > now]
        if not started and not later:
            raise RuntimeError(f"no rank can start anything at time {now:g} with cap = {cap}: "
                               "every rank holds cap activations and waits; raise the cap")
        if not started:
            now = min(later)
    return table


def _ready(stages, nxt, finish, now, last, m, prefer, may_forward) -> Action | None:
    """The first action of ``prefer``'s ops whose input is ready, over ``stages`` (ascending) in
    the order of its pass."""
    for op in prefer:
        if op == "F" and not may_forward:
            continue
        for s in reversed(stages) if op == "F" else stages:
            i = nxt[(op, s)]
            if i >= m:
                continue
            dep = (None if s == 0 else ("F", i, s - 1)) if op == "F" else (
                (("F", i, s) if s == last else ("B", i, s + 1)) if op == "B" else ("B", i, s))
            if dep is None or finish.get(dep, float("inf")) <= now:
                return (op, i, s)
    return None


def zb_v(num_ranks: int, num_microbatches: int) -> list[list[Action]]:
    """A zero-bubble V (Qi et al. 2023, sec. 6, ZB-V): stages ``s`` and ``2p-1-s`` on rank ``s``
    (``v_shape``), F, B and W of every microbatch, at most ``2p`` stage-microbatches held per
    rank (1F1B's peak: ``p`` whole microbatches, each stage half a rank's layers); replayed with
    t_F = t_B = t_W, the bubble of torch's ``ScheduleZBVZeroBubble`` (``m >= 2p``)."""
    # greedy_table for unit times under a cap of 2p
    p = num_ranks
    return greedy_table(v_shape(p), num_microbatches, cap=2 * p)
