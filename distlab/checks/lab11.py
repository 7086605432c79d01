"""Graded checks of Lab 11, "Pipelines without bubbles".

LAB11-DOCSTRING: each section's owner lists its exercises here, in the lab's order.
1. (l11split)  the split backward, ``lab11_split``.
2. (l11tables) schedules as tables and the prediction, ``lab11_tables``: ``interleaved_1f1b(p, m,
   v)``, ``zb_h1(p, m)``, ``zb_v(p, m)`` (tables replayed: valid, bubble and peak no worse than
   expected) and ``predict_interleaved(p, m, v)``.
3. (l11exec)   the executor on real ranks, ``lab11_executor``.
4. (l11design) the open design on a scale, ``lab11_design``.
"""
from __future__ import annotations

# LAB11-IMPORTS-SPLIT (l11split: one import line of your check_* names here)


from distlab.checks import lab11_tables  # noqa: E402
from distlab.checks.lab11_tables import (check_interleaved_1f1b, check_interleaved_prediction,  # noqa: E402,F401
                                         check_zb_h1, check_zb_v)
COURSE_CODE = {**globals().get("COURSE_CODE", {}), **lab11_tables.COURSE_CODE}   # each section adds its own


# LAB11-IMPORTS-EXECUTOR (l11exec)


# LAB11-IMPORTS-DESIGN (l11design)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
