"""Graded checks of Lab 12, "When a rank dies".

Exercises, in the lab's order (each section's grading in its own module):
LAB12-DOC-STATE (l12state: Sections 1 and 2)
LAB12-DOC-RESTART (l12restart: Sections 3 and 4)
LAB12-DOC-INTERVAL (l12interval: Sections 5 and 6)
"""
from __future__ import annotations

from distlab.checks.course_code import CourseCode  # noqa: F401

COURSE_CODE: dict = {}

# LAB12-CHECKS-STATE (l12state: import your module, define your check_* wrappers here, merge
# your COURSE_CODE and make_references; the judge serves only this module's check_*)

# LAB12-CHECKS-RESTART (l12restart: the same)

# LAB12-CHECKS-INTERVAL (l12interval: the same)

# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py).
RANK_IMPORTS: tuple[str, ...] = ()   # LAB12-RANK-IMPORTS (each section adds what its ranks need)


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 12, each section's."""
    return {}   # LAB12-REFERENCES (each section adds its sets)


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
