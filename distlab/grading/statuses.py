"""The one mapping from what happened to a test to its status in scores.csv and the feedback.

Two places see outcomes: the judge sees the exception a check raised, and the scoring sees the
error a test cell showed (its ``ename`` and message). Both name an exception, so both ask
``status_for`` with the exception's class names.
"""
from __future__ import annotations

STATUSES = ("pass", "fail", "error", "hang", "crash", "timeout", "not-done", "not-run", "tampered",
            "missing")

# Exception class name -> status, first match wins (a class's own name before its bases').
_BY_NAME = {
    "CheckFailed": "fail",              # a check compared and found a wrong answer
    "HangError": "hang",                # distlab.run stopped stuck ranks
    "RankCrashed": "crash",             # a rank's process died
    "DeadKernelError": "crash",         # the student's kernel died
    "NotRun": "not-run",                # a cell after the kernel died
    "CellTimeoutError": "timeout",      # nbclient's per-cell limit
    "TimeoutError": "timeout",
    "NotImplementedError": "not-done",  # the stub as handed out
}


def status_for(names: list[str], not_done: bool = False) -> str:
    """The status of an error whose exception classes are ``names`` (most derived first);
    ``not_done``: the student's code raised NotImplementedError underneath (on a rank, in a
    traceback), which is an exercise not done unless a more telling name matched first."""
    for name in names:
        if name in _BY_NAME and _BY_NAME[name] != "not-done":
            return _BY_NAME[name]
    if not_done or "NotImplementedError" in names:
        return "not-done"
    return "error"


def status_of_exception(exc: BaseException) -> str:
    """The status of an exception a check raised in the judge."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    # RankError and SubmittedError carry the type the student's code raised on its rank.
    return status_for(names, not_done=getattr(exc, "exc_type", "") == "NotImplementedError")


def status_of_cell(cell, score: float, max_score: float) -> tuple[str, str]:
    """(status, message) of an executed test cell, from its score and the last error it showed."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if score >= max_score and not errors:
        return "pass", ""
    if not errors:
        return ("missing", "the cell did not run") if cell.get("execution_count") is None \
            else ("fail", "no error, but not full marks")
    ename, evalue = errors[-1].get("ename", ""), str(errors[-1].get("evalue", ""))
    message = f"{ename}: {evalue}".strip()
    return status_for([ename], not_done="NotImplementedError" in message), message
