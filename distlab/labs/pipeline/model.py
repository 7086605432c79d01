"""Lab 5's model and its cut into stages: ``L`` equal residual layers, drawn from a seed, split
into ``p`` contiguous stages; and the single-process step every schedule must match."""
from __future__ import annotations

import collections
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs.losses import loss_fn


class ResidualLayer(nn.Module):
    """A residual MLP block, ``x + gelu(x W^T + c)``: the unit the pipeline cuts between."""

    def __init__(self, hidden: int):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x):  # (b, h) -> (b, h)
        return x + F.gelu(self.lin(x))


def make_model(num_layers: int, hidden: int, seed: int) -> nn.Sequential:
    """``num_layers`` blocks drawn from ``seed``: the same weights on every rank that builds it."""
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(*[ResidualLayer(hidden) for _ in range(num_layers)])
    with torch.no_grad():
        for p in model.parameters():  # scale 1/sqrt(h) keeps activations O(1) at any depth
            p.copy_(torch.randn(p.shape, generator=gen) / hidden ** 0.5)
    return model


@dataclasses.dataclass(frozen=True)
class PipeSpec:
    """One pipeline problem: a model of ``num_layers`` blocks of width ``hidden`` and a batch of
    ``batch`` rows, all drawn from ``seed``."""
    num_layers: int = 8
    hidden: int = 64
    batch: int = 16
    seed: int = 0

    def model(self) -> nn.Sequential:
        return make_model(self.num_layers, self.hidden, self.seed)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The input batch and the regression target, both ``(batch, hidden)``."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.hidden, generator=gen)
        return x, torch.randn(self.batch, self.hidden, generator=gen)


def reference_step(spec: PipeSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """The single-process computation every schedule must match: the loss of the whole batch and
    the gradient of every parameter, keyed ``"<layer>.lin.weight"`` like ``model.named_parameters()``."""
    model = spec.model()
    x, target = spec.data()
    loss = loss_fn(model(x), target)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def partition_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` layer ranges, one per stage, as equal as can be: the first
    ``num_layers % num_stages`` stages take one layer more."""
    if num_layers < num_stages:
        raise ValueError(f"{num_layers} layers cannot fill {num_stages} stages: "
                         "every stage needs at least one layer.")
    base, extra = divmod(num_layers, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def stage_layers(model: nn.Sequential, stage: int, num_stages: int,
                 bounds: list[tuple[int, int]] | None = None) -> nn.Sequential:
    """The blocks of ``stage``, keeping their global indices as names, so that the stage's
    ``named_parameters()`` read ``"5.lin.weight"`` exactly as in the whole model. ``bounds``: the
    ``(start, stop)`` of every stage, computed by the caller (the ranks of a check get them as
    data); without them, ``partition_layers``'s."""
    start, stop = (bounds or partition_layers(len(model), num_stages))[stage]
    return nn.Sequential(collections.OrderedDict((str(i), model[i]) for i in range(start, stop)))

