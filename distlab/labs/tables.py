"""Plain-text tables of the labs' measurements (a list of dicts with the same keys)."""
from __future__ import annotations

import math
import re
import sys

# A number as the labs print one: sign, digits with thousands commas, decimals, exponent, and a
# unit sign that is not a letter ("%", "Ψ").
_NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?[^\sA-Za-z0-9]{0,2}")


def _is_number(text: str) -> bool:
    """A cell of numbers ("12", "-3.5e-07", "2.00Ψ", "49,380 / 49,380"): aligned right; a cell
    with words in it ("4 all_reduce") is text."""
    parts = text.split()
    return bool(parts) and all(p == "/" or _NUMBER.fullmatch(p) for p in parts)


def format_table(rows: list[dict]) -> str:
    """A plain-text table of dicts (same keys; the keys are the header). Cells are ``str()`` of
    the values, so a caller formats numbers (digits, units) before; cells that read as numbers
    are right-aligned, and so is the header of a column whose cells all do."""
    if not rows:
        return "(nothing)"
    keys = list(rows[0])
    cells = [[str(r.get(k, "")) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    numeric = [all(_is_number(c[i]) for c in cells if c[i]) for i in range(len(keys))]

    def line(vals, header=False) -> str:
        return "  ".join((v.rjust(w) if (num if header else _is_number(v)) else v.ljust(w))
                         for v, w, num in zip(vals, width, numeric)).rstrip()
    return "\n".join([line(keys, header=True), line(["-" * w for w in width])]
                     + [line(c) for c in cells])


def residue(value: float, scale: float, eps: float = sys.float_info.epsilon, ulps: int = 32) -> str:
    """A difference that should be rounding, as a table shows it: ``"< 1e-14"`` when ``|value|``
    is under ``ulps`` units of rounding (``eps``, float64's by default) of numbers as large as
    ``scale``, the bound rounded up to a power of ten; else the value's digits, a real difference.
    Rounding's own digits depend on the CPU (torch picks its kernels by instruction set), so a
    table that printed them would differ from machine to machine."""
    bound = 10.0 ** math.ceil(math.log10(ulps * eps * max(abs(scale), sys.float_info.min)))
    return f"< {bound:.0e}" if abs(value) < bound else f"{value:.2e}"


def largest_residue(pairs) -> tuple[float, str]:
    """The largest ``|got - expected|`` over ``pairs`` of tensors of one floating dtype, and how
    a table shows it: ``residue`` against the expected tensors' largest |value|, in units of
    their dtype's rounding (float32's for a float32 computation: 2**-23, not float64's 2**-52)."""
    import torch
    diff, scale, eps = 0.0, 0.0, 0.0
    for got, expected in pairs:
        expected = expected.detach()
        diff = max(diff, float((got.detach().to(expected.device) - expected).abs().max()))
        scale = max(scale, float(expected.abs().max()))
        eps = max(eps, torch.finfo(expected.dtype).eps)
    return diff, residue(diff, scale, eps=eps or sys.float_info.epsilon)
