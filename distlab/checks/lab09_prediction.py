"""Lab 9's graded prediction (served by ``distlab.checks.lab09``): ``predict_all_to_all_bytes(
tokens, hidden, experts, k, world_size, capacity_factor)``, for one rank's dispatch all-to-all, as
nccl-tests counts a message (the tensor the rank hands in), in float32:

- ``"padded"``: the message of a capacity-padded all-to-all (GShard §2.2, Switch Transformer
  §2.2), which gives every expert exactly C = ⌈c·T·k/E⌉ rows (Switch Transformer eq. 3, with k
  assignments a token), kept or padding;
- ``"padding"``: the fewest of those bytes that are zeros, over every routing;
- ``"padded_off_rank"``: the part of the padded message that leaves the rank.

Not the uneven message itself: Exercise 1's contract states it (each assignment sent once, its
check reads the bytes), and a prediction asks what the text has not answered (issue 42).
The formulas are ``_a2a_bytes``'s. Visible values are stored in ``data/09_expert_parallel/prediction.pt`` (a handout has no
``_a2a_bytes``); hidden cases are drawn from the seed and computed in the judge."""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import numbers_by_key
from distlab.checks.ranks import call_each
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values

LAB = "09_expert_parallel"
SEED = 909
KEYS = ("padded", "padding", "padded_off_rank")
FLOAT32 = 4


def _a2a_bytes(tokens: int, hidden: int, experts: int, k: int, world_size: int,
               capacity_factor: float) -> dict:
    """The three byte counts of the module's docstring (the formulas)."""
    capacity = math.ceil(capacity_factor * tokens * k / experts)
    padded = experts * capacity * hidden * FLOAT32
    # The rank's T·k assignments fill at most T·k of the E·C rows (all of them when the routing
    # fits every expert's C, which T·k <= E·C allows); the rest are zeros.
    padding = max(0, experts * capacity - tokens * k) * hidden * FLOAT32
    return {"padded": padded, "padding": padding,
            "padded_off_rank": padded * (world_size - 1) / world_size}


def a2a_cases(seed: int | None) -> list[tuple[int, int, int, int, int, float]]:
    """(tokens, hidden, experts, k, world_size, capacity_factor): the lab's measured sizes at
    factors 1.0 and 1.25, the hidden tests' sizes (where the ceiling rounds up) and a top-1 case
    on 4 ranks (visible); or sizes drawn from ``seed`` (hidden)."""
    if seed is None:
        return [(64, 32, 4, 2, 2, 1.0), (64, 32, 4, 2, 2, 1.25), (10, 6, 8, 2, 4, 1.25),
                (20, 6, 4, 1, 4, 1.0), (7, 16, 8, 2, 2, 2.0)]
    rng = random.Random(seed)
    cases = []
    for _ in range(3):
        world = rng.choice([2, 4, 8])
        experts = world * rng.choice([1, 2, 4])
        cases.append((rng.randint(5, 300), rng.choice([8, 64, 1024]), experts,
                      rng.choice([1, 2]), world, rng.choice([1.0, 1.1, 1.25, 1.5, 2.0])))
    return cases


def a2a_bytes_set() -> dict:
    """The visible cases' bytes, for ``data/<lab>/prediction.pt``."""
    return {"seed": SEED, "bytes": torch.tensor([[_a2a_bytes(*c)[key] for key in KEYS]
                                                 for c in a2a_cases(None)],
                                                dtype=torch.float64)}


def grade_a2a_bytes(predict, seed: int | None = None) -> str:
    todo = a2a_cases(seed)
    expected = expected_values(LAB, "prediction", "bytes", seed, todo,
                               lambda case: [_a2a_bytes(*case)[key] for key in KEYS])
    calls = [(f"predict_all_to_all_bytes(tokens={t}, hidden={h}, experts={e}, k={k}, "
              f"world_size={p}, capacity_factor={c})") for t, h, e, k, p, c in todo]
    answers = call_each(predict, todo, names=calls)   # every case in one launch
    shown = []
    for (t, h, e, k, p, c), call, got, want in zip(todo, calls, answers, expected):
        got = numbers_by_key(call, got, KEYS)
        for key, g, w in zip(KEYS, got, want):
            if not math.isclose(g, w, rel_tol=1e-9):
                raise CheckFailed(
                    f"{call}[{key!r}] = {g:.6g}; the formula gives {w:.6g} bytes (float32). "
                    + {"padded": "Every expert gets exactly C slots from every rank, kept or "
                                 "not: how many slots does one rank's send buffer hold, and how "
                                 "is C rounded?",
                       "padding": "Zeros are the slots no assignment fills: how many of the "
                                  "buffer's slots can the rank's assignments fill at most, and "
                                  "can a routing fill that many?",
                       "padded_off_rank": "With equal splits, which share of the padded "
                                          "message does a rank send to itself?"}[key])
        shown.append(f"T={t} h={h} E={e} k={k} p={p} c={c:g}: "
                     + "/".join(f"{g:,.0f}" for g in got))
    return joined(f"predict_all_to_all_bytes: your padded/padding/off-rank bytes equal the "
                  f"formulas' (relative 1e-9) on {len(todo)} cases: ", shown)
