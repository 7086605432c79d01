"""Comparisons that fail with a message a student can act on.

Every graded check in ``distlab.checks`` ends in one of these: it names what was compared, on which
rank, what was expected and what came, and by how much it is off.
"""
from __future__ import annotations

import os

import torch


class CheckFailed(AssertionError):
    """A graded check found a wrong value; the message says what, where and by how much."""


def fresh_seed() -> int:
    """A seed nobody can know in advance: hidden tests draw their inputs from it at grading time."""
    return int.from_bytes(os.urandom(4), "little") % (2**31 - 1)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)}, dtype {str(x.dtype).removeprefix('torch.')}"
    return f"{type(x).__name__} {x!r}"[:200]


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
        return
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(f"{what}{where}: expected a {_describe(expected)}, got {_describe(got)}.{tail}")
    if got.shape != expected.shape:
        raise CheckFailed(f"{what}{where}: expected shape {list(expected.shape)}, "
                          f"got shape {list(got.shape)}.{tail}")
    got_f, exp_f = got.detach().cpu().double(), expected.detach().cpu().double()
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
