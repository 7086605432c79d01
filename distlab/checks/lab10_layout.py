"""Lab 10's causal balance (served by ``distlab.checks.lab10``, which defines the ``check_*``
wrappers the judge serves):

- the graded prediction, ``predict_contiguous_penalty(world_size)``: the contiguous split's
  critical path over the ideal (``distlab.labs.context.layout``) for long sequences, against
  ``contiguous_penalty_limit``, computed from the layouts themselves;
- the open design exercise, ``causal_layout(seq_len, world_size)``, graded on a scale: the
  critical path of the student's layout against the hinted design's (``striped_layout``: the
  positions dealt out like cards), then against a bar halfway from it to the bound (the ideal,
  which no layout beats). Each verdict shows the student's figure beside the hinted design's,
  the bar and the bound, on a pass as on a fail.
"""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import design_scale
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values
from distlab.labs.context.layout import (contiguous_layout, critical_path, ideal_path, penalty,
                                         striped_layout)

LAB = "10_context_parallel"
SEED = 1011
PENALTY_CASES = (2, 4, 8)          # the visible prediction's world sizes
LONG = 256                         # tokens per rank of the "long sequence" the limit is taken at


def answers(fn, calls: list[tuple], name: str) -> list:
    """What the student's ``fn`` returns on each args of ``calls``, run on one rank."""
    from distlab.checks.rank_failures import ranks_failed
    from distlab.checks.ranks import call_each
    from distlab.runtime.outcome import DistributedError
    try:
        return list(call_each(fn, calls))
    except DistributedError as err:
        raise ranks_failed(f"{name} on {', '.join(map(str, calls))}", err, "") from None


def _penalty_and_error(world_size: int) -> tuple[float, float]:
    """The contiguous split's penalty as s/p grows, extrapolated from s/p = LONG and 2·LONG (its
    gap to the limit shrinks as 1/(s/p)), and a bound on the error left: their difference."""
    at = [penalty(contiguous_layout(world_size * n, world_size)) for n in (LONG, 2 * LONG)]
    return 2 * at[1] - at[0], abs(at[1] - at[0])


def contiguous_penalty_limit(world_size: int) -> float:
    """The contiguous split's critical path over the ideal, for long sequences."""
    return _penalty_and_error(world_size)[0]


def penalty_cases(seed: int | None) -> list[int]:
    """PENALTY_CASES (visible), or two world sizes drawn from ``seed`` (hidden)."""
    if seed is None:
        return list(PENALTY_CASES)
    rng = random.Random(seed)
    return rng.sample([3, 5, 6, 7, 12, 16], 2)


def penalty_prediction_set() -> dict:
    limits = torch.tensor([_penalty_and_error(p) for p in PENALTY_CASES], dtype=torch.float64)
    return {"seed": SEED, "penalty": limits[:, 0], "error": limits[:, 1]}


def grade_penalty_prediction(predict, seed: int | None = None) -> str:
    """``predict(world_size)`` must be the contiguous split's long-sequence penalty on every case
    of ``penalty_cases(seed)``, within the extrapolation's error. Returns the verdict line."""
    todo = penalty_cases(seed)
    expected = zip(*(expected_values(LAB, "penalty_prediction", key, seed, todo,
                                     lambda p, i=i: _penalty_and_error(p)[i])
                     for i, key in enumerate(("penalty", "error"))))
    shown = []
    got_all = answers(predict, [(p,) for p in todo], "predict_contiguous_penalty")
    for p, (want, error), got in zip(todo, expected, got_all):
        call = f"predict_contiguous_penalty(world_size={p})"
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.160}: expected a number (the critical "
                              f"path over the ideal).") from None
        # the limit is extrapolated: what is left of its error is far below ``error``
        if not abs(got - want) <= error:
            mistaken = (f" {got:g} = 2p−1 is how much more rank p−1 does than rank 0 in all; "
                        f"the ring waits, at each step, only for that step's slowest block."
                        if math.isclose(got, 2 * p - 1) else "")
            raise CheckFailed(
                f"{call} = {got:.4g}; on long contiguous splits the critical path is {want:.4f} "
                f"times the ideal.{mistaken} Count one step at a time: which blocks does some "
                f"rank compute at step 0, and at each later step? How much work is each, in "
                f"(s/p)² units, against the ideal's?")
        shown.append(f"p = {p}: {got:.4f} (layouts: {round(want, 6):.4f})")   # one rounding
    line = "predict_contiguous_penalty: " + "; ".join(shown)
    print(line)   # the visible cell ends in a note of its own: the figures show here
    return line


