"""What each phase of a tensor-parallel run issued, compared with what it should, and a sentence
on the likely mistake when they differ (Lab 3's checks)."""
from __future__ import annotations

import collections

from distlab.checks.assertions import CheckFailed, verified
from distlab.checks.common import describe_comms, split_phases
from distlab.checks.crossed import assert_crossed_as_recorded

ALL_GATHER = {"all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base"}
REDUCE_SCATTER = {"reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                  "_reduce_scatter_base"}



def op_family(op: str) -> str:
    return "all_gather" if op in ALL_GATHER else "reduce_scatter" if op in REDUCE_SCATTER else op


def is_weight_slice(comm, shape: tuple) -> bool:
    """Whether `comm` gathered p blocks of a (out, in) weight, cut along rows or columns."""
    if not comm.shapes or len(comm.shapes[0]) != 2:
        return False
    rows, cols = comm.shapes[0]
    p = len(comm.group)
    return (rows * p, cols) == tuple(shape) or (rows, cols * p) == tuple(shape)


def diagnose_comms(issued, expected: list[tuple[str, int]], weights: dict[str, tuple]) -> str:
    """A sentence on the likely mistake, for the common ones."""
    for c in issued:
        names = [f"{name} {list(shape)}" for name, shape in weights.items()
                 if op_family(c.op) == "all_gather" and is_weight_slice(c, shape)]
        if names:
            return (f"The all_gather of {c.bytes} bytes assembles a whole weight matrix "
                    f"({' or '.join(names)}): gathering full weights makes every rank store and "
                    f"multiply the whole layer, which is what tensor parallelism avoids. Keep your "
                    f"shard and sum the partial outputs with one all_reduce (forward of the "
                    f"row-parallel layer; backward of the column-parallel one).")
    want = collections.Counter(f for f, _ in expected)
    got = collections.Counter(op_family(c.op) for c in issued)
    if want["reduce_scatter"] and got["all_reduce"]:
        return ("An all_reduce where a reduce-scatter belongs sends every rank the whole sum and "
                "twice the bytes; each rank needs only its own sequence slice.")
    if sum(got.values()) > sum(want.values()):
        return "More collectives than needed: one per phase suffices (see the formula above)."
    if sum(got.values()) < sum(want.values()):
        return ("A collective is missing: partial results on different ranks are never combined, "
                "or the backward does not undo the forward's data movement.")
    return "Check the sizes: the collective should carry the whole (b, s, h) activation."


def expect_phase_comms(out, expected: list[list[tuple[str, int]]], what: str, case: str,
                 weights: dict[str, tuple] | None = None, labels=("forward", "backward")) -> None:
    """Each phase must issue exactly the expected (op family, bytes) multiset, in any order; and
    first, what crossed must be within what the record says (``distlab.checks.crossed``)."""
    assert_crossed_as_recorded(out, f"{what} on {case}")
    for rank, comms in enumerate(out.comms):
        phases = split_phases(comms, len(expected), what, rank)
        for phase, issued, want in zip(labels, phases, expected):
            got = sorted((op_family(c.op), c.bytes) for c in issued)
            if got != sorted(want):
                want_text = ", ".join(f"{op} of {n} bytes" for op, n in want) or "no collective"
                raise CheckFailed(
                    f"{what} on {case}: rank {rank}'s {phase} should issue exactly {want_text}; "
                    f"it issued {describe_comms(issued)}.\n{diagnose_comms(issued, want, weights or {})}")
    phases = "; ".join(f"{phase}: " + (", ".join(f"{op} of {n:,} bytes" for op, n in want)
                                       or "no collective")
                       for phase, want in zip(labels, expected))
    verified(f"{what} on {case}: each rank issued exactly what the pattern needs ({phases})")

