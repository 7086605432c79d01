"""Lab 6's graded prediction (called from ``distlab.checks.lab06``, which the judge serves):
``predict_messages(run, spec, world_size, rank)``, the messages a rank sends per step of one of the
lab's profiled runs, by the formulas of Labs 2, 3 and 5, against ``formula_messages``
(``distlab.labs.timelines.runs``; ``tests/test_lab06.py`` checks it against recorded traces).
Visible cases are the lab's own runs at its sizes and a smaller spec, their expected messages
stored in ``data/06_timelines/messages.pt`` (a handout has no formula); hidden ones draw other
sizes from the seed and compute them in the judge."""
from __future__ import annotations

import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.ranks import call_each
from distlab.checks.stored import expected_values
from distlab.labs.timelines.runs import RUNS, Spec, formula_messages
from distlab.runtime.per_rank import reference

LAB = "06_timelines"
OPS = ("all_reduce", "send")


def message_cases(seed: int | None) -> list[tuple[str, Spec, int, int]]:
    """(run, spec, world_size, rank): every run on both ranks at the lab's sizes and a smaller
    spec (visible), or at sizes drawn from ``seed`` on 2 to 4 ranks (hidden)."""
    if seed is None:
        specs = [(Spec(), 2), (Spec(batch=8, dp_batch=32, hidden=32, layers=2, seq=4,
                                    microbatches=2, seed=3), 2)]
    else:
        rng = random.Random(seed)
        specs = []
        for _ in range(2):
            m = rng.choice([2, 4, 8])
            specs.append((Spec(batch=m * 4 * rng.randint(1, 4), dp_batch=rng.choice([64, 256]),
                               hidden=rng.choice([16, 64, 256]), layers=rng.randint(2, 6),
                               seq=rng.choice([4, 16]), microbatches=m, seed=seed),
                          rng.randint(2, 4)))
    return [(run, spec, n, rank) for spec, n in specs for run in RUNS for rank in range(n)]


def _summary(messages) -> list[int]:
    """Per op of ``OPS``: how many messages and their bytes in all."""
    out = []
    for op in OPS:
        sizes = [int(b) for o, b in messages if o == op]
        out += [len(sizes), sum(sizes)]
    return out


def messages_set() -> dict:
    """The visible cases' (count, bytes) per op, for ``data/<lab>/messages.pt``."""
    return {"seed": Spec().seed,
            "summary": torch.tensor([_summary(formula_messages(run, spec, n, rank))
                                     for run, spec, n, rank in message_cases(None)], dtype=torch.int64)}


def _counted(summary: list[int]) -> str:
    """"4 all_reduce (1,024 bytes)" for each op a summary has messages of."""
    return " + ".join(f"{summary[2 * i]} {op} ({summary[2 * i + 1]:,} bytes)"
                      for i, op in enumerate(OPS) if summary[2 * i]) or "none"


def grade_messages(predict, seed: int | None = None) -> str:
    """Every case's (count, bytes) per op against the formulas'; on a pass, the line that says so
    with the student's rank 0 figures of each run at the first spec."""
    todo = message_cases(seed)
    expected = reference(expected_values(LAB, "messages", "summary", seed, todo,
                                         lambda case: _summary(formula_messages(*case))))
    answers = call_each(predict, todo)   # every case in one launch
    shown = {}
    for (run, spec, n, rank), want, got in zip(todo, expected, answers):
        call = f"predict_messages({run!r}, {spec}, world_size={n}, rank={rank})"
        try:
            got = _summary([(str(op), int(b)) for op, b in got])
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.200}: expected a list of (op, bytes) "
                              "pairs, e.g. [('all_reduce', 1024), ...].")
        if got != want:
            said = ", ".join(f"{got[2 * i]} {op} ({got[2 * i + 1]} bytes)" for i, op in enumerate(OPS))
            right = ", ".join(f"{want[2 * i]} {op} ({want[2 * i + 1]} bytes)"
                              for i, op in enumerate(OPS))
            raise CheckFailed(
                f"{call}: your messages add up to {said}; the formulas give {right}. "
                "DP (Lab 2): one all-reduce per parameter tensor, batch-independent. TP (Lab 3): "
                "one all-reduce of this rank's (b, s, h) activation per MLP in forward and in "
                "backward, but for the first MLP's backward. PP (Lab 5): per microbatch, a send "
                "forward unless last stage, a send back unless first. float32: 4 bytes.")
        if rank == 0 and spec == todo[0][1]:
            shown[run] = _counted(got)
    sizes = "the lab's sizes and a smaller spec" if seed is None else "two drawn specs"
    return (f"predict_messages: {len(todo)} cases (every run on every rank, {sizes}), each the "
            f"formulas' count and bytes of all_reduce and send a step; your rank 0 "
            f"{'at the lab sizes' if seed is None else 'of the first spec'} ({todo[0][2]} ranks): "
            + "; ".join(f"{run} {said}" for run, said in shown.items()))
