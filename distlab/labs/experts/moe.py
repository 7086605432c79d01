"""The mixture-of-experts layer on one process: the reference every Lab 9 check compares with.

A router (a bias-free ``nn.Linear(h, E)``) scores each token, softmax turns the scores into
probabilities, and each token goes to its ``k`` most probable experts (top-k routing, Shazeer et
al. 2017; Switch Transformer uses k=1, GShard k=2). Expert ``e`` is a small MLP
``w2(gelu(w1 x))``. A token's output is the sum of its experts' outputs weighted by the
probabilities that chose them (the gates). Not renormalising them over the k chosen is a choice:
with k = 1 it is required (renormalised, the one gate is the constant 1 and the router gets no
gradient; Switch Transformer §2.1), while GShard (Algorithm 1) and Mixtral renormalise their
top-2, whose gates still pass gradient to the router through their ratios:

    y_t = Σ_j p_t[i_tj] · expert_{i_tj}(x_t),   (i_t1 .. i_tk) = top-k of p_t = softmax(W_r x_t).

With a capacity (the capacity factor c of Switch Transformer §2.2, eq. 3, with k assignments
per token; GShard §2.2 fixes a capacity per group) each expert takes at most
``ceil(c · T · k / E)`` of the ``T · k`` assignments, first choices of all tokens before second
choices, each in token order; an assignment over capacity is dropped (contributes nothing), so a
token whose every assignment is dropped leaves the block through the residual alone.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    """One expert: ``w2(gelu(w1 x))``, h -> f -> h, no biases."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Router + ``num_experts`` experts, top-``k`` routing, optional capacity factor."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, k: int,
                 capacity_factor: float | None = None):
        super().__init__()
        self.num_experts, self.k, self.capacity_factor = num_experts, k, capacity_factor
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))

    def route(self, x):
        """(probs (T, E), gates (T, k), expert_idx (T, k))."""
        probs = torch.softmax(self.router(x), dim=-1)       # (T, E)
        gates, idx = probs.topk(self.k, dim=-1)              # (T, k) each
        return probs, gates, idx

    def forward(self, x):
        probs, gates, idx = self.route(x)
        keep = torch.ones_like(idx, dtype=torch.bool)
        if self.capacity_factor is not None:
            keep = reference_keep(idx, self.num_experts, self.capacity_factor)
        return combine_reference(x, gates, idx, keep, self.experts)


def combine_reference(x, gates, idx, keep, experts) -> torch.Tensor:
    """Σ_j gate_tj · expert_{idx_tj}(x_t) over the kept assignments; (T, h)."""
    y = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        t, j = ((idx == e) & keep).nonzero(as_tuple=True)   # assignments to expert e
        if len(t):
            y = y.index_add(0, t, gates[t, j, None] * expert(x[t]))
    return y


def make_moe(hidden: int, ffn: int, num_experts: int, k: int, seed: int,
             capacity_factor: float | None = None) -> MoE:
    """An MoE layer with weights drawn from ``seed`` (the same on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MoE(hidden, ffn, num_experts, k, capacity_factor)


def reference_capacity(tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    """Switch Transformer §2.2, eq. 3 (capacity factor c), with k assignments per token: an
    expert's buffer holds ceil(c · T · k / E) assignments (T tokens, k each)."""
    return math.ceil(capacity_factor * tokens * k / num_experts)


def reference_keep(idx: torch.Tensor, num_experts: int, capacity_factor: float) -> torch.Tensor:
    """(T, k) bool: which assignments fit in their expert's capacity, first come first served
    in GShard's order (Algorithm 1: every first choice has priority over any second choice, and
    among the same choice an earlier token over a later one)."""
    tokens, k = idx.shape
    cap = reference_capacity(tokens, k, num_experts, capacity_factor)
    seen = [0] * num_experts
    keep = torch.zeros(tokens, k, dtype=torch.bool)
    for j in range(k):
        for t in range(tokens):
            e = int(idx[t, j])
            keep[t, j] = seen[e] < cap
            seen[e] += 1
    return keep.to(idx.device)


def reference_aux_loss(probs: torch.Tensor, idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch Transformer §2.2, eq. (4): E · Σ_i f_i · P_i, f_i the fraction of the T·k
    assignments sent to expert i (a count: no gradient), P_i the mean router probability of i."""
    tokens, k = idx.shape
    f = torch.stack([(idx == i).sum() for i in range(num_experts)]).to(probs.dtype) / (tokens * k)
    return num_experts * torch.dot(f, probs.mean(0))


def owner(expert: int, num_experts: int, world_size: int) -> int:
    """The rank holding ``expert``: rank r holds experts [r E/p, (r+1) E/p)."""
    return expert // (num_experts // world_size)
