"""How long a save stops training: a blocking ``dcp.save`` beside ``dcp.async_save``.

A blocking save stops every rank for the whole write. An asynchronous one stops it only while the
state is copied to CPU memory (staging); a thread then plans and writes while the next steps run,
and the training waits again only if the next save comes before that write has finished. On a
machine with cores to spare the write costs the steps nothing; on a busy one the writer thread
takes its share of the cores and the steps slow down instead: both are measured here.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch

from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.saving import async_save_checkpoint, save_checkpoint
from distlab.labs.tables import format_table

MODES = ("none", "blocking", "async")
# a model whose checkpoint takes a while to write: 4 blocks of 256 x 1024, float32, AdamW:
# 8.4 MB of parameters, 25 MB of checkpoint
BENCH_SPEC = RunSpec(d=256, hidden=1024, blocks=4, samples=1024, batch=32, dtype=torch.float32)


def stall_run(rank: int, world_size: int, root: str, mode: str, steps: int, save_every: int,
              spec: RunSpec = BENCH_SPEC, save=None, async_save=None) -> dict:
    """Train ``steps`` steps, saving every ``save_every`` (``mode``: none, blocking or async);
    return the seconds of each step, of each stall (the save call, plus for async any wait on the
    save before), and of the whole run. ``save(trainer, root)`` and ``async_save(trainer, root)
    -> (future, folder)``: the saves to time (default: the course's)."""
    save = save or save_checkpoint
    async_save = async_save or async_save_checkpoint
    trainer = Trainer(rank, world_size, spec)
    trainer.step()                              # warm-up: allocations, the first gathers
    step_times, stalls, pending = [], [], None
    start = time.perf_counter()
    for i in range(1, steps + 1):
        t0 = time.perf_counter()
        trainer.step()
        step_times.append(time.perf_counter() - t0)
        if mode != "none" and i % save_every == 0:
            t0 = time.perf_counter()
            if pending is not None:
                pending.result()
            if mode == "async":
                pending, _ = async_save(trainer, root)
            else:
                save(trainer, root)
            stalls.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    if pending is not None:
        pending.result()
    return {"steps": step_times, "stalls": stalls, "final_wait": time.perf_counter() - t0,
            "total": time.perf_counter() - start}


def measure_stalls(world_size: int = 2, steps: int = 12, save_every: int = 4,
                   spec: RunSpec = BENCH_SPEC, save=None, async_save=None,
                   under: str | None = None) -> list[dict]:
    """One row per mode (``stall_run`` on fresh ranks, in a temporary folder removed after,
    made in ``under``, default the system's): the slowest rank's median stall, median step and
    total. ``save``, ``async_save``: as ``stall_run`` takes them."""
    from distlab import run
    rows = []
    for mode in MODES:
        root = tempfile.mkdtemp(prefix="distlab-lab12-stall-", dir=under)
        try:
            out = run(stall_run, world_size, root, mode, steps, save_every, spec, save,
                      async_save, timeout=600)
            size = _bytes_under(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append({"mode": mode, "saves": len(out[0]["stalls"]),
                     "stall_ms": 1e3 * max(statistics.median(r["stalls"]) if r["stalls"] else 0.0
                                           for r in out),
                     "step_ms": 1e3 * max(statistics.median(r["steps"]) for r in out),
                     "final_wait_ms": 1e3 * max(r["final_wait"] for r in out),
                     "total_s": max(r["total"] for r in out), "bytes": size})
    return rows


def _bytes_under(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def format_stalls(rows: list[dict]) -> str:
    return format_table([{"save": r["mode"], "saves": r["saves"],
                          "stall per save (ms)": f"{r['stall_ms']:.1f}",
                          "median step (ms)": f"{r['step_ms']:.1f}",
                          "wait at the end (ms)": f"{r['final_wait_ms']:.1f}",
                          "run (s)": f"{r['total_s']:.2f}",
                          "written (MB)": f"{r['bytes'] / 1e6:.1f}"} for r in rows])

