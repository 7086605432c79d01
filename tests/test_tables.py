"""distlab.labs.tables.format_table: every key a column, every value a cell, numbers aligned
right and words left."""
from __future__ import annotations

from distlab.labs.tables import format_table


def test_columns_are_the_keys_and_numbers_align_right():
    text = format_table([{"scheme": "DP", "collectives": "4 all_reduce", "bytes": "395,040",
                          "psi": "8.00Ψ", "diff": "-1.2e-16", "memory": "49,380 / 49,380"},
                         {"scheme": "ZeRO-1", "collectives": "1 all_gather", "bytes": "98,760",
                          "psi": "2.00Ψ", "diff": "3.0e-17", "memory": "4 / 1,004"}])
    header, rule, first, second = text.splitlines()
    assert header.split() == ["scheme", "collectives", "bytes", "psi", "diff", "memory"]
    assert rule.split() == ["-" * 6, "-" * 12, "-" * 7, "-" * 5, "-" * 8, "-" * 15]
    # columns line up: each cell ends (numbers) or starts (words) where its rule does
    ends = [i + 1 for i, (a, b) in enumerate(zip(rule, rule[1:] + " ")) if a == "-" and b == " "]
    starts = [i for i, (a, b) in enumerate(zip(" " + rule, rule)) if a == " " and b == "-"]
    assert first[starts[1]:].startswith("4 all_reduce")          # words: left
    assert second[:ends[2]].endswith(" 98,760")                  # numbers: right
    assert header[:ends[2]].endswith(" bytes")                   # and their header
    assert first[:ends[4]].endswith("-1.2e-16") and second[:ends[3]].endswith(" 2.00Ψ")
    assert second[:ends[5]].endswith("    4 / 1,004")
    assert header[starts[1]:].startswith("collectives")


def test_values_are_str_of_the_dicts_values_and_empty_is_said():
    text = format_table([{"rank": 0, "group": (0, 1)}, {"rank": 12, "group": (2, 3)}])
    assert text.splitlines() == ["rank  group", "----  ------", "   0  (0, 1)", "  12  (2, 3)"]
    assert format_table([]) == "(nothing)"
