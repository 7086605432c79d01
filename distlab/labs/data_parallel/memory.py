"""ZeRO-1: optimizer-state bytes per rank against replicated AdamW, measured on ranks."""
from __future__ import annotations

import torch

from distlab.labs.data_parallel.problem import Setup, optimizer_state_bytes, rank_problem, train_steps
from distlab.labs.data_parallel.step_times import BENCH_SETUP

def _state_bytes_rank(rank: int, world_size: int, cls, setup: Setup) -> dict[str, int]:
    """Optimizer-state bytes on this rank after one step: ``cls`` (ZeRO-1, its
    ``local_optimizer``) and a replicated AdamW (a plain local step: its state's size does not
    depend on the gradients' values)."""
    sizes = {}
    for name, make in (("zero1", cls), ("adamw", torch.optim.AdamW)):
        model, x, y = rank_problem(setup, rank, world_size)
        optimizer = make(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
        train_steps(model, optimizer, x, y, 1)  # AdamW allocates its state at the first step
        sizes[name] = optimizer_state_bytes(getattr(optimizer, "local_optimizer", optimizer))
    return sizes


def optimizer_memory(cls, world_sizes=(2, 4), setup: Setup = BENCH_SETUP) -> list[dict]:
    """Optimizer-state bytes per rank of ZeRO-1 (``cls``, whose ``local_optimizer`` holds the
    rank's AdamW) against replicated AdamW, one row per world size; the row for 1 is plain AdamW.
    Measured (the live state tensors), not computed: Lab 2 asks the student for the formula."""
    from distlab import run
    runs = {world_size: run(_state_bytes_rank, world_size, cls, setup, timeout=120)
            for world_size in world_sizes}
    full = max(r["adamw"] for out in runs.values() for r in out)
    rows = [{"world_size": 1, "adamw": full, "zero1": full}]
    for world_size, out in runs.items():
        rows.append({"world_size": world_size, "adamw": full, "zero1": max(r["zero1"] for r in out)})
    for row in rows:
        row["ratio"] = row["zero1"] / full
    return rows


def format_memory(rows: list[dict]) -> str:
    lines = [f"{'ranks':>5} {'AdamW state/rank':>17} {'ZeRO-1 state/rank':>18} {'ratio':>6}"]
    lines += [f"{r['world_size']:>5} {r['adamw']:>17,} {r['zero1']:>18,} {r['ratio']:>6.3f}"
              for r in rows]
    return "\n".join(lines)


def plot_optimizer_memory(rows: list[dict], ax=None):
    """Optimizer-state bytes per rank against the world size, with the 1/W line."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ws = [r["world_size"] for r in rows]
    ax.plot(ws, [r["adamw"] / 2**10 for r in rows], "o-", label="AdamW, replicated")
    ax.plot(ws, [r["zero1"] / 2**10 for r in rows], "s-", label="ZeRO-1 (measured)")
    ax.plot(ws, [rows[0]["adamw"] / w / 2**10 for w in ws], "k:", label="1 / world size")
    ax.set_xticks(ws)
    ax.set_xlabel("ranks")
    ax.set_ylabel("optimizer state per rank (KiB)")
    ax.legend(fontsize=8)
    return ax

