"""A training state drawn whole, cut into the shards FSDP2 gives each rank, put into a rank's
trainer and read back out: what Section 2 of Lab 12 saves on one world size and loads on another.

FSDP2 (``fully_shard``) cuts every parameter along dim 0 as ``torch.chunk`` does: ceil(n / W)
rows per rank, the last ranks fewer or none when W does not divide n. AdamW's moments live as
the parameter does, so they are cut the same way; its step count is one number per parameter,
the same on every rank. A state drawn here (``drawn_state``) is cut into the rank's rows
(``state_rows``), installed into a fresh ``Trainer`` (``install``) and read back as the rank holds
it (``local_state``), so that what a rank loaded can be compared, row for row, with what the
writers held, without a collective.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import torch

from distlab.labs.checkpoint.run_state import RunSpec, Trainer

MOMENTS = ("exp_avg", "exp_avg_sq")
# The folder a rank saves into when the caller names none: in its own temporary folder, the one
# folder a rank confined by the grader may write (its TMPDIR).
FOLDER_PREFIX = "checkpoint-rank"


def drawn_state(spec: RunSpec, seed: int, step: int = 5) -> dict[str, torch.Tensor]:
    """A whole state for ``spec``'s model, drawn from ``seed``: every parameter ("name"), AdamW's
    two moments ("name.exp_avg", "name.exp_avg_sq", the second one positive) and its step count
    ("name.step"), in ``spec.dtype`` (the step in float32, as AdamW keeps it)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in spec.model().named_parameters():
        out[name] = torch.randn(p.shape, generator=g, dtype=spec.dtype)
        out[f"{name}.exp_avg"] = 0.1 * torch.randn(p.shape, generator=g, dtype=spec.dtype)
        out[f"{name}.exp_avg_sq"] = 0.01 * torch.rand(p.shape, generator=g, dtype=spec.dtype)
        out[f"{name}.step"] = torch.tensor(float(step))
    return out


def rows_of(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of ``tensor`` as FSDP2 shards it (a copy); a 0-d tensor whole."""
    if tensor.dim() == 0:
        return tensor.clone()
    chunks = torch.chunk(tensor, world_size, dim=0)
    if rank < len(chunks):
        return chunks[rank].clone()
    return tensor.new_empty((0, *tensor.shape[1:]))


def row_range(tensor: torch.Tensor, rank: int, world_size: int) -> tuple[int, int]:
    """The rows [start, stop) of ``tensor`` that rank ``rank`` holds (as ``rows_of``)."""
    per = -(-tensor.shape[0] // world_size)
    return min(rank * per, tensor.shape[0]), min((rank + 1) * per, tensor.shape[0])


def state_rows(state: dict[str, torch.Tensor], rank: int, world_size: int) -> dict:
    """Every entry of ``state`` cut to rank ``rank``'s rows: what that rank holds."""
    return {key: rows_of(value, rank, world_size) for key, value in state.items()}


def install(trainer: Trainer, shard: dict[str, torch.Tensor]) -> None:
    """Put this rank's ``shard`` of a drawn state into the trainer: the parameters' local rows
    and AdamW's state (made here as its first step makes it)."""
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            p.to_local().copy_(shard[name])
            state = {"step": shard[f"{name}.step"].clone()}
            for kind in MOMENTS:
                moment = torch.zeros_like(p)            # a DTensor sharded as the parameter
                moment.to_local().copy_(shard[f"{name}.{kind}"])
                state[kind] = moment
            trainer.optimizer.state[p] = state


def local_state(trainer: Trainer) -> dict:
    """What this rank holds, keyed as ``drawn_state``: its rows of every parameter and moment,
    the step counts; None for a part of AdamW's state the optimizer does not hold."""
    out = {}
    for name, p in trainer.model.named_parameters():
        out[name] = _local(p)
        held = trainer.optimizer.state.get(p, {})
        for kind in (*MOMENTS, "step"):
            out[f"{name}.{kind}"] = _local(held[kind]) if kind in held else None
    return out


def _local(value) -> torch.Tensor:
    value = value.detach()
    return (value.to_local() if hasattr(value, "to_local") else value).clone()


def save_drawn(rank: int, world_size: int, save, shard: dict, spec: RunSpec = RunSpec(),
               folder: str | None = None) -> str:
    """Rank body: a trainer holding this rank's ``shard``, saved with ``save(model, optimizer,
    folder)`` into ``folder`` (None: a new folder in the rank's own temporary folder); the
    folder."""
    trainer = Trainer(rank, world_size, spec)
    install(trainer, shard)
    own = folder is None
    folder = folder or tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{rank}-")
    try:
        save(trainer.model, trainer.optimizer, folder)
    except BaseException:
        if own:       # the folder this rank made: nobody else will know of it
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def load_files(rank: int, world_size: int, load, files: dict[str, bytes],
               spec: RunSpec = RunSpec()) -> dict:
    """Rank body: a fresh trainer, the checkpoint ``files`` (name -> bytes) written into a folder
    of this rank's own, ``load(model, optimizer, folder)``; what the rank then holds
    (``local_state``). The folder is removed."""
    trainer = Trainer(rank, world_size, spec)
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{rank}-")
    try:
        for name, blob in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(blob)
        load(trainer.model, trainer.optimizer, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return local_state(trainer)


def load_then_save(rank: int, world_size: int, load, files: dict[str, bytes], spec: RunSpec,
                   save, shard: dict, save_spec: RunSpec) -> dict:
    """Rank body: ``load_files`` of one checkpoint, then ``save_drawn`` of another state (two
    legs of a check in one launch): {"loaded": what the rank holds, "folder": the save's}."""
    return {"loaded": load_files(rank, world_size, load, files, spec),
            "folder": save_drawn(rank, world_size, save, shard, save_spec)}
