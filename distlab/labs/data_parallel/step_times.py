"""Step time of the gradient-synchronisation strategies on the same model: naive, bucketed,
overlapped and DDP, with the collectives and bytes each issued per step."""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from distlab.labs.data_parallel.ddp import ddp_model
from distlab.labs.data_parallel.problem import (Setup, param_bytes, rank_problem, stored,
                                                train_steps)


# Timing runs in float32, the dtype training uses, on a model large enough for communication to show.
BENCH_SETUP = Setup(batch=64, d_in=256, d_hidden=256, d_out=256, depth=6, dtype=torch.float32)


def _sync_for(kind: str, impl, params: list, bucket_bytes: int):
    """The ``after_backward`` callable for one strategy, built from the student's function."""
    if kind == "naive":
        return lambda: impl(params)
    if kind == "bucketed":
        return lambda: impl(params, bucket_bytes)
    if kind == "overlapped":
        return impl(params).wait  # registers its gradient hooks now, waits after backward
    raise ValueError(f"unknown strategy {kind!r}")


def _time_strategy(kind: str, impl, rank: int, world_size: int, setup: Setup, steps: int,
                   warmup: int, bucket_bytes: int) -> dict:
    model, x, y = rank_problem(setup, rank, world_size)
    hooked: list = []
    if kind == "DDP":
        model = ddp_model(model, bucket_bytes, record=hooked)
        after = None
    else:
        after = _sync_for(kind, impl, list(model.parameters()), bucket_bytes)
    optimizer = setup.optimizer(model.parameters())
    train_steps(model, optimizer, x, y, warmup, after)
    dist.barrier()  # every rank starts the timed steps together
    hooked.clear()
    record = train_steps(model, optimizer, x, y, steps, after)
    return {"kind": kind, "window": (record["step_start"][0], record["step_end"][-1]),
            "step_s": [e - s for s, e in zip(record["step_start"], record["step_end"])],
            "ddp_buckets": [b for b, _ in hooked]}


def step_time_ranks(rank: int, world_size: int, impls: dict, setup: Setup, steps: int,
                    warmup: int, bucket_bytes: int) -> list[dict]:
    """Rank function: time every strategy in ``impls`` (kind -> student implementation; DDP
    needs none) one after the other, in the same processes."""
    return [_time_strategy(kind, impl, rank, world_size, setup, steps, warmup, bucket_bytes)
            for kind, impl in impls.items()]


def compare_step_times(naive=None, bucketed=None, overlapped=None, *, world_size: int = 2,
                       setup: Setup = BENCH_SETUP, steps: int = 10, warmup: int = 3,
                       bucket_bytes: int = 256 * 1024, ddp: bool = True, timeout: float = 120,
                       backend: str = "auto") -> list[dict]:
    """Time one training step of each strategy on ``world_size`` ranks and count its collectives.

    ``naive(params)``, ``bucketed(params, bucket_bytes)`` and ``overlapped(params)`` (an object
    with ``wait()``) are the lab's exercises; DDP uses ``bucket_cap_mb = bucket_bytes / 2**20``.
    Returns one row per strategy: ``strategy``, ``ms_per_step`` (median over steps of the slowest
    rank), ``collectives`` and ``bytes`` per step (from ``out.comms`` for the lab's strategies,
    from a recording comm hook for DDP), and ``param_bytes``.
    """
    from distlab import run
    impls = {k: v for k, v in (("naive", naive), ("bucketed", bucketed),
                               ("overlapped", overlapped)) if v is not None}
    if ddp:
        impls["DDP"] = None
    out = run(step_time_ranks, world_size, impls, setup, steps, warmup, bucket_bytes,
              timeout=timeout, backend=backend)
    nbytes = param_bytes(setup.model().parameters())
    rows = []
    for i, kind in enumerate(impls):
        per_rank = [out[r][i] for r in range(world_size)]
        slowest = [max(s) for s in zip(*(p["step_s"] for p in per_rank))]
        if kind == "DDP":
            sizes = per_rank[0]["ddp_buckets"]
            source = "DDP comm hook"
        else:
            lo, hi = per_rank[0]["window"]
            sizes = [c.bytes for c in out.comms[0]
                     if lo <= c.start <= hi and c.op != "barrier"]
            source = "out.comms"
        rows.append({"strategy": kind, "ms_per_step": 1e3 * statistics.median(slowest),
                     "collectives": len(sizes) / steps, "bytes": sum(sizes) / steps,
                     "param_bytes": nbytes, "counted_by": source})
    return rows


def format_step_times(rows: list[dict]) -> str:
    """The comparison as a fixed-width text table."""
    lines = [f"{'strategy':<11} {'ms/step':>8} {'collectives/step':>17} {'bytes/step':>11} "
             f"{'counted by':>14}"]
    for r in rows:
        lines.append(f"{r['strategy']:<11} {r['ms_per_step']:>8.2f} {r['collectives']:>17.1f} "
                     f"{r['bytes']:>11,.0f} {r['counted_by']:>14}")
    return "\n".join(lines)


def plot_step_times(rows: list[dict], ax=None):
    """Bar chart of milliseconds per step, annotated with collectives per step."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    names = [r["strategy"] for r in rows]
    bars = ax.bar(names, [r["ms_per_step"] for r in rows], color="#4c72b0")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['collectives']:.0f} coll.", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (slowest rank, median)")
    ax.set_title("one data-parallel training step")
    return ax


# The A100 trace of data/traces/ (2-rank DDP, NCCL), measured by Lab 6's trace readers and
# interval measures (distlab.labs.timelines.gpu_traces.measures) when the references were made:
# a Lab 2 handout holds no trace readers (they are Lab 6's exercises), so it reads the numbers.
A100_LABEL = "A100, 2-rank DDP, rank 0 (Kineto; data/traces)"
A100_MEASURES = ("window_s", "comm_s", "nccl_share", "exposed_s", "overlap")


def a100_overlap_set() -> dict[str, torch.Tensor]:
    """The A100 trace's measures, as tensors to store (needs Lab 6's readers)."""
    from distlab.labs.timelines.gpu_traces import a100_timeline, measures
    m = measures(a100_timeline(), 0)
    return {k: torch.tensor(m[k], dtype=torch.float64) for k in A100_MEASURES}


def overlap_beside_gpu(rows: list[dict]) -> str:
    """This CPU's naive and overlapped step times (rows of ``compare_step_times``) beside the
    A100 trace's overlap, from the stored measures."""
    m = {k: float(v) for k, v in stored("a100_overlap").items()}
    ms = {r["strategy"]: r["ms_per_step"] for r in rows}
    cpu = (f"naive {ms.get('naive', float('nan')):.1f} ms/step, overlapped "
           f"{ms.get('overlapped', float('nan')):.1f} ms/step")
    return (f"{'this CPU (gloo, 2 ranks on shared cores):':<44}{cpu}\n"
            f"{'real GPUs, ' + A100_LABEL:<44}\n"
            f"{'':<44}NCCL kernels {m['comm_s'] * 1e3:.1f} ms of a {m['window_s'] * 1e3:.1f} ms "
            f"window ({m['nccl_share']:.1%}); {m['overlap']:.1%} of it overlapped by compute "
            f"kernels, {m['exposed_s'] * 1e3:.2f} ms exposed")


