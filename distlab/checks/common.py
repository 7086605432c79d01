"""Pieces the graded checks of several labs share."""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.checks.assertions import CheckFailed
from distlab.runtime.devices import device as rank_device  # noqa: F401 (re-exported for the checks)


def dense_run(model: nn.Module, x: torch.Tensor, dy: torch.Tensor, prefix: str = "") -> dict:
    """Forward x, backward with upstream gradient dy; weights, output, dL/dx and dL/dparams."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * dy).sum().backward()
    out = {f"{prefix}y": y.detach(), f"{prefix}dx": x.grad}
    for name, p in model.named_parameters():
        out[f"{prefix}param.{name}"] = p.detach().clone()
        out[f"{prefix}grad.{name}"] = p.grad
    return out


def cut(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """The plain slice rank r owns: elements [r*n/p, (r+1)*n/p) along dim."""
    n = t.shape[dim] // world_size
    return t.narrow(dim, rank * n, n)


def split_phases(comms, count: int, what: str, rank: int) -> list[list]:
    """Split a rank's record at the barriers the check's rank body puts between phases."""
    from distlab.labs.tensor_parallel import split_at_barriers
    phases = split_at_barriers(comms)
    if len(phases) != count:
        raise CheckFailed(f"{what}: rank {rank} called dist.barrier() itself; remove it (the check "
                          f"uses barriers to tell the forward from the backward).")
    return phases


def describe_comms(comms) -> str:
    return ", ".join(f"{c.op} of {list(c.shapes[0]) if c.shapes else '?'} ({c.bytes} bytes)"
                     for c in comms) or "no collective"
