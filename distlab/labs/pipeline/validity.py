"""Is a schedule table valid? Lab 11's tables (per rank, the ordered actions ``(op, microbatch,
stage)``) checked before ``replay`` times them: its shape, each action once and on its stage's
rank, and every dependency respected, with the first violated one named.

``table_problem(table, placement, m, ops)`` returns None for a valid table, else one message:
what is wrong, on which rank, and what to do. A table is valid when each rank can run its list in
order, each action once its input is ready (``replay``'s rules: ``F(i, s)`` needs ``F(i, s-1)``;
``B(i, s)`` needs ``B(i, s+1)``, the last stage's its own ``F(i, s)``; ``W(i, s)`` needs
``B(i, s)``), and every rank completes.

Sends and receives are not in a table: they follow from it. A forward whose next stage lives on
another rank sends its output there, a backward whose previous stage does sends its input's
gradient (``compare.messages`` counts them; the executor posts them).
"""
from __future__ import annotations

WHY = {"F": "a forward needs the previous stage's output of the same microbatch",
       "B": "a backward needs the gradient of its stage's output, from the next stage's backward "
            "(the last stage's from its own forward)",
       "W": "a weights' gradient needs the output gradient its B received"}


def needs(op: str, i: int, s: int, last: int):
    """The action ``(op, i, s)`` waits for; None for the first stage's forwards."""
    if op == "F":
        return None if s == 0 else ("F", i, s - 1)
    if op == "B":
        return ("F", i, s) if s == last else ("B", i, s + 1)
    return ("B", i, s)


def table_problem(table, placement: list[int], m: int, ops: str = "FBW") -> str | None:
    """None if ``table`` runs every action of ``ops`` (F and B always; W where ``ops`` has it)
    of each of ``m`` microbatches on each stage of ``placement`` exactly once, on its stage's
    rank, and completes; else what is wrong first."""
    actions = _actions(table, placement, m, ops)
    if isinstance(actions, str):
        return actions
    return _missing(actions, placement, m, ops) or _blocked(actions, len(placement) - 1)


def _actions(table, placement, m: int, ops: str):
    """The table as lists of (op, i, s) tuples, or the first malformed entry's message."""
    p, S = max(placement) + 1, len(placement)
    if not isinstance(table, (list, tuple)) or len(table) != p:
        got = f"{len(table)} lists" if isinstance(table, (list, tuple)) else type(table).__name__
        return (f"the table must be a list of {p} lists, one per rank; got {got}. Return "
                f"[actions of rank 0, ..., actions of rank {p - 1}].")
    rows, seen = [], {}
    for rank, row in enumerate(table):
        if not isinstance(row, (list, tuple)):
            return f"rank {rank}'s entry is a {type(row).__name__}, not a list of actions."
        out = []
        for k, action in enumerate(row):
            if not (isinstance(action, (list, tuple)) and len(action) == 3
                    and action[0] in ops and all(isinstance(x, int) for x in action[1:])):
                return (f"rank {rank}'s action {k} is {action!r:.60}: an action is a tuple (op, "
                        f"microbatch, stage) with op one of {', '.join(map(repr, ops))}.")
            op, i, s = action = (str(action[0]), int(action[1]), int(action[2]))
            if not (0 <= i < m and 0 <= s < S):
                return (f"rank {rank} has {action!r}: microbatches run 0..{m - 1}, stages "
                        f"0..{S - 1}.")
            if placement[s] != rank:
                return (f"rank {rank} has {action!r}, but stage {s} lives on rank {placement[s]} "
                        f"(placement {placement}): give every action of stage {s} to rank "
                        f"{placement[s]}.")
            if action in seen:
                return (f"rank {rank} runs {action!r} twice (actions {seen[action]} and {k} of its "
                        f"list): each action runs once.")
            seen[action] = k
            out.append(action)
        rows.append(out)
    return rows


def _missing(rows, placement, m: int, ops: str) -> str | None:
    ran = {a for row in rows for a in row}
    for op in ops:
        for s in range(len(placement)):
            for i in range(m):
                if (op, i, s) not in ran:
                    return (f"rank {placement[s]} never runs {(op, i, s)!r}: every stage runs "
                            f"{' and '.join(ops)} of every microbatch once.")
    return None


def _blocked(rows, last: int) -> str | None:
    """Run the lists in order, each action once its input has run (times do not matter to
    whether a table completes); where every unfinished rank waits, the first violated
    dependency: an action listed before what it needs on its own rank, else a wait that comes
    round in a circle through other ranks."""
    done, nxt, where = set(), [0] * len(rows), {a: (r, k) for r, row in enumerate(rows)
                                                for k, a in enumerate(row)}
    progressed = True
    while progressed:
        progressed = False
        for r, row in enumerate(rows):
            while nxt[r] < len(row) and (needs(*row[nxt[r]], last) in done
                                         or needs(*row[nxt[r]], last) is None):
                done.add(row[nxt[r]])
                nxt[r] += 1
                progressed = True
    stuck = [r for r, row in enumerate(rows) if nxt[r] < len(row)]
    if not stuck:
        return None
    for r in stuck:                     # an action before what it needs, on the same rank
        action = rows[r][nxt[r]]
        dep = needs(*action, last)
        if where[dep][0] == r:
            return (f"rank {r} runs {action!r} (action {nxt[r]} of its list) before {dep!r} "
                    f"(action {where[dep][1]}), which it needs: {WHY[action[0]]}. Put {dep!r} "
                    f"first.")
    r = stuck[0]                        # a circle of waits across ranks
    chain, seen = [], set()
    while r not in seen:
        seen.add(r)
        action = rows[r][nxt[r]]
        dep = needs(*action, last)
        chain.append(f"rank {r} waits at {action!r} for {dep!r} on rank {where[dep][0]}")
        r = where[dep][0]
    return ("the ranks wait for each other forever: " + "; ".join(chain) + ". Each of those "
            "actions comes later in its rank's list than the action that waits for it: reorder "
            "so that what another rank needs comes before what waits for that rank.")
