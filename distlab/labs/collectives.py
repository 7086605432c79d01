"""Lab 1's plumbing: the collectives shown on real ranks, who-sends-what diagrams, a message-size
sweep with its bandwidth plots, and the plots around the alpha-beta fit.

Demo data: rank r starts with values 10*r + j, so every number says where it came from (23 is
rank 2's element 3); a reduction's result (a sum) no longer has one origin and is drawn grey.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

import distlab
from distlab.runtime.devices import device as rank_device

OPS = ["broadcast", "scatter", "gather", "reduce", "all_gather", "reduce_scatter", "all_reduce",
       "all_to_all", "send_recv"]
REDUCING = {"reduce", "reduce_scatter", "all_reduce"}
COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def _demo_rank(rank: int, world_size: int, op: str):
    """Rank body of ``demo``: (what this rank held before, what it holds after) for ``op``."""
    n = world_size
    # On the rank's GPU under NCCL, which has no CPU path (results come back on the CPU).
    x = torch.arange(n, dtype=torch.float32, device=rank_device()) + 10 * rank  # (n,): 10r + j
    before = x.clone()
    if op == "broadcast":
        dist.broadcast(x, src=0)
        after = x
    elif op == "scatter":
        after = x.new_empty(1)
        dist.scatter(after, list(x.chunk(n)) if rank == 0 else None, src=0)
        before = before if rank == 0 else None
    elif op == "gather":
        before = x[:1].clone()  # each rank contributes one value, 10r
        bucket = [x.new_empty(1) for _ in range(n)] if rank == 0 else None
        dist.gather(before, bucket, dst=0)
        after = torch.cat(bucket) if rank == 0 else None
    elif op == "reduce":
        dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
        after = x if rank == 0 else None  # other ranks' buffers hold partial sums: undefined
    elif op == "all_gather":
        before = x[:1].clone()
        after = x.new_empty(n)
        dist.all_gather_single(after, before)
    elif op == "reduce_scatter":
        after = x.new_empty(1)
        dist.reduce_scatter_single(after, x)
    elif op == "all_reduce":
        dist.all_reduce(x)
        after = x
    elif op == "all_to_all":
        after = x.new_empty(n)
        dist.all_to_all_single(after, x)  # chunk j of rank r lands as chunk r of rank j
    elif op == "send_recv":
        after = x.new_empty(n)
        work = dist.isend(x, (rank + 1) % n)  # to the right neighbour; receive from the left
        dist.recv(after, (rank - 1) % n)
        work.wait()
    else:
        raise ValueError(f"unknown collective {op!r}; one of {OPS}")
    return before, after


def _edges(op: str, n: int) -> list[tuple[int, int]]:
    """(sender, receiver) pairs of ``op``'s logical data flow."""
    if op in ("broadcast", "scatter"):
        return [(0, r) for r in range(n)]
    if op in ("gather", "reduce"):
        return [(r, 0) for r in range(n)]
    if op == "send_recv":
        return [(r, (r + 1) % n) for r in range(n)]
    return [(s, r) for s in range(n) for r in range(n)]


def _fmt(t) -> str:
    return "-" if t is None else "[" + " ".join(f"{v:g}" for v in t.tolist()) + "]"


def demo(op: str, world_size: int = 4, show: bool = True):
    """Run ``op`` on ``world_size`` ranks; print each rank's tensor before and after and what it
    sent, and draw who sends what. Returns the ranks' (before, after) pairs."""
    out = distlab.run(_demo_rank, world_size, op, timeout=60)
    # both columns: an all-gather's ``after`` is longer than its ``before``
    width = max(len(_fmt(t)) for pair in out for t in pair) + 4
    print(f"{op} on {world_size} ranks ({out.backend})")
    print(f"  {'':8}{'before':<{width}}{'after':<{width}}call")
    for rank, (before, after) in enumerate(out):
        calls = ", ".join(f"{c.op} {c.bytes} B" + (f" peer {c.peer}" if c.peer is not None else "")
                          for c in out.comms[rank])
        print(f"  rank {rank:<3}{_fmt(before):<{width}}{_fmt(after):<{width}}{calls}")
    if show:
        draw(op, list(out))
    return list(out)


