"""Activation checkpointing under a memory budget (Lab 8, exercise 4): what each block of a stack
keeps for backward with and without ``torch.utils.checkpoint``, measured, and the whole stack
measured with a given choice.

A block Linear(d, h) -> tanh -> Linear(h, d) keeps its input x (B*d values) and the tanh output
(B*h values, one storage saved by tanh and the second Linear). Checkpointed (non-reentrant
``torch.utils.checkpoint.checkpoint``), it keeps only x and runs its forward again in backward:
that recompute costs its forward FLOPs, 2*B*d*h per Linear. Blocks do not share saved storages
(a block's output is saved by the next block, not by itself), so the stack's saved bytes are the
sum of its blocks': the per-block profile predicts the measurement exactly.
"""
from __future__ import annotations

import dataclasses
import itertools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from distlab.labs.activation_memory import ActivationMeter
from distlab.labs.sharded.problem import MLPBlock
from distlab.labs.threads import one_thread


@dataclasses.dataclass(frozen=True)
class CheckpointProblem:
    """A stack of MLP blocks of hidden widths ``widths`` on a batch of ``batch`` rows of width d,
    float32; ``fraction`` places the budget between keeping least (everything checkpointed) and
    keeping all (nothing checkpointed)."""
    seed: int = 0
    batch: int = 8
    d: int = 16
    widths: tuple = (64, 16, 96, 32, 48, 24)
    fraction: float = 0.5

    def model(self) -> nn.Sequential:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(*[MLPBlock(self.d, h) for h in self.widths])

    def data(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(self.batch, self.d, generator=g).requires_grad_()  # (B, d)


def run_stack(model: nn.Sequential, x: torch.Tensor, choice) -> torch.Tensor:
    """Forward through the blocks, wrapping block i in ``checkpoint`` where ``choice[i]``."""
    for block, wrapped in zip(model, choice):
        x = checkpoint(block, x, use_reentrant=False) if wrapped else block(x)
    return x


def saved_bytes(problem: CheckpointProblem, choice) -> int:
    """Measured: bytes autograd keeps after the stack's forward with ``choice`` (parameters
    excluded; ``distlab.labs.activation_memory.ActivationMeter``)."""
    model, x = problem.model(), problem.data()
    with one_thread(), ActivationMeter(model) as meter:
        out = run_stack(model, x, choice)
    del out
    return meter.peak


def recompute_flops(problem: CheckpointProblem, choice) -> int:
    """The FLOPs backward spends running checkpointed blocks' forwards again: 4*B*d*h each."""
    return sum(4 * problem.batch * problem.d * h for h, c in zip(problem.widths, choice) if c)


def block_profile(problem: CheckpointProblem) -> list[dict]:
    """Per block, measured on the block alone: ``saved_bytes`` (kept for backward when not
    checkpointed), ``checkpointed_bytes`` (kept when checkpointed) and ``recompute_flops``."""
    rows = []
    n = len(problem.widths)
    for i in range(n):
        alone = CheckpointProblem(problem.seed, problem.batch, problem.d, (problem.widths[i],))
        rows.append({"block": i, "hidden": problem.widths[i],
                     "saved_bytes": saved_bytes(alone, [False]),
                     "checkpointed_bytes": saved_bytes(alone, [True]),
                     "recompute_flops": recompute_flops(alone, [True])})
    return rows


def budget_of(problem: CheckpointProblem) -> int:
    """The budget: least + fraction * (most - least) bytes, both measured."""
    n = len(problem.widths)
    least, most = saved_bytes(problem, [True] * n), saved_bytes(problem, [False] * n)
    return int(least + problem.fraction * (most - least))


def best_checkpoint_choice(problem: CheckpointProblem, budget: int,
                           profile: list[dict] | None = None) -> tuple[list[bool], int]:
    """The reference: every one of the 2^n choices tried; among those within ``budget`` the one
    of least recompute. Returns (choice, its recompute FLOPs). A choice's saved bytes are the sum
    of its blocks' (``block_profile``: each block measured alone, checkpointed and not, 2n
    measurements instead of 2^n stacks): the stack measured with any choice equals that sum
    (blocks share no saved storage; ``tests/test_lab08.py`` measures every choice of a stack
    against it). ``profile``: the problem's, where the caller has measured it already."""
    profile = block_profile(problem) if profile is None else profile
    best = None
    for choice in itertools.product([False, True], repeat=len(problem.widths)):
        kept = sum(b["checkpointed_bytes"] if c else b["saved_bytes"]
                   for b, c in zip(profile, choice))
        if kept <= budget:
            cost = recompute_flops(problem, choice)
            if best is None or cost < best[1]:
                best = (list(choice), cost)
    if best is None:
        raise ValueError(f"no choice keeps the activations within {budget} bytes")
    return best
