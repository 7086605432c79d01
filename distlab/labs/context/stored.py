"""The course's stored sets of Lab 10 (``data/10_context_parallel/<name>.pt``, written by
``distlab references 10_context_parallel`` from ``distlab.checks.lab10.make_references``).

A handout has no plain attention to compare with (``dense_attention`` is the checks' reference):
the lab's demonstrations compare the student's functions with these stored outputs.
"""
from __future__ import annotations

import torch

from distlab.labs.stored_sets import load_set

LAB = "10_context_parallel"


def stored_set(name: str) -> dict[str, torch.Tensor]:
    """The stored set ``name`` (e.g. "demos")."""
    return load_set(LAB, name)
