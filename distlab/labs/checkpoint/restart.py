"""A training loop that survives the loss of a rank: it saves the whole state every few steps
and, started again, resumes from the newest complete checkpoint.

``train_resumable(rank, world_size, ...)`` is a rank body for ``distlab.run`` (and, unchanged, under
torchrun: ``distlab.labs.checkpoint.torchrun_job``). Run it once and it trains from step 0; kill
a rank and run it again on the same folder and it resumes from the last checkpoint, landing on
the uninterrupted run's losses and parameters to the last bit.

Killing a rank from outside (``KillAt``): the victim rank, on reaching the chosen step, writes
its process id to a file and waits; a thread in the launching process sees the file and sends
that process SIGKILL, as a failing node would: no exception, no clean-up, no goodbye.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.saving import (STEP_FOLDER, async_save_checkpoint, load_checkpoint,
                                           save_checkpoint)

KILL_FILE = "kill-me.pid"


def complete_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, folder) of every finished save under ``root``, oldest first. A step folder without
    ``.metadata`` is a save a dead rank left unfinished: it is skipped (and kept, for a look)."""
    found = []
    prefix = STEP_FOLDER.split("{")[0]
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        folder = os.path.join(root, name)
        if name.startswith(prefix) and os.path.exists(os.path.join(folder, ".metadata")):
            found.append((int(name[len(prefix):]), folder))
    return found


def train_resumable(rank: int, world_size: int, root: str, steps: int, save_every: int,
          spec: RunSpec = RunSpec(), asynchronous: bool = False, kill: tuple | None = None,
          crash_once: tuple | None = None) -> dict:
    """Train to ``steps`` steps, saving under ``root`` every ``save_every`` steps (``async_save``
    if ``asynchronous``), resuming from the newest complete checkpoint there if any.
    ``kill=(victim, step)``: that rank waits to be killed from outside at that step (``KillAt``).
    ``crash_once=(victim, step)``: that rank kills itself there, once per ``root`` (torchrun).
    Returns {"resumed_from": step or None, "losses": {step: loss}, "params": {name: tensor}}."""
    trainer = Trainer(rank, world_size, spec)
    done = complete_checkpoints(root)
    resumed_from = None
    if done:
        resumed_from, folder = done[-1]
        load_checkpoint(trainer, folder)
    losses, pending = {}, None
    while trainer.steps_done < steps:
        if kill and rank == kill[0] and trainer.steps_done + 1 == kill[1]:
            _wait_to_be_killed(root)
        if crash_once and rank == crash_once[0] and trainer.steps_done + 1 == crash_once[1]:
            _crash_once(root)
        loss = trainer.step()
        losses[trainer.steps_done] = loss
        if trainer.steps_done % save_every == 0:
            if pending is not None:
                pending.result()          # one save in flight at a time
            if asynchronous:
                pending, _ = async_save_checkpoint(trainer, root)
            else:
                save_checkpoint(trainer, root)
    if pending is not None:
        pending.result()
    return {"resumed_from": resumed_from, "losses": losses, "params": trainer.full_params()}


def _wait_to_be_killed(root: str) -> None:
    path = os.path.join(root, KILL_FILE)
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)   # whole or absent: the killer never reads half a number
    time.sleep(120)
    raise RuntimeError(f"rank waited 120 s at {path} to be killed and nobody did: run it "
                       f"inside KillAt(root)")


def _crash_once(root: str) -> None:
    marker = os.path.join(root, "crashed-once")
    try:
        open(marker, "x").close()
    except FileExistsError:      # the restarted worker: it has crashed already
        return
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(contextlib.AbstractContextManager):
    """Within the block, a thread kills (SIGKILL) the process that writes its id to
    ``root/kill-me.pid`` (``train_resumable(..., kill=(victim, step))``); ``killed`` is its pid
    once done."""

    def __init__(self, root: str, timeout: float = 120):
        self.path, self.timeout = os.path.join(root, KILL_FILE), timeout
        self.killed: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            if os.path.exists(self.path):
                with open(self.path) as f:
                    pid = int(f.read())
                os.kill(pid, signal.SIGKILL)
                os.unlink(self.path)
                self.killed = pid
                return
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False