def draw(op: str, pairs: list):
    """Boxes for every rank before (top) and after (bottom), arrows for who sends to whom; each
    value coloured by the rank it came from (grey: a sum over ranks)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    n = len(pairs)
    fig, ax = plt.subplots(figsize=(1.9 * n, 2.6))
    cell = 0.34

    def row(y: float, rank: int, t, reduced: bool) -> None:
        ax.text(rank * 2 - 0.15, y + cell / 2, f"r{rank}", ha="right", va="center", fontsize=8)
        if t is None:
            ax.text(rank * 2 + 0.3, y + cell / 2, "—", ha="center", va="center", color="grey")
            return
        for j, v in enumerate(t.tolist()):
            origin = int(v // 10) if not reduced and 0 <= v < 10 * len(COLORS) else None
            color = COLORS[origin % len(COLORS)] if origin is not None else "#BBBBBB"
            ax.add_patch(Rectangle((rank * 2 + j * cell, y), cell, cell, facecolor=color,
                                   edgecolor="white", alpha=0.85))
            ax.text(rank * 2 + (j + 0.5) * cell, y + cell / 2, f"{v:g}", ha="center",
                    va="center", fontsize=6 if v >= 100 else 7, color="white")

    for rank, (before, after) in enumerate(pairs):
        row(1.6, rank, before, reduced=False)
        row(0.0, rank, after, reduced=op in REDUCING)
    for src, dst in _edges(op, n):
        ax.add_patch(FancyArrowPatch((src * 2 + 0.6, 1.55), (dst * 2 + 0.6, cell + 0.05),
                                     arrowstyle="-|>", mutation_scale=8, lw=0.8,
                                     color=COLORS[src % len(COLORS)], alpha=0.7))
    ax.text(-0.6, 1.6 + cell / 2, "before", ha="right", va="center", fontsize=9)
    ax.text(-0.6, cell / 2, "after", ha="right", va="center", fontsize=9)
    ax.set_xlim(-1.6, 2 * n)
    ax.set_ylim(-0.2, 2.2)
    ax.axis("off")
    ax.set_title(op.replace("_", " "), fontsize=10)
    plt.show()
    return fig


# ---------------------------------------------------------------------------------------------
# The message-size sweep

def _buffers(op: str, nbytes: int, n: int):
    """(input, output) of ``op`` for a message of ``nbytes`` as nccl-tests counts it."""
    numel = max(n, nbytes // 4 // n * n)  # float32, a multiple of n elements
    dev = rank_device()                    # the rank's GPU under NCCL
    if op == "all_gather":
        return torch.ones(numel // n, device=dev), torch.empty(numel, device=dev)
    if op == "reduce_scatter":
        return torch.ones(numel, device=dev), torch.empty(numel // n, device=dev)
    return torch.ones(numel, device=dev), None


def _call(op: str, x, y, ring):
    if op == "all_reduce":
        dist.all_reduce(x)
    elif op == "all_gather":
        dist.all_gather_single(y, x)
    elif op == "reduce_scatter":
        dist.reduce_scatter_single(y, x)
    elif op == "broadcast":
        dist.broadcast(x, src=0)
    elif op == "ring_all_reduce":
        ring(x)
    else:
        raise ValueError(op)


WARMUP, ITERS = 5, 20  # nccl-tests' defaults (-w 5 -n 20): untimed calls, then timed ones


def time_calls(call, x: torch.Tensor, warmup: int, iters: int, group=None) -> float:
    """Mean seconds of ``call()``, the slowest rank's, as nccl-tests times it: ``warmup`` untimed
    calls, a barrier, then ``iters`` timed ones (``x``: a tensor the call uses, for its device)."""
    for _ in range(warmup):  # connections, buffers, caches
        call()
    dist.barrier(group=group)
    if x.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    if x.is_cuda:  # NCCL returns at once: wait for the GPU before reading the clock
        torch.cuda.synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                           device=x.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed)


def _sweep_rank(rank: int, world_size: int, ops, sizes, warmup: int, iters: int, ring):
    """Rank body of ``sweep``: mean seconds per call, the slowest rank's, for each (op, size)."""
    rows = []
    for op in ops:
        for nbytes in sizes:
            x, y = _buffers(op, nbytes, world_size)
            seconds = time_calls(lambda: _call(op, x, y, ring), x, warmup, iters)
            actual = x.numel() * 4 if op != "all_gather" else y.numel() * 4
            rows.append({"op": op, "nbytes": actual, "seconds": seconds})
    return rows


def sweep(world_size: int = 2, ops=("all_reduce", "all_gather", "reduce_scatter", "broadcast"),
          min_bytes: int = 1 << 10, max_bytes: int = 1 << 22, ring=None, iters: int = ITERS,
          warmup: int = WARMUP, step: int = 4) -> list[dict]:
    """Time each of ``ops`` (and ``ring``, your ring all-reduce, if given) on message sizes from
    ``min_bytes`` to ``max_bytes`` in steps of ``step``x, ``warmup`` untimed then ``iters`` timed
    calls per size; rows of {op, nbytes, seconds, world_size}."""
    sizes = []
    s = min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= step
    ops = list(ops) + (["ring_all_reduce"] if ring is not None else [])
    out = distlab.run(_sweep_rank, world_size, ops, sizes, warmup, iters, ring, timeout=300)
    for row in out[0]:
        row["world_size"] = world_size
    return out[0]


