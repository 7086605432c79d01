"""Peak memory of attention against the sequence length: the whole sequence on one rank against
ring attention on p ranks, measured as the bytes of the tensors alive at once (Lab 8's
``TensorsMade``, sampled after every operation, the inputs left out).

Formulas (b bytes per element, per sequence of the batch): attention on one rank keeps an
(s × s) score matrix per head, s²·h·b bytes, and a few more of the same size (the softmax's
exponentials, the weights) while it computes; a ring step keeps the (s/p × s/p) scores of one
block, (s/p)²·h·b, p² times less, plus the blocks: its q, the K/V block it attends to, the next
one arriving and the running output, each (s/p)·h·d·b. So the measured peak is a small constant
times the formula for both, and the ring's peak at s on p ranks is the dense one's at s/p.
"""
from __future__ import annotations

import torch

from distlab.labs.context.dense import block_attention
from distlab.labs.context.traffic import ITEMSIZE, qkv_chunk, stored_measurement
from distlab.labs.sharded.alive import TensorsMade
from distlab.labs.tables import format_table

SEQ_LENS = (64, 128, 256, 512)
WORLD_SIZES = (2, 4)
SHAPE = dict(batch=1, heads=2, head_dim=16)


class PeakBytes(TensorsMade):
    """``TensorsMade`` that keeps the largest sum of alive bytes seen after any operation."""

    def __init__(self):
        super().__init__()
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.peak = max(self.peak, sum(nbytes for nbytes, _ in self.alive().values()))
        return out


def peak_bytes(fn, *args) -> int:
    """The peak bytes of the tensors ``fn(*args)`` makes (its inputs not counted)."""
    with PeakBytes() as mode:
        fn(*args)
    return mode.peak


def _ring_peaks_rank(rank, world_size, ring_attention, seq_lens, batch, heads, head_dim):
    """This rank's peak for each of ``seq_lens``: one launch per world size, not one per length
    (a launch of p ranks costs a few tenths of a CPU-second; the peaks are per call)."""
    return [peak_bytes(ring_attention, *qkv_chunk(rank, world_size, s, batch, heads, head_dim))
            for s in seq_lens]


def score_bytes(seq_len: int, heads: int, batch: int, world_size: int = 1) -> int:
    """One score matrix per head and sequence: (s/p)²·h·b·batch bytes (p = 1: dense)."""
    return (seq_len // world_size) ** 2 * heads * batch * ITEMSIZE


def block_bytes(seq_len: int, heads: int, head_dim: int, batch: int, world_size: int) -> int:
    """One (s/p, d) block per head and sequence: (s/p)·h·d·b·batch bytes."""
    return seq_len // world_size * heads * head_dim * batch * ITEMSIZE


def measure_memory(ring_attention, seq_lens=SEQ_LENS, world_sizes=WORLD_SIZES,
                   batch: int = SHAPE["batch"], heads: int = SHAPE["heads"],
                   head_dim: int = SHAPE["head_dim"]) -> list[dict]:
    """Peak bytes of dense attention (this process) and of ``ring_attention`` (yours; the largest
    rank's peak) on p ranks, for every s. When ``ring_attention`` is not written yet (it raises
    NotImplementedError), the ring's peaks are the course's, stored. Returns the rows."""
    import distlab
    ring = {}                                   # (s, p) -> (the largest rank's peak, source)
    for p in world_sizes:
        try:
            peaks = distlab.run(_ring_peaks_rank, p, ring_attention, seq_lens, batch, heads,
                                head_dim)
            ring.update({(s, p): (max(per_rank), "measured")
                         for s, per_rank in zip(seq_lens, zip(*peaks))})
        except distlab.RankError as err:
            if err.exc_type != "NotImplementedError":
                raise
            ring.update({(s, p): (stored_peak(s, p), "stored (the course's ring_attention)")
                         for s in seq_lens})
    rows = []
    for s in seq_lens:
        full = qkv_chunk(0, 1, s, batch, heads, head_dim)
        rows.append({"method": "dense", "p": 1, "s": s, "peak": peak_bytes(block_attention, *full),
                     "source": "measured"})
        rows += [{"method": "ring", "p": p, "s": s, "peak": ring[s, p][0], "source": ring[s, p][1]}
                 for p in world_sizes]
    for r in rows:
        r["scores"] = score_bytes(r["s"], heads, batch, r["p"])
        r["blocks"] = 0 if r["p"] == 1 else block_bytes(r["s"], heads, head_dim, batch, r["p"])
    return rows


MEMORY_KEYS = ("s", "p", "peak")


def memory_set(ring_attention) -> torch.Tensor:
    """(s, p, peak) of the ring's rows of ``measure_memory``, for the stored set."""
    rows = measure_memory(ring_attention)
    return torch.tensor([[r[k] for k in MEMORY_KEYS] for r in rows if r["method"] == "ring"],
                        dtype=torch.int64)


def stored_peak(seq_len: int, world_size: int) -> int:
    for s, p, peak in stored_measurement("memory").tolist():
        if (s, p) == (seq_len, world_size):
            return peak
    raise KeyError(f"no stored ring peak for s={seq_len}, p={world_size}: the stored run has "
                   f"s in {SEQ_LENS}, p in {WORLD_SIZES}")


def attention_memory_table(rows: list[dict]) -> str:
    """Peak KiB beside the score formula and the measured/formula ratio."""
    return format_table([{"method": r["method"], "p": r["p"], "s": r["s"],
                          "peak KiB": f"{r['peak'] / 1024:,.1f}",
                          "scores (s/p)²·h·b KiB": f"{r['scores'] / 1024:,.1f}",
                          "blocks (s/p)·h·d·b KiB": f"{r['blocks'] / 1024:,.1f}",
                          "peak / scores": f"{r['peak'] / r['scores']:.2f}",
                          "source": r["source"]} for r in rows])


def plot_attention_memory(rows: list[dict]):
    """Peak bytes against s, log-log: dense and ring on each p, the score formula dashed."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (method, p), colour in zip(sorted({(r["method"], r["p"]) for r in rows},
                                          key=lambda k: k[1]), ("C0", "C1", "C2", "C3")):
        mine = [r for r in rows if (r["method"], r["p"]) == (method, p)]
        label = "dense, one rank" if p == 1 else f"ring, p = {p}"
        ax.plot([r["s"] for r in mine], [r["peak"] for r in mine], "o-", color=colour,
                label=f"{label} (measured)")
        ax.plot([r["s"] for r in mine], [r["scores"] for r in mine], "--", color=colour,
                alpha=0.6, label=f"{label}: {'s²' if p == 1 else '(s/p)²'}·h·b")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("peak bytes per rank")
    ax.set_title("attention's peak memory per rank")
    ax.legend(fontsize=7)
    plt.show()
    return fig
