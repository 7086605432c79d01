"""Graded checks of Lab 11, "Pipelines without bubbles".

LAB11-DOCSTRING: each section's owner lists its exercises here, in the lab's order.
1. (l11split)  the split backward, ``lab11_split``.
2. (l11tables) schedules as tables and the prediction, ``lab11_tables``.
3. (l11exec)   ``run_table(row, stages, placement, num_microbatches)``: one rank's row of any
   schedule table run with isend/irecv, equal to one process within 1e-6, the table's messages
   (``lab11_executor``).
4. (l11design) the open design on a scale, ``lab11_design``.
"""
from __future__ import annotations

# LAB11-IMPORTS-SPLIT (l11split: one import line of your check_* names here)


# LAB11-IMPORTS-TABLES (l11tables)


# LAB11-IMPORTS-EXECUTOR (l11exec)
from distlab.checks.lab11_executor import EXECUTOR_SHIPPED, executor_set, torch_set  # noqa: E402


def check_executor(run_table, seed: int | None = None, world_size: int = 4,
                   num_microbatches: int = 8) -> str:
    """``run_table(row, stages, placement, num_microbatches)`` on every rank, for the course's
    interleaved 1F1B (v = 2), ZB-H1 and zero-bubble V tables: the loss and every gradient equal
    one process's within 1e-6 (float64); only isend/irecv, exactly the table's messages per
    peer; a deadlock reported after 10 s of no progress (``lab11_executor``)."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab11_executor import grade_executor
    return grade_executor(run_table, seed, world_size, num_microbatches)


# LAB11-IMPORTS-DESIGN (l11design)


# What the ranks of this lab's checks import beyond torch.distributed (l11exec: none; measured
# with the solution, distlab/checks/__init__.py); each section adds its own.
RANK_IMPORTS = ()


def make_references() -> dict:
    """The stored sets of every section (``distlab references 11_pipeline_schedules``)."""
    return {"executor": executor_set(), "torch": torch_set()}


# The course code each exercise may not use (distlab.checks.course_code); each section adds its own.
from distlab.checks.course_code import CourseCode  # noqa: E402
COURSE_CODE = {"check_executor": CourseCode(forbidden=EXECUTOR_SHIPPED)}
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
