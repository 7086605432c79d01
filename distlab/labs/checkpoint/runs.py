"""Rank bodies the lab (and its tests) run with ``distlab.run``: a resume beside the run it
interrupts, and resharding a checkpoint to another world size."""
from __future__ import annotations

import torch

from distlab.labs.checkpoint.refusals import CheckpointRefused
from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.saving import (async_save_checkpoint, load_checkpoint, load_shards,
                                           save_checkpoint)

# What ``resume_beside`` can leave out of the restore, to show what each part is for.
FORGETTABLE = ("torch_rng", "noise_rng", "python_rng", "data", "optimizer")


def resume_beside(rank: int, world_size: int, root: str, steps: int, save_at: int,
                  spec: RunSpec = RunSpec(), forget: tuple = ()) -> dict:
    """Train ``steps`` steps, starting an asynchronous save after step ``save_at`` and training on
    while it is written; then a fresh trainer loads that checkpoint and trains to ``steps`` too.
    ``forget``: parts of the state the resume puts back as a fresh run has them (FORGETTABLE).
    Returns both runs' losses from step save_at + 1 on and their gathered parameters."""
    first = Trainer(rank, world_size, spec)
    uninterrupted, pending = [], None
    while first.steps_done < steps:
        uninterrupted.append(first.step())
        if first.steps_done == save_at:
            pending, folder = async_save_checkpoint(first, root)
    pending.result()
    params = first.full_params()
    del first
    second = Trainer(rank, world_size, spec)   # generators, data and weights as at step 0
    fresh = _fresh_parts(second)
    load_checkpoint(second, folder)
    _put_back(second, fresh, forget)
    resumed = [second.step() for _ in range(steps - save_at)]
    return {"uninterrupted": uninterrupted[save_at:], "resumed": resumed,
            "params": params, "resumed_params": second.full_params()}


def _fresh_parts(trainer: Trainer) -> dict:
    import random
    return {"rng": (torch.get_rng_state(), trainer.noise.get_state(), random.getstate()),
            "data": trainer.data.state_dict(),
            "optimizer": {k: v for k, v in trainer.optimizer.state_dict().items()}}


def _put_back(trainer: Trainer, fresh: dict, forget: tuple) -> None:
    import random
    unknown = set(forget) - set(FORGETTABLE)
    if unknown:
        raise ValueError(f"forget: {sorted(unknown)} are not parts of the state; "
                         f"choose among {FORGETTABLE}")
    if "torch_rng" in forget:
        torch.set_rng_state(fresh["rng"][0])
    if "noise_rng" in forget:
        trainer.noise.set_state(fresh["rng"][1])
    if "python_rng" in forget:
        random.setstate(fresh["rng"][2])
    if "data" in forget:
        trainer.data.load_state_dict(fresh["data"])
    if "optimizer" in forget:
        trainer.optimizer.state.clear()     # moments and step counts as before the first step


def full_optimizer_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The optimizer's state gathered whole, keyed "param.kind" (exp_avg, exp_avg_sq, step)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    _, optim = get_state_dict(trainer.model, trainer.optimizer,
                              options=StateDictOptions(full_state_dict=True))
    return {f"{name}.{kind}": value.detach().clone()
            for name, per in optim["state"].items() for kind, value in per.items()}


def reshard(rank: int, world_size: int, steps: int = 0, source: str | None = None,
            target: str | None = None, broken: str | None = None,
            spec: RunSpec = RunSpec()) -> dict:
    """On this world size: load the shards of ``source`` (written by any world size) or train
    ``steps`` steps, then save to ``target`` (``saved``: the step folder); return the parameters
    and optimizer state gathered whole. ``broken``: a folder to try first, which must be refused
    with nothing loaded (``refused`` says what came, ``untouched`` whether the parameters stayed
    as they were)."""
    trainer = Trainer(rank, world_size, spec)
    out = {}
    if broken is not None:
        before = trainer.full_params()
        try:
            load_checkpoint(trainer, broken)
            out["refused"] = None
        except CheckpointRefused as exc:
            out["refused"] = (exc.path, exc.reason)
        after = trainer.full_params()
        out["untouched"] = all(torch.equal(before[k], after[k]) for k in before)
    if source is not None:
        load_shards(trainer, source)
    for _ in range(steps):
        trainer.step()
    if target is not None:
        out["saved"] = save_checkpoint(trainer, target)
    return dict(out, params=trainer.full_params(), optimizer=full_optimizer_state(trainer))
