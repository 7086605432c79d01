"""Lab 2's graded prediction (called from ``distlab.checks.lab02``, which the judge serves):
``predict_state_bytes(numel, num_tensors, world_size, sharded)``, the optimizer-state bytes one
rank holds after a step, replicated AdamW or ZeRO-1 (Rajbhandari et al. 2020, sec. 5.1, P_os),
for float32 parameters.

The formula is the student's to derive (the lab says what AdamW keeps); it is withheld from the
handout with the judge's ``_state_bytes``. The lab's ``memory`` cell measures the same
(``distlab.labs.data_parallel.memory``), and ``tests/test_lab02.py`` checks the formula against
that measurement. Visible cases' values are stored in ``data/02_data_parallel/prediction.pt``;
hidden ones are drawn from the seed and computed in the judge."""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed, verified
from distlab.checks.ranks import call_each
from distlab.checks.stored import expected_values

LAB = "02_data_parallel"
SEED = 202
# The lab's benchmark model (BENCH_SETUP: 6 Linear layers of 256, float32) and the checks' MLP.
BENCH = (394_752, 12)
SMALL = (6_792, 6)


def state_cases(seed: int | None) -> list[tuple[int, int, int, bool]]:
    """(numel, num_tensors, world_size, sharded)."""
    if seed is None:
        sizes, worlds = [BENCH, SMALL], [1, 2, 4, 3]
    else:
        rng = random.Random(seed)
        sizes = [(rng.randint(1_000, 5_000_000), rng.randint(2, 40)) for _ in range(3)]
        worlds = [rng.randint(2, 64), rng.randint(2, 64), 3]
    return [(n, t, w, sharded) for n, t in sizes for w in worlds for sharded in (False, True)]


def _state_bytes(numel: int, num_tensors: int, world_size: int, sharded: bool) -> int:
    if not sharded:
        return 8 * numel + 4 * num_tensors
    return 8 * math.ceil(numel / world_size) + 4


def state_bytes_set() -> dict:
    return {"seed": SEED, "bytes": torch.tensor([_state_bytes(*c) for c in state_cases(None)],
                                                dtype=torch.int64)}


def grade_state_bytes(predict, seed: int | None = None) -> None:
    todo = state_cases(seed)
    expected = expected_values(LAB, "prediction", "bytes", seed, todo,
                               lambda c: _state_bytes(*c))
    calls = [(f"predict_state_bytes(numel={numel}, num_tensors={tensors}, world_size={world}, "
              f"sharded={sharded})") for numel, tensors, world, sharded in todo]
    answers = call_each(predict, todo, names=calls)   # every case in one launch
    for (numel, tensors, world, sharded), call, got, want in zip(todo, calls, answers, expected):
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.100}: expected a whole number of bytes.")
        if got != want:
            hint = ("ZeRO-1 keeps AdamW's state for ceil(P / W) elements of one flat tensor, "
                    "with one step counter" if sharded else
                    "Replicated AdamW keeps exp_avg and exp_avg_sq for every element and one step "
                    "counter per parameter tensor")
            raise CheckFailed(f"{call} returned {got}, the formula gives {want}. {hint}; float32: "
                              f"4 bytes per element, and a 0-d float32 step is 4 bytes.")
    verified(f"predict_state_bytes gave the formula's bytes on all {len(todo)} cases (e.g. "
             f"{call} = {got:,})")
