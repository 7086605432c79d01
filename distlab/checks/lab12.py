"""Graded checks of Lab 12, "When a rank dies".

Exercises, in the lab's order (each section's grading in its own module):
1. ``whole_state(trainer)`` / ``restore(trainer, state)``: the whole training state, graded by
   resuming from it, bit for bit against the uninterrupted run (``lab12_state``).
2. ``save(model, optimizer, folder)`` / ``load(model, optimizer, folder)`` with
   ``torch.distributed.checkpoint``, each rank its own shards, loaded on another world size
   (2 -> 4 and 4 -> 2): every rank's rows exact (``lab12_reshard``).
LAB12-DOC-RESTART (l12restart: Sections 3 and 4)
LAB12-DOC-INTERVAL (l12interval: Sections 5 and 6)
"""
from __future__ import annotations

from distlab.checks.course_code import CourseCode  # noqa: F401

COURSE_CODE: dict = {}

# Sections 1 and 2: the whole state, and DCP with resharding (``lab12_state``, ``lab12_reshard``)
from distlab.checks import lab12_reshard, lab12_state  # noqa: E402
from distlab.checks.course_code import names  # noqa: E402

# The course's answers to Sections 1 and 2 (the handout withholds them); the uninterrupted run
# the checks compare with is not one (any Trainer trains it), so a student's own kernel can
# make it where the stored one was made on another CPU.
STATE_SHIPPED = (names("distlab.labs.checkpoint.run_state", "training_state", "restore_state")
                 + names("distlab.labs.checkpoint.saving", "save_checkpoint", "load_checkpoint",
                         "load_shards"))
COURSE_CODE = {**COURSE_CODE, "check_whole_state": CourseCode(forbidden=STATE_SHIPPED),
               "check_resharding": CourseCode(forbidden=STATE_SHIPPED)}


def check_whole_state(whole_state, restore, seed: int | None = None, world_size: int = 2,
                      steps: int = 6, save_at: int = 3) -> str:
    """``whole_state(trainer)`` and ``restore(trainer, state)``: ranks train ``save_at`` steps,
    take the state, serialize it (torch.save to bytes and back), restore it into a fresh
    Trainer and train to ``steps``; the losses after the resume and every parameter at the end
    equal the uninterrupted run's to the last bit (float64), and the step is restored
    (``lab12_state``). Hidden: the run stopped after another step and trained on for
    another number of steps, drawn from the seed."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_state.grade_whole_state(whole_state, restore, seed, world_size, steps, save_at)


def check_resharding(save, load, seed: int | None = None) -> str:
    """``save(model, optimizer, folder)`` and ``load(model, optimizer, folder)``: 2 ranks save a
    drawn state (each into a folder of its own, merged by the checker), 4 load it and save
    another, 2 load that; each save a DCP checkpoint every writer wrote its shards of, and after
    each load every rank holds exactly its rows of every parameter and of AdamW's state
    (``lab12_reshard``). ``seed``: other states and widths (no hidden case: nothing in it can
    be known ahead)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_reshard.grade_resharding(save, load, seed)


# LAB12-CHECKS-RESTART (l12restart: the same)

# LAB12-CHECKS-INTERVAL (l12interval: the same)

# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py).
RANK_IMPORTS: tuple[str, ...] = (   # LAB12-RANK-IMPORTS (each section adds what its ranks need)
    # Sections 1 and 2: FSDP2's trainer (its AdamW imports torch._dynamo), DTensor, DCP
    "torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor",
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict")


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 12, each section's."""
    return {"resume": lab12_state.visible_set()}   # LAB12-REFERENCES (each section adds its sets)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
