"""The stages an executor runs a schedule table on: what one action computes, never what it
sends. ``TableStage``'s ``forward``, ``backward`` and ``weights`` are F, B and W of one
microbatch on one stage of Lab 5's model (residual blocks ``h + gelu(h W^T + c)``); an executor
(Lab 11, Section 3) decides where their inputs come from and where their outputs go.

B and W are split here by hand for this model, without autograd: B runs the blocks backwards from
the output's gradient ``g``, keeping each block's ``delta = g * gelu'(z)`` (``z = h W^T + c``),
and hands on ``g + delta W``; W turns the kept deltas and the blocks' inputs into
``grad W = delta^T h`` and ``grad c = sum(delta)``. So each of F, B and W does one matrix product
per block, and a stage holds its blocks' inputs from F to W (Exercise 1 splits any stage with
autograd and measures what it holds). Given ``split``, a pair ``(backward_input,
backward_weight)`` of Section 1's contract, a stage runs its forward under autograd instead and B
and W with that pair (a whole backward with ``torch.autograd.backward``).

A stage also stamps every action (``events``: ``StageEvent`` with ``perf_counter`` times), for
the timelines, and refuses an action its inputs are not there for, saying which.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from distlab.labs.losses import loss_fn
from distlab.labs.pipeline.schedules import StageEvent


def _gelu_grad(z: torch.Tensor) -> torch.Tensor:
    """d gelu(z) / dz for the exact (erf) GELU: Phi(z) + z phi(z)."""
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-0.5 * z * z) / math.sqrt(
        2 * math.pi)


class TableStage:
    """Stage ``index`` of ``num_stages`` of a table, on ``rank``: its blocks (``layers``, an
    ``nn.Sequential`` of Lab 5's residual blocks), the batch where it is the first stage, the
    target where it is the last, cut into ``num_microbatches`` equal microbatches.

    - ``forward(i, x=None)``: F of microbatch ``i``. ``x``: the activation from stage
      ``index - 1`` (None on the first stage, which reads its own microbatch). Returns the
      output to hand to stage ``index + 1``; on the last stage None (it keeps the loss,
      ``loss_fn / m``, in ``losses[i]``).
    - ``backward(i, grad=None, weights=True)``: B of microbatch ``i``. ``grad``: the gradient of
      the output, from stage ``index + 1`` (None on the last stage: the loss's). Returns the
      gradient of the input for stage ``index - 1`` (None on the first stage). With
      ``weights=True`` it also adds the weights' gradient into ``.grad`` (a whole backward);
      with ``weights=False`` that waits for ``weights(i)``.
    - ``weights(i)``: W of microbatch ``i``, after ``backward(i, ..., weights=False)``.
    - ``buffer()``: an empty tensor of a message's shape and dtype (every boundary's is the same).
    """

    def __init__(self, index: int, num_stages: int, layers, num_microbatches: int, rank: int,
                 rows: int, x: torch.Tensor | None = None, target: torch.Tensor | None = None,
                 split: tuple | None = None):
        self.index, self.num_stages, self.layers, self.rank = index, num_stages, layers, rank
        self.split = split
        self.first, self.last = index == 0, index == num_stages - 1
        self.m = num_microbatches
        self.xs = x.chunk(self.m) if self.first else None
        self.targets = target.chunk(self.m) if self.last else None
        param = next(layers.parameters())
        self.shape, self.dtype = (rows, param.shape[-1]), param.dtype
        self.saved: dict[int, object] = {}    # F -> B: each block's (input h, z); with split,
        self.deltas: dict[int, object] = {}   # (output, input); B -> W: each block's (input h,
        #                                       delta); with split, what backward_input kept
        self.out_grads: dict[int, torch.Tensor] = {}   # the last stage's: d(loss_i)/d(output)
        self.losses: dict[int, torch.Tensor] = {}
        self.events: list[StageEvent] = []

    def __repr__(self) -> str:
        return f"TableStage({self.index} of {self.num_stages}, rank {self.rank})"

    def buffer(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype)

    def _refuse(self, op: str, i: int, why: str):
        raise RuntimeError(f"rank {self.rank}: {op} of microbatch {i} on stage {self.index}: {why}")

    def _stamp(self, op: str, i: int, start: float) -> None:
        self.events.append(StageEvent(self.rank, i, op, start, time.perf_counter(),
                                      stage=self.index))

    def forward(self, i: int, x: torch.Tensor | None = None) -> torch.Tensor | None:
        if not 0 <= i < self.m or i in self.saved or i in self.deltas:
            self._refuse("F", i, f"microbatches run once each, 0 to {self.m - 1}")
        if self.first != (x is None):
            self._refuse("F", i, "the first stage reads its own microbatch (pass x=None)"
                         if self.first else f"x is None: pass the activation stage "
                         f"{self.index - 1} sent")
        start = time.perf_counter()
        h = self.xs[i] if self.first else x
        if tuple(h.shape) != self.shape or h.dtype != self.dtype:
            self._refuse("F", i, f"x is {list(h.shape)} {h.dtype}, expected "
                         f"{list(self.shape)} {self.dtype}")
        if self.split is not None:
            return self._autograd_forward(i, h, start)
        saved = []
        with torch.no_grad():
            for block in self.layers:
                z = F.linear(h, block.lin.weight, block.lin.bias)
                saved.append((h, z))
                h = h + F.gelu(z)
        self.saved[i] = saved
        out = h
        if self.last:
            y = h.detach().requires_grad_()
            loss = loss_fn(y, self.targets[i]) / self.m
            (self.out_grads[i],) = torch.autograd.grad(loss, [y])
            self.losses[i], out = loss.detach(), None
        self._stamp("F", i, start)
        return out

    def backward(self, i: int, grad: torch.Tensor | None = None,
                 weights: bool = True) -> torch.Tensor | None:
        if i not in self.saved:
            self._refuse("B", i, "its F has not run here (or its B already has)")
        if self.last != (grad is None):
            self._refuse("B", i, "the last stage starts from its own loss (pass grad=None)"
                         if self.last else f"grad is None: pass the gradient stage "
                         f"{self.index + 1} sent")
        if grad is not None and (tuple(grad.shape) != self.shape or grad.dtype != self.dtype):
            self._refuse("B", i, f"grad is {list(grad.shape)} {grad.dtype}, expected "
                         f"{list(self.shape)} {self.dtype}")
        start = time.perf_counter()
        if self.split is not None:
            return self._autograd_backward(i, grad, weights, start)
        g = self.out_grads.pop(i) if self.last else grad
        kept = []
        with torch.no_grad():
            for block, (h, z) in zip(reversed(self.layers), reversed(self.saved.pop(i))):
                delta = g * _gelu_grad(z)
                kept.append((h, delta))
                g = g + delta @ block.lin.weight
        self.deltas[i] = kept[::-1]
        if weights:
            self._weights(i)
        self._stamp("B", i, start)
        return None if self.first else g

    def weights(self, i: int) -> None:
        if i not in self.deltas:
            self._refuse("W", i, "its B has not run here, or ran with weights=True (a whole "
                         "backward), or its W already has")
        start = time.perf_counter()
        if self.split is not None:
            self.split[1](self.deltas.pop(i), list(self.layers.parameters()))
        else:
            self._weights(i)
        self._stamp("W", i, start)

    def _autograd_forward(self, i: int, h: torch.Tensor, start: float):
        h = h if self.first else h.detach().requires_grad_()
        with torch.enable_grad():
            out = self.layers(h)
            if self.last:
                out = loss_fn(out, self.targets[i]) / self.m
                self.losses[i] = out.detach()
        self.saved[i] = (out, h)
        self._stamp("F", i, start)
        return None if self.last else out.detach()

    def _autograd_backward(self, i: int, grad, weights: bool, start: float):
        out, h = self.saved.pop(i)
        if weights:
            torch.autograd.backward(out, grad)
            g = h.grad
        else:
            g, self.deltas[i] = self.split[0](out, grad, h)
        self._stamp("B", i, start)
        return None if self.first else g

    def _weights(self, i: int) -> None:
        with torch.no_grad():
            for block, (h, delta) in zip(self.layers, self.deltas.pop(i)):
                for p, g in ((block.lin.weight, delta.T @ h), (block.lin.bias, delta.sum(0))):
                    p.grad = g if p.grad is None else p.grad + g


def build_stages(rank: int, layers: dict, placement: list[int], num_microbatches: int,
                 x: torch.Tensor, target: torch.Tensor,
                 split: tuple | None = None) -> dict[int, TableStage]:
    """This rank's stages of a table: ``layers`` holds the blocks of every stage placed here
    (stage -> ``nn.Sequential``); ``x`` reaches the first stage, ``target`` the last; ``split``:
    B and W by that pair (None: by hand)."""
    S, rows = len(placement), x.shape[0] // num_microbatches
    return {s: TableStage(s, S, layers[s], num_microbatches, rank, rows,
                          x if s == 0 else None, target if s == S - 1 else None, split)
            for s in sorted(layers)}
