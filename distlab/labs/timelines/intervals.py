"""Arithmetic on sets of time intervals [(start, end), ...]: how much of a window a rank spent
communicating, and how much of that no compute covered."""
from __future__ import annotations



def union(intervals) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering exactly the given ones."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def length(intervals) -> float:
    return sum(b - a for a, b in union(intervals))


def minus(first, second) -> list[tuple[float, float]]:
    """The parts of ``first`` not covered by ``second``."""
    out, cover = [], union(second)
    for a, b in union(first):
        cur = a
        for c, d in cover:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out
