"""A toy task whose tokens cluster, trained with and without the load-balancing loss.

Tokens come from ``clusters`` Gaussian clusters that share one large common direction (as real
token embeddings share a mean); each cluster has its own target map, so experts can specialise.
The router starts out preferring one expert for the common direction (a slightly unlucky
initialisation, exaggerated so that a few steps show what happens). The model is the residual MoE
block ``x + MoE(x)`` with top-1 routing and capacity factor 1.0 (Switch Transformer §2.2 trains
with 1.0 to 2.0); the loss is the mean squared error plus, optionally, α times the Switch auxiliary loss
(α = 0.01 in the paper §2.2; a toy this short needs more, α is a parameter). Recorded per step: the
share of assignments each expert got (before capacity) and the fraction dropped by capacity.
"""
from __future__ import annotations

import dataclasses

import torch

from distlab.labs.experts.moe import (combine_reference, make_moe, reference_aux_loss,
                                      reference_keep)
from distlab.labs.threads import one_thread


@dataclasses.dataclass(frozen=True)
class ToyTask:
    tokens: int = 256
    hidden: int = 16
    ffn: int = 32
    experts: int = 4
    clusters: int = 4
    k: int = 1
    capacity_factor: float = 1.0
    steps: int = 60
    lr: float = 0.02
    bias: float = 2.0        # how strongly the initial router prefers expert 0
    seed: int = 0


def _data(task: ToyTask, g: torch.Generator):
    common = torch.randn(task.hidden, generator=g)
    common = 3 * common / common.norm()                              # the shared direction
    centres = torch.randn(task.clusters, task.hidden, generator=g)   # (C, h)
    maps = torch.randn(task.clusters, task.hidden, task.hidden, generator=g) / task.hidden ** 0.5
    return common, centres, maps


def _batch(task: ToyTask, data, g: torch.Generator):
    common, centres, maps = data
    c = torch.randint(task.clusters, (task.tokens,), generator=g)    # (T,) cluster of each token
    x = common + centres[c] + 0.3 * torch.randn(task.tokens, task.hidden, generator=g)   # (T, h)
    target = torch.einsum("thd,td->th", maps[c], x)                  # (T, h)
    return x, target


def train(task: ToyTask = ToyTask(), aux_weight: float = 0.0, aux_loss=reference_aux_loss) -> dict:
    """Train the block; returns per step ``load`` (steps, E), ``dropped`` (steps,), ``loss``."""
    with one_thread():
        return _train(task, aux_weight, aux_loss)


def _their_block(capacity_mask, moe_forward):
    """The block x + MoE(x) from a reader's functions: ``moe_forward`` (the expert-parallel layer,
    here on a group of one rank, every expert local) and ``capacity_mask``. With top-1 routing
    an assignment dropped by capacity is its token's only one, so the kept output is the layer's
    output times the keep mask."""
    def block(moe, x, idx, task):
        keep, _ = capacity_mask(idx, task.experts, task.capacity_factor)
        keep = keep.to(torch.bool)
        y = moe_forward(x, moe.router, moe.experts, task.experts, task.k, None)   # (T, h)
        return x + y * keep[:, :1].to(y.dtype), keep                             # dropped: residual
    return block


def _reference_block(moe, x, idx, task):
    probs, gates, idx = moe.route(x)
    keep = reference_keep(idx, task.experts, task.capacity_factor)
    return x + combine_reference(x, gates, idx, keep, moe.experts), keep        # dropped: residual


def _runs_on_rank(rank, world_size, task, aux_weight, aux_loss, capacity_mask, moe_forward):
    block = _their_block(capacity_mask, moe_forward)
    with one_thread():
        return {name: _train(task, weight, aux_loss, block)
                for name, weight in (("without", 0.0), ("with", aux_weight))}


def _train(task: ToyTask, aux_weight: float, aux_loss, block=_reference_block) -> dict:
    g = torch.Generator().manual_seed(task.seed)
    data = _data(task, g)
    moe = make_moe(task.hidden, task.ffn, task.experts, task.k, task.seed)
    with torch.no_grad():
        moe.router.weight[0] += task.bias * data[0] / data[0].norm()
    opt = torch.optim.Adam(moe.parameters(), lr=task.lr)
    load, dropped, losses = [], [], []
    for _ in range(task.steps):
        x, target = _batch(task, data, g)
        probs, gates, idx = moe.route(x)
        y, keep = block(moe, x, idx, task)
        loss = ((y - target) ** 2).mean()
        total = loss + aux_weight * aux_loss(probs, idx, task.experts) if aux_weight else loss
        opt.zero_grad()
        total.backward()
        opt.step()
        load.append(torch.bincount(idx.reshape(-1), minlength=task.experts).float() / idx.numel())
        dropped.append(1 - keep.float().mean().item())
        losses.append(loss.item())
    return {"load": torch.stack(load), "dropped": torch.tensor(dropped), "loss": torch.tensor(losses)}


def compare_training(task: ToyTask = ToyTask(), aux_weight: float = 0.3, aux_loss=reference_aux_loss,
                     capacity_mask=None, moe_forward=None):
    """Both runs, drawn: expert load per step as heat maps, dropped fraction and loss as lines.
    Returns {"without": run, "with": run}. With a reader's ``capacity_mask`` and ``moe_forward``
    (the lab passes its own), the block is theirs, run on one rank (top-1 routing only); without,
    the course's plain layer."""
    import matplotlib.pyplot as plt
    if (capacity_mask is None) != (moe_forward is None):
        raise ValueError("pass both capacity_mask and moe_forward (your exercises), or neither")
    if moe_forward is not None:
        import distlab
        if task.k != 1:
            raise ValueError(f"the toy's block from your moe_forward needs top-1 routing "
                             f"(k = 1, got {task.k}): a dropped assignment is then its token's "
                             f"only one, so your capacity_mask's keep masks the layer's output")
        # The toy's tensors live on the CPU: one gloo rank, GPUs or not ("auto" would pick NCCL
        # on a machine with a GPU, whose collectives refuse CPU tensors; seen on an H100).
        runs = distlab.run(_runs_on_rank, 1, task, aux_weight, aux_loss, capacity_mask,
                           moe_forward, backend="gloo")[0]
    else:
        runs = {"without": train(task, 0.0), "with": train(task, aux_weight, aux_loss)}
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.2),
                             gridspec_kw={"width_ratios": [1.2, 1.2, 1, 1]})
    for ax, (name, run) in zip(axes[:2], runs.items()):
        im = ax.imshow(run["load"].T, aspect="auto", cmap="viridis", vmin=0, vmax=1,
                       interpolation="nearest")
        ax.set(title=f"load per expert, {name} aux loss", xlabel="step", ylabel="expert",
               yticks=range(task.experts))
    fig.colorbar(im, ax=axes[1], label="share of assignments")
    for name, run in runs.items():
        axes[2].plot(run["dropped"], label=f"{name} aux loss")
        axes[3].plot(run["loss"], label=f"{name} aux loss")
    axes[2].set(title=f"dropped (capacity factor {task.capacity_factor})", xlabel="step",
                ylabel="fraction of tokens", ylim=(0, 1))
    axes[3].set(title="task loss (MSE)", xlabel="step", yscale="log")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    plt.show()
    for name, run in runs.items():
        last = run["load"][-10:].mean(0)
        print(f"{name:>7} aux loss: last 10 steps, load {[round(v, 2) for v in last.tolist()]}, "
              f"dropped {run['dropped'][-10:].mean():.1%}, MSE {run['loss'][-10:].mean():.3f}")
    return runs
