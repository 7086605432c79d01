"""What the lab prints about the single-process layer and, at the end, the closing note built from
the measurements the lab made."""
from __future__ import annotations

import torch

from distlab.labs.experts.moe import make_moe
from distlab.labs.tables import format_table


def show_routing(tokens: int = 6, hidden: int = 8, ffn: int = 16, experts: int = 4, k: int = 2,
                 seed: int = 0) -> dict:
    """Route a few tokens through a fresh layer: each token's experts and gates, each expert's
    load, and the output computed token by token against the layer's batched loop."""
    moe = make_moe(hidden, ffn, experts, k, seed)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1))   # (T, h)
    with torch.no_grad():
        probs, gates, idx = moe.route(x)
        y = moe(x)
        by_token = torch.stack([sum(gates[t, j] * moe.experts[int(idx[t, j])](x[t])
                                    for j in range(k)) for t in range(tokens)])
    print(format_table([{"token": t, "experts": str(idx[t].tolist()),
                         "gates": str([round(g, 3) for g in gates[t].tolist()]),
                         "sum of gates": f"{gates[t].sum():.3f}"} for t in range(tokens)]))
    load = torch.bincount(idx.reshape(-1), minlength=experts)
    print(f"\nassignments per expert: {load.tolist()} (T·k = {tokens * k})")
    print(f"max |layer - token-by-token sum| = {(y - by_token).abs().max():.1e}")
    return {"idx": idx, "gates": gates, "load": load, "y": y}


def moe_closing_note(summary: dict, world_size: int, tokens: int, hidden: int, k: int,
                 mesh_diff: float, dropped: dict) -> str:
    """The summary's numbers, each from the measurement that produced it."""
    ep, tp = summary["EP"], summary["TP"]
    return (
        f"Measured here (gloo, {world_size} ranks, T={tokens} tokens per rank, h={hidden}, k={k}, "
        f"float32): EP sent {ep['bytes_per_rank']:.0f} token bytes per rank per forward+backward "
        f"in {ep['calls_per_rank']:.0f} all-to-alls, each dispatch exactly T·k·h·4 = "
        f"{tokens * k * hidden * 4} bytes "
        f"({'as the formula says' if ep['dispatch_matches_formula'] else 'NOT the formula'}); "
        f"TP of the same layer all-reduced {tp['bytes_per_rank']:.0f} bytes per rank in "
        f"{tp['calls_per_rank']:.0f} all-reduces of p·T·h·4 = {world_size * tokens * hidden * 4}. "
        f"EP × DP on the 2 × 2 mesh matched one plain step within {mesh_diff:.1e}. "
        f"Toy training, last 10 steps: {dropped['without']:.0%} of tokens dropped without the "
        f"auxiliary loss, {dropped['with']:.0%} with it.")
