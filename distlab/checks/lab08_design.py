"""Lab 8's open design exercise (called from ``distlab.checks.lab08``, which the judge serves):
``design(model, mesh) -> model``, the student's choice of ``fully_shard`` units and activation
checkpointing for the design stack (``distlab.labs.sharded.budget``), graded by its properties
on real ranks:

- memory: on every rank, the peak live bytes of a steady step (``budget.LiveBytes``, read by
  ``budget.steady_peak``: parameters sharded and gathered, gradients, AdamW's state, saved
  activations), on a scale of two tests (``common.design_scale``): the first at the peak of
  Hint 3's design (``budget.hinted_design``), the second at a bar halfway from it to the bound
  no design beats (``budget.design_bound``, derived in the lab). The course's design
  (``budget.course_design``) reaches the bar;
- values: the mean over the ranks of their losses equals single-process AdamW on the full batch,
  step by step (so the gradients were averaged over the ranks), and every parameter has its
  gradient when the check's AdamW steps (the bound counts on it).

Both tests grade one run: the second takes the first's (``_design_run``, ``common.DesignRuns``),
so the scale costs no more ranks than one test did. The hinted design's peak on 2 ranks (the visible case) is stored in
``data/<lab>/design_budget.pt`` with the reference losses (a handout has neither the designs nor
the reference training); on 4 ranks (hidden cases, another seed) in
``data/<lab>/design_peaks_4.pt``: bytes follow the shapes, not the seed (``tests/test_lab08.py``
measures both seeds), so the runs that measure them are made once by ``distlab references``, not
once per student; their losses, which do depend on the seed, are computed in the judge per call.
The plain designs' peaks, stored beside, are the lab's table."""
from __future__ import annotations

import dataclasses
import functools

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import DesignRuns, design_scale
from distlab.checks.stored import tolerance
from distlab.labs.sharded.budget import (DESIGN_SETUP, DESIGN_STEPS, PLAIN_DESIGNS, DesignPeaks,
                                         budget_training, design_bound, hinted_design,
                                         measure_peak, steady_peak)
from distlab.labs.sharded.problem import ShardSetup, reference_sharded_training

from distlab.runtime.per_rank import PerRank, reference

LAB = "08_sharded_data_parallel"
TOL = dict(atol=1e-9, rtol=1e-9)


def _setup(seed: int | None) -> ShardSetup:
    return DESIGN_SETUP if seed is None else dataclasses.replace(DESIGN_SETUP, seed=seed)


STORED_PEAKS = {2: "design_budget", 4: "design_peaks_4"}   # world size -> its stored set


@functools.lru_cache(maxsize=None)
def measured_peaks(world_size: int) -> DesignPeaks:
    """Every plain design's peak and Hint 3's design's, measured on ``world_size`` ranks."""
    return DesignPeaks(plain={name: measure_peak(d, world_size)
                              for name, d in PLAIN_DESIGNS.items()},
                       course=measure_peak(hinted_design, world_size))


def _peaks_set(peaks: DesignPeaks) -> dict:
    return {"plain": torch.tensor(list(peaks.plain.values()), dtype=torch.int64),
            "course": torch.tensor(peaks.course), "budget": torch.tensor(peaks.budget)}


def peaks_sets() -> dict:
    """The 4-rank peaks for ``data/<lab>/design_peaks_4.pt`` (the 2-rank ones are in
    ``design_budget_set``). Seed-free: a hidden case's fresh seed draws other values of the same
    shapes, and the bytes a rank holds follow the shapes."""
    return {"design_peaks_4": {"seed": DESIGN_SETUP.seed, **_peaks_set(measured_peaks(4))}}


def stored_peaks(world_size: int) -> DesignPeaks:
    """The peaks on ``world_size`` ranks as stored, or measured here where none are stored."""
    name = STORED_PEAKS.get(world_size)
    if name is None:
        return measured_peaks(world_size)
    from distlab.checks.stored import load
    stored = load(LAB, name)
    return DesignPeaks(plain=dict(zip(PLAIN_DESIGNS, stored["plain"].tolist())),
                       course=int(stored["course"]))


def design_budget_set() -> dict:
    """The visible case (2 ranks, seed 0): the peaks, the budget and the reference losses."""
    return {"seed": DESIGN_SETUP.seed, **_peaks_set(measured_peaks(2)),
            "losses": reference_sharded_training(DESIGN_SETUP, DESIGN_STEPS)["losses"]}


def stored_design() -> tuple[DesignPeaks, torch.Tensor]:
    """The visible case as stored: (peaks, reference losses)."""
    from distlab.checks.stored import load
    return stored_peaks(2), load(LAB, "design_budget")["losses"]


def peak_scale(peaks: DesignPeaks, world_size: int) -> dict[str, int]:
    """The peaks a student's is shown beside: Hint 3's design's, the bar and the bound (bytes)."""
    return {k: int(v) for k, v in design_scale(peaks.course, design_bound(world_size)).items()}


