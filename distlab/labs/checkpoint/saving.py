"""Saving and loading the whole training state with ``torch.distributed.checkpoint`` (DCP).

Every rank writes its own shards (``__<rank>_0.distcp``) in parallel; rank 0 then writes
``.metadata``, the map from every tensor's name to its global shape and to the chunks (offsets,
sizes, file, byte range) the ranks wrote. Because loading reads that map, not the writers' world
size, a checkpoint written by 4 ranks loads on 2: each rank asks for the part of each tensor its
own shard covers and DCP reads it from whichever files hold it (resharding).

``.metadata`` is written last, after every rank has reported its files: a folder without it is a
save that did not finish, and ``checked_folder`` refuses it (``distlab.labs.checkpoint.refusals``).

``async_save``: the state is first copied to CPU memory (staging), then written by a thread
while training goes on. That thread's save runs collectives of its own (planning, the final
gather); on the training's process group they would interleave with the training's and the
ranks would disagree, so the saves get a gloo group of their own (``save_group``).
"""
from __future__ import annotations

import os

import torch.distributed as dist

from distlab.labs.checkpoint.refusals import checked_folder
from distlab.labs.checkpoint.run_state import Trainer, restore_state, training_state

STEP_FOLDER = "step_{:06d}"


def step_folder(root: str, step: int) -> str:
    return os.path.join(root, STEP_FOLDER.format(step))


def save_checkpoint(trainer: Trainer, root: str) -> str:
    """Write the trainer's whole state under ``root/step_NNNNNN`` (blocking); its folder."""
    import torch.distributed.checkpoint as dcp
    folder = step_folder(root, trainer.steps_done)
    dcp.save(training_state(trainer), checkpoint_id=folder)
    return folder


_SAVE_GROUPS: dict = {}


def save_group():
    """A gloo group of this process's world for asynchronous saves (made once: every rank must
    make it at the same point, and making one is itself a collective)."""
    key = dist.get_world_size()
    if key not in _SAVE_GROUPS:
        _SAVE_GROUPS[key] = dist.new_group(backend="gloo")
    return _SAVE_GROUPS[key]


def async_save_checkpoint(trainer: Trainer, root: str):
    """Start writing the trainer's state under ``root/step_NNNNNN`` and return at once, after the
    state is copied to CPU memory: (future, folder). Wait on ``future.result()`` before the next
    save, and before the training ends."""
    import torch.distributed.checkpoint as dcp
    folder = step_folder(root, trainer.steps_done)
    future = dcp.async_save(training_state(trainer), checkpoint_id=folder,
                            process_group=save_group())
    return future, folder


def load_checkpoint(trainer: Trainer, folder: str) -> None:
    """Read a checkpoint into the trainer, whatever world size wrote it (module doc): its model,
    optimizer, generators and data position as they were saved. A folder ``checked_folder``
    refuses (a save that did not finish, another model's) loads nothing at all."""
    import torch.distributed.checkpoint as dcp
    state = training_state(trainer)       # the shapes and shards this rank wants, filled in place
    checked_folder(folder, state)
    dcp.load(state, checkpoint_id=folder)
    restore_state(trainer, state)


def load_shards(trainer: Trainer, folder: str) -> None:
    """Read only the model and optimizer from a checkpoint (resharding to another world size: the
    generators of 4 ranks have no meaning on 2, so they are not asked for)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    state = training_state(trainer)
    state = {"model": state["model"], "optim": state["optim"]}
    checked_folder(folder, state)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
