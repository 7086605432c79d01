"""Lab 3's demonstrations on real ranks, each printing a table: the hand-written modules
against DTensor's (``compare_with_dtensor``) and the time of a step per world size
(``timing_table``)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.labs.tables import format_table, largest_residue
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


def _problem(kind: str, rank: int, world_size: int, shape):
    """The dense model and this rank's input and output gradient (its sequence block for
    "block_sp"), on the rank's device: the same on every run."""
    dev = rank_device()
    batch, seq, hidden, ffn = shape
    dense_model = dense_mlp("block" if kind == "block_sp" else kind, hidden, ffn, seed=0).to(dev)
    x, dy = (t.to(dev) for t in random_batch(batch, seq, hidden))
    if kind == "block_sp":
        x, dy = x.chunk(world_size, 1)[rank], dy.chunk(world_size, 1)[rank]   # (b, s/p, h)
    return dense_model, x, dy


def _hand_rank(rank, world_size, kind, hand_cls, shape):
    """Rank body of `compare_with_dtensor`: the hand-written step; the barrier between forward
    and backward marks the record: [hand forward] | [hand backward]."""
    dense_model, x, dy = _problem(kind, rank, world_size, shape)
    y, dx = _step(_wrap(kind, dense_model, hand_cls).to(x.device), x, dy, between=dist.barrier)
    return {"y": y, "dx": dx}


def _dtensor_rank(rank, world_size, kinds, shape):
    """Rank body of `dtensor_runs`: each plan's DTensor step, its collectives recorded."""
    result = {}
    for kind in kinds:
        dense_model, x, dy = _problem(kind, rank, world_size, shape)
        model = parallelize(dense_model, kind)
        log = comm_debug_mode_class()()
        with log:
            y, dx = _step(model, x, dy)
        result[kind] = {"y": y, "dx": dx, "records": log.records}
    return result


def dtensor_runs(kinds, world_size: int = 2, batch=2, seq=8, hidden=16, ffn=64) -> dict:
    """DTensor's side of `compare_with_dtensor`, run now: ``{kind: {"y": [per rank], "dx": [per
    rank], "records": rank 0's collectives}}``. It needs the course's plans (`dtensor_plan`, Lab
    7's exercise), which a student's handout of an earlier lab leaves out: the lab's own case is
    stored (`stored_dtensor_run`)."""
    import distlab
    out = distlab.run(_dtensor_rank, world_size, tuple(kinds), (batch, seq, hidden, ffn))
    return {kind: {"y": [r[kind]["y"] for r in out], "dx": [r[kind]["dx"] for r in out],
                   "records": out[0][kind]["records"]} for kind in kinds}


# The lab's case, stored with the course (data/03_tensor_parallel_mlp/dtensor_<kind>.pt, made by
# `distlab references`): 2 ranks, b=2, s=8, h=16, f=64. Records as rows of integers:
# (phase, op, bytes, ndim, shape padded with -1 to 4 dims).
STORED_DTENSOR = {"world_size": 2, "shape": (2, 8, 16, 64)}
DTENSOR_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
               "broadcast")
PHASES = ("forward", "backward")


def dtensor_reference_set(run: dict) -> dict[str, torch.Tensor]:
    """One kind of `dtensor_runs` as tensors, to store."""
    rows = []
    for r in run["records"]:
        if r["op"] not in DTENSOR_OPS:
            raise ValueError(f"DTensor issued {r['op']}, which DTENSOR_OPS does not list: add it")
        shape = list(r["shape"])
        rows.append([PHASES.index(r["phase"]), DTENSOR_OPS.index(r["op"]), r["bytes"], len(shape),
                     *shape, *[-1] * (4 - len(shape))])
    return {"y": torch.stack(run["y"]), "dx": torch.stack(run["dx"]),
            "records": torch.tensor(rows, dtype=torch.int64).reshape(-1, 8)}


