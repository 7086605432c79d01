"""What Lab 5's checks say where a student's call cannot be checked as made, or the ranks hang:
a case with no stored expected values in a handout, a batch that m does not cut into equal
microbatches, and a deadlock, told by what each rank was stuck in."""
from __future__ import annotations

import re

import torch

from distlab.checks.assertions import CheckFailed


def course_value(fn, *args, what: str, stored: str):
    """``fn(*args)``: course code that the judge has and a student's handout has not. In a
    handout a case without stored expected values cannot be checked: say that, and which are."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise CheckFailed(
            f"This check has no stored expected values for {what}, and your handout has no code "
            f"to compute them (the grader computes the hidden cases). Stored: {stored}. Call the "
            f"check as the test cell does, or with one of those.") from None


def assert_equal_split(batch: int, m: int) -> None:
    """The contract's equal microbatches exist only where m divides the batch: x.chunk(m) on
    another batch returns fewer or unequal pieces (x.chunk(5) on 8 rows: 4 pieces of 2)."""
    if m < 1 or batch % m:
        pieces = [len(c) for c in torch.empty(batch).chunk(m)] if m >= 1 else []
        raise CheckFailed(
            f"num_microbatches = {m} does not cut a batch of {batch} rows into equal "
            f"microbatches: x.chunk({m}) returns {len(pieces)} piece(s) of {pieces} rows. Call the "
            f"check with a num_microbatches that divides batch = {batch} "
            f"({', '.join(str(d) for d in range(1, batch + 1) if batch % d == 0)}).")


_STUCK = re.compile(r"rank (\d+): in (i?send|i?recv) #\d+ (?:to|from) rank (\d+)")


def deadlock_advice(diagnosis: str) -> str:
    """What each stuck rank is in, from the launcher's per-rank lines, and what that means for a
    pipeline: on gloo a send returns only once its peer has posted the matching recv."""
    stuck = [(int(r), op, int(peer)) for r, op, peer in _STUCK.findall(diagnosis)]
    if not stuck:
        return ("A pipeline deadlocks when two neighbouring stages each wait for the other: check, "
                "for each pair of neighbouring stages, the order of their sends and recvs.")
    said = "; ".join(f"rank {r} is stuck in {op} {'to' if 'send' in op else 'from'} rank {peer}"
                     for r, op, peer in stuck)
    ops = {op.lstrip("i") for _, op, _ in stuck}
    if ops == {"send"}:
        why = ("Each is sending and none is receiving: on gloo a blocking send returns only once "
               "the peer has posted its recv, at every message size (the probe before Exercise 4 "
               "shows it), so two neighbours that both send before they receive wait for each "
               "other. Post sends with dist.isend, keep the work objects, and wait() them at the "
               "end.")
    elif ops == {"recv"}:
        why = ("Each is receiving a message the other would send only after its own recv "
               "returns: issue the send a neighbour needs before the recv that depends on it.")
    else:
        why = ("A send waits for the peer's recv (on gloo, at every size), and that peer waits "
               "elsewhere: order each pair of neighbours' calls so every send meets its recv, or "
               "post sends with dist.isend.")
    return f"{said}. {why}"
