"""Profiling a few training steps on every rank under ``torch.profiler`` (Kineto), with named
ranges, and merging the ranks' traces into one timeline."""
from __future__ import annotations

import dataclasses
import gzip
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from distlab.labs.timelines.trace import Timeline, merge_traces
from distlab.runtime.devices import device as rank_device

def _profiled_rank(rank: int, world_size: int, make_step: Callable, args: tuple, steps: int,
                   warmup: int) -> bytes:
    """Rank body: build the step, run ``warmup`` steps, then ``steps`` under torch.profiler.
    Returns the rank's Chrome trace, gzipped (mtime 0, so equal traces give equal bytes)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    step = make_step(rank, world_size, *args)
    for _ in range(warmup):  # first steps pay for allocation and connection set-up
        step()
    on_gpu = rank_device().type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    dist.barrier()
    # record_shapes: gloo's regions carry their tensors' shapes only when shapes are recorded.
    with profile(activities=activities, record_shapes=True) as prof:
        dist.barrier()  # a common instant on every rank, for align="barrier"
        for _ in range(steps):
            with record_function("step"):
                step()
        if on_gpu:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"rank{rank}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            return gzip.compress(f.read(), mtime=0)


@dataclasses.dataclass
class Profile:
    """A profiled run: each rank's Kineto trace (gzip bytes) and the merged timeline."""
    traces: list[bytes]
    timeline: Timeline

    def save(self, folder) -> list[Path]:
        """Write ``rank{r}_trace.json.gz`` per rank into ``folder`` (Perfetto opens them)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for r, blob in enumerate(self.traces):
            paths.append(folder / f"rank{r}_trace.json.gz")
            paths[-1].write_bytes(blob)
        return paths


def profile_ranks(make_step: Callable, world_size: int, *args, steps: int = 3, warmup: int = 1,
                  label: str = "", backend: str = "auto", timeout: float = 120) -> Profile:
    """Run ``make_step(rank, world_size, *args)`` on fresh ranks; it returns ``step()``, one
    training step. ``warmup`` steps run unrecorded, then ``steps`` steps under torch.profiler,
    each inside a range named "step". Returns the traces and their merged timeline."""
    return profile_many({label: (make_step, args)}, world_size, steps, warmup, backend,
                        timeout)[label]



def _profiled_ranks(rank: int, world_size: int, runs: list, steps: int, warmup: int) -> list[bytes]:
    """Rank body: ``_profiled_rank`` for each (make_step, args) of ``runs``, one after another."""
    return [_profiled_rank(rank, world_size, make_step, args, steps, warmup)
            for make_step, args in runs]


def profile_many(runs: dict, world_size: int, steps: int = 3, warmup: int = 1,
                 backend: str = "auto", timeout: float = 120) -> dict[str, Profile]:
    """``profile_ranks`` of each ``{label: (make_step, args)}``, on the same ranks one run after
    another: one launch (ranks' start, rendezvous, the profiler's first start) instead of one per
    run. Each run's traces hold its own steps only (a profiler session per run)."""
    from distlab import run
    out = run(_profiled_ranks, world_size, list(runs.values()), steps, warmup, backend=backend,
              timeout=timeout)
    return {label: Profile([out[r][k] for r in range(world_size)],
                           merge_traces([out[r][k] for r in range(world_size)], label=label))
            for k, label in enumerate(runs)}