def layout_bars(seq_len: int, world_size: int) -> dict:
    """Critical paths (score pairs) of the scale: the hinted design's (dealt like cards), the
    bar halfway from it to the bound, and the bound (the ideal)."""
    return design_scale(critical_path(striped_layout(seq_len, world_size)),
                        ideal_path(seq_len, world_size))


def grade_causal_layout(causal_layout, sizes, bar: str) -> str:
    """``causal_layout(seq_len, world_size)`` for each (world_size, seq_len) of ``sizes``: a
    permutation of the positions, (p, s/p), whose critical path is at most
    ``layout_bars(...)[bar]``. Returns the verdict lines."""
    sizes = [(int(p), int(s)) for p, s in sizes]
    got_all = answers(causal_layout, [(s, p) for p, s in sizes], "causal_layout")
    lines = [_grade_layout(got, p, s, bar) for (p, s), got in zip(sizes, got_all)]
    if len(lines) == 1:
        return lines[0][0]
    return joined(f"causal_layout: every position once, the critical path at most the "
                  f"{'hinted design' if bar == 'hinted' else 'bar'}'s on {len(lines)} sizes: ",
                  [short for _, short in lines])


def _grade_layout(got, world_size: int, seq_len: int, bar: str) -> tuple[str, str]:
    """(the full line of figures, a short one for a line of several sizes), or CheckFailed."""
    what = f"causal_layout(seq_len={seq_len}, world_size={world_size})"
    n = seq_len // world_size
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (world_size, n) \
            or got.is_floating_point():
        raise CheckFailed(f"{what}: expected an integer tensor of shape [{world_size}, {n}], got "
                          f"{got!r:.200}")
    if not torch.equal(got.flatten().sort().values, torch.arange(seq_len)):
        raise CheckFailed(f"{what}: every position 0..{seq_len - 1} must appear exactly once.")
    bars = layout_bars(seq_len, world_size)
    mine = critical_path(got)

    def times(x: float) -> str:
        return f"{x:,.0f} ({x / bars['bound']:.3f}× ideal)"
    figures = (f"critical path {times(mine)}; dealt like cards (the hinted design) "
               f"{times(bars['hinted'])}, bar halfway to the bound {times(bars['bar'])}, "
               f"bound (ideal) {times(bars['bound'])}")
    if mine > bars[bar]:
        advice = ("Give every rank cheap (early) and expensive (late) positions alike."
                  if bar == "hinted" else
                  "Look at one step at a time (layout.steps_table): which ranks' blocks cost "
                  "more than the others', and could every pair of different ranks' blocks cost "
                  "the same?")
        raise CheckFailed(f"{what}: {figures}. Needed: at most the "
                          f"{'hinted design' if bar == 'hinted' else 'bar'}. {advice}")
    return (f"{what}: {figures}: at most the {'hinted design' if bar == 'hinted' else 'bar'}",
            f"s={seq_len}, p={world_size}: {times(mine)} (hinted "
            f"{bars['hinted'] / bars['bound']:.3f}×, bar {bars['bar'] / bars['bound']:.3f}×)")


# What ``distlab.checks.lab10`` adds to its COURSE_CODE (the prediction's reference: an answer
# that calls it earns nothing, and a handout has none).
LAYOUT_SHIPPED = (f"{__name__}:contiguous_penalty_limit", f"{__name__}:_penalty_and_error")
