"""Tensor parallelism within, FSDP across: Lab 8's stack on a 2 x 2 device mesh (dp, tp).

Each block's Linear(d, h) is split by columns and its Linear(h, d) by rows over the "tp" axis
(``parallelize_module`` with ColwiseParallel / RowwiseParallel: Megatron's MLP, Lab 3), then
``fully_shard`` shards those tensor-parallel DTensors again over the "dp" axis (FSDP2 on a 2-D
mesh). The ranks of a tp group see the same rows; the two dp groups see different halves of the
batch. One AdamW step must equal single-process training.

Which axis each collective runs on: FSDP's gathers and reduce-scatters go through the Python API
(the collective record has their group); tensor parallelism's all-reduces are functional
collectives (``torch.ops._c10d_functional``), counted by ``distlab.labs.functional_collectives``
with their groups' ranks.
"""
from __future__ import annotations

import logging
import time
import warnings

import torch

from distlab.labs.functional_collectives import FunctionalCollectives
from distlab.labs.losses import loss_fn
from distlab.labs.sharded.problem import ShardSetup, rank_batch, reference_params
from distlab.labs.tables import format_table, residue
from distlab.runtime.devices import device


def tp_fsdp_step(rank: int, world_size: int, setup: ShardSetup) -> dict:
    """Rank body: one AdamW step of the stack, TP on the mesh's "tp" axis, FSDP2 on "dp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    warnings.filterwarnings("ignore", category=UserWarning)  # FSDP2's notes on views and hooks
    # DTensor logs that gathering a 2-D-sharded tensor whole takes two all-gathers (full_tensor)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dev = device()
    mesh = init_device_mesh(dev.type, (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    model = setup.model().to(dev)
    for block in model:
        parallelize_module(block, mesh["tp"], {"lin1": ColwiseParallel(), "lin2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = setup.optimizer(model.parameters())
    dp_rank = mesh["dp"].get_local_rank()
    x, y = (rank_batch(t, dp_rank, 2).to(dev) for t in setup.data())  # the dp group's rows
    recorder = FunctionalCollectives()
    start = time.perf_counter()
    with recorder:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    optimizer.step()
    window = (start, time.perf_counter())
    full = [torch.cat([p.full_tensor().detach().reshape(-1) for p in block.parameters()])
            for block in model]
    local = [tuple(p.to_local().shape) for p in model[0].parameters()]
    return {"params": full, "functional": [(op, ranks) for _, ranks, op, _ in recorder.calls], "local_shapes": local, "window": window,
            "tp_group": tuple(mesh["tp"].mesh.tolist()), "dp_group": tuple(mesh["dp"].mesh.tolist())}


def tp_within_fsdp(setup: ShardSetup = ShardSetup()) -> dict:
    """Run ``tp_fsdp_step`` on 4 ranks; the largest difference from one process after one step,
    the collectives per axis on rank 0 and rank 0's local shapes of block 0's parameters."""
    from distlab import run
    out = run(tp_fsdp_step, 4, setup, timeout=180)
    ref = reference_params(setup, 1)            # the lab's case: stored
    diff = max((got - exp).abs().max().item() for got, exp in zip(out[0]["params"], ref))
    axes = {out[0]["tp_group"]: "tp", out[0]["dp_group"]: "dp"}
    counts: dict[tuple[str, str], int] = {}
    lo, hi = out[0]["window"]
    for c in out.comms[0]:
        if c.op != "barrier" and lo <= c.start <= hi:
            key = (c.op, axes.get(c.group, str(c.group)))
            counts[key] = counts.get(key, 0) + 1
    for op, ranks in out[0]["functional"]:
        key = (op + " (functional)", axes.get(ranks, str(ranks)))
        counts[key] = counts.get(key, 0) + 1
    return {"max_diff": diff, "scale": max(exp.abs().max().item() for exp in ref),
            "counts": counts, "local_shapes": out[0]["local_shapes"],
            "tp_group": out[0]["tp_group"], "dp_group": out[0]["dp_group"]}


def format_tp_fsdp(result: dict) -> str:
    """``tp_within_fsdp``'s result as text: the groups, the difference, the collectives per axis."""
    counts = [{"collective (rank 0, one step)": op, "axis": axis, "count": n}
              for (op, axis), n in sorted(result["counts"].items())]
    return (f"rank 0: tp group {list(result['tp_group'])}, dp group {list(result['dp_group'])}; "
            f"block 0's local parameter shapes {result['local_shapes']}\n"
            # float64 rounding's digits are the CPU's: shown as the bound they are under
            f"max |2-D mesh - single process| after one step: "
            f"{residue(result['max_diff'], result['scale'])}\n"
            + format_table(counts))
