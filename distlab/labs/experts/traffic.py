"""What one MoE layer sends, read from the collective records (``out.comms``): expert parallelism
(two token all-to-alls each way) against tensor parallelism of the same layer (every expert's
hidden dimension split over the ranks, Megatron-style, one all-reduce of the activations each
way, Lab 3). Both run one forward and backward of the same layer on the same p·T tokens.

The tables put the records beside the formulas of Lab 9's section 7 (bytes as
``distlab.Comm.bytes`` counts them; on the wire, ``wire_bytes``, what leaves the rank: an
all-to-all's off-rank part under balanced routing, a ring all-reduce's 2(p−1)/p). TP assumes
every rank already holds all p·T tokens.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.labs.experts.moe import make_moe
from distlab.labs.experts.parallel import local_experts
from distlab.labs.experts.stored import stored_output
from distlab.labs.tables import format_table, largest_residue
from distlab.labs.tensor_parallel import copy_to_tp, reduce_from_tp, split_at_barriers
from distlab.runtime.devices import device as rank_device


def _batch(seed: int, rows: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)


def _ep_rank(rank, world_size, moe_forward, seed, tokens, hidden, ffn, experts, k):
    dev = rank_device()
    moe = make_moe(hidden, ffn, experts, k, seed).to(dev)
    mine = local_experts(moe, rank, world_size)
    x, dy = (t[rank * tokens:(rank + 1) * tokens].to(dev)
             for t in _batch(seed, world_size * tokens, hidden))
    y = moe_forward(x.requires_grad_(True), moe.router, mine, experts, k, None)
    dist.barrier()
    (y * dy).sum().backward()
    return y.detach()


def tp_moe_forward(x, moe, group=None):
    """The same layer, tensor parallel: every rank routes all tokens (router replicated), and
    holds rows [r f/p, (r+1) f/p) of every expert's w1 and those columns of its w2; the partial
    outputs are summed by one all-reduce (g), and dL/dx by one in the backward (f)."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    probs = torch.softmax(moe.router(x), dim=-1)                    # (N, E)
    gates, idx = probs.topk(moe.k, dim=-1)                          # (N, k)
    xe = copy_to_tp(x, group)
    y = torch.zeros_like(x)
    for e, expert in enumerate(moe.experts):
        f = expert.w1.out_features // p
        w1 = expert.w1.weight[r * f:(r + 1) * f]                     # (f/p, h)
        w2 = expert.w2.weight[:, r * f:(r + 1) * f]                  # (h, f/p)
        t, j = (idx == e).nonzero(as_tuple=True)
        if len(t):
            y = y.index_add(0, t, gates[t, j, None] * F.linear(F.gelu(F.linear(xe[t], w1)), w2))
    return reduce_from_tp(y, group)                                 # (N, h), summed over ranks


def _tp_rank(rank, world_size, seed, tokens, hidden, ffn, experts, k):
    dev = rank_device()
    moe = make_moe(hidden, ffn, experts, k, seed).to(dev)
    x, dy = (t.to(dev) for t in _batch(seed, world_size * tokens, hidden))
    y = tp_moe_forward(x.requires_grad_(True), moe)
    dist.barrier()
    (y * dy).sum().backward()
    return y.detach()


TRAFFIC = dict(world_size=2, tokens=64, hidden=32, ffn=64, experts=4, k=2, seed=0)   # stored


def plain_output(world_size: int = 2, tokens: int = 64, hidden: int = 32, ffn: int = 64,
                 experts: int = 4, k: int = 2, seed: int = 0) -> torch.Tensor:
    """The plain layer's output (p T, h) on measure_traffic's tokens (the course's full package)."""
    plain = make_moe(hidden, ffn, experts, k, seed)
    with torch.no_grad():
        return plain(_batch(seed, world_size * tokens, hidden)[0])


