"""Graded checks of Lab 11, "Pipelines without bubbles".

LAB11-DOCSTRING: each section's owner lists its exercises here, in the lab's order.
1. (l11split)  the split backward, ``lab11_split``.
2. (l11tables) schedules as tables and the prediction, ``lab11_tables``.
3. (l11exec)   the executor on real ranks, ``lab11_executor``.
4. (l11design) the open design on a scale, ``lab11_design``: ``check_capped_schedule``,
   ``check_capped_schedule_bar``.
"""
from __future__ import annotations

# LAB11-IMPORTS-SPLIT (l11split: one import line of your check_* names here)


# LAB11-IMPORTS-TABLES (l11tables)


# LAB11-IMPORTS-EXECUTOR (l11exec)


# LAB11-IMPORTS-DESIGN (l11design). The judge serves only ``distlab.checks.lab11:check_*``, so
# the section's checks are defined here, each one line into its module.
from distlab.checks import lab11_design  # noqa: E402
from distlab.checks.lab11_design import VISIBLE as DESIGN_CASE, grade_capped  # noqa: E402


def check_capped_schedule(capped_schedule, world_size: int = DESIGN_CASE[0],
                          num_microbatches: int = DESIGN_CASE[1], max_held: int = DESIGN_CASE[2],
                          seed: int | None = None) -> str:
    """``capped_schedule(p, m, k)``: a complete table, its dependencies kept, at most ``k``
    held per rank, equal to one process on real ranks, its bubble at most the hinted design's."""
    return grade_capped(capped_schedule, world_size, num_microbatches, max_held, seed, "hinted")


def check_capped_schedule_bar(capped_schedule, world_size: int = DESIGN_CASE[0],
                              num_microbatches: int = DESIGN_CASE[1],
                              max_held: int = DESIGN_CASE[2], seed: int | None = None) -> str:
    """The same properties, the bubble at most the bar (halfway to the course's design)."""
    return grade_capped(capped_schedule, world_size, num_microbatches, max_held, seed, "bar")


# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py),
# each section's: the design's ranks (the course's executor, one Submitted call) need nothing.
RANK_IMPORTS: tuple[str, ...] = ()   # l11design: ()


# LAB11-COURSE-CODE: each section's checks module keeps its own COURSE_CODE (the judge reads the
# check's own module); this one merges them (the handout withholds what they name).
COURSE_CODE: dict = {}
COURSE_CODE.update(lab11_design.COURSE_CODE)   # l11design


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 11, each section's."""
    return {**lab11_design.design_sets()}   # l11design


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
