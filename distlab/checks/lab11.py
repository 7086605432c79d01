"""Graded checks of Lab 11, "Pipelines without bubbles".

LAB11-DOCSTRING: each section's owner lists its exercises here, in the lab's order.
1. (l11split)  the split backward, ``backward_input`` / ``backward_weight`` (B, W), and the
   prediction ``predict_held_bytes``: ``lab11_split``.
2. (l11tables) schedules as tables and the prediction, ``lab11_tables``.
3. (l11exec)   the executor on real ranks, ``lab11_executor``.
4. (l11design) the open design on a scale, ``lab11_design``.
"""
from __future__ import annotations

from distlab.checks import lab11_split  # noqa: E402
from distlab.checks.lab11_split import COURSE_CODE, make_references  # noqa: E402,F401


def check_split_backward(backward_input, backward_weight, seed: int | None = None, layers=2,
                         hidden=6, batch=8) -> str:
    """backward_input / backward_weight (B, W) of the first, a middle and the last stage, two
    microbatches each: equal to the full backward; B computes no weight gradient, W no input
    gradient (``lab11_split``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_split.grade_split_backward(backward_input, backward_weight, seed, layers,
                                            hidden, batch)


def check_held_prediction(predict_held_bytes, seed: int | None = None) -> str:
    """predict_held_bytes(num_layers, batch, hidden, itemsize): the bytes held between B and W,
    recompute and keep (``lab11_split``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_split.grade_held_prediction(predict_held_bytes, seed)


# LAB11-IMPORTS-TABLES (l11tables)


# LAB11-IMPORTS-EXECUTOR (l11exec)


# LAB11-IMPORTS-DESIGN (l11design)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
