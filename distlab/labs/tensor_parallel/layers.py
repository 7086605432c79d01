"""Tensor-parallel linear layers and the MLPs built from them (Megatron-LM, section 3).

nn.Linear stores its weight as (out_features, in_features), so "column parallel" (split the
output features) slices weight rows, dim 0, and "row parallel" (split the input features) slices
weight columns, dim 1. ``from_linear`` takes the shard of a dense layer (identical on every rank)
that this rank owns, so a parallel module can be compared with its dense original.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs.tensor_parallel.dense import MLP, SwiGLU
from distlab.labs.tensor_parallel.ops import copy_to_tp, gather_from_sp, gather_from_tp, reduce_from_tp, reduce_scatter_to_sp

def shard(tensor: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s contiguous slice, of size n/p, of `tensor` along `dim` (a copy)."""
    n = tensor.shape[dim]
    if n % world_size:
        raise ValueError(f"cannot split dimension {dim} of size {n} evenly over {world_size} "
                         f"ranks: choose sizes divisible by the tensor-parallel degree")
    size = n // world_size
    return tensor.detach().narrow(dim, rank * size, size).clone()


def column_shard(linear: nn.Linear, rank: int, world_size: int):
    """(weight (out/p, in), bias (out/p,) or None): the output features rank `rank` computes."""
    bias = None if linear.bias is None else shard(linear.bias, 0, rank, world_size)
    return shard(linear.weight, 0, rank, world_size), bias


def row_shard(linear: nn.Linear, rank: int, world_size: int):
    """(weight (out, in/p), full bias (out,) or None): the input features rank `rank` reads.

    The bias is not split: it is added once, after the partial outputs have been summed.
    """
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return shard(linear.weight, 1, rank, world_size), bias



def _init_like_linear(weight: torch.Tensor, bias, fan_in: int) -> None:
    # nn.Linear's default, with the fan-in of the *dense* layer so shards match its distribution.
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


def _load(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """Copy a rank's shard of a dense layer into ``layer`` (both parallel layers' from_linear)."""
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class ColumnParallelLinear(nn.Module):
    """y_r = x A_r^T + b_r with A_r the rank's (out/p, in) rows of the dense weight.

    Input: replicated (b, s, in), or with `sequence_parallel` a sequence shard (b, s/p, in).
    Output: this rank's features (b, s, out/p); with `gather_output` the full (b, s, out).
    Collectives: forward none (sequence parallel: all-gather of the input); backward one
    all-reduce of dL/dx (sequence parallel: reduce-scatter).
    """

    def __init__(self, in_features, out_features, bias=True, *, group=None,
                 gather_output=False, sequence_parallel=False):
        super().__init__()
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        p = dist.get_world_size(group)
        if out_features % p:
            raise ValueError(f"out_features={out_features} is not divisible by {p} ranks")
        self.weight = nn.Parameter(torch.empty(out_features // p, in_features))
        self.bias = nn.Parameter(torch.empty(out_features // p)) if bias else None
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **kwargs) -> "ColumnParallelLinear":
        """The shard of a dense layer (identical on every rank) that this rank owns."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    group=group, **kwargs)
        return _load(layer, *column_shard(linear, dist.get_rank(group), dist.get_world_size(group)))

    def forward(self, x):
        x = gather_from_sp(x, self.group) if self.sequence_parallel else copy_to_tp(x, self.group)
        y = F.linear(x, self.weight, self.bias)                  # (b, s, out/p)
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = sum_r x_r B_r^T + b with B_r the rank's (out, in/p) columns of the dense weight.

    Input: this rank's features (b, s, in/p) (the output of a ColumnParallelLinear).
    Output: replicated (b, s, out); with `sequence_parallel` a sequence shard (b, s/p, out).
    Collectives: forward one all-reduce of (b, s, out) (sequence parallel: reduce-scatter);
    backward none (sequence parallel: all-gather of dL/dy). The bias is added after the sum,
    so it is added once.
    """

    def __init__(self, in_features, out_features, bias=True, *, group=None, sequence_parallel=False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        p = dist.get_world_size(group)
        if in_features % p:
            raise ValueError(f"in_features={in_features} is not divisible by {p} ranks")
        self.weight = nn.Parameter(torch.empty(out_features, in_features // p))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        _init_like_linear(self.weight, self.bias, in_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **kwargs) -> "RowParallelLinear":
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    group=group, **kwargs)
        return _load(layer, *row_shard(linear, dist.get_rank(group), dist.get_world_size(group)))

    def forward(self, x):
        partial = F.linear(x, self.weight)                       # (b, s, out), this rank's share
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, self.group)        # (b, s/p, out)
        else:
            y = reduce_from_tp(partial, self.group)              # (b, s, out)
        return y if self.bias is None else y + self.bias



class TensorParallelMLP(nn.Module):
    """fc1 column parallel, fc2 row parallel: one all-reduce of (b, s, h) each way."""

    def __init__(self, mlp: MLP, group=None, sequence_parallel=False):
        super().__init__()
        self.fc1 = ColumnParallelLinear.from_linear(mlp.fc1, group, sequence_parallel=sequence_parallel)
        self.fc2 = RowParallelLinear.from_linear(mlp.fc2, group, sequence_parallel=sequence_parallel)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TensorParallelSwiGLU(nn.Module):
    """w1 and w3 column parallel (same input, so one f covers both), w2 row parallel."""

    def __init__(self, mlp: SwiGLU, group=None):
        super().__init__()
        self.group = group
        p, r = dist.get_world_size(group), dist.get_rank(group)
        self.w1 = nn.Linear(mlp.w1.in_features, mlp.w1.out_features // p, bias=False)
        self.w3 = nn.Linear(mlp.w3.in_features, mlp.w3.out_features // p, bias=False)
        self.w2 = RowParallelLinear.from_linear(mlp.w2, group)
        with torch.no_grad():
            self.w1.weight.copy_(column_shard(mlp.w1, r, p)[0])
            self.w3.weight.copy_(column_shard(mlp.w3, r, p)[0])

    def forward(self, x):
        x = copy_to_tp(x, self.group)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))          # (b, s, f/p) before w2

