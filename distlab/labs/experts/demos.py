"""What the lab prints about the single-process layer and, at the end, the closing note built from
the measurements the lab made."""
from __future__ import annotations

import torch

from distlab.labs.experts.moe import make_moe
from distlab.labs.experts.stored import stored_output
from distlab.labs.tables import format_table, largest_residue

ROUTING = dict(tokens=6, hidden=8, ffn=16, experts=4, k=2, seed=0)   # the lab's case (stored)


def _routing_case(tokens, hidden, ffn, experts, k, seed):
    moe = make_moe(hidden, ffn, experts, k, seed)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1))   # (T, h)
    return moe, x


def routing_output(tokens: int = 6, hidden: int = 8, ffn: int = 16, experts: int = 4, k: int = 2,
                   seed: int = 0) -> torch.Tensor:
    """The plain layer's output (T, h) on show_routing's tokens (the course's full package)."""
    moe, x = _routing_case(tokens, hidden, ffn, experts, k, seed)
    with torch.no_grad():
        return moe(x)


def show_routing(tokens: int = 6, hidden: int = 8, ffn: int = 16, experts: int = 4, k: int = 2,
                 seed: int = 0) -> dict:
    """Route a few tokens through a fresh layer: each token's experts and gates, each expert's
    load, and the output computed token by token against the layer's batched loop (for the lab's
    case, its output as the course stored it: a handout has no plain layer)."""
    case = dict(tokens=tokens, hidden=hidden, ffn=ffn, experts=experts, k=k, seed=seed)
    moe, x = _routing_case(**case)
    y = stored_output("routing_y") if case == ROUTING else routing_output(**case)
    with torch.no_grad():
        probs, gates, idx = moe.route(x)
        by_token = torch.stack([sum(gates[t, j] * moe.experts[int(idx[t, j])](x[t])
                                    for j in range(k)) for t in range(tokens)])
    print(format_table([{"token": t, "experts": str(idx[t].tolist()),
                         "gates": str([round(g, 3) for g in gates[t].tolist()]),
                         "sum of gates": f"{gates[t].sum():.3f}"} for t in range(tokens)]))
    load = torch.bincount(idx.reshape(-1), minlength=experts)
    print(f"\nassignments per expert: {load.tolist()} (T·k = {tokens * k})")
    print(f"max |layer - token-by-token sum|: {largest_residue([(by_token, y)])[1]}")
    return {"idx": idx, "gates": gates, "load": load, "y": y}


def moe_closing_note(summary: dict, world_size: int, tokens: int, hidden: int, k: int,
                 mesh_diff: str, dropped: dict) -> str:
    """The summary's numbers, each from the measurement that produced it (``mesh_diff``: the
    EP × DP step's largest difference as ``ep_dp_step`` shows it, a bound when it is rounding)."""
    ep, tp = summary["EP"], summary["TP"]
    return (
        f"Measured here (gloo, {world_size} ranks, T={tokens} tokens per rank, h={hidden}, k={k}, "
        f"float32): EP sent {ep['bytes_per_rank']:.0f} token bytes per rank per forward+backward "
        f"in {ep['calls_per_rank']:.0f} all-to-alls, each dispatch exactly T·k·h·4 = "
        f"{tokens * k * hidden * 4} bytes "
        f"({'as the formula says' if ep['dispatch_matches_formula'] else 'NOT the formula'}); "
        f"TP of the same layer all-reduced {tp['bytes_per_rank']:.0f} bytes per rank in "
        f"{tp['calls_per_rank']:.0f} all-reduces of p·T·h·4 = {world_size * tokens * hidden * 4}; "
        f"on the wire (off the rank: (p−1)/p of an all-to-all, 2(p−1)/p of a ring all-reduce) "
        f"EP {ep['bytes_per_rank'] * (world_size - 1) / world_size:.0f} and TP "
        f"{tp['bytes_per_rank'] * 2 * (world_size - 1) / world_size:.0f} bytes, k/p = "
        f"{k / world_size:g}. "
        f"EP × DP on the 2 × 2 mesh matched one plain step (largest difference {mesh_diff}). "
        f"Toy training, last 10 steps: {dropped['without']:.0%} of tokens dropped without the "
        f"auxiliary loss, {dropped['with']:.0%} with it.")
