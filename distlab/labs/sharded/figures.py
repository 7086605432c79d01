"""Lab 8's figures and its activation-checkpointing measurement: the collective timeline of
ZeRO-3 with and without prefetch, per-rank memory over one step per ZeRO stage, and saved
activations and step time of an attention block with and without checkpointing."""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from distlab.labs.activation_memory import ActivationMeter
from distlab.labs.sharded.accounting import PHASES, STAGE_NAMES
from distlab.labs.threads import one_thread
from distlab.labs.sharded.harness import wrap_blocks, wrap_model, zero3_training
from distlab.labs.sharded.problem import ShardSetup
from distlab.labs.tables import format_table

GATHER_OPS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def prefetch_timeline(zero3_cls, prefetch_cls, world_size: int = 2,
                      setup: ShardSetup = ShardSetup(hidden=256, d=128, batch=64)) -> dict:
    """Rank 0's last of 2 steps under ``zero3_cls`` (blocking gathers) and ``prefetch_cls``:
    {name: {"comms": [(op, start, end, async)], "probes": per-block timestamps, "t0": start}}."""
    from distlab import run
    result = {}
    for name, wrap in (("blocking gathers", wrap_blocks(zero3_cls)),
                       ("prefetch", wrap_model(prefetch_cls))):
        out = run(zero3_training, world_size, wrap, setup, 2, timeout=120)
        last = out[0]["steps"][-1]
        lo, hi = last["window"]
        comms = [(c.op, c.start, c.end if c.end is not None else hi, c.async_op)
                 for c in out.comms[0] if lo <= c.start <= hi and c.op != "barrier"]
        result[name] = {"comms": comms, "probes": last, "t0": lo, "t1": hi}
    return result


def plot_prefetch_timeline(timeline: dict):
    """Per variant three lanes: the blocks' compute (grey), all-gathers (blue, from issue to the
    return of their wait) and reduce-scatters (orange), in milliseconds from the step's start.
    Blue overlapping grey is a gather hidden behind compute."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(timeline), 1, figsize=(9, 1.9 * len(timeline) + 0.6))
    for ax, (name, rec) in zip(axes, timeline.items()):
        t0, p = rec["t0"], rec["probes"]
        ms = lambda t: 1e3 * (t - t0)  # noqa: E731
        n = len(p["fwd_end"])
        spans = [(p["fwd_compute"][i], p["fwd_end"][i]) for i in range(n)]
        spans += [(p["bwd_compute"][i], p["bwd_start"][i - 1] if i else rec["t1"])
                  for i in range(n)]
        for a, b in spans:
            ax.barh(2, max(ms(b) - ms(a), 0.05), left=ms(a), color="0.7", edgecolor="0.4")
        for op, a, b, _ in rec["comms"]:
            gather = op in GATHER_OPS
            ax.barh(1 if gather else 0, max(ms(b) - ms(a), 0.05), left=ms(a),
                    color="#4c72b0" if gather else "#dd8452", alpha=0.8, edgecolor="k",
                    linewidth=0.3)
        ax.set_yticks([0, 1, 2], ["reduce-scatter", "all-gather", "compute"])
        ax.set_title(f"ZeRO-3, {name} (rank 0, one step)", fontsize=9)
    axes[-1].set_xlabel("ms since the step started (an all-gather's bar runs from its issue to "
                        "the return of its wait)")
    fig.tight_layout()
    return axes


def plot_memory_over_step(stages: dict):
    """Stacked areas of rank 0's bytes (weights, gradients, optimizer state, activations) at the
    end of each phase of one step, one panel per ZeRO stage."""
    import matplotlib.pyplot as plt
    terms = ("weights", "gradients", "optimizer", "activations")
    fig, axes = plt.subplots(1, 4, figsize=(12, 3), sharey=True)
    for ax, rec in zip(axes, stages["ranks"][0]):
        series = [[rec["phases"][ph][t] / 2**10 for ph in PHASES] for t in terms]
        ax.stackplot(range(len(PHASES)), *series, labels=terms, alpha=0.85)
        ax.set_xticks(range(len(PHASES)), PHASES, fontsize=8)
        ax.set_title(STAGE_NAMES[rec["stage"]], fontsize=9)
    axes[0].set_ylabel(f"KiB on rank 0 of {stages['world_size']}")
    axes[-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return axes


# ---------------------------------------------------------------------------------------------
# Activation checkpointing measured on an attention block

class TinyAttentionBlock(nn.Module):
    """Pre-norm self-attention with an explicit softmax (so its (B, heads, s, s) scores are saved
    for backward, the quadratic term) followed by a GELU MLP of width 4h."""

    def __init__(self, h: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))             # (B, nh, s, hs)
        scores = (q @ k.transpose(-1, -2)) / (h // self.heads) ** 0.5  # (B, nh, s, s)
        att = torch.softmax(scores, dim=-1) @ v                        # (B, nh, s, hs)
        x = x + self.out(att.transpose(1, 2).reshape(b, s, h))         # (B, s, h)
        return x + self.mlp(self.norm2(x))


def _measure(blocks: nn.Sequential, x: torch.Tensor, wrapped: bool) -> tuple[int, float]:
    def forward(inp):
        for block in blocks:
            inp = checkpoint(block, inp, use_reentrant=False) if wrapped else block(inp)
        return inp
    with ActivationMeter(blocks) as meter:
        out = forward(x)
    saved = meter.peak
    out.sum().backward()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        forward(x).sum().backward()
        times.append(time.perf_counter() - start)
    return saved, statistics.median(times)


def checkpointing_measured(seq_lens=(64, 128), batch: int = 2, h: int = 32, layers: int = 2,
                           seed: int = 0) -> list[dict]:
    """Per sequence length: saved-activation bytes and step time (forward + backward, median of
    5, one thread) of ``layers`` attention blocks without and with checkpointing every block, and the model
    states' bytes at 16 per parameter for the 1.25 rule of thumb (activations = 0.25 x states)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = nn.Sequential(*[TinyAttentionBlock(h) for _ in range(layers)])
    # One thread: several intra-op threads on tiny matrices thrash on a shared 2-core machine,
    # and the step times would measure the contention instead of the recompute.
    with one_thread():
        return _rows(blocks, seq_lens, batch, h, layers, seed)


