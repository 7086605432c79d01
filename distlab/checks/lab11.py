"""Graded checks of Lab 11, "Pipelines without bubbles".

LAB11-DOCSTRING: each section's owner lists its exercises here, in the lab's order.
1. (l11split)  the split backward, ``backward_input`` / ``backward_weight`` (B, W), and the
   prediction ``predict_held_bytes``: ``lab11_split``.
2. (l11tables) schedules as tables and the prediction, ``lab11_tables``.
3. (l11exec)   the executor on real ranks, ``lab11_executor``.
4. (l11design) the open design on a scale, ``lab11_design``.
"""
from __future__ import annotations

from distlab.checks.lab11_split import (COURSE_CODE, check_held_prediction,  # noqa: F401
                                        check_split_backward, make_references)


# LAB11-IMPORTS-TABLES (l11tables)


# LAB11-IMPORTS-EXECUTOR (l11exec)


# LAB11-IMPORTS-DESIGN (l11design)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
