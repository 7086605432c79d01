"""The course's stored sets of Lab 10 (``data/10_context_parallel/<name>.pt``, written by
``distlab references 10_context_parallel`` from ``distlab.checks.lab10.make_references``).

A handout has no plain attention to compare with (``dense_attention`` is the checks' reference):
the lab's demonstrations compare the student's functions with these stored outputs.
"""
from __future__ import annotations

import torch

from distlab import paths

LAB = "10_context_parallel"


def stored_set(name: str) -> dict[str, torch.Tensor]:
    """The stored set ``name`` (e.g. "demos")."""
    path = paths.data() / LAB / f"{name}.pt"
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with `distlab references {LAB}`") \
            from None
