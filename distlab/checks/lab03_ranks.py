"""What Lab 3's checks hand each rank, and the rank bodies that run the student's code.

A rank gets its own inputs only (``distlab.runtime.per_rank``): the dense module the exercise
wraps, with every parameter the rank's shard must not read filled with NaN (a shortcut through
the whole layer yields NaN), its own sequence block where the exercise is sequence parallel, and
the replicated input otherwise. Expected outputs and gradients stay in the judge, which compares
what the ranks return (``distlab.checks.lab03``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from distlab.checks.common import cut, rank_device
from distlab.labs import tensor_parallel as tp
from distlab.runtime.per_rank import PerRank, nan_module_outside


def own(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's block of ``t`` along ``dim``, as a copy: a view would pickle its whole storage,
    i.e. every rank's block."""
    return cut(t, dim, rank, world_size).clone()


def blocks(t: torch.Tensor, dim: int, world_size: int) -> PerRank:
    """Each rank's own block of ``t`` along ``dim``, one per rank."""
    return PerRank([own(t, dim, r, world_size) for r in range(world_size)])


def shard_index(shape: tuple, dim: int, rank: int, world_size: int) -> tuple:
    """The index of rank r's contiguous block along ``dim`` of a tensor of ``shape``."""
    n = shape[dim] // world_size
    return (slice(None),) * dim + (slice(rank * n, (rank + 1) * n),)


def blinded(dense: nn.Module, dims: dict, world_size: int) -> PerRank:
    """For each rank, ``dense`` with the parameters named in ``dims`` (name -> sharded dim; other
    values: replicated) NaN outside the rank's block."""
    params = dict(dense.named_parameters())
    sharded = {name: dim for name, dim in dims.items() if dim in (0, 1)}
    return PerRank([nan_module_outside(dense, {
        name: shard_index(tuple(params[name].shape), dim, r, world_size)
        for name, dim in sharded.items()}) for r in range(world_size)])


def dense_module(kind: str, ref: dict, prefix: str = "") -> nn.Module:
    """The dense module of a reference set, weights loaded (its inputs: ``param.*``)."""
    if kind == "linear":
        w = ref[f"{prefix}param.weight"]
        layer = nn.Linear(w.shape[1], w.shape[0])
        layer.load_state_dict({"weight": w, "bias": ref[f"{prefix}param.bias"]})
        return layer
    hidden, ffn = ref["x"].shape[-1], _ffn(kind, ref)
    model = {"mlp": tp.MLP, "swiglu": tp.SwiGLU, "block": tp.Block}[kind](hidden, ffn)
    model.load_state_dict({k[len("param."):]: v for k, v in ref.items() if k.startswith("param.")})
    return model


def _ffn(kind: str, ref: dict) -> int:
    key = {"mlp": "param.fc1.weight", "swiglu": "param.w1.weight", "block": "param.mlp.fc1.weight"}[kind]
    return ref[key].shape[0]


def grads(module: nn.Module, names) -> dict:
    out = {}
    for name in names:
        for path in (name, f"mlp.{name}"):   # a block may keep its layers under .mlp
            try:
                p = module.get_parameter(path)
                break
            except AttributeError:
                continue
        else:
            raise AttributeError(f"{type(module).__name__} has no parameter {name!r}: the check "
                                 f"finds the shards by name; keep the layer names of the exercise "
                                 f"({', '.join(names)}).")
        out[name] = None if p.grad is None else p.grad.detach()
    return out


# ---------------------------------------------------------------------------------------------
# Rank bodies: what the student's code produced, nothing compared here

def op_on_rank(rank, world_size, op_cls, x, g):
    """y = op_cls.apply(x, None) on this rank's x; barrier; backward with this rank's upstream g."""
    import torch.distributed as dist
    dev = rank_device()
    x = x.to(dev).requires_grad_(True)
    before = x.detach().clone()
    y = op_cls.apply(x, None)
    dist.barrier()
    (y * g.to(dev)).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "input_changed": not torch.equal(x.detach(), before)}


def module_on_rank(rank, world_size, dense, x, dy, student_cls, names):
    """Wrap this rank's (blinded) dense module, forward x, barrier, backward with dy; return
    output, input gradient, parameter gradients."""
    import torch.distributed as dist
    dev = rank_device()
    model = student_cls(dense.to(dev), None).to(dev)
    x = x.to(dev).clone().requires_grad_(True)
    y = model(x)
    dist.barrier()
    (y * dy.to(dev)).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "grads": grads(model, names)}


def linears_on_rank(rank, world_size, layers, col_cls, row_cls):
    """Column layer on the full x (upstream: this rank's block of dy_col), barrier, backward,
    barrier; row layer on this rank's block of z, barrier, backward. ``layers``: for the column
    layer, then the row layer, (the rank's blinded dense layer, input, upstream gradient)."""
    import torch.distributed as dist
    dev = rank_device()
    res = {}
    for tag, cls, (dense, x, dy) in (("col", col_cls, layers[0]), ("row", row_cls, layers[1])):
        layer = cls(dense.to(dev), None).to(dev)
        x = x.to(dev).clone().requires_grad_(True)
        y = layer(x)
        dist.barrier()
        (y * dy.to(dev)).sum().backward()
        if tag == "col":
            dist.barrier()
        res[tag] = {"y": y.detach(), "dx": x.grad, "grads": grads(layer, ["weight", "bias"])}
    return res
