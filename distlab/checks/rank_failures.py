"""A run of the student's code that broke the ranks, as a failed check: the ranks' own message,
its traceback cut to the student's frames (the course's harness, PyTorch and Python are not
what the student can change), and a hint where one applies.

``student_frames(tb)`` keeps, of a Python traceback's text, the frames of files outside the
``distlab`` package, the installed packages and Python's library; ``ranks_failed(what, err)``
rewrites a ``DistributedError``'s message with it into a ``CheckFailed``.
"""
from __future__ import annotations

import re
import sysconfig
from pathlib import Path

from distlab.checks.assertions import CheckFailed

_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')
_NOT_STUDENT = tuple({str(Path(__file__).resolve().parents[1])} |
                     {str(Path(p).resolve()) for k, p in sysconfig.get_paths().items()
                      if k in ("stdlib", "platstdlib", "purelib", "platlib")})


# A copy of the package, such as a lab's student package (distlab.grading.student_package),
# whose frames a grader's ranks show: a "distlab" folder holding the package's own entries.
_PACKAGE_ENTRIES = frozenset(p.name for p in Path(__file__).resolve().parents[1].iterdir())


def _in_a_distlab_package(path: str) -> bool:
    parts = Path(path).parts
    return any(part == "distlab" and parts[i + 1] in _PACKAGE_ENTRIES
               for i, part in enumerate(parts[:-1]))


def _is_student(path: str) -> bool:
    try:
        resolved = str(Path(path).resolve())
    except (OSError, ValueError):
        resolved = path
    return not (resolved.startswith(_NOT_STUDENT) or "site-packages" in path
                or "dist-packages" in path or path.startswith("<frozen")
                or _in_a_distlab_package(path))


def student_frames(tb: str) -> tuple[str, int]:
    """(the traceback ``tb`` with only the student's frames, each with its source lines, the
    headers and the exception lines; how many frames it kept). A line says how many it left out."""
    out, kept, left_out, keep = [], 0, 0, True
    for line in tb.rstrip().splitlines():
        frame = _FRAME.match(line)
        if frame:
            keep = _is_student(frame["path"])
            kept, left_out = kept + keep, left_out + (not keep)
        elif not line.startswith(" "):
            keep = True   # a header or the exception's own lines
        if keep:
            out.append(line)
    if left_out:
        out.insert(1 if out else 0, f"  ({left_out} frames of the course's code, PyTorch and "
                                    f"Python left out)")
    return "\n".join(out), kept


def cut_tracebacks(message: str, rank_traceback: str | None) -> str:
    """``message`` (a ``RankError``'s) with its traceback section cut to the student's frames;
    a traceback without any is left out (its last line is the message's first)."""
    tb = (rank_traceback or "").rstrip()
    if not tb or tb not in message:
        return message
    cut, kept = student_frames(tb)
    if kept:
        return message.replace(tb, cut)
    section = re.search(r"\n*--- traceback on rank \d+ ---\n" + re.escape(tb) + r"\n*", message)
    if not section:
        return message.replace(tb, cut)
    return (message[:section.start()] + "\n(no line of yours in its traceback: it failed in the "
            "course's code or PyTorch, called with your code)\n\n" + message[section.end():])


def ranks_failed(what: str, err: Exception, hint: str = "") -> CheckFailed:
    """A ``CheckFailed`` for a run of ``what`` whose ranks failed with ``err`` (a
    ``DistributedError``): its message, tracebacks cut to the student's frames, and ``hint``."""
    text = cut_tracebacks(str(err), getattr(err, "rank_traceback", None))
    return CheckFailed(f"{what}: the ranks failed.\n{text}" + (f"\n{hint}" if hint else ""))
