"""A lab's graded checks run in the test process, each to "pass" or its failure message: what a
planted mistake test compares (the mistake loses exactly its own test)."""
from __future__ import annotations

from typing import Callable

from distlab.checks.assertions import CheckFailed


def verdicts(calls: dict[str, Callable[[], object]]) -> dict[str, str]:
    """{test id: "pass" or the CheckFailed message} of each call, in order."""
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "pass"
        except CheckFailed as err:
            out[name] = str(err)
    return out