def _ring_rank(rank: int, world_size: int, ring, numel: int):
    ring(torch.ones(numel, device=rank_device()))


def ring_record(ring, world_size: int = 2, numel: int = 1 << 16, timeout: float = 60,
                check=None) -> dict:
    """Run ``ring`` once on a float32 tensor of ``numel`` elements; rank 0's collective record
    (``out.comms[0]``), the buffer's bytes and the world size. ``check(out)``, if given, sees the
    run first (a grader's: that the record accounts for what crossed)."""
    out = distlab.run(_ring_rank, world_size, ring, numel, timeout=timeout)
    if check is not None:
        check(out)
    return {"comms": list(out.comms[0]), "nbytes": numel * 4, "world_size": world_size}


def bus_factors(bus_factor, record: dict) -> dict[str, float]:
    """busbw / algbw per op, from what the ring sent (``bus_factor(comms, nbytes)``): the whole
    record for all-reduce; its first n-1 sends (the reduce-scatter phase) and its last n-1 (the
    all-gather phase) for reduce-scatter and all-gather; broadcast, pipelined along a chain,
    forwards the whole buffer once per rank (factor 1)."""
    sends = [c for c in record["comms"] if c.op in ("send", "isend")]
    half = len(sends) // 2
    return {"all_reduce": float(bus_factor(record["comms"], record["nbytes"])),
            "reduce_scatter": float(bus_factor(sends[:half], record["nbytes"])),
            "all_gather": float(bus_factor(sends[half:], record["nbytes"])),
            "broadcast": 1.0}


def bandwidth_table(rows: list[dict], bandwidths, factors: dict[str, float]) -> list[dict]:
    """Add algbw and busbw (GB/s) to each row with ``bandwidths(nbytes, seconds, factor)``, the
    factor of the row's op from ``factors`` (see ``bus_factors``); print the table."""
    print(f"{'op':<16}{'size':>10}{'time (us)':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
    for row in rows:
        op = "all_reduce" if row["op"] == "ring_all_reduce" else row["op"]
        row["algbw"], row["busbw"] = bandwidths(row["nbytes"], row["seconds"], factors[op])
        print(f"{row['op']:<16}{_size(row['nbytes']):>10}{row['seconds'] * 1e6:>12.1f}"
              f"{row['algbw']:>12.3f}{row['busbw']:>12.3f}")
    return rows


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g} TiB"


