"""EP × DP on a 2 × 2 mesh: four ranks, each with its own tokens; the EP axis splits the experts
(ranks (d, 0) hold experts [0, E/2), ranks (d, 1) the rest), the DP axis replicates them. One SGD
step must equal the plain layer's step on all 4·T tokens:

- expert gradients: each EP rank collects, by the backward all-to-all, the gradient of every token
  of its EP group; the two replicas of an expert (one per DP row) saw different groups' tokens, so
  their gradients are summed over the DP axis;
- router (the layer's dense weight): every rank saw different tokens, so its gradients are summed
  over all ranks (both axes), as DeepSpeed-MoE does for non-expert parameters.
The loss is the mean over all 4·T tokens, so each rank's part is its sum divided by 4·T.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from distlab.labs.experts.moe import make_moe
from distlab.labs.experts.parallel import ep_moe_forward, local_experts
from distlab.labs.experts.stored import stored_output
from distlab.labs.tables import format_table, largest_residue
from distlab.runtime.devices import device as rank_device

MESH = (2, 2)   # (dp, ep)


def _problem(seed: int, rows: int, hidden: int):
    g = torch.Generator().manual_seed(seed + 2)
    return torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)


def _loss(y, x, target, total_rows):
    return ((x + y - target) ** 2).sum() / total_rows                 # residual block, MSE


def _mesh_rank(rank, world_size, moe_forward, seed, tokens, hidden, ffn, experts, k, lr):
    from torch.distributed.device_mesh import init_device_mesh
    dev = rank_device()
    mesh = init_device_mesh(dev.type, MESH, mesh_dim_names=("dp", "ep"))
    ep_group, dp_group = mesh.get_group("ep"), mesh.get_group("dp")
    ep_rank = dist.get_rank(ep_group)
    moe = make_moe(hidden, ffn, experts, k, seed).to(dev)
    mine = local_experts(moe, ep_rank, MESH[1])
    x, target = (t[rank * tokens:(rank + 1) * tokens].to(dev)
                 for t in _problem(seed, world_size * tokens, hidden))
    y = moe_forward(x, moe.router, mine, experts, k, ep_group)
    _loss(y, x, target, world_size * tokens).backward()
    for p in moe.router.parameters():
        dist.all_reduce(p.grad)                                     # both axes: all tokens
    for p in mine.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=dp_group)                     # the expert's replicas
    with torch.no_grad():
        for p in [*moe.router.parameters(), *mine.parameters()]:
            p -= lr * p.grad
    per = experts // MESH[1]
    return {"router": moe.router.weight.detach(),
            "experts": {ep_rank * per + i: [p.detach() for p in e.parameters()]
                        for i, e in enumerate(mine)}}


EP_DP = dict(seed=0, tokens=16, hidden=16, ffn=32, experts=4, k=2, lr=0.5)   # the lab's (stored)


def plain_step(seed: int = 0, tokens: int = 16, hidden: int = 16, ffn: int = 32, experts: int = 4,
               k: int = 2, lr: float = 0.5) -> dict:
    """One plain SGD step of the layer on all 4·T tokens (the course's full package): the router
    weight (E, h) and every expert's w1 (E, f, h) and w2 (E, h, f) after it."""
    world = MESH[0] * MESH[1]
    moe = make_moe(hidden, ffn, experts, k, seed)
    x, target = _problem(seed, world * tokens, hidden)
    _loss(moe(x), x, target, world * tokens).backward()
    with torch.no_grad():
        for p in moe.parameters():
            p -= lr * (p.grad if p.grad is not None else 0)
    moe.requires_grad_(False)
    return {"router": moe.router.weight.detach().clone(),
            "w1": torch.stack([e.w1.weight.detach() for e in moe.experts]),
            "w2": torch.stack([e.w2.weight.detach() for e in moe.experts])}


def ep_dp_step(moe_forward=ep_moe_forward, seed: int = 0, tokens: int = 16, hidden: int = 16,
               ffn: int = 32, experts: int = 4, k: int = 2, lr: float = 0.5) -> dict:
    """One step on the 2 × 2 mesh against one plain step; prints the largest difference of every
    parameter group and the collectives of rank 0. Returns {"max_diff", "shown" (max_diff as the
    table shows it: a bound when it is rounding), "comms"}."""
    import distlab
    world = MESH[0] * MESH[1]
    out = distlab.run(_mesh_rank, world, moe_forward, seed, tokens, hidden, ffn, experts, k, lr)
    case = dict(seed=seed, tokens=tokens, hidden=hidden, ffn=ffn, experts=experts, k=k, lr=lr)
    # The lab's case: the plain step as the course stored it (a handout has no plain layer).
    plain = {key: stored_output(f"ep_dp_{key}") for key in ("router", "w1", "w2")} \
        if case == EP_DP else plain_step(**case)
    rows, every = [], []
    for rank, res in enumerate(out):
        pairs = [(res["router"], plain["router"])]
        for e, params in res["experts"].items():
            pairs += list(zip(params, (plain["w1"][e], plain["w2"][e])))
        every += pairs
        shown = largest_residue(pairs)[1]      # float32: a residue shows as its bound
        rows.append({"rank": rank, "mesh (dp, ep)": str(divmod(rank, MESH[1])),
                     "experts": str(sorted(res["experts"])), "max |Δ| after the step": shown})
    print(format_table(rows))
    ops = [f"{c.op}[{c.dtype}] group {list(c.group)}" for c in out.comms[0]]
    print("\nrank 0 issued, in order:\n  " + "\n  ".join(ops))
    worst, shown = largest_residue(every)
    return {"max_diff": worst, "shown": shown, "comms": out.comms}
