"""Attention on one rank, with its log-sum-exp: the plain computation every context-parallel
answer of Lab 10 is compared with, and the block computation a ring step does.

Shapes: q (b, h, s_q, d), k and v (b, h, s_k, d). Causal attention is given by the tokens'
global positions (q_pos (s_q,), k_pos (s_k,)): query i sees key j when k_pos[j] <= q_pos[i].
A query whose keys are all masked in a block gets out = 0 and lse = -inf, so that merging it
with another block (the online softmax of Milakov & Gimelshein 2018, FlashAttention §3.1)
leaves the other block unchanged.
"""
from __future__ import annotations

import math

import torch


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """(s_q, s_k) bool: True where query i may see key j (k_pos[j] <= q_pos[i])."""
    return k_pos[None, :] <= q_pos[:, None]


def block_attention(q, k, v, q_pos=None, k_pos=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (b, h, s_q, d), lse (b, h, s_q)) of softmax(q kᵀ/√d) v over these keys only;
    causal when both positions are given."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])      # (b, h, s_q, s_k)
    if q_pos is not None and k_pos is not None:
        scores = scores.masked_fill(~causal_mask(q_pos.to(q.device), k_pos.to(q.device)),
                                    float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                           # (b, h, s_q)
    # exp(scores - lse) is 0/0 on fully masked rows: zero them instead (out = 0, lse = -inf).
    seen = torch.isfinite(lse)
    weights = torch.exp(scores - torch.where(seen, lse, torch.zeros_like(lse))[..., None])
    weights = torch.where(seen[..., None], weights, torch.zeros_like(weights))
    return weights @ v, lse


def dense_attention(q, k, v, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole sequence on one rank: (out, lse), causal over positions 0..s-1 when asked."""
    if not causal:
        return block_attention(q, k, v)
    pos = torch.arange(q.shape[-2])
    return block_attention(q, k, v, pos, torch.arange(k.shape[-2]))
