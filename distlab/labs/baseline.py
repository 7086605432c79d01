"""The single-process baselines' training loop: the whole batch in one process, which every
distributed variant of Labs 2 (data parallelism) and 8 (ZeRO, FSDP) must reproduce."""
from __future__ import annotations

import torch
from torch import nn

from distlab.labs.losses import loss_fn


def full_batch_training(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                        y: torch.Tensor, steps: int) -> list[float]:
    """``steps`` steps of ``optimizer`` on the mean squared error of the whole batch ``x``, ``y``;
    returns each step's loss. The last step's gradients stay in ``.grad``: an optimizer step
    reads them and leaves them as they are."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
