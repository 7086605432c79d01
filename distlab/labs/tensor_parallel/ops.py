"""Megatron's conjugate communication operators for tensor and sequence parallelism, as autograd
Functions named after the data movement of their forward pass (Shoeybi et al. 2019, section 3;
Korthikanti et al. 2022, section 4.2.2):

    f = CopyToTensorParallel              forward: identity        backward: all-reduce
    g = ReduceFromTensorParallel          forward: all-reduce      backward: identity
    GatherFromSequenceParallel            forward: all-gather      backward: reduce-scatter
    ReduceScatterToSequenceParallel       forward: reduce-scatter  backward: all-gather
    GatherFromTensorParallel              forward: all-gather      backward: split (none)

Process groups are passed explicitly (``group=None``: the default group). The gathers and
scatters use ``all_gather_single`` / ``reduce_scatter_single``, the names every lab uses.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`: (.., n, ..) -> (.., p*n, ..)."""
    p = dist.get_world_size(group)
    if p == 1:
        return x
    front = x.movedim(dim, 0).contiguous()                           # (n, ...)
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))    # (p*n, ...)
    dist.all_gather_single(out, front, group=group)
    return out.movedim(0, dim)


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Sum `x` over ranks and keep this rank's slice along `dim`: (.., p*n, ..) -> (.., n, ..)."""
    p = dist.get_world_size(group)
    if p == 1:
        return x
    front = x.movedim(dim, 0).contiguous()                           # (p*n, ...)
    if front.shape[0] % p:
        raise ValueError(f"reduce-scatter along dim {dim}: size {front.shape[0]} is not "
                         f"divisible by {p} ranks")
    out = front.new_empty((front.shape[0] // p, *front.shape[1:]))   # (n, ...)
    dist.reduce_scatter_single(out, front, group=group)
    return out.movedim(0, dim)


def _split(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's slice of `x` along `dim` (no communication)."""
    p = dist.get_world_size(group)
    return x if p == 1 else x.chunk(p, dim=dim)[dist.get_rank(group)].contiguous()


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: enter a tensor-parallel region with a replicated input.

    forward: identity (every rank already holds the full input).
    backward: all-reduce (sum) of the input gradient, because each rank's shard of the next
    layer contributes only part of dL/dX.
    """

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()   # all_reduce works in place; never write into autograd's buffer
        if dist.get_world_size(ctx.group) > 1:
            dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: leave a tensor-parallel region by summing partial outputs.

    forward: all-reduce (sum) of the partial outputs of a row-parallel layer.
    backward: identity (the output is replicated, so is its gradient).
    """

    @staticmethod
    def forward(ctx, x, group=None):
        x = x.contiguous().clone()          # all_reduce works in place; keep the caller's tensor
        if dist.get_world_size(group) > 1:
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromSequenceParallel(torch.autograd.Function):
    """Sequence parallelism's replacement for f: sequence shards in, full sequence out.

    forward: all-gather along `dim` (the sequence), (b, s/p, h) -> (b, s, h).
    backward: reduce-scatter along `dim`: sum the ranks' gradients of the full sequence and give
    each rank the slice of its own tokens, (b, s, h) -> (b, s/p, h).
    """

    @staticmethod
    def forward(ctx, x, group=None, dim=1):
        ctx.group, ctx.dim = group, dim
        return _all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim, ctx.group), None, None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Sequence parallelism's replacement for g: partial outputs in, summed sequence shard out.

    forward: reduce-scatter along `dim`, (b, s, h) partial sums -> (b, s/p, h) full sums.
    backward: all-gather along `dim`, (b, s/p, h) -> (b, s, h), the gradient every rank's
    row-parallel shard needs.
    """

    @staticmethod
    def forward(ctx, x, group=None, dim=1):
        ctx.group, ctx.dim = group, dim
        return _reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group), None, None


class GatherFromTensorParallel(torch.autograd.Function):
    """Concatenate column-parallel outputs: (.., n/p) -> (.., n) on every rank.

    forward: all-gather along the last dim.  backward: split, keep this rank's slice (no
    communication: the gradient of the replicated output is already replicated).
    """

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return _all_gather(x, x.dim() - 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _split(grad, grad.dim() - 1, ctx.group), None


def copy_to_tp(x, group=None):
    return CopyToTensorParallel.apply(x, group)


def reduce_from_tp(x, group=None):
    return ReduceFromTensorParallel.apply(x, group)


def gather_from_sp(x, group=None, dim=1):
    return GatherFromSequenceParallel.apply(x, group, dim)


def reduce_scatter_to_sp(x, group=None, dim=1):
    return ReduceScatterToSequenceParallel.apply(x, group, dim)


def gather_from_tp(x, group=None):
    return GatherFromTensorParallel.apply(x, group)

