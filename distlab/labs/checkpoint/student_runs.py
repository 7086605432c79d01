"""What Lab 12's teaching cells of Sections 1 and 2 run with the student's own functions: a resume
with each part of the state left out in turn, a checkpoint written by 4 ranks and read by 2, and
loads of folders that must be refused. Rank bodies and the tables the cells print."""
from __future__ import annotations

import os
import shutil

import torch

from distlab.labs.checkpoint.layout import files_written, tensor_chunks
from distlab.labs.checkpoint.refusals import CheckpointRefused
from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.runs import FORGETTABLE, _fresh_parts, _put_back
from distlab.labs.tables import format_table


# ---------------------------------------------------------------------------------------------
# Section 1: what each part of the state is for

def resumes_forgetting(rank: int, world_size: int, whole_state, restore, steps: int,
                       save_at: int, spec: RunSpec = RunSpec()) -> dict:
    """The uninterrupted run's losses from step ``save_at + 1`` on, and per part of the state
    (``runs.FORGETTABLE``; "" for none) the losses of a resume from ``whole_state`` through
    ``restore`` with that part put back as a fresh trainer holds it."""
    first = Trainer(rank, world_size, spec)
    losses = []
    while first.steps_done < steps:
        losses.append(first.step())
        if first.steps_done == save_at:
            blob = _bytes(whole_state(first))
    out = {"uninterrupted": losses[save_at:]}
    for part in ("", *FORGETTABLE):
        trainer = Trainer(rank, world_size, spec)
        fresh = _fresh_parts(trainer)
        blob.seek(0)
        restore(trainer, torch.load(blob, weights_only=False))
        _put_back(trainer, fresh, (part,) if part else ())
        out[part] = [trainer.step() for _ in range(steps - save_at)]
    return out


def _bytes(state):
    """``state`` written with ``torch.save`` (read back once per resume: a copy each time)."""
    import io
    blob = io.BytesIO()
    torch.save(state, blob)
    return blob


WHAT = {"": "nothing", "torch_rng": "torch's generator (dropout)",
        "noise_rng": "the trainer's noise generator", "python_rng": "Python's random (shuffle)",
        "data": "the data position", "optimizer": "AdamW's moments and steps"}


def forgetting_table(runs: dict, save_at: int) -> str:
    """One row per part left out: the losses after the resume, and the first step that differs
    from the uninterrupted run."""
    rows = []
    for part, losses in runs.items():
        if part == "uninterrupted":
            continue
        differs = [save_at + 1 + i for i, (a, b) in enumerate(zip(losses, runs["uninterrupted"]))
                   if a != b]
        rows.append({"left out": WHAT[part],
                     **{f"step {save_at + 1 + i}": f"{x:.6f}" for i, x in enumerate(losses)},
                     "first step that differs": differs[0] if differs else "none: bit-identical"})
    rows.insert(0, {"left out": "(uninterrupted run)",
                    **{f"step {save_at + 1 + i}": f"{x:.6f}"
                       for i, x in enumerate(runs["uninterrupted"])},
                    "first step that differs": ""})
    return format_table(rows)


# ---------------------------------------------------------------------------------------------
# Section 2: a checkpoint of 4 ranks read by 2, and folders refused

def gathered(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every parameter and every part of AdamW's state gathered whole ("name", "name.exp_avg",
    ...): a collective, every rank calls it."""
    out = trainer.full_params()
    names = {p: n for n, p in trainer.model.named_parameters()}
    for p, state in trainer.optimizer.state.items():
        for kind, value in state.items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            out[f"{names[p]}.{kind}"] = full.detach().clone()
    return out


def train_and_save(rank: int, world_size: int, save, folder: str, steps: int,
                   spec: RunSpec = RunSpec()) -> dict:
    """Train ``steps`` steps, then ``save(model, optimizer, folder)``; what was saved, gathered."""
    trainer = Trainer(rank, world_size, spec)
    for _ in range(steps):
        trainer.step()
    save(trainer.model, trainer.optimizer, folder)
    return gathered(trainer)


def load_and_gather(rank: int, world_size: int, load, folder: str,
                    spec: RunSpec = RunSpec()) -> dict:
    """A fresh trainer, ``load(model, optimizer, folder)``; what it then holds, gathered."""
    trainer = Trainer(rank, world_size, spec)
    load(trainer.model, trainer.optimizer, folder)
    return gathered(trainer)


def loaded_beside_saved(saved: dict, loaded: dict, writers: int, readers: int) -> str:
    """A table: per kind of tensor, how many the readers hold equal to the writers' (whole)."""
    kinds: dict[str, list] = {}
    for key, value in saved.items():
        kind = next((k for k in ("exp_avg_sq", "exp_avg", "step") if key.endswith("." + k)),
                    "parameter")
        got = loaded.get(key)
        kinds.setdefault(kind, []).append(got is not None and torch.equal(got, value))
    return format_table([{"tensor": kind, "tensors": len(same),
                          f"equal after {writers} -> {readers} ranks": sum(same)}
                         for kind, same in kinds.items()])


def layout_tables(folder: str, name: str = "0.lin1.weight") -> str:
    """The files a save wrote, and the chunks the metadata maps for parameter ``name`` (under
    whatever key the save put the model's state: the shortest key ending in the name)."""
    files = format_table([{"file": r["file"], "bytes": f"{r['bytes']:,}"}
                          for r in files_written(folder)])
    chunks = tensor_chunks(folder)
    keys = sorted({r["key"] for r in chunks if r["key"].endswith(name)}, key=len)
    rows = [{"key": r["key"], "global shape": r["global shape"], "offsets": r["offsets"],
             "sizes": r["sizes"], "file": r["file"], "bytes": f"{r['bytes']:,}"}
            for r in chunks if keys and r["key"] == keys[0]]
    return (f"{files}\n\nThe metadata's chunks of {keys[0] if keys else name}:\n"
            f"{format_table(rows)}")


def unfinished_copy(folder: str, into: str) -> str:
    """A copy of ``folder`` as a save leaves it when a rank dies while writing: no ``.metadata``
    (the coordinator writes it last) and the last rank's shard file cut short."""
    shutil.copytree(folder, into)
    os.unlink(os.path.join(into, ".metadata"))
    shards = sorted(n for n in os.listdir(into) if n.endswith(".distcp"))
    path = os.path.join(into, shards[-1])
    os.truncate(path, os.path.getsize(path) // 2)
    return into


def try_loads(rank: int, world_size: int, load, cases: list) -> list[dict]:
    """For each (label, folder, spec): a fresh trainer of ``spec`` tries ``load``; what refused it
    (the file and the reason) and whether its parameters stayed as they were."""
    out = []
    for label, folder, spec in cases:
        trainer = Trainer(rank, world_size, spec)
        before = trainer.full_params()
        try:
            load(trainer.model, trainer.optimizer, folder)
            refused = None
        except CheckpointRefused as exc:
            refused = (os.path.basename(exc.path), exc.reason)
        after = trainer.full_params()
        out.append({"case": label, "refused": refused,
                    "untouched": all(torch.equal(before[k], after[k]) for k in before)})
    return out


def refusals_table(results: list[dict]) -> str:
    return format_table([{"case": r["case"],
                          "refused": f"{r['refused'][0]}: {r['refused'][1]}" if r["refused"]
                          else "loaded (not refused)",
                          "parameters untouched": "yes" if r["untouched"] else "NO"}
                         for r in results])
