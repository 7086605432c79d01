"""Lab 9's problems: an MoE layer and tokens drawn from a seed, and the single-process results
every check compares with (the stored set for visible tests, a fresh one for hidden tests).

Rank r holds tokens [r T, (r+1) T) of the (p T, h) batch and experts [r E/p, (r+1) E/p).
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import dense_run
from distlab.labs.experts.moe import MoE, make_moe
from distlab.runtime.per_rank import PerRank, reference

LAB = "09_expert_parallel"
SHAPE = dict(tokens=12, hidden=8, ffn=16, experts=4, k=2)   # tokens per rank; E divisible by 2, 4
SEED = 9                                                     # the stored set's seed


def moe_problem(seed: int, world_size: int, tokens: int, hidden: int, ffn: int, experts: int,
                k: int, starve: bool = False) -> dict:
    """x, dy (p T, h); the layer's param.*; the plain layer's y, dx, grad.*; the routing
    (probs (p T, E), gates and idx (p T, k)). ``starve``: the last rank's experts get no token
    (``starve_last_rank``)."""
    if experts % world_size or k > experts:
        raise ValueError(f"{experts} experts cannot be split over {world_size} ranks with k={k}")
    if starve and k > experts - experts // world_size:
        raise ValueError(f"with k={k} every token needs {k} experts; starving a rank leaves "
                         f"{experts - experts // world_size}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world_size * tokens, hidden, generator=g)          # (p T, h)
    dy = torch.randn(world_size * tokens, hidden, generator=g)         # (p T, h)
    moe = make_moe(hidden, ffn, experts, k, seed)
    if starve:
        starve_last_rank(moe, x, world_size)
    with torch.no_grad():
        probs, gates, idx = moe.route(x)
    return {"seed": seed, "x": x, "dy": dy, "probs": probs, "gates": gates, "idx": idx,
            **dense_run(moe, x, dy)}


def with_references(problem: dict) -> dict:
    """``problem`` with the plain layer's results (y, dx, grad.*) marked as references (stored
    or fresh): none of them can head for a rank (``distlab.runtime.per_rank``)."""
    return {key: reference(t) if key in ("y", "dx") or key.startswith("grad.") else t
            for key, t in problem.items()}


def starve_last_rank(moe, x: torch.Tensor, world_size: int) -> None:
    """Make the routing leave the last rank's experts without a token, in place and by
    construction (no search): feature 0 of every token becomes positive (|x_0| + 1) and the
    router's weight on it for those experts drops by 8 (their logits by at least 8), doubling
    the drop until no token picks them."""
    last = slice(moe.num_experts - moe.num_experts // world_size, moe.num_experts)
    with torch.no_grad():
        x[:, 0] = x[:, 0].abs() + 1
        drop = 8.0
        while True:
            moe.router.weight[last, 0] -= drop
            idx = moe.route(x)[2]
            if not ((idx >= last.start).any()):
                return
            drop *= 2


def starved(problem: dict, world_size: int, experts: int) -> bool:
    """Whether some rank's experts receive no token at all."""
    owners = set((problem["idx"] // (experts // world_size)).flatten().tolist())
    return len(owners) < world_size


def moe_case(seed, world_size: int, shape: dict, starve: bool = False) -> tuple[dict, str]:
    """(problem, description): the stored set when seed is None, else a fresh one; with
    ``starve``, a fresh one (seed ``SEED`` when None) whose routing leaves the last rank's experts
    without a token (a rank that must still join the backward's all-to-alls)."""
    s = shape
    sizes = (f"{world_size} ranks, T={s['tokens']} tokens per rank, h={s['hidden']}, "
             f"E={s['experts']}, k={s['k']}")
    if starve:
        seed = SEED if seed is None else seed
        return (with_references(moe_problem(seed, world_size, **shape, starve=True)),
                f"fresh inputs (seed {seed}, {sizes}; rank {world_size - 1}'s experts get no token)")
    if seed is None:
        if world_size != 2 or shape != SHAPE:
            raise CheckFailed("the stored references are for 2 ranks and the default sizes; "
                              "pass a seed to check other world sizes or sizes")
        from distlab.checks.stored import load
        return with_references(load(LAB, "moe")), "the stored inputs (2 ranks)"
    return with_references(moe_problem(seed, world_size, **shape)), f"fresh inputs (seed {seed}, {sizes})"


def moe_shape(tokens, hidden, ffn, experts, k) -> dict:
    return dict(tokens=tokens, hidden=hidden, ffn=ffn, experts=experts, k=k)


def mine(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank r's rows of a (p T, ...) tensor."""
    n = t.shape[0] // world_size
    return t[rank * n:(rank + 1) * n]


def own_rows(t: torch.Tensor, world_size: int) -> PerRank:
    """Each rank's own rows of a (p T, ...) tensor, as copies: rank r receives its T rows and
    nothing of the other ranks' (a pickled view would carry the whole storage)."""
    return PerRank([mine(t, r, world_size).clone() for r in range(world_size)])


def layer_of(problem: dict, experts: int, k: int) -> MoE:
    """The problem's whole layer, built in the judge from its param.* (the router is replicated;
    each rank receives only its own experts, ``experts_by_rank``)."""
    moe = MoE(problem["x"].shape[1], problem["param.experts.0.w1.weight"].shape[0], experts, k)
    moe.load_state_dict({n[6:]: v for n, v in problem.items() if n.startswith("param.")})
    return moe


def experts_by_rank(moe: MoE, world_size: int) -> PerRank:
    """Rank r's experts [r E/p, (r+1) E/p), as a ModuleList each rank receives alone."""
    per = moe.num_experts // world_size
    return PerRank([torch.nn.ModuleList(moe.experts[r * per + i] for i in range(per))
                    for r in range(world_size)])


def expected_dispatch(idx: torch.Tensor, x: torch.Tensor, experts: int, world_size: int,
                      rank: int) -> dict:
    """What rank ``rank`` must receive: rows ordered by source rank, then local expert, then the
    source's flat assignment index t·k+j; the local expert of each row; the splits."""
    per = experts // world_size
    rows, local, recv_splits = [], [], []
    for src in range(world_size):
        src_idx, src_x = mine(idx, src, world_size), mine(x, src, world_size)
        k = src_idx.shape[1]
        flat = src_idx.reshape(-1)
        n = 0
        for e in range(rank * per, (rank + 1) * per):
            hits = (flat == e).nonzero().squeeze(1)
            rows.append(src_x[hits // k])
            local += [e - rank * per] * len(hits)
            n += len(hits)
        recv_splits.append(n)
    mine_idx = mine(idx, rank, world_size).reshape(-1)
    send_splits = [int(((mine_idx // per) == dst).sum()) for dst in range(world_size)]
    return reference({"recv": torch.cat(rows), "recv_expert": torch.tensor(local, dtype=torch.long),
                      "recv_splits": recv_splits, "send_splits": send_splits})