# The run both tests grade, by (design, world size, visible or hidden): the first test runs it,
# the bar's test takes it (``common.DesignRuns``).
_RUNS = DesignRuns()


def _design_run(design, run, world_size: int, seed: int | None, first: bool) -> tuple:
    """(the run's per-rank results, the peaks it is graded against, the case, the reference
    losses, their tolerance): the design trained once for both tests (``first``: the first's)."""
    return _RUNS.run(design, (world_size, seed is None),
                     lambda: _train(design, run, world_size, seed), first=first)


def _train(design, run, world_size: int, seed: int | None) -> tuple:
    setup = _setup(seed)
    if seed is None and world_size == 2:
        peaks, losses = stored_design()
        # Stored on the course's CPU, whose float32 weight init another CPU rounds a last bit
        # apart: what that carries through the steps (distlab.checks.stored.tolerance).
        tol = tolerance(losses, steps=DESIGN_STEPS)
    else:
        peaks = stored_peaks(world_size)
        losses = reference_sharded_training(setup, DESIGN_STEPS)["losses"]
        tol = TOL
    case = "the stored inputs" if seed is None else f"fresh inputs, seed {seed}"
    # Each rank: the initial model (the design's input, whole on every rank) and its own rows.
    out = run(budget_training, world_size, f"your design ({case})", design,
              PerRank(setup.shares(world_size)), DESIGN_STEPS)
    return out, peaks, case, reference(losses), tol


def _check_values(out, world_size: int, losses, tol: dict) -> None:
    for rank in range(world_size):
        if out[rank]["no_grad"]:
            raise CheckFailed(
                f"rank {rank}: after backward, {len(out[rank]['no_grad'])} parameter(s) had no "
                f"gradient (e.g. {out[rank]['no_grad'][0]}): the check's AdamW steps every "
                f"parameter after backward, so a design must leave every gradient to it.")
    mean = torch.tensor([out[r]["losses"] for r in range(world_size)], dtype=torch.float64).mean(0)
    assert_close(mean, losses.to(mean.dtype), what="mean over the ranks of their losses per step",
                 hint="Each rank trains on its own rows: the ranks' gradients must be averaged "
                      "(fully_shard reduce-scatters them; a module left out of every "
                      "fully_shard unit is neither sharded nor averaged).", **tol)


def _comparison(peak: int, fig: dict[str, int]) -> str:
    return (f"peak {peak:,} bytes per rank; Hint 3's design {fig['hinted']:,}, the bar "
            f"{fig['bar']:,}, the bound {fig['bound']:,}")


def grade_design(design, run, world_size: int = 2, seed: int | None = None,
                 level: str = "hinted") -> str:
    """``run(fn, world_size, what, *args)`` runs the rank bodies (``lab08_ranks.run_ranks``). Every rank's
    peak against ``level``: "hinted" (Hint 3's design's peak) or "bar"; returns the line the test
    cell prints."""
    out, peaks, case, losses, tol = _design_run(design, run, world_size, seed, level == "hinted")
    fig = peak_scale(peaks, world_size)
    limit, name = fig[level], ("Hint 3's design's peak" if level == "hinted" else "the bar")
    ranks = {r: steady_peak(out[r]["peaks"]) for r in range(world_size)}
    rank = max(ranks, key=lambda r: ranks[r][0])
    top, step = ranks[rank]
    if top > limit:
        others = "; ".join(f"{d}: {p:,}" for d, p in peaks.plain.items())
        advice = ("Model states (parameters, gradients, AdamW's two moments) shrink only with "
                  "sharding; saved activations only with checkpointing: which of the two does "
                  "your design leave whole?" if level == "hinted" else
                  "At your design's peak, what does the rank hold that the work of that moment "
                  "does not read? (Hint 4)")
        raise CheckFailed(
            f"your design ({case}, {world_size} ranks): rank {rank} held {top:,} bytes at its "
            f"peak in step {step} (every tensor the rank made: parameters, gradients, AdamW's "
            f"state, saved activations, buffers, at every module's forward and backward); "
            f"{_comparison(top, fig)}. This test's limit is {name}, {limit:,} bytes. The plain "
            f"designs on {world_size} ranks: {others}. {advice}")
    _check_values(out, world_size, losses, tol)
    return (f"your design ({case}, {world_size} ranks, {DESIGN_STEPS} steps): "
            f"{_comparison(top, fig)}: within {name}; losses equal to one process's")


def design_budget() -> dict:
    """The visible case as stored (2 ranks): the peak bytes per rank of each plain design and of
    Hint 3's design (the first test's limit), the bar (the second's) and the bound."""
    peaks, _ = stored_design()
    fig = peak_scale(peaks, 2)
    return {**peaks.plain, "Hint 3's design (first test's limit)": fig["hinted"],
            "the bar (second test's limit)": fig["bar"],
            "the bound (no design goes below)": fig["bound"]}
