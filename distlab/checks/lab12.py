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

# Sections 5 and 6, how often to save (``lab12_interval``): the prediction and the open design
from distlab.checks import lab12_interval  # noqa: E402
COURSE_CODE = {**COURSE_CODE, **lab12_interval.COURSE_CODE}


def check_lost_prediction(predict_lost_fraction, seed: int | None = None) -> str:
    """``predict_lost_fraction(tau, delta, restart, mtbf)``: the expected fraction of time lost,
    within first order's own error of the model, on three cases."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_lost_prediction(predict_lost_fraction, seed)


def check_checkpoint_plan(plan_checkpoints, seed: int | None = None) -> str:
    """``plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write) -> (interval,
    mode)``: on three problems, the expected loss at most the hinted design's."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_plan(plan_checkpoints, seed, "hinted")


def check_checkpoint_plan_bar(plan_checkpoints, seed: int | None = None) -> str:
    """The same problems, the expected loss at most the bar (halfway to the best plan's)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_plan(plan_checkpoints, seed, "bar")

# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py).
RANK_IMPORTS: tuple[str, ...] = ()   # LAB12-RANK-IMPORTS (each section adds what its ranks need)
# Section 4's ranks (measured: a rank with nothing preloaded, after the solution's loop): FSDP2
# and DTensor, the optimizer (AdamW imports torch._dynamo, which imports part of _inductor), DCP
RANK_IMPORTS += ("torch._dynamo", "torch._inductor", "torch.distributed.tensor",
                 "torch.distributed.fsdp", "torch.distributed.checkpoint",
                 "torch.distributed.checkpoint.state_dict")


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 12, each section's."""
    # LAB12-REFERENCES (each section adds its sets)
    return {**lab12_interval.lost_prediction_sets(), **lab12_interval.plan_sets()}


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