def dtensor_reference_sets() -> dict[str, dict]:
    """Lab 3's stored DTensor runs (``make_references``): ``dtensor_<kind>`` of the lab's case."""
    runs = dtensor_runs(("mlp", "swiglu", "block_sp"), STORED_DTENSOR["world_size"],
                        *STORED_DTENSOR["shape"])
    return {f"dtensor_{kind}": {"seed": 0, **dtensor_reference_set(run)}
            for kind, run in runs.items()}


def stored_dtensor_run(kind: str) -> dict:
    """DTensor's run of the lab's case, as the course recorded it (`dtensor_runs`' form)."""
    from distlab import paths
    path = paths.data() / "03_tensor_parallel_mlp" / f"dtensor_{kind}.pt"
    try:
        stored = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with "
                                f"`distlab references 03_tensor_parallel_mlp`") from None
    records = [{"phase": PHASES[row[0]], "op": DTENSOR_OPS[row[1]], "bytes": row[2],
                "shape": tuple(row[4:4 + row[3]])} for row in stored["records"].tolist()]
    return {"y": list(stored["y"]), "dx": list(stored["dx"]), "records": records}


def compare_with_dtensor(hand_cls=None, kind: str = "mlp", world_size: int = 2,
                         batch=2, seq=8, hidden=16, ffn=64) -> list[dict]:
    """Run the hand-written module (`hand_cls(dense, group)`, default: this module's) and compare
    it with the same dense model under `parallelize_module(dtensor_plan(kind))` on the same
    input; print the largest differences and both lists of collectives (rank 0), side by side by
    phase. DTensor's side of the lab's case (2 ranks, default shapes) is the course's stored run
    (a handout has no DTensor plans: they are Lab 7's exercise); any other case runs it now.

    The hand-written collectives come from `out.comms` (torch.distributed calls); DTensor's go
    through functional collectives, which only `CommDebugMode` sees.
    """
    import distlab
    shape = (batch, seq, hidden, ffn)
    stored = {"world_size": world_size, "shape": shape} == STORED_DTENSOR
    theirs = stored_dtensor_run(kind) if stored else dtensor_runs([kind], world_size, *shape)[kind]
    out = distlab.run(_hand_rank, world_size, kind, hand_cls, shape)
    hand_phases = dict(zip(PHASES, split_at_barriers(out.comms[0])))
    rows = []
    for phase in PHASES:
        mine = [f"{c.op} {list(c.shapes[0])} {c.bytes} B" for c in hand_phases[phase]]
        dt = [f"{r['op']} {list(r['shape'])} {r['bytes']} B" for r in theirs["records"]
              if r["phase"] == phase]
        for i in range(max(len(mine), len(dt), 1)):
            rows.append({"phase": phase if i == 0 else "",
                         "hand-written (out.comms)": mine[i] if i < len(mine) else "-",
                         "DTensor (CommDebugMode)": dt[i] if i < len(dt) else "-"})
    # float32: a residue shows as its bound (its digits would differ by CPU)
    gap = {key: largest_residue((r[key], t) for r, t in zip(out, theirs[key]))[1]
           for key in ("y", "dx")}
    print(f"{kind} on {world_size} ranks: max |hand - DTensor| output {gap['y']}, input "
          f"gradient {gap['dx']}" + (" (DTensor: the course's stored run)" if stored else ""))
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
    variants = {"hand-written": _wrap("mlp", model, hand_cls).to(dev)}
    try:
        variants["DTensor"] = parallelize(dense_mlp("mlp", hidden, ffn, seed=0).to(dev), "mlp")
    except NotImplementedError:   # a handout without the course's DTensor plans: not timed
        pass
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
    (median of `steps`, slowest rank). Ranks share this machine's cores. DTensor is timed where
    the package holds the course's DTensor plans (a student's handout before Lab 8 does not:
    they are Lab 7's exercise)."""
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
    if not any(r["variant"] == "DTensor" for r in rows):
        print("DTensor is not timed: your handout does not hold the course's DTensor plans "
              "(writing one is Lab 7's exercise).")
    return rows
