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
