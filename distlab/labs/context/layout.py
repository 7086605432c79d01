"""How much causal attention work each rank of a sequence split does, and how long a ring waits.

Rank r holds the tokens at positions ``positions[r]`` (a (p, s/p) table, the same on every rank).
Under causal attention query i sees key j when j <= i. At ring step t rank r computes its
queries against the block of rank (r − t) mod p; every rank moves on to the next step together,
so a step lasts as long as its slowest rank's block. The **critical path** of a layout is the
sum over the p steps of the largest block work of the step; no layout does better than the
**ideal**, the total work spread evenly, s(s+1)/2 / p score pairs (a step's largest block is at
least the step's mean). ``penalty`` is their ratio.
"""
from __future__ import annotations

import torch


def contiguous_layout(seq_len: int, world_size: int) -> torch.Tensor:
    """(p, s/p): rank r holds positions [r s/p, (r+1) s/p)."""
    if seq_len % world_size:
        raise ValueError(f"seq_len={seq_len} is not divisible by world_size={world_size}")
    return torch.arange(seq_len).view(world_size, -1)


def striped_layout(seq_len: int, world_size: int) -> torch.Tensor:
    """(p, s/p): the positions dealt out like cards, rank r holds r, r + p, r + 2p, ... (Striped
    Attention, Brandon et al., 2023, arXiv 2311.09431)."""
    if seq_len % world_size:
        raise ValueError(f"seq_len={seq_len} is not divisible by world_size={world_size}")
    return torch.arange(seq_len).view(-1, world_size).t().contiguous()


def causal_work(positions: torch.Tensor) -> torch.Tensor:
    """(p,) int64: the (query, key) score pairs each rank computes under causal attention, over
    all the steps."""
    return (torch.as_tensor(positions).long() + 1).sum(dim=1)


def imbalance(positions: torch.Tensor) -> float:
    """max over min of ``causal_work``: each rank's total, not what a ring waits for."""
    work = causal_work(positions)
    return float(work.max()) / float(work.min())


def block_work(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
    """Score pairs (i, j) with key position k_pos[j] <= query position q_pos[i]."""
    keys = torch.as_tensor(k_pos).long().sort().values
    return int(torch.searchsorted(keys, torch.as_tensor(q_pos).long().contiguous(),
                                  right=True).sum())


def step_work(positions: torch.Tensor) -> torch.Tensor:
    """(p steps, p ranks) int64: rank r's block work at ring step t (the block of rank
    (r − t) mod p)."""
    positions = torch.as_tensor(positions).long().contiguous()
    keys = positions.sort(dim=1).values                                  # (p, s/p), each row sorted
    p = positions.shape[0]
    src = [(torch.arange(p) - t) % p for t in range(p)]                  # whose block, per rank
    return torch.stack([torch.searchsorted(keys[src[t]], positions, right=True).sum(dim=1)
                        for t in range(p)])                              # (p steps, p ranks)


def critical_path(positions: torch.Tensor) -> int:
    """Σ over ring steps of the step's largest block work: score pairs the ring waits for."""
    return int(step_work(positions).max(dim=1).values.sum())


def ideal_path(seq_len: int, world_size: int) -> float:
    """The bound: every score pair of the sequence, s(s+1)/2, spread evenly over p ranks."""
    return seq_len * (seq_len + 1) / 2 / world_size


def penalty(positions: torch.Tensor) -> float:
    """critical_path / ideal_path: 1.0 is the bound; how much longer the ring takes."""
    positions = torch.as_tensor(positions)
    return critical_path(positions) / ideal_path(positions.numel(), positions.shape[0])


def work_table(layouts: dict[str, torch.Tensor]) -> list[dict]:
    """One row per layout: each rank's total work (one column, whatever p), their max/min, the
    critical path, the ideal and their ratio."""
    rows = []
    for name, positions in layouts.items():
        positions = torch.as_tensor(positions)
        p, s = positions.shape[0], positions.numel()
        rows.append({"layout": name, "p": p, "s": s,
                     "work per rank": " ".join(str(int(w)) for w in causal_work(positions)),
                     "max/min": f"{imbalance(positions):.3f}",
                     "critical path": critical_path(positions),
                     "ideal": f"{ideal_path(s, p):g}",
                     "critical / ideal": f"{penalty(positions):.3f}"})
    return rows


def steps_table(positions: torch.Tensor) -> list[dict]:
    """One row per ring step: each rank's block work and the step's largest, then their sums."""
    work = step_work(positions)
    rows = [{"step": t, **{f"rank {r}": int(w) for r, w in enumerate(row)},
             "slowest": int(row.max())} for t, row in enumerate(work)]
    rows.append({"step": "sum", **{f"rank {r}": int(w) for r, w in enumerate(work.sum(0))},
                 "slowest": int(work.max(dim=1).values.sum())})
    return rows


def penalty_table(layout, predict=None, world_sizes=(2, 4, 8), tokens_per_rank: int = 1024) -> list[dict]:
    """``layout(s, p)`` at each p of ``world_sizes`` (s = ``tokens_per_rank``·p): the max/min of the
    ranks' total work, the penalty (critical path over ideal) and ``predict(p)`` beside it (a
    prediction not written yet shows "-")."""
    rows = []
    for p in world_sizes:
        positions = layout(tokens_per_rank * p, p)
        try:
            predicted = "-" if predict is None else f"{float(predict(p)):.3f}"
        except NotImplementedError:
            predicted = "-"
        rows.append({"p": p, "s": f"{tokens_per_rank * p:,}",
                     "work max/min": f"{imbalance(positions):.3f}",
                     "critical / ideal": f"{penalty(positions):.4f}", "your prediction": predicted})
    return rows
