"""What a save costs on real ranks, in the figures Lab 12's design takes: a blocking save's stall,
an asynchronous save's stall (the copy to CPU memory) and its write (until its future is done),
and a load (the part of a restart a checkpoint decides).

The model and optimizer shards are saved with ``torch.distributed.checkpoint`` as the course's
``Trainer`` holds them (``get_state_dict``: the state without the generators and the data
position, whose saving is Section 1's exercise; a few bytes more would not change the costs).
"""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time

from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.saving import save_group

COST_SPEC = RunSpec(d=128, hidden=512, blocks=2, samples=256, batch=16)


def _state(trainer: Trainer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model, optim = get_state_dict(trainer.model, trainer.optimizer)
    return {"model": model, "optim": optim}


def save_costs_run(rank: int, world_size: int, root: str, repeats: int, spec: RunSpec) -> dict:
    """A rank body: ``repeats`` times, a step, a blocking save, a step, an asynchronous one;
    then a load. The seconds of each, per save."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    trainer = Trainer(rank, world_size, spec)
    trainer.step()                               # warm-up: the first gathers, allocations
    group = save_group()
    out = {"blocking": [], "async_stall": [], "async_write": [], "load": []}
    for i in range(repeats):
        trainer.step()
        t0 = time.perf_counter()
        dcp.save(_state(trainer), checkpoint_id=f"{root}/blocking_{i}")
        out["blocking"].append(time.perf_counter() - t0)
        trainer.step()
        t0 = time.perf_counter()
        future = dcp.async_save(_state(trainer), checkpoint_id=f"{root}/async_{i}",
                                process_group=group)
        t1 = time.perf_counter()
        future.result()
        out["async_stall"].append(t1 - t0)
        out["async_write"].append(time.perf_counter() - t1)
        dist.barrier()
        t0 = time.perf_counter()
        state = _state(trainer)
        dcp.load(state, checkpoint_id=f"{root}/blocking_{i}")
        out["load"].append(time.perf_counter() - t0)
    return out


def measure_save_costs(world_size: int = 2, repeats: int = 3, spec: RunSpec = COST_SPEC,
                       where: str = ".") -> dict[str, float]:
    """The slowest rank's median of each cost (seconds), on fresh ranks, with the checkpoints in
    a temporary folder under ``where``, removed after."""
    from distlab import run
    root = tempfile.mkdtemp(prefix="distlab-lab12-costs-", dir=where)
    try:
        out = run(save_costs_run, world_size, root, repeats, spec, timeout=300)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {key: max(statistics.median(r[key]) for r in out) for key in out[0]}
