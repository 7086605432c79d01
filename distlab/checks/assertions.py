"""Comparisons that fail with a message a student can act on.

Every graded check in ``distlab.checks`` ends in one of these: it names what was compared, on which
rank, what was expected and what came, and by how much it is off.
"""
from __future__ import annotations

import contextlib
import contextvars
import os

import torch

from distlab.runtime.per_rank import plain


class CheckFailed(AssertionError):
    """A graded check found a wrong value; the message says what, where and by how much."""


# ---------------------------------------------------------------------------------------------
# What a passing check verified: the comparisons note their figures while a check runs under
# ``recording()``, and ``verdict_line`` makes the one line the feedback shows for a pass.

_NOTES: contextvars.ContextVar[list | None] = contextvars.ContextVar("distlab_verified",
                                                                   default=None)
VERDICT_CHARS = 400


class VerdictLine(str):
    """A passing check's verdict: a str that a notebook shows as its text (no quotes), so a test
    cell that ends in a check, or prints it, shows what was verified."""
    def __repr__(self) -> str:
        return str(self)


def verified(text: str, margin: float | None = None) -> None:
    """Note what a passing comparison verified, with the figures (``margin``: how much of its
    allowance the comparison used, 0..1, so the closest one is the one shown)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append((margin, text))


@contextlib.contextmanager
def recording():
    """Collect the ``verified`` notes of the comparisons made inside (one check call)."""
    token = _NOTES.set([])
    try:
        yield _NOTES.get()
    finally:
        _NOTES.reset(token)


def verdict_line(returned, notes: list) -> VerdictLine:
    """The line a passing check shows: the line (or lines) it returned itself, else what its
    comparisons verified (how many, the one nearest its tolerance first, then the others' figures
    as room allows)."""
    if isinstance(returned, str) and returned.strip():
        return VerdictLine(returned)
    if not notes:
        return VerdictLine("passed (this check compared nothing it can show)")
    margins = [m for m, _ in notes if m is not None]
    if len(notes) == 1 and not margins:
        return VerdictLine(notes[0][1][:VERDICT_CHARS])
    closest = max(notes, key=lambda n: -1.0 if n[0] is None else n[0])
    shown = [closest[1]] + [t for _, t in notes if t != closest[1]]
    head = f"{len(notes)} check{'s' if len(notes) > 1 else ''} passed"
    if margins:
        head += f", the largest error at {100 * max(margins):.2g}% of its tolerance"
    line = head + ": " + "; ".join(dict.fromkeys(shown))
    return VerdictLine(line if len(line) <= VERDICT_CHARS else line[:VERDICT_CHARS - 1] + "…")


def fresh_seed() -> int:
    """A seed nobody can know in advance: hidden tests draw their inputs from it at grading time."""
    return int.from_bytes(os.urandom(4), "little") % (2**31 - 1)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)}, dtype {str(x.dtype).removeprefix('torch.')}"
    return f"{type(x).__name__} {x!r}"[:200]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def assert_close(got, expected, *, what: str, rank: int | None = None,
                 atol: float = 1e-5, rtol: float = 1e-5, hint: str = "") -> None:
    """Raise CheckFailed unless ``got`` matches ``expected`` (tensors elementwise within
    ``atol * scale + rtol * |expected|``, other values by equality). ``scale`` is the tensor's
    largest finite ``|expected|`` when that is over 1: float32 sums taken in another order (per
    microbatch, per shard) are off by about 1e-7 of the tensor's magnitude, so an element near
    zero among large ones may be off by more than a fixed ``atol`` in a correct answer (Lab 5's
    GPipe gradients, about one hidden seed in 300)."""
    where = f" on rank {rank}" if rank is not None else ""
    tail = f"\n{hint}" if hint else ""
    if not isinstance(expected, torch.Tensor):
        if got != expected:
            raise CheckFailed(f"{what}{where}: expected {expected!r}, got {got!r}.{tail}")
        verified(f"{what}{where} = {_short(got)} as expected")
        return
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{what}{where}: expected a {_describe(expected)}, got {_describe(got)}.{tail}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{what}{where}: expected shape {list(expected.shape)}, "
                          f"got shape {list(got.shape)}.{tail}")
    # The expected result's mark (``per_rank.reference``) dropped for the arithmetic: a tensor
    # subclass sends each of the dozen operations below through Python (a third of the cost of
    # a comparison); nothing computed here leaves the judge but the numbers of the message.
    got_f, exp_f = got.detach().cpu().double(), plain(expected).detach().cpu().double()
    # Equal infinities (both −∞: a fully masked row) and NaN against NaN are equal, not an
    # error of nan; NaN against a number is wrong (a comparison with NaN is never "within").
    same = (got_f == exp_f) | (torch.isnan(got_f) & torch.isnan(exp_f))
    err = torch.where(same, torch.zeros_like(got_f), (got_f - exp_f).abs())
    finite = exp_f[torch.isfinite(exp_f)].abs()
    scale = max(1.0, finite.max().item()) if finite.numel() else 1.0
    bad = ~same & ~(err <= atol * scale + rtol * exp_f.abs())
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        scaled = f" x {scale:.3g} (the largest |expected|)" if scale > 1 else ""
        first = (f" First wrong element at index {list(idx)}: expected {exp_f[idx].item():.6g}, "
                 f"got {got_f[idx].item():.6g}." if idx or got_f.dim() == 0 else "")
        wrong = err[bad]
        nans = int(torch.isnan(wrong).sum())
        largest = (f"max abs error {wrong[~torch.isnan(wrong)].max().item():.3g}"
                   if nans < wrong.numel() else "every one nan against a number")
        if 0 < nans < wrong.numel():
            largest += f"; {nans} of them nan against a number"
        raise CheckFailed(
            f"{what}{where}: {int(bad.sum())} of {bad.numel()} elements differ "
            f"({largest}, allowed {atol:g}{scaled} + {rtol:g}*|expected|)."
            f"{first}{tail}")
    compared = torch.isfinite(err)   # NaN (or -inf) where both are: no error to show
    err, allowed = err[compared], (atol * scale + rtol * exp_f.abs())[compared]
    worst = err.max().item() if err.numel() else 0.0
    margin = float((err / allowed).max()) if err.numel() and bool((allowed > 0).all()) else None
    verified(f"{what}{where}: max abs error {worst:.2g} (allowed {atol * scale:.2g} "
             f"+ {rtol:.2g}·|expected|)", margin)