def plot_bandwidth(rows: list[dict]):
    """algbw and busbw against message size, one line per op (rows from ``bandwidth_table``)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for key, ax in zip(("algbw", "busbw"), axes):
        for i, op in enumerate(dict.fromkeys(r["op"] for r in rows)):
            mine = [r for r in rows if r["op"] == op]
            ax.plot([r["nbytes"] for r in mine], [r[key] for r in mine], "o-", ms=3,
                    color=COLORS[i % len(COLORS)], label=op)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes, as nccl-tests counts it)")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s")
    axes[1].legend(fontsize=8)
    plt.show()
    return fig


def timings(rows: list[dict], op: str = "all_reduce") -> tuple[torch.Tensor, torch.Tensor]:
    """(sizes, seconds) of ``op`` in a sweep, as float64 tensors for the fit."""
    mine = [r for r in rows if r["op"] == op]
    return (torch.tensor([r["nbytes"] for r in mine], dtype=torch.float64),
            torch.tensor([r["seconds"] for r in mine], dtype=torch.float64))


def plain_fit(sizes, times) -> tuple[float, float]:
    """Ordinary least squares t = alpha + S/B (absolute errors): the large messages dominate, so
    alpha comes out poorly (even negative). Shown beside the relative fit for comparison."""
    design = torch.stack([torch.ones_like(sizes), sizes], dim=1)  # (k, 2)
    alpha, inv_bw = torch.linalg.lstsq(design, times.unsqueeze(1)).solution.squeeze(1).tolist()
    return alpha, (1 / inv_bw if inv_bw > 0 else float("inf"))


def plot_fit(sizes, times, alpha: float, bandwidth: float, predict=None, unseen=None):
    """Measured times and the fitted model (and the plain least-squares one), log-log."""
    import matplotlib.pyplot as plt
    grid = torch.logspace(torch.log10(sizes.min()), torch.log10(sizes.max() * 4), 100, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.loglog(sizes, times, "o", label="measured")
    ax.loglog(grid, alpha + grid / bandwidth,
              label=f"relative fit: alpha={alpha * 1e6:.1f} us, B={bandwidth / 1e9:.2f} GB/s")
    a2, b2 = plain_fit(sizes, times)
    ax.loglog(grid, (a2 + grid / b2).clamp(min=1e-9), "--",
              label=f"plain fit: alpha={a2 * 1e6:.1f} us, B={b2 / 1e9:.2f} GB/s")
    if predict is not None and unseen is not None:
        ax.loglog([unseen], [predict(alpha, bandwidth, unseen)], "r*", ms=12, label="prediction")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    plt.show()
    return fig


def _two_column_lstsq(x1: list[float], x2: list[float]) -> tuple[float, float]:
    """Least squares of [x1, x2] @ [a, b] = 1, in closed form with exactly rounded sums
    (math.fsum) on unit-scaled columns, so a stored reference is the same bits on every machine;
    a LAPACK lstsq may differ in the last bits between builds and thread counts."""
    n1, n2 = math.sqrt(math.fsum(v * v for v in x1)), math.sqrt(math.fsum(v * v for v in x2))
    u, w = [v / n1 for v in x1], [v / n2 for v in x2]
    uu, ww = math.fsum(a * a for a in u), math.fsum(b * b for b in w)
    uw = math.fsum(a * b for a, b in zip(u, w))
    u1, w1 = math.fsum(u), math.fsum(w)            # right-hand side: all ones
    det = uu * ww - uw * uw
    return (u1 * ww - w1 * uw) / det / n1, (uu * w1 - uw * u1) / det / n2


def _floats(values) -> list[float]:
    return [float(v) for v in torch.as_tensor(values, dtype=torch.float64)]


def reference_fit(sizes, times) -> tuple[float, float]:
    """(alpha, bandwidth) minimising sum(((alpha + S/B - t)/t)^2) over the measurements."""
    t, s = _floats(times), _floats(sizes)
    alpha, inv_bandwidth = _two_column_lstsq([1 / ti for ti in t], [si / ti for si, ti in zip(s, t)])
    return alpha, 1 / inv_bandwidth


def reference_ring_fit(world_sizes, sizes, times) -> tuple[float, float]:
    """(alpha, bandwidth) of the ring all-reduce model t(n, S) = 2(n-1) alpha + 2(n-1)/n S/B
    (Thakur et al. 2005, sec. 4; Patarasuk and Yuan 2009), fitted on several world sizes at once:
    the pair minimising the relative squared error sum(((t(n, S) - t) / t)^2)."""
    n, s, t = _floats(world_sizes), _floats(sizes), _floats(times)
    alpha, inv_bandwidth = _two_column_lstsq(
        [2 * (ni - 1) / ti for ni, ti in zip(n, t)],
        [2 * (ni - 1) / ni * si / ti for ni, si, ti in zip(n, s, t)])
    return alpha, 1 / inv_bandwidth


def ring_sweep(ring, world_sizes=(2, 4), min_bytes: int = 1 << 10, max_bytes: int = 1 << 20,
               step: int = 8) -> list[dict]:
    """Your ring all-reduce timed on each world size (nccl-tests' 5 warm-up, 20 timed calls)."""
    rows = []
    for n in world_sizes:
        rows += sweep(world_size=n, ops=(), ring=ring, min_bytes=min_bytes, max_bytes=max_bytes,
                      step=step)
    return rows


def latency_and_bandwidth_terms(alpha: float, bandwidth: float, nbytes: float,
                                world_sizes=(2, 4, 8, 64, 512, 4096)) -> list[dict]:
    """The ring's two terms, 2(n-1) alpha and 2(n-1)/n S/B, against a (double binary) tree's
    latency term, ~2 log2(n) alpha (NCCL picks trees at scale for small messages); printed."""
    rows = []
    print(f"{'n':>6}{'ring latency 2(n-1)a':>24}{'tree latency 2log2(n)a':>24}"
          f"{'bandwidth 2(n-1)/n S/B':>26}")
    for n in world_sizes:
        row = {"n": n, "ring_latency": 2 * (n - 1) * alpha,
               "tree_latency": 2 * math.log2(n) * alpha,
               "bandwidth_term": 2 * (n - 1) / n * nbytes / bandwidth}
        rows.append(row)
        print(f"{n:>6}{row['ring_latency'] * 1e3:>21.3f} ms{row['tree_latency'] * 1e3:>21.3f} ms"
              f"{row['bandwidth_term'] * 1e3:>23.3f} ms")
    return rows
