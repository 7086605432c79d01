"""The lines Lab 1's passing checks show (served by ``distlab.checks.lab01``): what was verified,
on how many cases, with the student's own figures beside the tolerance they met. A hidden case's
figures are the student's answers, which matched: the line shows nothing the answer did not."""
from __future__ import annotations


def relative_error(got: float, expected: float) -> float:
    return abs(got - expected) / abs(expected) if expected else abs(got)


def size(nbytes: float) -> str:
    """1,024 -> "1 KiB", in the largest binary unit that keeps it at least 1."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def rate(gbs: float) -> str:
    """GB/s as read: 3 significant figures, whole numbers from 1,000 up."""
    return f"{gbs:,.0f}" if gbs >= 1000 else f"{gbs:.3g}"


def off_by(worst: float, rel_tol: float) -> str:
    return f"off the reference by at most {worst:.2g} relative (allowed {rel_tol:g})"


def span(values, fmt) -> str:
    """"low to high" of ``values``, each formatted by ``fmt``; one figure when they are equal."""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low} to {high}"


def all_reduce_line(name: str, world_size: int, numel: int, errors: dict, how: str) -> str:
    """``errors``: per backend, (the largest error of any rank, the absolute part of its
    allowance); ``how``: what the record showed."""
    worst, allowed = max(errors.values())
    return (f"{name} on {world_size} ranks, {numel:,} elements ({', '.join(errors)}): every rank's "
            f"result is the sum of all ranks' rows, max abs error {worst:.2g} (allowed "
            f"{allowed:.2g} + 1e-05·|sum|); {how}")


def bandwidths_line(calls, answers, expected, rel_tol: float) -> str:
    """``calls``: (nbytes, seconds, factor); ``answers``, ``expected``: (algbw, busbw) pairs."""
    worst = max(relative_error(g, e) for got, exp in zip(answers, expected) for g, e in zip(got, exp))
    nbytes, seconds, factors = zip(*calls)
    return (f"bandwidths: {len(calls)} cases ({span(nbytes, size)} in {span(seconds, duration)}, "
            f"factor {span(factors, rate)}): your algbw {span([a for a, _ in answers], rate)} GB/s "
            f"and busbw {span([b for _, b in answers], rate)} GB/s, each size / time / 1e9 and "
            f"algbw x factor, {off_by(worst, rel_tol)}")


def bus_factor_line(shorts, answers, expected, nbytes: int, rel_tol: float) -> str:
    """``shorts``: each record's short name; ``answers``: the student's factors, which matched."""
    worst = max(relative_error(g, e) for g, e in zip(answers, expected))
    yours = ", ".join(f"{g:.4g} ({short})" for short, g in zip(shorts, answers))
    return (f"bus_factor on {len(answers)} records of a {nbytes:,}-byte buffer: your {yours}; each "
            f"the bytes its sends carried / {nbytes:,}, {off_by(worst, rel_tol)}. A table's "
            f"2(n-1)/n holds for the rings only")


def fit_line(name: str, rows: str, fit, expected, rel_tol: float, model: str) -> str:
    """A fitted (alpha, bandwidth) that matched the reference's relative least squares."""
    worst = max(relative_error(g, e) for g, e in zip(fit, expected))
    return (f"{name} on {rows}: your alpha {duration(fit[0])} and bandwidth {fit[1] / 1e9:.4g} "
            f"GB/s, the relative least-squares fit of {model}, {off_by(worst, rel_tol)}")


def prediction_line(nbytes: float, got: float, expected: float, rel_tol: float) -> str:
    return (f"predict_time at {size(nbytes)}: your {duration(got)}, alpha + S/B "
            f"{off_by(relative_error(got, expected), rel_tol)}")
