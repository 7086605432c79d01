"""Lab 3's graded prediction (served by ``distlab.checks.lab03``): ``predict_ring_bytes(batch,
seq, hidden, world_size, variant)``, the bytes one rank sends per MLP block on a ring, forward and
backward, for tensor parallelism (``"tp"``) and sequence parallelism (``"sp"``).

The messages are ``megatron_comm_bytes``'s (Megatron-LM, Shoeybi et al. 2019, sec. 3: one
all-reduce of b*s*h each way; Korthikanti et al. 2022, sec. 4.2.2: an all-gather and a
reduce-scatter forward, a reduce-scatter and two all-gathers backward); on a ring a rank sends
2(p-1)/p of an all-reduce's bytes and (p-1)/p of an all-gather's or a reduce-scatter's (Lab 1):
``ring_bytes_per_rank``. Visible values are stored in ``data/03_tensor_parallel_mlp/prediction.pt``
(a handout has no ``ring_bytes_per_rank``); hidden cases are drawn from the seed."""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed, verified
from distlab.checks.ranks import call_each
from distlab.checks.stored import expected_values
from distlab.labs.tensor_parallel import megatron_comm_bytes, ring_bytes_per_rank

LAB = "03_tensor_parallel_mlp"
SEED = 303
CODE = ("distlab.labs.tensor_parallel.sequence_parallel:ring_bytes_per_rank",)


def ring_cases(seed: int | None) -> list[tuple[int, int, int, int, str]]:
    """(batch, seq, hidden, world_size, variant): the lab's b=2, s=8, h=16 and a GPT-3 layer's
    b=1, s=2048, h=12288 on 2, 4 and 8 ranks (visible), or sizes drawn from ``seed``."""
    if seed is None:
        shapes, worlds = [(2, 8, 16), (1, 2048, 12288)], [2, 4, 8]
    else:
        rng = random.Random(seed)
        shapes = [(rng.randint(1, 8), rng.choice([128, 512, 4096]), rng.choice([1024, 4096, 8192]))
                  for _ in range(2)]
        worlds = [rng.choice([2, 3, 4, 6, 8, 16])]
    return [(*shape, w, v) for shape in shapes for w in worlds for v in ("tp", "sp")]


def _expected(batch, seq, hidden, world_size, variant) -> list[float]:
    ring = ring_bytes_per_rank(megatron_comm_bytes(batch, seq, hidden)[variant], world_size)
    return [ring["forward"], ring["backward"]]


def ring_bytes_set() -> dict:
    return {"seed": SEED, "bytes": torch.tensor([_expected(*c) for c in ring_cases(None)],
                                                dtype=torch.float64)}


def grade_ring_bytes(predict, seed: int | None = None) -> None:
    todo = ring_cases(seed)
    expected = expected_values(LAB, "prediction", "bytes", seed, todo,
                               lambda c: _expected(*c))
    calls = [f"predict_ring_bytes(batch={b}, seq={s}, hidden={h}, world_size={p}, variant={variant!r})"
             for b, s, h, p, variant in todo]
    answers = call_each(predict, todo, names=calls)   # every case in one launch
    for (b, s, h, p, variant), call, got, (fwd, bwd) in zip(todo, calls, answers, expected):
        try:
            got = [float(got["forward"]), float(got["backward"])]
        except (TypeError, KeyError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.120}: expected a dict "
                              "{'forward': bytes, 'backward': bytes}.")
        for phase, g, want in (("forward", got[0], fwd), ("backward", got[1], bwd)):
            if not math.isclose(g, want, rel_tol=1e-9):
                raise CheckFailed(
                    f"{call}[{phase!r}] = {g:.6g}, the formula gives {want:.6g} bytes. n = "
                    f"b*s*h*4 = {b * s * h * 4} bytes per message; a ring all-reduce sends "
                    f"2(p-1)/p of it per rank, an all-gather or reduce-scatter (p-1)/p. Which "
                    f"collectives does {variant.upper()} issue in the {phase}? "
                    + ("(Sequence parallelism's backward all-gathers fc1's input once more.)"
                       if variant == "sp" and phase == "backward" else ""))
    verified(f"predict_ring_bytes gave the formula's bytes on all {len(todo)} cases (e.g. "
             f"{call}: forward {got[0]:,.0f}, backward {got[1]:,.0f})")
