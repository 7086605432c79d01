"""Lab 10's demonstration: the reader's ring attention on the reader's causal layout, on 4 ranks,
against plain causal attention (stored), with each layout's causal work per rank.

    ring_with_layout(ring_attention, causal_layout)  # prints the work table and the max error
"""
from __future__ import annotations

import torch

from distlab.labs.context.layout import contiguous_layout, work_table
from distlab.labs.context.stored import stored_set
from distlab.labs.tables import format_table, largest_residue
from distlab.runtime.devices import device as rank_device

# The demonstration's sizes (its inputs and plain causal attention's output are stored as "demos")
DEMO = dict(world_size=4, batch=1, heads=2, seq=64, dim=8)


def demo_problem(seed: int = 0, world_size=4, batch=1, heads=2, seq=64, dim=8) -> dict:
    """q, k, v (b, h, s, d) float64 of the demonstration."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64)
               for _ in range(3))
    return {"q": q, "k": k, "v": v}


def _ring_on_rank(rank, world_size, ring_attention, problem, positions):
    dev = rank_device()
    q, k, v = (problem[n][:, :, positions[rank]].to(dev) for n in "qkv")
    with torch.no_grad():
        out, _ = ring_attention(q, k, v, positions, None)
    return out.cpu()


def ring_with_layout(ring_attention, causal_layout, show: bool = True) -> dict:
    """Run ``ring_attention`` on DEMO's ranks with ``causal_layout``'s positions; compare every
    rank's output with plain causal attention's (stored); tabulate the causal work per rank of
    the contiguous split and of the layout (float64: a difference that is rounding shows as its
    bound, whose digits would differ by CPU). Returns {"max_error", "rows"}."""
    import distlab
    p, s = DEMO["world_size"], DEMO["seq"]
    stored = stored_set("demos")
    positions = torch.as_tensor(causal_layout(s, p))
    outs = distlab.run(_ring_on_rank, p, ring_attention, stored, positions)
    error, shown = largest_residue((out, stored["causal.out"][:, :, positions[r]])
                                   for r, out in enumerate(outs))
    rows = work_table({"contiguous": contiguous_layout(s, p), "causal_layout": positions})
    if show:
        print(format_table(rows))
        print(f"\nring_attention on causal_layout's split, {p} ranks, s = {s}: largest difference "
              f"from plain causal attention {shown}")
    return {"max_error": error, "rows": rows}


# ---------------------------------------------------------------------------------------------
# Training through the reader's ring: forward and backward as one autograd function

class RingAttentionFunction(torch.autograd.Function):
    """out = ring attention of (q, k, v), differentiable: ``forward_fn`` (the reader's
    ring_attention) runs the forward, ``backward_fn`` (their ring_attention_backward) the
    backward from the saved q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, positions, forward_fn, backward_fn):
        out, lse = forward_fn(q, k, v, positions, None)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.positions, ctx.backward_fn = positions, backward_fn
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.backward_fn(dout.contiguous(), q, k, v, out, lse, ctx.positions, None)
        return dq, dk, dv, None, None, None


# One attention layer's q, k, v projection W (e, 3·h·d), trained on a causal sequence of GRAD_DEMO
GRAD_DEMO = dict(world_size=2, batch=1, seq=16, embed=8, heads=2, dim=4)


def grad_problem(seed: int = 1, world_size=2, batch=1, seq=16, embed=8, heads=2, dim=4) -> dict:
    """x (b, s, e), the projection w (e, 3·h·d) and an upstream gradient dy (b, h, s, d)."""
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(batch, seq, embed, generator=g, dtype=torch.float64),
            "w": torch.randn(embed, 3 * heads * dim, generator=g, dtype=torch.float64) / embed ** 0.5,
            "dy": torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64)}


def _project(x, w, heads: int):
    """q, k, v (b, h, tokens, d) of x (b, tokens, e)."""
    b, n, _ = x.shape
    return (x @ w).view(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def plain_weight_grad(attention, problem: dict, heads: int) -> torch.Tensor:
    """dL/dw on one process, L = Σ attention(q, k, v, causal) ∘ dy: what the stored set holds
    (``attention`` is plain attention, ``(q, k, v, causal) -> (out, lse)``)."""
    w = problem["w"].clone().requires_grad_(True)
    out, _ = attention(*_project(problem["x"], w, heads), True)
    (out * problem["dy"]).sum().backward()
    return w.grad


def _train_on_rank(rank, world_size, forward_fn, backward_fn, problem, heads):
    import torch.distributed as dist
    positions = contiguous_layout(problem["x"].shape[1], world_size)
    mine = positions[rank]
    w = problem["w"].clone().requires_grad_(True)       # replicated over the CP ranks
    q, k, v = (t.contiguous() for t in _project(problem["x"][:, mine], w, heads))
    out = RingAttentionFunction.apply(q, k, v, positions, forward_fn, backward_fn)
    (out * problem["dy"][:, :, mine]).sum().backward()
    dist.all_reduce(w.grad)                              # summed over the ranks, as over DP
    return w.grad


def ring_gradients(ring_attention, ring_attention_backward, show: bool = True) -> float:
    """Train-step gradients through the reader's ring on GRAD_DEMO's 2 ranks: the projection's
    gradient, all-reduced over the ranks, against plain attention's on one process (stored).
    Returns the largest difference."""
    import distlab
    stored = stored_set("demos")
    problem = {key: stored[f"grad.{key}"] for key in ("x", "w", "dy")}
    grads = distlab.run(_train_on_rank, GRAD_DEMO["world_size"], ring_attention,
                        ring_attention_backward, problem, GRAD_DEMO["heads"])
    error, shown = largest_residue((g, stored["grad.dw"]) for g in grads)
    if show:
        print(f"dL/dW of the q, k, v projection through your ring on {GRAD_DEMO['world_size']} "
              f"ranks (summed over them) against one process: largest difference {shown}")
    return error
