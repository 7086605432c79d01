"""A passing check's one line of figures, kept within ``VERDICT_CHARS``: the cases a check
verified are listed until the line is full, then counted ("and 2 more"), so a hidden test with
many cases still shows a true line and never one the grader cuts mid-figure."""
from __future__ import annotations

from distlab.checks.assertions import VERDICT_CHARS


def joined(head: str, parts: list[str], tail: str = "", sep: str = "; ") -> str:
    """``head`` + as many of ``parts`` as fit + ``tail``, with "and N more" for the rest."""
    for shown in range(len(parts), -1, -1):
        rest = len(parts) - shown
        more = f"{sep if shown else ''}and {rest} more" if rest else ""
        line = head + sep.join(parts[:shown]) + more + tail
        if len(line) <= VERDICT_CHARS:
            return line
    return (head + tail)[:VERDICT_CHARS]
