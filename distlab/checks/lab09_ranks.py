"""Lab 9's checks' rank runs (``_run``: ranks that broke a collective become a failed check, with
the hint that applies) and their tolerance (``_close``: atol = rtol = 1e-4 in float32; the ranks
compute the same products on the same rows in other batch groupings, about 1e-6 apart here, while
a token sent to the wrong expert, or a missing gate, moves values by O(0.1)). Shared by
``lab09`` and ``lab09_design``."""
from __future__ import annotations

from distlab.checks.assertions import assert_close
from distlab.checks.rank_failures import ranks_failed
from distlab.checks.ranks import run_each_backend
from distlab.runtime.outcome import DistributedError

ATOL = RTOL = 1e-4
SPLITS_HINT = ("The token all-to-all failed: the sizes one rank sends must be the sizes its peer "
               "expects. Rank r's output_split_sizes are the counts every *source* rank sends "
               "it (what the count exchange returned), its input_split_sizes its own counts "
               "per destination.")


def _close(got, expected, what: str, rank, hint: str = "") -> None:
    assert_close(got, expected, what=what, rank=rank, atol=ATOL, rtol=RTOL, hint=hint)


MISSING_HINT = ("A rank left out an all-to-all the others called. Every rank joins every "
                "all-to-all, forward and backward, even one whose experts got no token (its "
                "splits are zeros): run each local expert on its rows even when there are none, "
                "so that the combine's output depends on the dispatch on every rank and autograd "
                "runs both backward all-to-alls everywhere.")
SIZE_MISMATCH = ("doesn't match", "does not match", "mismatch", "Split sizes", "SIGABRT")


def failure_hint(text: str) -> str:
    """The hint that applies to ranks that failed with ``text``: a token all-to-all whose sizes
    disagreed (``SPLITS_HINT``), or one a rank never called (``MISSING_HINT``); else none."""
    if "all_to_all" not in text:
        return ""
    if "without calling it" in text:
        return MISSING_HINT
    if any(mark in text for mark in SIZE_MISMATCH):
        return SPLITS_HINT
    return ""


def _run(fn, world_size: int, what: str, *args, hint_of=failure_hint):
    """``run_each_backend``, with a collective that broke the ranks turned into a failed check
    (tracebacks cut to the student's frames, and the hint ``hint_of(message)`` gives)."""
    __tracebackhide__ = True  # noqa: F841
    try:
        return run_each_backend(fn, world_size, *args)
    except DistributedError as err:
        raise ranks_failed(what, err, hint_of(str(err))) from None
