"""What Lab 5's checks read from the events the stages recorded: one forward and one backward
pass per microbatch on every rank, and 1F1B's order of passes on each stage."""
from __future__ import annotations

from distlab.checks.assertions import CheckFailed
from distlab.labs.pipeline import ScheduleRun


def _check_microbatches(run: ScheduleRun, m: int, batch: int) -> None:
    for rank in range(run.num_stages):
        for kind, word in (("F", "forward"), ("B", "backward")):
            got = sorted(e.mb for e in run.events if e.rank == rank and e.kind == kind)
            if got != list(range(m)):
                raise CheckFailed(
                    f"{run.name}: rank {rank} ran {len(got)} {word} pass(es) of its stage, "
                    f"expected {m}, one per microbatch. Split x and target into {m} microbatches "
                    f"(x.chunk({m}): {m} pieces of {batch // m} rows here) and call the "
                    f"stage once per microbatch.")


def one_f_one_b_order(stage: int, world_size: int, m: int) -> str:
    """1F1B's order of passes on ``stage``: w = min(p - s - 1, m) warm-up forwards, m - w
    (forward, backward) pairs, w cool-down backwards, e.g. 'FFFBFBBB' on stage 0 of 3, m = 4."""
    w = min(world_size - stage - 1, m)
    return "F" * w + "FB" * (m - w) + "B" * w


def _check_alternation(run: ScheduleRun, rank: int, world_size: int, m: int) -> None:
    got = "".join(e.kind for e in sorted((e for e in run.events if e.rank == rank),
                                         key=lambda e: e.start))
    expected = one_f_one_b_order(rank, world_size, m)
    if got != expected:
        w = min(world_size - rank - 1, m)
        raise CheckFailed(
            f"one_f_one_b_step: stage {rank} (rank {rank}) ran its passes in the order {got} "
            f"(F forward, B backward); 1F1B runs {w} warm-up forward(s), then must alternate one "
            f"forward and one backward, then {w} cool-down backward(s): {expected}.")
