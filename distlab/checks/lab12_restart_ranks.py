"""The rank side of Lab 12's restart check: plumbing around the student's loop, no answer.

The student's own clean restart from a given checkpoint (a fresh trainer, the student's ``load``
of that folder, the remaining steps: ``clean_rank``) runs in a launch of its own: it is the
reference the loop is compared with, so no process that runs the loop may hold it.

Each rank runs the loop in a checkpoint folder of its own, ``lab12-TAG-rankR`` in its working
directory (a confined rank's own folder while grading), after writing there the checkpoint
files the judge hands it (a merged checkpoint to resume from). The student's ``save`` is
wrapped so that the rank notes, for every save started, whether the loop waited for it
(``result()``, or ``done()`` seen true) before it started the next one and before it returned.
What comes back is plain data: the losses, the parameters, the saves not waited for.
"""
from __future__ import annotations

import os

FOLDER = "lab12-{tag}-rank{rank}"


def rank_root(tag: str, rank: int, base: str | None = None) -> str:
    return os.path.join(base or os.getcwd(), FOLDER.format(tag=tag, rank=rank))


class WaitedFuture:
    """A save's future that notes whether anyone waited for it to finish."""

    def __init__(self, future):
        self.future, self.waited = future, False

    def result(self, timeout=None):
        value = self.future.result(timeout)
        self.waited = True
        return value

    def done(self) -> bool:
        done = self.future.done()
        self.waited = self.waited or done
        return done

    def __getattr__(self, name):            # anything else a Future has
        return getattr(self.future, name)


class WatchedSaves:
    """``save`` as the loop sees it; ``unwaited`` lists, per save started, the steps of earlier
    saves still not waited for at that moment (and, once the loop returned, at the end)."""

    def __init__(self, save):
        self.save, self.started, self.unwaited = save, [], []

    def __call__(self, trainer, root):
        step = trainer.steps_done
        self._note(f"the save of step {step} started")
        future, folder = self.save(trainer, root)
        watched = WaitedFuture(future)
        self.started.append((step, watched))
        return watched, folder

    def _note(self, when: str) -> None:
        late = [step for step, future in self.started if not future.waited]
        if late:
            self.unwaited.append((when, late))

    def at_return(self) -> None:
        self._note("the loop returned")


def _write_files(root: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise ValueError(f"not a file inside the checkpoint folder: {rel}")
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def clean_restart(rank: int, world_size: int, root: str, folder: str, load, steps: int,
                  spec) -> dict:
    """A fresh trainer, ``load(trainer, root/folder)``, ``steps`` steps: {"losses": {step:
    loss}, "params"} (steps numbered on from the folder's step)."""
    from distlab.labs.checkpoint.run_state import Trainer
    trainer = Trainer(rank, world_size, spec)
    load(trainer, os.path.join(root, folder))
    first = int(folder.rsplit("_", 1)[1])
    losses = {first + k + 1: float(trainer.step()) for k in range(steps)}
    return {"losses": losses, "params": trainer.full_params()}


def clean_rank(rank: int, world_size: int, tag: str, files: dict, load, steps: int, spec,
               folder: str) -> dict:
    """``clean_restart`` from ``folder`` (a step folder among ``files``, written in a folder of
    this rank's own) to ``steps``."""
    root = rank_root(tag, rank)
    os.makedirs(root)
    _write_files(root, {k: v for k, v in files.items() if k.startswith(folder + "/")})
    first = int(folder.rsplit("_", 1)[1])
    return clean_restart(rank, world_size, root, folder, load, steps - first, spec)


def resumable_rank(rank: int, world_size: int, tag: str, files: dict, train, save, load,
                   steps: int, save_every: int, spec) -> dict:
    """The student's ``train(rank, world_size, root, steps, save_every, save, load, spec)`` in a
    folder of this rank's own holding ``files``; what it returned, as plain data."""
    root = rank_root(tag, rank)
    os.makedirs(root)
    _write_files(root, files)
    watched = WatchedSaves(save)
    out = train(rank, world_size, root, steps, save_every, watched, load, spec)
    watched.at_return()
    if not isinstance(out, dict) or not {"losses", "params"} <= set(out):
        raise TypeError(f"train_resumable returned {type(out).__name__}; it returns a dict with "
                        f"'resumed_from', 'losses' ({{step: loss}}) and 'params' "
                        f"(trainer.full_params())")
    resumed = out.get("resumed_from")
    return {"resumed_from": None if resumed is None else int(resumed),
            "losses": {int(k): float(v) for k, v in out["losses"].items()},
            "params": {str(k): v.detach().clone() for k, v in out["params"].items()},
            "unwaited": watched.unwaited}
