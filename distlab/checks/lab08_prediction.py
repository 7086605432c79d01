"""Lab 8's graded prediction (called from ``distlab.checks.lab08``, which the judge serves):
``predict_step_bytes(scheme, block_numels, world_size, itemsize)``, the bytes one rank's
collectives move in one training step under data parallelism or a ZeRO stage, counted as the ZeRO
paper counts them (Rajbhandari et al. 2020, sec. 7) and as the lab's volume table measures them
from the collective record: the ring's per-rank traffic (Lab 1) without its (W-1)/W factor.

The formula is ``formula_step_bytes`` (a handout leaves its body out), with the flat layout's
padding; ``tests/test_lab08.py`` checks it against the volume table's measurement. Visible
cases' values are stored in ``data/08_sharded_data_parallel/prediction.pt`` (a handout has no
formula); hidden ones are drawn from the seed and computed in the judge."""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.ranks import call_each
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values

LAB = "08_sharded_data_parallel"
SCHEMES = ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
# The lab's measured stack (accounting.MEASURED_SETUP: 4 blocks of 33,088 float32 parameters, W =
# 2, no padding) and the checks' blocks of hidden width 21 on 4 ranks (709 elements: padded).
VISIBLE = [((33_088,) * 4, 2, 4), ((709,) * 3, 4, 8)]


def prediction_cases(seed: int | None) -> list[tuple[str, tuple, int, int]]:
    """(scheme, block_numels, world_size, itemsize): every scheme on each visible case, or on
    blocks, world sizes and dtypes drawn from ``seed``."""
    if seed is None:
        cases = VISIBLE
    else:
        rng = random.Random(seed)
        cases = [(tuple(rng.randint(100, 50_000) for _ in range(rng.randint(2, 6))),
                  rng.choice([2, 3, 4, 8]), rng.choice([2, 4, 8])) for _ in range(2)]
    return [(scheme, blocks, w, item) for blocks, w, item in cases for scheme in SCHEMES]


def formula_step_bytes(scheme: str, block_numels, world_size: int, itemsize: int) -> int:
    """Bytes one rank's collectives move in one step of ``scheme`` (module doc)."""
    if scheme == "DP":
        return 2 * sum(block_numels) * itemsize
    padded = sum(world_size * math.ceil(n / world_size) for n in block_numels) * itemsize
    return (3 if scheme == "ZeRO-3" else 2) * padded


def prediction_set() -> dict:
    """The visible cases' bytes, for ``data/<lab>/prediction.pt``."""
    return {"seed": 0, "bytes": torch.tensor([formula_step_bytes(*c) for c in prediction_cases(None)],
                                             dtype=torch.int64)}


def grade_step_bytes(predict, seed: int | None = None) -> str:
    todo = prediction_cases(seed)
    expected = expected_values(LAB, "prediction", "bytes", seed, todo,
                               lambda c: formula_step_bytes(*c))
    calls = [(f"predict_step_bytes({scheme!r}, block_numels={list(blocks)}, world_size={world}, "
              f"itemsize={item})") for scheme, blocks, world, item in todo]
    answers = call_each(predict, [(scheme, list(blocks), world, item)
                                  for scheme, blocks, world, item in todo], names=calls)   # one launch
    for (scheme, blocks, world, item), call, got, want in zip(todo, calls, answers, expected):
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.100}: expected a whole number of bytes.")
        if got != want:
            raise CheckFailed(
                f"{call} returned {got}; the formula gives {want} ({want / (sum(blocks) * item):.3f} "
                f"Psi, Psi = {sum(blocks) * item} bytes of parameters). Count what the scheme's "
                f"step calls, per block: an all-reduce moves 2x its tensor, an all-gather or a "
                f"reduce-scatter 1x its whole buffer, and a ZeRO bucket's buffer is padded to "
                f"W * ceil(P_i / W) elements.")
    return _step_bytes_line(todo, answers)


def _step_bytes_line(todo, answers) -> str:
    """What a pass verified: per case, the student's bytes for each scheme (the formula's)."""
    cases: dict = {}
    for (scheme, blocks, world, item), got in zip(todo, answers):
        cases.setdefault((blocks, world, item), []).append(f"{scheme} {int(got):,}")
    shown = [f"{len(blocks)} blocks, Psi = {sum(blocks) * item:,} bytes, W={world}: "
             + ", ".join(parts) for (blocks, world, item), parts in cases.items()]
    return joined(f"predict_step_bytes: your bytes per rank per step equal the ZeRO paper's "
                  f"count with padding (exactly) on {len(todo)} cases: ", shown)
