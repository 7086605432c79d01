"""Lab 4's dense single-process references: grouped-query causal attention with a fused QKV
projection, and a pre-norm transformer block (attention + Lab 3's MLP)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs import tensor_parallel as tp
from distlab.labs.attention.layout import QKVLayout


def attend(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Causal attention of fused projections (b, s, (nh + 2 nkv) hs) -> (b, s, nh hs).

    Per head: softmax(q k^T / sqrt(hs) + causal mask) v, by `F.scaled_dot_product_attention`.
    Key/value head g serves query heads g*(nh/nkv) .. (g+1)*(nh/nkv)-1. Pure per-head
    computation: on a rank, call it with that rank's head counts nh/p and nkv/p.
    """
    b, s, width = qkv.shape
    hs = width // (n_heads + 2 * n_kv_heads)
    q, k, v = qkv.split([n_heads * hs, n_kv_heads * hs, n_kv_heads * hs], dim=-1)
    q = q.view(b, s, n_heads, hs).transpose(1, 2)                       # (b, nh, s, hs)
    k = k.view(b, s, n_kv_heads, hs).transpose(1, 2)                    # (b, nkv, s, hs)
    v = v.view(b, s, n_kv_heads, hs).transpose(1, 2)                    # (b, nkv, s, hs)
    if n_kv_heads != n_heads:
        # Explicit repeat rather than SDPA's enable_gqa: same result, on every torch and kernel.
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)           # (b, nh, s, hs)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)           # (b, nh, s, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)         # (b, nh, s, hs)
    return y.transpose(1, 2).reshape(b, s, n_heads * hs)                # (b, s, nh hs)


class Attention(nn.Module):
    """Dense causal self-attention: y = proj(attend(qkv(x))), (b, s, h) -> (b, s, h)."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True):
        super().__init__()
        self.layout = QKVLayout(hidden, n_heads, n_kv_heads or n_heads)
        self.n_heads, self.n_kv_heads = n_heads, self.layout.n_kv_heads
        self.qkv = nn.Linear(hidden, self.layout.rows, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x):
        return self.proj(attend(self.qkv(x), self.n_heads, self.n_kv_heads))


class TransformerBlock(nn.Module):
    """Dense pre-norm block: h = x + attn(norm1(x)); y = h + mlp(norm2(h)), MLP from Lab 3."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int | None = None, ffn: int | None = None):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(hidden), Attention(hidden, n_heads, n_kv_heads)
        self.norm2, self.mlp = nn.LayerNorm(hidden), tp.MLP(hidden, ffn or 4 * hidden)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


def dense_transformer(kind: str, seed: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int) -> nn.Module:
    """A dense "attention" or "block" whose weights depend only on the seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if kind == "attention":
            return Attention(hidden, n_heads, n_kv_heads)
        return TransformerBlock(hidden, n_heads, n_kv_heads, ffn)

