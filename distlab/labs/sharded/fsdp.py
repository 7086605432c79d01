"""PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on Lab 8's stack beside the lab's own
ZeRO-3, and tensor parallelism within FSDP on a 2 x 2 device mesh (Lab 8, sections 8 and 9).

FSDP2 is ZeRO-3: each ``fully_shard``-ed module's parameters become DTensors sharded on dim 0
over the mesh; a pre-forward hook all-gathers them, a post-forward hook frees them again
(``reshard_after_forward=True``) or keeps them until backward (``False``: fewer gathers, more
memory), and the gradients are reduce-scattered after the module's backward. Wrapping each block
gathers one block at a time; wrapping only the root gathers the whole model at once.

Measured per variant on each rank: all-gathers and bytes per step (the collective record; FSDP2
calls ``all_gather_into_tensor``/``reduce_scatter_tensor`` through the Python API, so
``out.comms`` sees them), the most gathered parameter bytes held at once (the storages behind
the unsharded parameters, probed at every block's forward end and when its output gradient arrives,
as for the lab's ZeRO-3), milliseconds per step (median), and after k steps the parameters'
largest difference from single-process AdamW.
"""
from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.distributed as dist

from distlab.labs.losses import loss_fn
from distlab.labs.sharded.flat import storage_bytes
from distlab.labs.sharded.harness import wrap_blocks, zero3_training
from distlab.labs.sharded.problem import ShardSetup, rank_batch, reference_params
from distlab.labs.tables import format_table, residue
from distlab.runtime.devices import device

GATHER_OPS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
FSDP_VARIANTS = (("FSDP2 per block, reshard", True, True), ("FSDP2 per block, keep", True, False),
                 ("FSDP2 whole model", False, True))


def _full_flats(model) -> list[torch.Tensor]:
    """Each block's parameters gathered whole (DTensor.full_tensor), flattened: [(P_i,)]."""
    return [torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                       for p in block.parameters()]) for block in model]


def _fsdp_variant(rank: int, world_size: int, setup: ShardSetup, steps: int, per_block: bool,
                  reshard: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    warnings.filterwarnings("ignore", category=UserWarning)  # FSDP2's notes on views and hooks
    dev = device()
    mesh = init_device_mesh(dev.type, (world_size,))
    model = setup.model().to(dev)
    if per_block:
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    peaks: list[int] = []

    def probe(*_):  # unsharded parameters are plain tensors, sharded ones DTensors
        peaks.append(storage_bytes(p for p in model.parameters() if not hasattr(p, "to_local")))

    for block in model:
        block.register_forward_hook(lambda m, a, out: (probe(), out.register_hook(probe))[0]
                                    if out.requires_grad else probe())
    optimizer = setup.optimizer(model.parameters())
    x, y = (rank_batch(t, rank, world_size).to(dev) for t in setup.data())
    windows = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()
        windows.append((start, time.perf_counter()))
    return {"windows": windows, "peak": max(peaks), "params": _full_flats(model)}


def _zero3_variant(rank: int, world_size: int, zero3_cls, setup: ShardSetup, steps: int) -> dict:
    dist.barrier()
    rec = zero3_training(rank, world_size, wrap_blocks(zero3_cls), setup, steps)
    shards = [s.contiguous() for s in rec["shards"]]
    gathered = []
    for shard in shards:  # join the shards once, after the steps
        full = shard.new_empty(world_size * shard.numel())
        dist.all_gather_single(full, shard)
        gathered.append(full)
    return {"windows": [s["window"] for s in rec["steps"]], "peak": max(rec["gathered"]),
            "params": gathered}


def _compare_rank(rank: int, world_size: int, zero3_cls, setup: ShardSetup, steps: int) -> list:
    results = [_zero3_variant(rank, world_size, zero3_cls, setup, steps)]
    for _, per_block, reshard in FSDP_VARIANTS:
        results.append(_fsdp_variant(rank, world_size, setup, steps, per_block, reshard))
    return results


def compare_with_fsdp(zero3_cls, world_size: int = 2, steps: int = 3,
                      setup: ShardSetup = ShardSetup()) -> list[dict]:
    """The lab's ZeRO-3 (``zero3_cls``) and three FSDP2 wrappings trained ``steps`` steps on the
    same data; one row per variant, measured on rank 0 (module doc)."""
    from distlab import run
    out = run(_compare_rank, world_size, zero3_cls, setup, steps, timeout=180)
    ref = reference_params(setup, steps)        # the lab's case: stored
    names = ["your ZeRO-3 (Zero3Block)"] + [name for name, _, _ in FSDP_VARIANTS]
    rows = []
    for i, name in enumerate(names):
        rec = out[0][i]
        per_step = [[c for c in out.comms[0] if lo <= c.start <= hi and c.op != "barrier"]
                    for lo, hi in rec["windows"]]
        last = per_step[-1]
        diff = max((got[:exp.numel()] - exp).abs().max().item()
                   for got, exp in zip(rec["params"], ref))
        rows.append({"variant": name,
                     "gathers": sum(c.op in GATHER_OPS for c in last),
                     "bytes": sum(c.bytes for c in last),
                     "peak_param_bytes": rec["peak"],
                     "ms": 1e3 * statistics.median(hi - lo for lo, hi in rec["windows"][1:]
                                                   or rec["windows"]),
                     "max_diff": diff, "scale": max(exp.abs().max().item() for exp in ref)})
    return rows


def format_fsdp_comparison(rows: list[dict]) -> str:
    """``compare_with_fsdp``'s rows as a table (rank 0, one step)."""
    return format_table([{"variant": r["variant"], "gathers/step": r["gathers"],
                          "bytes/step": f"{r['bytes']:,}",
                          "peak gathered": f"{r['peak_param_bytes']:,}", "ms/step": f"{r['ms']:.2f}",
                          # float64 rounding's digits are the CPU's: shown as their bound
                          "max |Δ| vs 1 process": residue(r["max_diff"], r["scale"])}
                         for r in rows])


def plot_fsdp_comparison(rows: list[dict]):
    """Bars: all-gathers per step and peak parameter bytes per variant."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3))
    names = [r["variant"].replace(", ", "\n").replace(" (", "\n(") for r in rows]
    a.bar(names, [r["gathers"] for r in rows], color="#4c72b0")
    a.set_ylabel("all-gathers per step")
    b.bar(names, [r["peak_param_bytes"] / 2**10 for r in rows], color="#dd8452")
    b.set_ylabel("peak gathered parameter KiB (rank 0)")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    return a, b