def _rows(blocks, seq_lens, batch, h, layers, seed) -> list[dict]:
    states = 16 * sum(p.numel() for p in blocks.parameters())
    rows = []
    for s in seq_lens:
        x = torch.randn(batch, s, h, generator=torch.Generator().manual_seed(seed + s),
                        requires_grad=True)
        plain, t_plain = _measure(blocks, x, False)
        ckpt, t_ckpt = _measure(blocks, x, True)
        rows.append({"seq_len": s, "saved": plain, "saved_checkpointed": ckpt,
                     "ms": 1e3 * t_plain, "ms_checkpointed": 1e3 * t_ckpt, "states": states,
                     "score_bytes": 4 * batch * blocks[0].heads * s * s * layers})
    return rows


def format_checkpointing(rows: list[dict]) -> str:
    """``checkpointing_measured``'s rows as a table, and how the saved bytes grew with the
    sequence (the s^2 attention scores) with and without checkpointing."""
    lines = [format_table([{"seq": r["seq_len"], "saved": f"{r['saved']:,}",
                            "checkpointed": f"{r['saved_checkpointed']:,}",
                            "ms/step": f"{r['ms']:.2f}", "ckpt ms": f"{r['ms_checkpointed']:.2f}",
                            "saved / states": f"{r['saved'] / r['states']:.2f}"} for r in rows])]
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        lines.append(f"x{b['seq_len'] / a['seq_len']:g} sequence: saved x{b['saved'] / a['saved']:.2f} "
                     f"(linear terms x{b['seq_len'] / a['seq_len']:g}, the s^2 scores "
                     f"x{(b['seq_len'] / a['seq_len']) ** 2:g}); checkpointed "
                     f"x{b['saved_checkpointed'] / a['saved_checkpointed']:.2f} (the inputs only)")
    lines.append("times: median of 5 steps, one thread; at these sizes the recompute is of the order of "
                 "the timing noise: read the bytes, not the milliseconds")
    lines.append("Lab 7's quick count (the 1.25 rule, no published source) assumes saved / states = 0.25 "
                 "(states: 16 bytes per parameter)")
    return "\n".join(lines)
