"""The dense single-process modules that Lab 3's checks compare against: the GELU MLP, Llama's
SwiGLU and a pre-norm residual MLP block, with weights drawn from a seed (``dense_mlp``)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

class MLP(nn.Module):
    """Dense transformer MLP: y = fc2(gelu(fc1(x))), (b, s, h) -> (b, s, f) -> (b, s, h)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    """Dense gated MLP (Llama): y = w2(silu(w1 x) * w3 x), no biases."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Dense pre-norm residual MLP block: y = x + dropout(mlp(layernorm(x)))."""

    def __init__(self, hidden: int, ffn: int, dropout: float = 0.0):
        super().__init__()
        self.norm, self.mlp, self.drop = nn.LayerNorm(hidden), MLP(hidden, ffn), nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.mlp(self.norm(x)))


def dense_mlp(kind: str, hidden: int, ffn: int, seed: int) -> nn.Module:
    """A dense "mlp", "swiglu" or "block" whose weights depend only on the seed (same on every rank)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return {"mlp": MLP, "swiglu": SwiGLU, "block": Block}[kind](hidden, ffn)



def random_batch(batch: int, seq: int, hidden: int, seed: int = 0):
    """An input and an output gradient, both (b, s, h), drawn from ``seed`` (same on every rank)."""
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g)
