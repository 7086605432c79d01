"""The stored reference sets that visible tests read: ``data/<lab>/<name>.pt``, each verified
against the sha256 in ``data/<lab>/manifest.json`` (written by ``distlab references``), so a stale
or edited reference is an error, not a silent wrong grade."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import torch

from distlab import paths

MANIFEST = "manifest.json"

# How close a stored value and the same value recomputed now must be, on any CPU torch supports.
# Torch picks its CPU kernels by instruction set (AVX-512, AVX2, NEON, none; ATEN_CPU_CAPABILITY
# forces one): sums round in another order, and float32 random draws (randn's Box-Muller, the
# weights' uniform init) come out a few float32 ulps apart (up to 5.6 measured between AVX-512 and
# `default`), so a value drawn from the same seed starts from other inputs on another CPU,
# whatever dtype it is then computed in (Labs 2 and 8 draw their weights in float32 and train in
# float64). Tolerances are relative to the tensor's largest |value|, and to 1 when that is
# smaller (as in assertions.assert_close): an element near zero among large ones carries the
# rounding of the large ones, and a small value made from the labs' inputs of order 1 (randn
# draws), such as a residue or a difference, carries theirs.
EPS32 = torch.finfo(torch.float32).eps
# Drawn inputs 8 ulps apart, through a forward and backward pass of a few layers, each adding
# about as much again: 32 float32 ulps, 3.8e-6 (measured at most 9 ulps, Lab 9's router gradient).
DRAWN = 32 * EPS32
# Float64 from the same inputs (formulas, stored timings, parsed traces): a sum in another order
# is off by ~1e-16 of its terms; 1e-12 leaves room for long sums and is far below any code change.
EXACT64 = 1e-12


def tolerance(expected: torch.Tensor, rel: float = DRAWN, steps: int = 1) -> dict[str, float]:
    """``rtol``/``atol`` for ``torch.testing.assert_close(recomputed, stored)``: ``rel`` of the
    tensor's largest finite |value| or of 1, whichever is larger, times
    ``steps`` for an optimizer's trajectory (each AdamW step divides a gradient by its own size,
    so it hands the gradient's relative error on to the update, and the steps add up). Integers
    are exact."""
    if not (expected.is_floating_point() or expected.is_complex()):
        return {"rtol": 0.0, "atol": 0.0}
    values = expected.detach().abs().double()
    finite = values[torch.isfinite(values)]
    scale = finite.max().item() if finite.numel() else 0.0
    r = rel * steps
    return {"rtol": r, "atol": r * max(1.0, scale)}


def load(lab: str, name: str, data: Path | None = None) -> dict[str, torch.Tensor]:
    """Reference set ``name`` of ``lab``, verified against the manifest's sha256."""
    folder = (data or paths.data()) / lab
    fix = f"Rebuild the references with `distlab references {lab}` (or `make references`)."
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        entry = manifest["files"][f"{name}.pt"]
        blob = (folder / f"{name}.pt").read_bytes()
    except (OSError, KeyError, ValueError) as err:
        raise FileNotFoundError(f"reference set {name!r} of {lab} is missing in {folder} ({err}). {fix}")
    if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        raise ValueError(f"{folder / (name + '.pt')} does not match its sha256 in the manifest. {fix}")
    return torch.load(io.BytesIO(blob), weights_only=True)


def expected_values(lab: str, name: str, key: str, seed: int | None, cases, formula) -> list:
    """What a prediction's check expects for ``cases``: for the visible test (``seed`` None) the
    values stored in set ``name`` under ``key`` (a handout holds no formula); for hidden cases,
    ``formula(case)`` for each, computed where the check runs (the judge)."""
    if seed is None:
        return load(lab, name)[key].tolist()
    return [formula(case) for case in cases]
