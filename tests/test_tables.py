"""distlab.labs.tables.format_table: every key a column, every value a cell, numbers aligned
right and words left; largest_residue: a difference that is rounding shows as its bound."""
from __future__ import annotations

import torch

from distlab.labs.tables import format_table, largest_residue, residue


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


def test_largest_residue_is_bounded_in_the_computations_own_precision():
    """float32 results are compared in float32 units (a float64 bound would call their rounding a
    real difference), float64 in float64's; the scale is the expected values' largest |value|."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    ref = a @ b
    by_rows = torch.cat([a[:32] @ b, a[32:] @ b])                 # same products, other kernels
    by_k = a[:, :32] @ b[:32] + a[:, 32:] @ b[32:]               # sums in another order
    diff, shown = largest_residue([(by_rows, ref), (by_k, ref)])
    assert 0 < diff == max((by_k - ref).abs().max().item(), (by_rows - ref).abs().max().item())
    eps32 = torch.finfo(torch.float32).eps
    scale = ref.abs().max().item()
    assert shown == residue(0.0, scale, eps=eps32) and shown.startswith("< 1e-")
    diff64, shown64 = largest_residue([(by_k.double(), ref.double())])
    assert diff64 == diff and shown64 == f"{diff:.2e}"      # float32 rounding, seen in float64
    exact = a.double()[:, :32] @ b.double()[:32] + a.double()[:, 32:] @ b.double()[32:]
    assert largest_residue([(exact, a.double() @ b.double())])[1] == residue(0.0, scale)
    wrong = ref.clone()
    wrong[3, 5] += 0.5                                           # a bug's size shows its digits
    assert largest_residue([(wrong, ref)])[1] == "5.00e-01"
