"""Lab 3's demonstrations on real ranks, each printing a table: the hand-written modules
against DTensor's (``compare_with_dtensor``) and the time of a step per world size
(``timing_table``)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.labs.tables import format_table
from distlab.labs.tensor_parallel.dense import dense_mlp, random_batch
from distlab.labs.tensor_parallel.dtensor import comm_debug_mode_class, parallelize
from distlab.labs.tensor_parallel.layers import TensorParallelMLP, TensorParallelSwiGLU
from distlab.labs.tensor_parallel.sequence_parallel import TensorParallelBlock
from distlab.runtime.devices import device as rank_device

def _wrap(kind: str, model: nn.Module, hand_cls) -> nn.Module:
    """The hand-written parallel version of a dense model (student class or this module's)."""
    if hand_cls is not None:
        return hand_cls(model, None)
    if kind == "block_sp":
        return TensorParallelBlock(model, None, sequence_parallel=True)
    return {"mlp": TensorParallelMLP, "swiglu": TensorParallelSwiGLU}[kind](model, None)


def _step(model, x, dy, between=None):
    """One forward and backward, `between()` called in between; (output, input gradient)."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    if between is not None:
        between()
    (y * dy).sum().backward()
    return y.detach(), x.grad


def _dtensor_rank(rank, world_size, kind, hand_cls, shape):
    """Rank body of `compare_with_dtensor`: hand-written step, barrier, DTensor step."""
    import copy
    dev = rank_device()
    batch, seq, hidden, ffn = shape
    dense_model = dense_mlp("block" if kind == "block_sp" else kind, hidden, ffn, seed=0).to(dev)
    x, dy = (t.to(dev) for t in random_batch(batch, seq, hidden))
    if kind == "block_sp":
        x, dy = x.chunk(world_size, 1)[rank], dy.chunk(world_size, 1)[rank]   # (b, s/p, h)
    # The barriers mark the record: [hand forward] | [hand backward] | [DTensor's set-up].
    y_hand, dx_hand = _step(_wrap(kind, copy.deepcopy(dense_model), hand_cls).to(dev), x, dy,
                            between=dist.barrier)
    dist.barrier()
    dt_model = parallelize(copy.deepcopy(dense_model), kind)
    log = comm_debug_mode_class()()
    with log:
        y_dt, dx_dt = _step(dt_model, x, dy)
    return {"y": (y_hand - y_dt).abs().max().item(), "dx": (dx_hand - dx_dt).abs().max().item(),
            "dtensor": log.records}


def compare_with_dtensor(hand_cls=None, kind: str = "mlp", world_size: int = 2,
                         batch=2, seq=8, hidden=16, ffn=64) -> list[dict]:
    """Run the hand-written module (`hand_cls(dense, group)`, default: this module's) and the
    same dense model under `parallelize_module(dtensor_plan(kind))` on the same input; print the
    largest differences and both lists of collectives (rank 0), side by side by phase.

    The hand-written collectives come from `out.comms` (torch.distributed calls); DTensor's go
    through functional collectives, which only `CommDebugMode` sees.
    """
    import distlab
    out = distlab.run(_dtensor_rank, world_size, kind, hand_cls, (batch, seq, hidden, ffn))
    hand_phases = dict(zip(("forward", "backward"), split_at_barriers(out.comms[0])))
    rows = []
    for phase in ("forward", "backward"):
        mine = [f"{c.op} {list(c.shapes[0])} {c.bytes} B" for c in hand_phases[phase]]
        theirs = [f"{r['op']} {list(r['shape'])} {r['bytes']} B" for r in out[0]["dtensor"]
                  if r["phase"] == phase]
        for i in range(max(len(mine), len(theirs), 1)):
            rows.append({"phase": phase if i == 0 else "",
                         "hand-written (out.comms)": mine[i] if i < len(mine) else "-",
                         "DTensor (CommDebugMode)": theirs[i] if i < len(theirs) else "-"})
    print(f"{kind} on {world_size} ranks: max |hand - DTensor| output "
          f"{max(r['y'] for r in out):.2e}, input gradient {max(r['dx'] for r in out):.2e}")
    print(format_table(rows))
    return rows


def split_at_barriers(comms: list) -> list[list]:
    """A rank's record cut into the stretches between its `dist.barrier()` calls."""
    parts = [[]]
    for c in comms:
        if c.op == "barrier":
            parts.append([])
        else:
            parts[-1].append(c)
    return parts



def _timing_rank(rank, world_size, hand_cls, shape, steps):
    """Rank body of `timing_table`: median seconds of one forward+backward, max over ranks."""
    import statistics
    import time
    dev = rank_device()
    batch, seq, hidden, ffn = shape
    model = dense_mlp("mlp", hidden, ffn, seed=0).to(dev)
    x, dy = (t.to(dev) for t in random_batch(batch, seq, hidden))
    variants = {"hand-written": _wrap("mlp", model, hand_cls).to(dev),
                "DTensor": parallelize(dense_mlp("mlp", hidden, ffn, seed=0).to(dev), "mlp")}
    if world_size == 1:
        variants = {"dense": model, **variants}
    result = {}
    for name, m in variants.items():
        times = []
        for i in range(steps + 2):            # two warm-up steps
            dist.barrier()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _step(m, x, dy)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        worst = torch.tensor([statistics.median(times[2:])], dtype=torch.float64, device=dev)
        if world_size > 1:
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)   # a step ends when the slowest rank does
        result[name] = worst.item()
    return result


def timing_table(hand_cls=None, world_sizes=(1, 2, 4), batch=8, seq=128, hidden=256, ffn=1024,
                 steps=5) -> list[dict]:
    """Forward+backward time of one MLP, dense vs hand-written TP vs DTensor TP, per world size
    (median of `steps`, slowest rank). Ranks share this machine's cores."""
    import os

    import distlab
    rows = []
    for p in world_sizes:
        # One core per rank, as one device per rank: otherwise 1 rank would get every core.
        out = distlab.run(_timing_rank, p, hand_cls, (batch, seq, hidden, ffn), steps, threads=1)
        for name, seconds in out[0].items():
            rows.append({"ranks": p, "variant": name, "ms per step": f"{seconds * 1e3:.2f}",
                         "backend": out.backend})
    print(f"MLP b={batch} s={seq} h={hidden} f={ffn}, {os.cpu_count()} CPU cores")
    print(format_table(rows))
    return rows
