"""The course's stored outputs of Lab 9's demonstrations: what the plain single-process layer
computes for the lab's own cases (``data/09_expert_parallel/demos.pt``, written by
``distlab references 09_expert_parallel`` from ``distlab.checks.lab09.make_references``).

A student's handout has no plain layer (``MoE.forward`` is the reference the checks compare
with), so the lab's figures compare the student's distributed layer with these; any other case
computes the plain layer afresh, which only the course's full package can.
"""
from __future__ import annotations

import torch

from distlab import paths

LAB = "09_expert_parallel"


def stored_output(key: str):
    """Tensor ``key`` of the stored demonstrations set."""
    path = paths.data() / LAB / "demos.pt"
    try:
        stored = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with `distlab references {LAB}`") \
            from None
    if key not in stored:
        raise KeyError(f"{path} has no {key!r}: rebuild it with `distlab references {LAB}`")
    return stored[key]
