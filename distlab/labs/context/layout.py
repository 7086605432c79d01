"""How much causal attention work each rank of a sequence split does.

Rank r holds the tokens at positions ``positions[r]`` (a (p, s/p) table, the same on every rank).
Under causal attention query i sees key j when j <= i, so a token at position i costs i + 1
(query, key) score pairs, whichever rank holds the keys: the work of rank r is the sum of
(position + 1) over its tokens. A contiguous split gives rank p-1 about 2p-1 times rank 0's work
(Llama 3, arXiv 2407.21783 §3.3.2, is why it cuts the sequence into 2·CP chunks instead).
"""
from __future__ import annotations

import torch


def contiguous_layout(seq_len: int, world_size: int) -> torch.Tensor:
    """(p, s/p): rank r holds positions [r s/p, (r+1) s/p)."""
    if seq_len % world_size:
        raise ValueError(f"seq_len={seq_len} is not divisible by world_size={world_size}")
    return torch.arange(seq_len).view(world_size, -1)


def causal_work(positions: torch.Tensor) -> torch.Tensor:
    """(p,) int64: the (query, key) score pairs each rank computes under causal attention."""
    return (torch.as_tensor(positions).long() + 1).sum(dim=1)


def imbalance(positions: torch.Tensor) -> float:
    """max over min of ``causal_work``: 1.0 is perfectly balanced."""
    work = causal_work(positions)
    return float(work.max()) / float(work.min())


def work_table(layouts: dict[str, torch.Tensor]) -> list[dict]:
    """One row per layout: the causal work of each rank and the max/min ratio."""
    rows = []
    for name, positions in layouts.items():
        work = causal_work(positions)
        rows.append({"layout": name, **{f"rank {r}": int(w) for r, w in enumerate(work)},
                     "max/min": f"{imbalance(positions):.3f}"})
    return rows