def measure_traffic(moe_forward, world_size: int = 2, tokens: int = 64, hidden: int = 32,
                    ffn: int = 64, experts: int = 4, k: int = 2, seed: int = 0) -> list[dict]:
    """One forward+backward of the layer under EP (``moe_forward``, e.g. yours) and under TP;
    per rank and phase, the bytes of every collective from ``out.comms`` beside the formula.
    Prints the table and returns its rows."""
    import distlab
    args = (seed, tokens, hidden, ffn, experts, k)
    ep = distlab.run(_ep_rank, world_size, moe_forward, *args)
    tp = distlab.run(_tp_rank, world_size, *args)
    case = dict(world_size=world_size, tokens=tokens, hidden=hidden, ffn=ffn, experts=experts,
                k=k, seed=seed)
    # The lab's case: the plain layer's output as the course stored it (a handout has no plain
    # layer); any other case computes it.
    y = stored_output("traffic_y") if case == TRAFFIC else plain_output(**case)
    # float32 outputs: a residue shows as its bound (its digits would differ by CPU)
    ep_err = largest_residue((ep[r], y[r * tokens:(r + 1) * tokens]) for r in range(world_size))[1]
    tp_err = largest_residue((tp[r], y) for r in range(world_size))[1]
    b = 4
    rows = []
    for name, out, formula in (("EP", ep, tokens * k * hidden * b), ("TP", tp, world_size * tokens * hidden * b)):
        for rank, comms in enumerate(out.comms):
            for phase, part in zip(("forward", "backward"), split_at_barriers(comms)):
                for c in part:
                    token = c.dtype.startswith("float")
                    rows.append({"layout": name, "rank": rank, "phase": phase, "op": c.op,
                                 "what": "tokens" if token else "counts", "bytes": c.bytes,
                                 "formula": formula if token else experts * 8})
    print(format_table(rows))
    print(f"\nlargest difference from the plain layer's output: EP {ep_err}, TP {tp_err}")
    return rows


def traffic_summary(rows: list[dict]) -> dict:
    """Per layout: token bytes one rank sends per forward+backward (mean over ranks) and the
    formula's (section 7 of Lab 9)."""
    out = {}
    for layout in ("EP", "TP"):
        mine = [r for r in rows if r["layout"] == layout and r["what"] == "tokens"]
        ranks = {r["rank"] for r in mine}
        out[layout] = {"bytes_per_rank": sum(r["bytes"] for r in mine) / max(len(ranks), 1),
                       "calls_per_rank": len(mine) / max(len(ranks), 1)}
    dispatch = [r for r in rows if r["layout"] == "EP" and r["what"] == "tokens" and r["phase"] == "forward"][::2]
    out["EP"]["dispatch_matches_formula"] = all(r["bytes"] == r["formula"] for r in dispatch)
    return out


def wire_bytes(world_size: int, tokens: int, hidden: int, k: int, b: int = 4) -> dict:
    """Bytes one rank sends off itself per forward+backward of the layer (balanced routing, ring
    all-reduce): EP's four all-to-alls, TP's two all-reduces, their ratio (k/p), and an all-gather
    dispatch's gathered bytes against the all-to-all's message (p/k)."""
    p = world_size
    ep = 4 * tokens * k * hidden * b * (p - 1) / p
    tp = 2 * (2 * (p - 1) / p) * (p * tokens * hidden * b)
    return {"p": p, "EP": ep, "TP": tp, "EP/TP": ep / tp,
            "gather/all-to-all": (p * tokens * hidden * b) / (tokens * k * hidden * b)}


def format_wire_bytes(tokens: int, hidden: int, k: int, world_sizes=(2, 4, 8), b: int = 4) -> str:
    """``wire_bytes`` for several world sizes, as a table."""
    rows = [wire_bytes(p, tokens, hidden, k, b) for p in world_sizes]
    return format_table([{"p": r["p"], "EP bytes sent": f"{r['EP']:,.0f}",
                          "TP bytes sent": f"{r['TP']:,.0f}", "EP / TP (= k/p)": f"{r['EP/TP']:.2f}",
                          "all-gather dispatch / all-to-all (= p/k)": f"{r['gather/all-to-all']:.2f}"}
                         for r in rows])
