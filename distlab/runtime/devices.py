"""Which backend a run uses and which device each rank computes on: the one place that decides."""
from __future__ import annotations

import torch

from distlab.runtime.outcome import DistributedError


def pick_backend(backend: str, world_size: int) -> str:
    """"auto" is NCCL when every rank can have a GPU of its own, gloo otherwise."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size \
            else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise DistributedError(
            f"backend='nccl' needs a GPU per rank: {world_size} ranks, "
            f"{torch.cuda.device_count()} GPU(s) here. Use backend='gloo' or 'auto', "
            f"or fewer ranks.")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', not {backend!r}")
    return backend


def device():
    """The device this rank computes on: its own GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_cpu(value):
    """Return values travel to the launcher, which may have no GPU: tensors come back on the CPU."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value.detach()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(to_cpu(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: to_cpu(v) for k, v in value.items()}
    return value
