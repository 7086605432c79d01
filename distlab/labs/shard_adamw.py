"""AdamW for a rank of Lab 7's mesh run (``distlab.labs.mesh.train_on_mesh``), stepping each
parameter's local shard rather than the DTensor.

AdamW works element by element, so stepping the shard a rank keeps is stepping the DTensor: the
same losses, bit for bit, and no collective either way. What it saves is DTensor working out the
placements of each op on each parameter the first time it sees them (its cache serves the later
steps): the first step's AdamW was a third of a rank's CPU time in a check's run (over the 8
ranks of PP=2 x DP=2 x TP=2, 3 steps: 1.7 of 5.2 CPU-s; the run went from 6.0 to 4.0 CPU-s).
"""
from __future__ import annotations

import torch


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a view of what TP and FSDP keep); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class ShardAdamW:
    """``torch.optim.AdamW`` over the local shards of ``params`` (FSDP2 and TP parameters:
    DTensors whose shards are views of the storage FSDP gathers from), with the DTensors'
    gradients handed to the shards before each step."""

    def __init__(self, params, lr: float, weight_decay: float | None = None):
        self.params = list(params)
        with torch.no_grad():
            self.shards = [local(p) for p in self.params]
        decay = {} if weight_decay is None else {"weight_decay": weight_decay}
        self.opt = torch.optim.AdamW(self.shards, lr=lr, foreach=False, **decay)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every gradient dropped, the shards' views of them too (held, they would keep the last
        step's gradients alive through the next forward: Lab 8's design measures that)."""
        for p, shard in zip(self.params, self.shards):
            p.grad = shard.grad = None

    def step(self) -> None:
        with torch.no_grad():
            for p, shard in zip(self.params, self.shards):
                grad = p.grad
                if grad is not None and hasattr(grad, "placements") and grad.placements != p.placements:
                    grad = grad.redistribute(p.device_mesh, p.placements)   # a pending sum: reduce it
                shard.grad = None if grad is None else local(grad)
        self.opt.step()
