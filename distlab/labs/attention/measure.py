"""Lab 4's measurements on real ranks: the collectives of one block step (from the record) and
strong scaling over 1, 2, 4 ranks, one code path for ``distlab.run`` on a laptop and for torchrun
on GPUs."""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from distlab.labs.attention.dense import dense_transformer
from distlab.labs.attention.layout import QKVLayout
from distlab.labs.attention.parallel import TensorParallelTransformerBlock
from distlab.labs.tables import format_table
from distlab.labs.tensor_parallel import split_at_barriers
from distlab.runtime.devices import device as rank_device

def _block_step_rank(rank, world_size, block_cls, config, shape):
    block = dense_transformer("block", 0, **config)
    model = block_cls(block, None)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, config["hidden"], generator=g).requires_grad_(True)   # (b, s, h)
    y = model(x)
    dist.barrier()                      # marks the end of the forward in the record
    y.sum().backward()
    return None


def block_comms_table(block_cls=TensorParallelTransformerBlock, world_size: int = 2, batch=2, seq=8,
                      hidden=32, n_heads=4, n_kv_heads=2, ffn=64) -> list[dict]:
    """Print rank 0's collectives in one forward and backward of `block_cls(dense block, group)`."""
    import distlab
    config = dict(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    out = distlab.run(_block_step_rank, world_size, block_cls, config, (batch, seq))
    rows = [{"pass": phase, "op": c.op, "shape": list(c.shapes[0]), "bytes": c.bytes}
            for phase, part in zip(("forward", "backward"), split_at_barriers(out.comms[0]))
            for c in part]
    print(f"one block step on {world_size} ranks, b={batch} s={seq} h={hidden}: "
          f"b*s*h*4 = {batch * seq * hidden * 4} bytes per activation")
    print(format_table(rows))
    return rows


# --------------------------------------------------------------------------------------------
# Scaling benchmark: one code path for distlab.run on a laptop and for torchrun on GPUs.
# --------------------------------------------------------------------------------------------


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time_steps(model, x, steps: int, warmup: int, dev) -> tuple[list[float], list[tuple]]:
    """Seconds of each timed forward+backward, and its (start, end) on perf_counter."""
    times, windows = [], []
    for i in range(warmup + steps):
        _sync(dev)
        t0 = time.perf_counter()
        model(x).sum().backward()
        _sync(dev)
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
            windows.append((t0, t1))
    return times, windows


def _scaling_rank(rank, world_size, sizes, config, shape, steps, warmup, block_cls):
    """For each N in `sizes`, ranks 0..N-1 time `block_cls(dense block, group)` on a group of N
    ranks (N = 1: the dense block); the others wait. Returns {N: (median seconds of the slowest
    rank, windows)}."""
    dev = rank_device()
    groups = {n: dist.new_group(list(range(n))) for n in sizes if n > 1}   # every rank creates all
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, config["hidden"], generator=g).to(dev).requires_grad_(True)  # (b, s, h)
    result = {}
    for n in sizes:
        if rank < n:
            block = dense_transformer("block", 0, **config).to(dev)
            model = block if n == 1 else block_cls(block, groups[n]).to(dev)
            times, windows = _time_steps(model, x, steps, warmup, dev)
            worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
            if n > 1:   # a step is over when the slowest rank is done
                dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=groups[n])
            result[n] = (worst.item(), windows)
        dist.barrier()
    return result


def _comm_seconds(comms, windows) -> float | None:
    """Median over steps of the seconds rank 0 spent inside all-reduce calls during a step."""
    per_step = [sum(c.end - c.start for c in comms
                    if c.op == "all_reduce" and c.end is not None and t0 <= c.start and c.end <= t1)
                for t0, t1 in windows]
    return statistics.median(per_step) if per_step else None


def scaling_table(world_sizes=(1, 2, 4), batch=4, seq=64, hidden=128, n_heads=8, n_kv_heads=8,
                  ffn=None, steps=5, warmup=2,
                  block_cls=TensorParallelTransformerBlock) -> list[dict]:
    """Forward+backward time of one tensor-parallel transformer block, `block_cls(dense block,
    group)` (in a lab: yours), on 1, 2, 4 ranks; print a table with speedup T1/TN and scaling
    efficiency T1/(N TN) against the dense 1-rank block.

    One thread per rank: a core stands in for a device. "all-reduce ms" is rank 0's time inside
    all-reduce calls per step, from the collective record (on NCCL that is only the launch: the
    collective runs asynchronously on the GPU; see Lab 6 for the real timeline).
    """
    import distlab
    ffn = ffn or 4 * hidden
    config = dict(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    sizes = sorted(set(world_sizes))
    QKVLayout(hidden, n_heads, n_kv_heads).check_degree(max(sizes))   # fail here, not on every rank
    out = distlab.run(_scaling_rank, max(sizes), sizes, config, (batch, seq), steps, warmup, block_cls,
                      threads=1, timeout=600)
    t1 = out[0][sizes[0]][0] * sizes[0] if sizes[0] == 1 else None
    rows = []
    for n in sizes:
        seconds, windows = out[0][n]
        comm = _comm_seconds(out.comms[0], windows)
        rows.append({"ranks": n, "ms per step": f"{seconds * 1e3:.2f}",
                     "all-reduce ms": "-" if n == 1 or comm is None else f"{comm * 1e3:.2f}",
                     "speedup T1/TN": f"{t1 / seconds:.2f}" if t1 else "-",
                     "efficiency T1/(N TN)": f"{t1 / (n * seconds):.2f}" if t1 else "-",
                     "backend": out.backend})
    if os.environ.get("RANK", "0") == "0":   # under torchrun every process has the rows
        print(f"transformer block b={batch} s={seq} h={hidden} heads={n_heads}/{n_kv_heads} "
              f"ffn={ffn}, {steps} steps (median, slowest rank), one thread per rank")
        print(format_table(rows))
    return rows


def plot_scaling(rows: list[dict]):
    """Step time and scaling efficiency against the number of ranks, with the ideal lines."""
    import matplotlib.pyplot as plt
    n = [r["ranks"] for r in rows]
    ms = [float(r["ms per step"]) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    comm = [float(r["all-reduce ms"]) if r["all-reduce ms"] != "-" else 0.0 for r in rows]
    ax1.plot(n, ms, "o-", label="measured step")
    ax1.plot(n, comm, "s:", label="inside all-reduce (rank 0)")
    ax1.plot(n, [ms[0] / k for k in n], "--", color="grey", label="ideal T1/N")
    ax1.set(xlabel="ranks N", ylabel="ms per step", xticks=n, title="step time")
    ax1.legend(fontsize="small")
    eff = [float(r["efficiency T1/(N TN)"]) for r in rows if r["efficiency T1/(N TN)"] != "-"]
    ax2.bar([str(k) for k in n[:len(eff)]], eff)
    ax2.axhline(1.0, ls="--", color="grey")
    ax2.set(xlabel="ranks N", ylabel="T1 / (N TN)", title="scaling efficiency", ylim=(0, 1.1))
    fig.tight_layout()
    return fig
