"""Lab 8's problem and its single-process baseline: a stack of MLP blocks trained with AdamW on
the mean squared error, and the flat layout ZeRO shards a block's parameters with.

The flat layout (ZeRO, Rajbhandari et al. 2020, sec. 5; FSDP's FlatParameter): a bucket's
parameters are flattened in ``parameters()`` order into P elements, padded with zeros to W * s
elements where s = ceil(P / W); rank r owns elements [r*s, (r+1)*s).
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from distlab.labs.baseline import full_batch_training
from distlab.labs.threads import one_thread
from distlab.runtime.per_rank import nan_module_outside


class MLPBlock(nn.Module):
    """Linear(d, h) -> tanh -> Linear(h, d). For backward autograd keeps the block's input x
    (saved by the first Linear) and the tanh output t (saved by tanh and by the second Linear:
    one storage), so a block keeps B*d + B*h values; checkpointed, only its input."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(torch.tanh(self.lin1(x)))  # (B, d) -> (B, h) -> (B, d)


@dataclasses.dataclass(frozen=True)
class ShardSetup:
    """The lab's problem: ``blocks`` MLP blocks of width ``d`` (hidden ``hidden``), a batch of
    ``batch`` rows (divisible by every world size used: 2 and 4), AdamW, float64 for the checks
    (rounding differences of 1e-16 stay twelve orders of magnitude below a real mistake)."""
    seed: int = 0
    batch: int = 16
    d: int = 16
    hidden: int = 24
    blocks: int = 4
    lr: float = 1e-2
    weight_decay: float = 0.01
    dtype: torch.dtype = torch.float64

    def model(self) -> nn.Sequential:
        """The same initial weights in every process (the global RNG is left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(*[MLPBlock(self.d, self.hidden)
                                   for _ in range(self.blocks)]).to(self.dtype)

    def rows(self, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank r's rows of the global batch: x, y (batch / W, d)."""
        return tuple(rank_batch(t, rank, world_size) for t in self.data())

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch, identical on every rank: x (batch, d), y (batch, d)."""
        g = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.d, generator=g, dtype=self.dtype)
        return x, torch.randn(self.batch, self.d, generator=g, dtype=self.dtype)

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, foreach=False)

    def shares(self, world_size: int, sharded: bool = False) -> list["RankShare"]:
        """What each rank of a graded run receives (``distlab.runtime.per_rank.PerRank``): the
        initial model (replicated: data parallelism starts every rank from the same weights)
        and its own rows of the batch, made here; never the seed that makes the others' rows.
        ``sharded`` (ZeRO-3, whose wrapper keeps only its shard): the model is NaN outside the
        rank's flat shard of each block (``blind_outside_shard``)."""
        x, y = self.data()
        return [RankShare(blind_outside_shard(self.model(), r, world_size) if sharded else
                          self.model(), rank_batch(x, r, world_size).clone(),
                          rank_batch(y, r, world_size).clone(), self.lr, self.weight_decay)
                for r in range(world_size)]


@dataclasses.dataclass
class RankShare:
    """One rank's inputs of a ``ShardSetup`` (``ShardSetup.shares``): the model, its rows, the
    optimizer's settings. The rank bodies take either: a share in a check, the setup in the
    lab's own runs."""
    initial: nn.Sequential
    x: torch.Tensor
    y: torch.Tensor
    lr: float
    weight_decay: float

    def model(self) -> nn.Sequential:
        return self.initial

    def rows(self, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, foreach=False)


def shard_numel(numel: int, world_size: int) -> int:
    """s = ceil(P / W): the elements of one rank's shard of a flat bucket of P elements."""
    return math.ceil(numel / world_size)


def padded_flat(tensors, world_size: int) -> torch.Tensor:
    """The tensors flattened in order and zero-padded to W * ceil(P / W) elements (a copy)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])               # (P,)
    out = flat.new_zeros(world_size * shard_numel(flat.numel(), world_size))  # (W * s,)
    out[:flat.numel()] = flat
    return out


def blind_outside_shard(model: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """A copy of ``model`` that is NaN outside rank ``rank``'s flat shard of each block, elements
    [r*s, (r+1)*s) of its ``padded_flat`` parameters. ZeRO-3 hands a rank the whole model to wrap,
    but the rank may keep only its shard: the rest it must gather from the others, so code that
    reads another rank's part of the model instead gets NaN."""
    keep = {}
    for block_name, block in model.named_children():
        params = list(block.named_parameters())
        s = shard_numel(sum(p.numel() for _, p in params), world_size)
        offset = 0
        for name, p in params:
            mask = torch.zeros(p.numel(), dtype=torch.bool)   # this rank's part of p, flat
            mask[max(rank * s - offset, 0):max((rank + 1) * s - offset, 0)] = True
            keep[f"{block_name}.{name}"] = mask.view(p.shape)
            offset += p.numel()
    return nan_module_outside(model, keep)


def rank_batch(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's contiguous rows of the global batch: (batch / W, ...)."""
    return t.chunk(world_size)[rank]


def block_flats(model: nn.Sequential, grads: bool = False) -> list[torch.Tensor]:
    """Each block's parameters (or gradients) flattened in order, unpadded: [(P_i,)]."""
    return [torch.cat([(p.grad if grads else p).detach().reshape(-1) for p in block.parameters()])
            for block in model]


def reference_sharded_training(setup: ShardSetup, steps: int) -> dict:
    """AdamW on the full batch in this process for ``steps`` steps: ``losses`` per step,
    ``params`` (each block's flat parameters after the last step) and ``grads`` (each block's flat
    gradient of the last step)."""
    with one_thread():   # in a grader's judge, beside busy ranks: 2 threads spin against each other
        model = setup.model()
        losses = full_batch_training(model, setup.optimizer(model.parameters()), *setup.data(),
                                     steps)
    return {"losses": torch.tensor(losses, dtype=torch.float64), "params": block_flats(model),
            "grads": block_flats(model, grads=True)}


LAB = "08_sharded_data_parallel"
STORED_STEPS = {3: "adamw_3_steps", 1: "adamw_1_step"}   # the lab's setup, stored (references)


def reference_params(setup: ShardSetup, steps: int) -> list[torch.Tensor]:
    """Each block's flat parameters after ``steps`` steps of AdamW on the full batch in one
    process: for the lab's setup (``ShardSetup()``, 3 or 1 steps) as the course stored them
    (``distlab references 08_sharded_data_parallel``; a handout has no reference training), for
    any other one computed with reference_sharded_training."""
    name = STORED_STEPS.get(steps)
    if setup != ShardSetup() or name is None:
        return reference_sharded_training(setup, steps)["params"]
    from distlab import paths
    path = paths.data() / LAB / f"{name}.pt"
    try:
        stored = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with `distlab references {LAB}`") \
            from None
    sizes = [sum(p.numel() for p in block.parameters()) for block in setup.model()]
    return list(stored["params"].split(sizes))
