"""Answers that do no work (issue 41, route 1): from inside the student's function, walk the
stack up to the rank body's locals and take what is there, the other ranks' inputs or the
expected results, keeping the communication of an honest answer (or one dummy collective each
way) for the record. Where nothing is there, answer zeros or take the local shortcut through the
whole dense module the rank was handed.

The checks hand a rank its own inputs only and keep the expected results in the judge
(``distlab.runtime.per_rank``), so each of these must earn nothing.

- Labs 1 and 3, as Python functions (tests/test_lab01.py, tests/test_lab03.py; Lab 1's is also
  graded by the real grader, tests/submissions/attacks.py): ``steal_rows`` and ``steal_problem``
  are the searches, kept apart so that a test can show they find what a leaky rank body would
  hold.
- Labs 9 and 10, as code a student could put in a solution cell (tests/test_per_rank_checks.py):
  ``STEAL`` is the search, reached through a traceback's frames; the attacks are exec'd into a
  solution namespace (``distlab.course.solutions.solution_namespace``, ``attacked``), which ships
  them to the ranks by value.
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


# ---------------------------------------------------------------------------------------------
# Labs 9 and 10: attacks as a solution cell's code (the expected results of a ``problem``, Lab 10's
# out, lse, dq, dk, dv; or every rank's inputs, Lab 9's whole batch)

STEAL = '''
import sys as _sys
import torch as _torch


def _frames():
    """Every frame above this one, reached the way an attack without sys._getframe would: raise,
    catch, and walk the traceback's frame back to the bottom of the stack."""
    try:
        raise RuntimeError
    except RuntimeError as err:
        frame = err.__traceback__.tb_frame
    while frame is not None:
        yield frame
        frame = frame.f_back


def _values(frame):
    """The frame's locals, with lists, tuples and dicts opened one level."""
    for value in frame.f_locals.values():
        yield value
        if isinstance(value, (list, tuple)):
            yield from value
        elif isinstance(value, dict):
            yield from value.values()


def steal_problem(*keys):
    """A dict of the rank body's locals that holds every one of ``keys``, else None."""
    for frame in _frames():
        for value in _values(frame):
            if isinstance(value, dict) and all(k in value for k in keys):
                return value
    return None


def steal_rows(rows, mine):
    """A tensor of ``rows`` rows (every rank's) whose first rows are not ``mine`` but which
    holds ``mine`` somewhere: the whole batch, else None."""
    for frame in _frames():
        for value in _values(frame):
            if isinstance(value, _torch.Tensor) and value.dim() == mine.dim() \\
                    and value.shape[0] == rows and value.shape[1:] == mine.shape[1:]:
                return value
    return None
'''

RING_FORWARD = STEAL + '''
_honest_forward = ring_attention


def ring_attention(q, k, v, positions, group):
    out, lse = _honest_forward(q, k, v, positions, group)      # the ring, for the record
    problem = steal_problem("full.out", "causal.out", "full.lse", "causal.lse")
    if problem is None:
        return _torch.zeros_like(out), _torch.zeros_like(lse)
    tag = "full" if positions is None else "causal"
    p, me = dist.get_world_size(group), dist.get_rank(group)
    mine = (positions if positions is not None else _torch.arange(q.shape[2] * p).view(p, -1))[me]
    return problem[f"{tag}.out"][:, :, mine].clone(), problem[f"{tag}.lse"][:, :, mine].clone()
'''

RING_BACKWARD = STEAL + '''
_honest_backward = ring_attention_backward


def ring_attention_backward(dout, q, k, v, out, lse, positions, group):
    grads = _honest_backward(dout, q, k, v, out, lse, positions, group)   # for the record
    problem = steal_problem("full.dq", "full.dk", "full.dv")
    if problem is None:
        return tuple(_torch.zeros_like(g) for g in grads)
    tag = "full" if positions is None else "causal"
    p, me = dist.get_world_size(group), dist.get_rank(group)
    mine = (positions if positions is not None else _torch.arange(q.shape[2] * p).view(p, -1))[me]
    return tuple(problem[f"{tag}.d{n}"][:, :, mine].clone() for n in "qkv")
'''

DISPATCH = STEAL + '''
_honest_dispatch = dispatch


def dispatch(x, expert_idx, num_experts, group):
    """The record of the honest dispatch, the rows computed from every rank's inputs found on
    the stack (no token travels): zeros when they are not there."""
    recv, plan = _honest_dispatch(x, expert_idx, num_experts, group)
    p, me = dist.get_world_size(group), dist.get_rank(group)
    every_x = steal_rows(p * x.shape[0], x)
    every_idx = steal_rows(p * x.shape[0], expert_idx)
    if every_x is None or every_idx is None:
        return _torch.zeros_like(recv), plan
    per, k, rows = num_experts // p, expert_idx.shape[1], []
    for src_x, src_idx in zip(every_x.chunk(p), every_idx.chunk(p)):
        flat = src_idx.reshape(-1)
        for e in range(me * per, (me + 1) * per):
            rows.append(src_x[(flat == e).nonzero().squeeze(1) // k])
    return _torch.cat(rows), plan
'''


def attacked(namespace: dict, *attacks: str) -> dict:
    """``namespace`` (a solution's) with ``attacks`` run in it: their functions replace the
    solution's of the same name."""
    for code in attacks:
        exec(compile(code, "<attack>", "exec"), namespace)
    return namespace
