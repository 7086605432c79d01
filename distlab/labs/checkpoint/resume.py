"""Rank bodies of Section 1 of Lab 12: a run resumed from the state a student's ``whole_state``
took, and the uninterrupted run it must equal.

``resume_with`` trains ``save_at`` steps, takes the state, and serializes it (``torch.save`` to
bytes and back, as a checkpoint on disk would: what comes back is data, never the live objects
the trainer holds); then a fresh ``Trainer`` of another seed (``RunSpec.restarted``: the same
data, other weights and generators, the data position at step 0) gets that state through
``restore`` and trains to ``steps``: only the state can make it the run again, so that a restore
that trains from step 0 anew does not land on the run. ``uninterrupted`` trains the same run to
``steps`` without stopping: the course's run, with no student code in it.
"""
from __future__ import annotations

import io

import torch

from distlab.labs.checkpoint.run_state import RunSpec, Trainer


def serialized(state):
    """``state`` through ``torch.save`` to bytes and ``torch.load`` back: a copy holding data only
    (each tensor its own storage, generators as their saved states). Its size in bytes too."""
    blob = io.BytesIO()
    torch.save(state, blob)
    size = blob.tell()
    blob.seek(0)
    return torch.load(blob, weights_only=False), size   # this rank's own bytes


def resume_with(rank: int, world_size: int, whole_state, restore, spec: RunSpec, steps: int,
                save_at: int) -> dict:
    """Train ``save_at`` steps, take ``whole_state(trainer)``, serialize it, ``restore`` it into a
    fresh trainer and train to ``steps``. Returns the losses after the resume, every parameter
    gathered whole at the end, the step the fresh trainer holds once restored, and the state's
    size in bytes."""
    first = Trainer(rank, world_size, spec)
    for _ in range(save_at):
        first.step()
    state, size = serialized(whole_state(first))
    del first
    second = Trainer(rank, world_size, spec.restarted())
    restore(second, state)
    restored_step = second.steps_done
    losses = [second.step() for _ in range(steps - save_at)]
    return {"losses": losses, "params": second.full_params(), "restored_step": restored_step,
            "bytes": size}


def uninterrupted(rank: int, world_size: int, spec: RunSpec, steps: int, save_at: int) -> dict:
    """The same run trained to ``steps`` without stopping: the losses of steps ``save_at + 1``
    on, and every parameter gathered whole at the end."""
    trainer = Trainer(rank, world_size, spec)
    losses = [trainer.step() for _ in range(steps)]
    return {"losses": losses[save_at:], "params": trainer.full_params()}


def epoch_starts(spec: RunSpec, world_size: int, steps: int) -> list[int]:
    """The steps (counted from 1) at which a new epoch starts and Python's ``random`` shuffles
    the rows again (``DataPosition.next_rows``: the epoch's tail is dropped)."""
    per_epoch = spec.samples // (spec.batch * world_size)
    return [k for k in range(2, steps + 1) if (k - 1) % per_epoch == 0]
