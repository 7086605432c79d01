"""Lab 12's Section 3 cell: the stall of a blocking save beside an asynchronous one, measured
with the student's own saves on a model big enough for the write to take a while, printed with
the machine it ran on (the figures mean little without it)."""
from __future__ import annotations

import os
import platform

import torch

from distlab.labs.checkpoint.run_state import RunSpec
from distlab.labs.checkpoint.stall import format_stalls, measure_stalls

# 2 blocks of 256 x 1024, float32, AdamW: 4.2 MB of parameters, 12.8 MB a checkpoint; an epoch
# of 8 steps on 2 ranks
LAB_SPEC = RunSpec(d=256, hidden=1024, blocks=2, samples=512, batch=32, dtype=torch.float32)


def machine() -> str:
    """The cores, the load average and the versions the measurement ran with."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}; "
            f"torch {torch.__version__.split('+')[0]}, gloo, 2 ranks")


def stall_table(save, async_save, under: str | None = None, steps: int = 8,
                save_every: int = 4, spec: RunSpec = LAB_SPEC) -> str:
    """Train ``steps`` steps three times, saving every ``save_every`` steps: never, with
    ``save(trainer, root)`` (blocking) and with ``async_save(trainer, root)`` (asynchronous);
    the table of ``stall.format_stalls`` under the machine's line."""
    before = machine()
    rows = measure_stalls(2, steps, save_every, spec, save=save, async_save=async_save,
                          under=under)
    return f"{before}\n{steps} steps, a save every {save_every}\n\n{format_stalls(rows)}"
