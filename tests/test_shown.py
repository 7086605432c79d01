"""A passing check's line of figures (distlab.checks.shown): every case while they fit, then a
count of the rest, never over VERDICT_CHARS."""
from distlab.checks.assertions import VERDICT_CHARS
from distlab.checks.shown import joined


def test_cases_that_fit_are_all_shown():
    assert joined("x: ", ["a 1", "b 2"], " bytes") == "x: a 1; b 2 bytes"


def test_cases_beyond_the_line_are_counted_not_cut():
    parts = [f"case {i}: {i * 1000:,} bytes" for i in range(40)]
    line = joined("head: ", parts, " per step")
    shown = line.count("case ")
    one_more = "head: " + "; ".join(parts[:shown + 1]) + f"; and {39 - shown} more per step"
    assert len(line) <= VERDICT_CHARS < len(one_more)      # as many as fit, and no more
    assert line.endswith(f"; and {40 - shown} more per step") and 0 < shown < 40
    assert parts[shown - 1] in line and parts[shown] not in line
