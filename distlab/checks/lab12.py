"""Graded checks of Lab 12, "When a rank dies".

Exercises, in the lab's order (each section's grading in its own module):
LAB12-DOC-STATE (l12state: Sections 1 and 2)
3. (Section 3, asynchronous saves: taught and measured, not graded here.)
4. ``train_resumable(rank, world_size, root, steps, save_every, save, load, spec)``: the loop
   that resumes from the newest complete checkpoint, graded with a rank killed from outside by
   SIGKILL at a (hidden: random) step and a relaunch (``lab12_restart``).
LAB12-DOC-INTERVAL (l12interval: Sections 5 and 6)
"""
from __future__ import annotations

from distlab.checks.course_code import CourseCode  # noqa: F401

COURSE_CODE: dict = {}

# LAB12-CHECKS-STATE (l12state: import your module, define your check_* wrappers here, merge
# your COURSE_CODE and make_references; the judge serves only this module's check_*)

# Section 4: the resumable loop, a rank killed from outside (``lab12_restart``)
from distlab.checks import lab12_restart  # noqa: E402
from distlab.checks.lab12_restart import VISIBLE as RESTART_CASE  # noqa: E402
COURSE_CODE = {**COURSE_CODE, **lab12_restart.COURSE_CODE}


def check_train_resumable(train_resumable, save, load, seed: int | None = None,
                          world_size: int = RESTART_CASE["world_size"],
                          steps: int = RESTART_CASE["steps"],
                          save_every: int = RESTART_CASE["save_every"]) -> str:
    """``train_resumable(rank, world_size, root, steps, save_every, save, load, spec)`` with
    your ``save`` (asynchronous) and ``load``: a rank killed by SIGKILL from outside at a step
    (hidden: drawn from ``seed``), the run relaunched on the merged checkpoints plus an
    unfinished newer one; it resumes from the newest complete one, trains exactly the steps
    left (the launcher's record) and lands bit for bit on your own clean restart from that
    checkpoint; every save waited for (``lab12_restart``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_restart.grade_train_resumable(train_resumable, save, load, seed, world_size,
                                               steps, save_every)

# LAB12-CHECKS-INTERVAL (l12interval: the same)

# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py).
RANK_IMPORTS: tuple[str, ...] = ()   # LAB12-RANK-IMPORTS (each section adds what its ranks need)
# Section 4's ranks (measured: a rank with nothing preloaded, after the solution's loop): FSDP2
# and DTensor, the optimizer (AdamW imports torch._dynamo, which imports part of _inductor), DCP
RANK_IMPORTS += ("torch._dynamo", "torch._inductor", "torch.distributed.tensor",
                 "torch.distributed.fsdp", "torch.distributed.checkpoint",
                 "torch.distributed.checkpoint.state_dict")


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 12, each section's."""
    return {}   # LAB12-REFERENCES (each section adds its sets)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
