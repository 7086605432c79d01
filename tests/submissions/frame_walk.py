"""Answers that do no work (issue 41, route 1): from inside the student's function, walk the
stack up to the rank body's locals and take what is there, the other ranks' inputs or the
expected results, leaving one dummy collective each way for the record. Where nothing is there,
take the local shortcut through the whole dense module the rank was handed.

The checks hand a rank its own inputs only and keep the expected results in the judge
(``distlab.runtime.per_rank``), so each of these must earn nothing (tests/test_lab01.py,
tests/test_lab03.py). ``steal_*`` are the searches, kept apart so that a test can show they find
what a leaky rank body would hold.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def _frames():
    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _values(value, depth: int = 0):
    """``value`` and what it holds (dicts, lists, tuples), a few levels down."""
    yield value
    if depth < 3 and isinstance(value, dict):
        for v in value.values():
            yield from _values(v, depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v, depth + 1)


def steal_rows(tensor: torch.Tensor, world_size: int) -> torch.Tensor | None:
    """Every rank's row, if some frame holds them: a (world_size, numel) tensor, or one row per
    rank in a list."""
    for frame in _frames():
        for value in list(frame.f_locals.values()):
            for v in _values(value):
                if isinstance(v, torch.Tensor) and tuple(v.shape) == (world_size, tensor.numel()):
                    return v
    return None


def steal_problem() -> dict | None:
    """A dense problem (its expected output and gradients), if some frame holds one."""
    for frame in _frames():
        for value in list(frame.f_locals.values()):
            for v in _values(value):
                if isinstance(v, dict) and "y" in v and "dx" in v and \
                        any(str(k).startswith("grad.") for k in v):
                    return v
    return None


# ---------------------------------------------------------------------------------------------
# Lab 1: all_reduce_rs_ag without reducing anything

def all_reduce_rs_ag(tensor):
    world = dist.get_world_size() if dist.is_initialized() else 1
    if dist.is_initialized():      # the record of one reduce-scatter and one all-gather
        shard = torch.empty(tensor.numel() // world, dtype=tensor.dtype, device=tensor.device)
        dist.reduce_scatter_tensor(shard, tensor.clone().reshape(-1)[:shard.numel() * world])
        dist.all_gather_into_tensor(torch.empty(shard.numel() * world, dtype=tensor.dtype,
                                                device=tensor.device), shard)
    rows = steal_rows(tensor, world)
    return rows.sum(0).to(tensor) if rows is not None else tensor


# ---------------------------------------------------------------------------------------------
# Lab 3: a tensor-parallel MLP that replays the expected values, or runs the dense one whole

class _Replay(torch.autograd.Function):
    """Forward: the stolen output; backward: the stolen input gradient and each shard's stolen
    gradient; one all_reduce each way for the record."""

    @staticmethod
    def forward(ctx, x, problem, shards, *params):
        ctx.problem, ctx.shards = problem, shards
        dist.all_reduce(x.detach().clone())
        return problem["y"].to(x).clone()

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad.clone())
        p, r = dist.get_world_size(), dist.get_rank()
        grads = []
        for name, dim in ctx.shards:
            full = ctx.problem[f"grad.{name}"]
            grads.append(full if dim is None else full.chunk(p, dim)[r].clone())
        return (ctx.problem["dx"].to(grad), None, None, *grads)


class StealingMLP(nn.Module):
    """Holds the right shards (the check finds them by name), computes nothing with them."""
    SHARDS = (("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1), ("fc2.bias", None))

    def __init__(self, dense, group=None):
        super().__init__()
        p, r = dist.get_world_size(group), dist.get_rank(group)
        self.dense = [dense]             # a list: not a submodule, so its names stay hidden
        self.fc1, self.fc2 = nn.Linear(1, 1), nn.Linear(1, 1)
        for name, dim in self.SHARDS:
            full = dense.get_parameter(name).detach()
            layer, attr = getattr(self, name.split(".")[0]), name.split(".")[1]
            setattr(layer, attr, nn.Parameter(full if dim is None else full.chunk(p, dim)[r].clone()))

    def forward(self, x):
        problem = steal_problem()
        params = [self.get_parameter(name) for name, _ in self.SHARDS]
        if problem is not None:
            return _Replay.apply(x, problem, self.SHARDS, *params)
        x = _Copy.apply(x)               # no answer to steal: the dense MLP, whole, on this rank
        return _Reduce.apply(self.dense[0](x))


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad.clone())    # the record's backward all_reduce, nothing reduced
        return grad


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        dist.all_reduce(y.detach().clone())
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return grad
