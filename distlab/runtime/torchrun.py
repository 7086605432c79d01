"""``distlab.run`` under torchrun or Slurm: the process group already exists (or the environment
says how to make it), so ``fn`` runs right here, as this process's rank.

    torchrun --standalone --nproc-per-node=4 lab.py      # one node
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 lab.py

Every process gets the list of all ranks' results (gathered with ``all_gather_object``), so a lab's
code runs unchanged on a laptop and on a cluster.
"""
from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist

from distlab.runtime.comms import Recorder
from distlab.runtime.devices import pick_backend, to_cpu
from distlab.runtime.outcome import DistributedError, Results
from distlab.runtime.per_rank import for_rank


def run_in_process(fn, world_size: int, args: tuple, kwargs: dict, backend: str):
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise DistributedError(
            f"distlab.run(fn, {world_size}) under torchrun, which started {env_world} processes "
            f"(WORLD_SIZE={env_world}). Launch with --nproc-per-node={world_size} (times nodes), "
            f"or pass world_size={env_world}.")
    rank = int(os.environ["RANK"])
    if not dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", rank))
        chosen = pick_backend(backend, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if chosen == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(chosen)
        # Leave the group before the interpreter exits: a gloo or NCCL group still alive then
        # aborts the process ("terminate called without an active exception") as its threads
        # are torn down under it.
        atexit.register(_leave_group)
    args, kwargs = for_rank(args, kwargs, rank, world_size)
    recorder = Recorder(rank, lambda *_: None).install()
    try:
        value = fn(rank, world_size, *args, **kwargs)
    finally:
        recorder.uninstall()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, (to_cpu(value), recorder.comms))
    out = Results([v for v, _ in gathered])
    out.comms = [c for _, c in gathered]
    out.backend, out.seconds = dist.get_backend(), float("nan")
    return out


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
