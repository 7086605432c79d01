"""A lab's stored sets (``data/<lab>/<name>.pt``, written by ``distlab references <lab>`` from the
lab's ``make_references``): what a handout's demonstrations compare with when it has no reference
of its own."""
from __future__ import annotations

import torch

from distlab import paths


def load_set(lab: str, name: str) -> dict[str, torch.Tensor]:
    """The stored set ``name`` of ``lab``; a missing file says how to make it."""
    path = paths.data() / lab / f"{name}.pt"
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with `distlab references {lab}`") \
            from None
