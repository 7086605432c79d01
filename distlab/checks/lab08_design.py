"""Lab 8's open design exercise (called from ``distlab.checks.lab08``, which the judge serves):
``design(model, mesh) -> model``, the student's choice of ``fully_shard`` units and activation
checkpointing for the design stack (``distlab.labs.sharded.budget``), graded by its properties
on real ranks:

- memory: on every rank, the peak live bytes of a steady step (``budget.LiveBytes``, read by
  ``budget.steady_peak``: parameters sharded and gathered, gradients, AdamW's state, saved
  activations) stay within the budget;
- values: the mean over the ranks of their losses equals single-process AdamW on the full batch,
  step by step (so the gradients were averaged over the ranks).

The budget is measured, not typed: halfway between the peak of the course's design (every block
checkpointed and ``fully_shard``-ed) and the lowest peak of the plain designs (DDP; DDP with every
block checkpointed; ``fully_shard`` per block without checkpointing), so that none of those fits.
The visible case's peaks, budget and losses are stored in ``data/<lab>/design_budget.pt`` (a
handout has neither the course's design nor the reference training). Hidden cases (another seed,
4 ranks) read the 4-rank peaks from ``data/<lab>/design_peaks_4.pt``: bytes follow the shapes,
not the seed (``tests/test_lab08.py`` measures both seeds), so the four runs that measure them
are made once by ``distlab references``, not once per student; their losses, which do depend on
the seed, are computed in the judge per call."""
from __future__ import annotations

import dataclasses
import functools

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.stored import tolerance
from distlab.labs.sharded.budget import (DESIGN_SETUP, DESIGN_STEPS, PLAIN_DESIGNS, DesignPeaks,
                                         budget_training, course_design, measure_peak,
                                         steady_peak)
from distlab.labs.sharded.problem import ShardSetup, reference_sharded_training

from distlab.runtime.per_rank import PerRank, reference

LAB = "08_sharded_data_parallel"
TOL = dict(atol=1e-9, rtol=1e-9)


def _setup(seed: int | None) -> ShardSetup:
    return DESIGN_SETUP if seed is None else dataclasses.replace(DESIGN_SETUP, seed=seed)


STORED_PEAKS = {2: "design_budget", 4: "design_peaks_4"}   # world size -> its stored set


@functools.lru_cache(maxsize=None)
def measured_peaks(world_size: int) -> DesignPeaks:
    """Every plain design's peak and the course design's, measured on ``world_size`` ranks."""
    return DesignPeaks(plain={name: measure_peak(d, world_size)
                              for name, d in PLAIN_DESIGNS.items()},
                       course=measure_peak(course_design, world_size))


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


def grade_design(design, run, world_size: int = 2, seed: int | None = None) -> None:
    """``run(fn, world_size, what, *args)`` runs the rank bodies (``lab08._run``); prints what
    passed (the judge sends printed output back to the notebook)."""
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
    losses = reference(losses)
    # Each rank: the initial model (the design's input, whole on every rank) and its own rows.
    out = run(budget_training, world_size, f"your design ({case})", design,
              PerRank(setup.shares(world_size)), DESIGN_STEPS)
    budget = peaks.budget
    for rank in range(world_size):
        peak, step = steady_peak(out[rank]["peaks"])
        if peak > budget:
            others = "; ".join(f"{name}: {p:,}" for name, p in peaks.plain.items())
            raise CheckFailed(
                f"rank {rank} held {peak:,} bytes at its peak in step {step}, over the budget "
                f"of {budget:,} bytes per rank (measured: every tensor the rank made, "
                f"parameters, gradients, AdamW's state and saved activations, at every "
                f"module's forward and backward). For comparison, on {world_size} ranks: "
                f"{others}. Model states (parameters, gradients, AdamW's two moments) shrink "
                f"only with sharding; saved activations only with checkpointing: which of "
                f"the two does your design leave whole?")
    mean = torch.tensor([out[r]["losses"] for r in range(world_size)], dtype=torch.float64).mean(0)
    assert_close(mean, losses.to(mean.dtype), what="mean over the ranks of their losses per step",
                 hint="Each rank trains on its own rows: the ranks' gradients must be averaged "
                      "(fully_shard reduce-scatters them; a module left out of every "
                      "fully_shard unit is neither sharded nor averaged).", **tol)
    top = max(steady_peak(out[r]["peaks"])[0] for r in range(world_size))
    print(f"your design peaked at {top:,} bytes per rank, within the budget of {budget:,} "
          f"({world_size} ranks, {DESIGN_STEPS} steps; the course's design, every block "
          f"checkpointed and sharded: {peaks.course:,}; the lowest plain design: "
          f"{min(peaks.plain.values()):,}); losses equal to one process's")
