# ---
# jupyter:
#   distlab:
#     summary: "The whole training state for a bit-identical resume; DCP with every rank its own shards, resharded; asynchronous saves; a killed rank restarted; the checkpoint interval designed."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 12 — When a rank dies
#
# At scale a failure is not an accident but the weather. During a 54-day stretch of Llama 3
# 405B's pre-training on up to 16,384 H100 GPUs, the job was interrupted 466 times: 47 times on
# purpose (firmware upgrades, configuration changes) and 419 times unexpectedly, about 78% of
# those from confirmed or suspected hardware faults, faulty GPUs and their memory first
# (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.4 and Table 5). The
# run still spent more than 90% of its time training, because every interruption cost only a
# restart and the work done since the last checkpoint. One GPU's failure stops the whole job:
# with FSDP, tensor or pipeline parallelism every rank needs every other at the next
# collective. So what a large run really does is train, save, die, restart, and carry on as if
# nothing had happened.
#
# "As if nothing had happened" is a strong promise, and this lab keeps it to the last bit. You
# will:
#
# 1. write the **whole training state** of a sharded run (FSDP2, as in Lab 8): the model's and
#    optimizer's shards, the step, every random generator and the data position, and resume from
#    it bit-identically (Section 1);
# 2. **save and load** it with `torch.distributed.checkpoint`, every rank writing its own shards,
#    and load a checkpoint written by 4 ranks on 2, and by 2 on 4 (**resharding**; Section 2);
# 3. save **asynchronously**, the next steps training while the checkpoint is written, and
#    measure the stall beside a blocking save (Section 3);
# 4. write a training loop that **restarts** from its last checkpoint when a rank is killed,
#    on the course's launcher and under `torchrun --max-restarts` (Section 4);
# 5. predict the **fraction of time lost** to saves, restarts and rework, then measure it on a
#    simulated run; Young's and Daly's interval, and the Llama 3 numbers (Section 5);
# 6. **design** the checkpoint interval (and sync or async) that loses the least time (open
#    design, graded on a scale; Section 6).
#
# **Notation.** A run trains in **steps**, counted from 1; "the state after step k" is what a
# run holds once step k is done, and a resume from it goes on with step k + 1. Time between
# failures, saves and restarts is wall-clock time: the **checkpoint interval** $\tau$ is the
# compute time between two saves, the **save cost** $\delta$ the time training stalls for one
# save, the **restart cost** $R$ the time from a failure to training again (relaunch, load),
# and $M$ the **mean time between failures** of the whole job (one failure of any of its
# ranks).

# %% [markdown]
# ## 1. The whole training state
#
# A resume is bit-identical when the resumed run computes exactly the numbers the uninterrupted
# run would have: the same rows, the same noise, the same dropout masks, the same weights and
# optimizer moments, in the same order. Saving the weights is the part everyone remembers. The
# rest is easy to forget, and forgetting it does not crash anything: the run goes on, its loss
# curve looks fine, and it is another run.
#
# The lab's run (`distlab.labs.checkpoint.run_state`) is small, but it has every source of
# randomness a real one has. `Trainer(rank, world_size, spec)` builds one rank's side of it:
#
# | what | where | what it decides |
# | --- | --- | --- |
# | the model's shards | `trainer.model`: two MLP blocks with dropout, each sharded by FSDP2's `fully_shard` over all ranks (Lab 8): every parameter is a `DTensor`, this rank holding its rows (dim 0) | the forward and backward |
# | AdamW's state | `trainer.optimizer`: per parameter its moments `exp_avg`, `exp_avg_sq` (sharded as the parameter) and `step` | every update |
# | torch's global generator | `torch.get_rng_state()` | the dropout masks (the same seed on every rank, other rows) |
# | the trainer's own generator | `trainer.noise`, a `torch.Generator`, seeded per rank | the noise each rank adds to its inputs |
# | Python's `random` | `random.getstate()` | the shuffle of the rows at the start of each epoch |
# | the data position | `trainer.data` (`state_dict()`, `load_state_dict()`): the epoch, the offset into it, the epoch's order | which rows come next |
# | the step | `trainer.steps_done` | how far the run is |
#
# `trainer.step()` trains one step and returns its loss (the mean over all ranks' rows, the same
# on every rank); `trainer.full_params()` gathers every parameter whole (a collective). The run
# is in float64, so that a resume that is not bit-identical cannot hide in rounding.
#
# ### Exercise 1 — the whole state, and a resume from it (4 points)
#
# **Build** `whole_state(trainer) -> state` and `restore(trainer, state)`.
#
# **Contract.** Every rank calls `whole_state` on its trainer after some step and gets back
# everything a bit-identical resume needs, as data: tensors, numbers, strings, and lists, tuples
# and dicts of them (what `torch.save` writes, and what `torch.distributed.checkpoint` saves).
# The model's and optimizer's shards are state dicts keyed
# by parameter name whose values are `DTensor`s (each rank's rows, with the tensor's global
# shape), so that another world size can read them. Every rank later calls `restore` on a
# **fresh** `Trainer` of the same data and world size but another seed (`spec.restarted()`: its
# weights and generators are not the run's, its data position is step 0's) with the state it
# took, saved and loaded; from then on the fresh trainer's steps give the
# same losses and parameters as the uninterrupted run's, to the last bit, and
# `trainer.steps_done` is the step the state was taken after.
#
# The check runs your functions on 2 ranks: they train 3 steps, take your state, write it with
# `torch.save` to bytes and read it back (so a reference to a live object cannot pass), restore
# it into a fresh trainer and train steps 4 to 6. In the grader, beside the course's
# uninterrupted run of 6 steps (stored; made again on the grader's machine if this machine
# rounds otherwise), the three losses and every parameter gathered at the end must be equal
# with `torch.equal`: not close, equal. Hidden: a run of other seeds stopped after step 3 or 4,
# then two or three steps more (a new epoch always starts after the resume).
#
# **Why it matters.** A resume that is almost right is a silent fork: the run you get is
# statistically like the one you lost, but a bug hunt, an ablation or a bisection of a loss
# spike needs the same one. Only bit-identity makes a restarted run a continuation.
#
# <details><summary>Hint 1</summary>
#
# Go down the table above. For each row: what gives its state as data, and what puts it back?
# A `torch.Generator` has `get_state()` and `set_state()`; torch's global one
# `torch.get_rng_state()` and `torch.set_rng_state()`; Python's `random.getstate()` and
# `random.setstate()`.
# </details>
#
# <details><summary>Hint 2</summary>
#
# `torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer)` returns the model's
# and the optimizer's state dicts, both keyed by parameter name (the optimizer's own
# `state_dict()` numbers them instead), with each rank's shards as `DTensor`s;
# `set_state_dict(model, optimizer, model_state_dict=..., optim_state_dict=...)` puts them back.
# </details>
#
# <details><summary>Hint 3</summary>
#
# The generators differ from rank to rank (the noise is seeded per rank; the dropout masks
# differ because the rows do). `torch.distributed.checkpoint` takes a plain value under a key as
# the same on every rank and writes it once: keep each rank's generators under a key with the
# rank in it, `f"rank{trainer.rank}"`, and let `restore` read its own.
# </details>

# %% nbgrader={"grade": false, "grade_id": "state_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import random

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import distlab
from distlab.checks.lab12 import check_whole_state
from distlab.labs.checkpoint.run_state import RunSpec, Trainer
from distlab.labs.checkpoint.student_runs import forgetting_table, resumes_forgetting

# %% nbgrader={"grade": false, "grade_id": "whole_state", "locked": false, "schema_version": 3, "solution": true, "task": false}
def whole_state(trainer):
    """Everything a bit-identical resume of this rank's `trainer` needs, as data."""
    ### BEGIN SOLUTION
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)   # DTensor shards
    generators = {
        "torch": torch.get_rng_state(),           # the dropout masks
        "noise": trainer.noise.get_state(),       # this rank's input noise
        "python": random.getstate(),              # each epoch's shuffle
    }
    progress = {
        "step": trainer.steps_done,
        "data": trainer.data.state_dict(),        # epoch, offset, the epoch's order
    }
    return {"model": model_sd, "optim": optim_sd, "progress": progress,
            "rng": {f"rank{trainer.rank}": generators}}   # each rank's under its own key
    ### END SOLUTION


def restore(trainer, state):
    """Put `state` (taken by whole_state, saved and loaded) into a fresh `trainer`."""
    ### BEGIN SOLUTION
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer.steps_done = int(state["progress"]["step"])
    trainer.data.load_state_dict(state["progress"]["data"])
    mine = state["rng"][f"rank{trainer.rank}"]
    torch.set_rng_state(mine["torch"])
    trainer.noise.set_state(mine["noise"])
    random.setstate(mine["python"])
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_whole_state", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_whole_state(whole_state, restore)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_whole_state(whole_state, restore, seed=fresh_seed())   # stopped after another step
### END HIDDEN TESTS

# %% [markdown]
# ### What each part is for
#
# Your functions once more, on 2 ranks: the run stops after step 3, and the fresh trainer gets
# your state back, but then one part of it is put back as a fresh trainer holds it (the seeds
# of step 0, the data at its start, AdamW without moments), one part at a time. Each row is one
# resume; the first shows your state whole.

# %% nbgrader={"grade": false, "grade_id": "state_forgetting", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
forgotten = distlab.run(resumes_forgetting, 2, whole_state, restore, 6, 3)
print(forgetting_table(forgotten[0], 3))

# %% [markdown]
# Only the whole state continues the run; every part left out forks it, and not all at once.
# The generators and the data position change the very next step, step 4: its dropout masks,
# its noise or its rows are other ones. AdamW's state and Python's `random` wait a step. Step
# 4's loss is computed before its update, and that update, without the moments, is AdamW's
# first all over again, so the weights differ from step 5 on. The data position already holds
# the current epoch's order, so Python's generator is read only at step 5, the first of a new
# epoch, whose shuffle it draws. A check that stopped one step after the resume would miss both;
# so would one that compared losses to a few digits.

# %% [markdown]
# ## 2. Saving with torch.distributed.checkpoint, and resharding
#
# Section 1's state lives in each rank's memory; a checkpoint puts it on disk, and a sharded
# run should write it sharded. Gathering the whole model onto rank 0 to write one file moves
# every byte through one rank and needs its memory for all of it; at the scale of Llama 3 405B
# that is terabytes of weights and optimizer state. So every rank writes its own shards, all at
# once: `torch.distributed.checkpoint` (DCP) writes, in the checkpoint's folder, one file per
# rank, `__r_0.distcp`, and then one `.metadata`, written by one rank (the coordinator, rank 0)
# once every rank has reported what it wrote.
#
# The metadata is what makes a checkpoint more than a pile of shards. For every tensor it
# records the name, the **global** shape, and the chunks the ranks wrote: each chunk's offsets
# and sizes in the global tensor, and the file and byte range it lies in. Loading reads that
# map, not the writers' world size. A rank of another world size asks for the rows *it* owns
# now, by name and global shape, and DCP reads them from whichever files hold them: a
# checkpoint written by 4 ranks loads on 2 (**resharding**). That matters in practice: a job
# that restarts after losing a node may come back on fewer GPUs, and a model trained on one
# layout is fine-tuned or served on another.
#
# ### Exercise 2 — save and load with DCP, on any world size (4 points)
#
# **Build** `save(model, optimizer, folder)` and `load(model, optimizer, folder)`.
#
# **Contract.** `model` is a trainer's FSDP2 model and `optimizer` its AdamW, as in Section 1;
# every rank calls each function with its own, and the same folder. `save` writes the model's
# and the optimizer's state (every parameter; AdamW's `exp_avg`, `exp_avg_sq` and `step`) with
# `torch.distributed.checkpoint`, **every rank its own shards**: no rank gathers another's.
# `load` reads a checkpoint that `save` wrote on **any** number of ranks into this run's model
# and optimizer, so that afterwards every rank holds exactly its rows of every parameter and of
# AdamW's state (a fresh optimizer holds no state until its first step). Before reading, `load`
# asks `checked_folder(folder, state)` (`distlab.labs.checkpoint.refusals`) whether the folder
# can fill the state it is about to fill, whole: a folder that cannot is refused, naming the
# file and the reason, before a single tensor is touched. The model and the optimizer only:
# Section 1's generators and data position are one per rank, and have no meaning on another
# world size.
#
# The check draws a whole state (weights, AdamW's moments and step counts) and hands each of 2
# ranks its own rows of it, which it installs in a trainer and saves with your `save`. In the
# grader each rank writes into a folder of its own (it may write nowhere else); the check
# merges them (`layout.merge_rank_folders`) and reads what your save made: a DCP checkpoint
# whose metadata names a shard file for each writer. Then 4 fresh trainers load it with your
# `load`, and each must hold exactly (with `torch.equal`) its rows of every parameter,
# `exp_avg`, `exp_avg_sq` and `step`; the same 4 ranks save another drawn state, and 2 fresh
# trainers load that. The first state is for the lab's model, the second for a model whose
# widths 4 does not divide (hidden width 10, input width 6: FSDP2's last of 4 ranks then holds
# fewer rows, or none). There is no hidden test: every value the check compares goes through
# your `save` and `load`, so nothing can be known ahead.
#
# **Why it matters.** A checkpoint that only its own world size can read ties a run to its
# hardware: after losing a node the job cannot come back smaller, and every change of layout
# needs a conversion script. With the metadata, the checkpoint outlives the layout that wrote
# it.
#
# <details><summary>Hint 1</summary>
#
# A rank's parameter is a `DTensor`: `p.to_local()` is its rows, `p.shape` the global shape,
# `p.placements` how it is cut. What must a checkpoint record so that a rank of another world
# size can find the rows it owns now? Which of the state dicts you met in Section 1 carries
# that?
# </details>
#
# <details><summary>Hint 2</summary>
#
# `dcp.save(state, checkpoint_id=folder)` (`import torch.distributed.checkpoint as dcp`) writes
# a nested dict of tensors and values, every rank its own; for a `DTensor` it records the global
# shape and this rank's chunk. `dcp.load(state, checkpoint_id=folder)` fills a state dict **in
# place**: the shapes and placements it asks for are those of the dict you hand it. Whose dict
# should that be on a reader?
# </details>
#
# <details><summary>Hint 3</summary>
#
# `save`: `get_state_dict(model, optimizer)`, both dicts under keys of your choice in one dict,
# `dcp.save`. `load`: the same `get_state_dict` on this run's model and optimizer (for a fresh
# AdamW it first makes the state, zeros, so that there is something to fill), under the same
# keys; `checked_folder`; `dcp.load`; then `set_state_dict` with what was filled.
# </details>

# %% nbgrader={"grade": false, "grade_id": "reshard_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os
import shutil
import tempfile

import torch.distributed.checkpoint as dcp

from distlab.checks.lab12 import check_resharding
from distlab.labs.checkpoint.refusals import checked_folder
from distlab.labs.checkpoint.student_runs import (layout_tables, load_and_gather,
                                                   loaded_beside_saved, refusals_table,
                                                   train_and_save, try_loads, unfinished_copy)

# %% nbgrader={"grade": false, "grade_id": "save_load", "locked": false, "schema_version": 3, "solution": true, "task": false}
def save(model, optimizer, folder):
    """Write the model's and optimizer's state into `folder`, every rank its own shards."""
    ### BEGIN SOLUTION
    model_sd, optim_sd = get_state_dict(model, optimizer)    # this rank's DTensor shards
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    ### END SOLUTION


def load(model, optimizer, folder):
    """Read the checkpoint in `folder`, written on any number of ranks, into this run's shards."""
    ### BEGIN SOLUTION
    model_sd, optim_sd = get_state_dict(model, optimizer)    # the shards this rank owns now
    state = {"model": model_sd, "optim": optim_sd}
    checked_folder(folder, state)                             # whole, and this model's, or refused
    dcp.load(state, checkpoint_id=folder)                     # fills `state` in place
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_resharding", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_resharding(save, load)

# %% [markdown]
# ### What a checkpoint holds
#
# Your `save` on 4 ranks, after 2 steps of training, into a folder of the lab's own: the files
# it wrote, and the chunks the metadata maps for one parameter, the first block's `lin1.weight`
# (16 × 8: FSDP2 gives each of 4 ranks 4 of its rows).

# %% nbgrader={"grade": false, "grade_id": "reshard_layout", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
workdir = tempfile.mkdtemp(prefix="lab12-checkpoints-", dir=".")   # removed at the section's end
four = os.path.join(workdir, "four-ranks")
saved = distlab.run(train_and_save, 4, save, four, 2)
print(layout_tables(four))

# %% [markdown]
# One shard file per rank, of about the same size, and a small `.metadata`. Each rank's file
# holds its rows of every parameter and moment (and the objects, such as AdamW's `step`, that
# the planner gave it). The metadata's rows for one tensor tile it: offsets $(0, 0)$, $(4, 0)$,
# $(8, 0)$, $(12, 0)$, each $4 \times 8$, each in its writer's file, with the global shape
# beside them. A reader of any world size intersects the rows it owns with these chunks and
# reads just those bytes.
#
# Now 2 fresh trainers load it with your `load`; beside them, what the 4 ranks saved, gathered
# whole on both sides:

# %% nbgrader={"grade": false, "grade_id": "reshard_four_to_two", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
loaded = distlab.run(load_and_gather, 2, load, four)
print(loaded_beside_saved(saved[0], loaded[0], writers=4, readers=2))

# %% [markdown]
# ### Folders that must be refused
#
# `dcp.load` copies tensor by tensor into the model as it reads, so a load that fails halfway
# leaves the model half old and half new, and a training loop that catches the error and goes
# on trains a chimera. Hence `checked_folder` first. Two folders it must refuse, each loaded by
# 2 fresh trainers with your `load`: a save that did not finish (a copy of the checkpoint above
# as a rank that died while writing leaves it: no `.metadata`, since the coordinator writes it
# last, and the last shard cut short), and the complete checkpoint, read by a trainer of
# another model (hidden width 24 instead of 16).

# %% nbgrader={"grade": false, "grade_id": "reshard_refusals", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
unfinished = unfinished_copy(four, os.path.join(workdir, "unfinished"))
refused = distlab.run(try_loads, 2, load, [("a save that did not finish", unfinished, RunSpec()),
                                           ("another model's run", four, RunSpec(hidden=24))])
print(refusals_table(refused[0]))
shutil.rmtree(workdir)

# %% [markdown]
# Each refusal names the file at fault and why, and the trainers' parameters are as they were:
# nothing was loaded. A restart loop (Section 4) that meets the first refusal falls back to the
# checkpoint before; the second is a mistake of configuration that no retry fixes, and says so.

# %% [markdown]
# ## 3. Saving without stopping: asynchronous checkpoints
#
# A blocking `dcp.save` stops every rank for the whole write: the state is planned, serialised
# and written to the folder, and only then does the next step start. At scale a save is
# terabytes (mixed-precision Adam keeps about 16 bytes per parameter, Lab 7), written by every
# rank at once, and the stall is paid again at every save.
# `torch.distributed.checkpoint.async_save` splits a save in two:
#
# 1. **staging**, on the training's thread: the state dict is copied to CPU memory. Training
#    must stop for this part, since the next step will change the tensors;
# 2. **the write**, in a thread of its own: planning (the ranks agree on who writes what), the
#    files, then `.metadata`, written by rank 0 once every rank has reported its files. It
#    returns a future at once; training goes on while it runs.
#
# Two rules follow. The thread's planning and finishing are collectives of their own: on the
# training's process group they would interleave with the training's collectives, and the ranks
# would disagree about which call comes next, so an asynchronous save gets a **gloo group of its
# own** (`save_group()`, made once, at the same point on every rank). And a save is complete
# only when its future is: wait on it (`future.result()`) **before the next save** (two writes
# in flight on one group interleave too) and **before the run ends** (a process that exits with
# its write half done leaves a folder with no `.metadata`, which Section 4 must skip).
#
# The checkpoint of Sections 3 and 4 is your whole state (Section 1) written with DCP, as Section
# 2 wrote the shards: the cell after the imports makes the blocking `save_checkpoint(trainer,
# root)` and `load_checkpoint(trainer, folder)` from your `whole_state` and `restore` (a folder
# is checked complete, and made for this model, before anything is loaded).
# `async_save_checkpoint(trainer, root)` is that save made asynchronous: the same state (your
# `whole_state`), the same folder (`step_folder(root, trainer.steps_done)`, `root/step_NNNNNN`),
# `dcp.async_save` with `process_group=save_group()`; it returns `(future, folder)`. Section 4's
# loop saves with it.

# %% nbgrader={"grade": false, "grade_id": "async_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os
import shutil
import tempfile

import torch.distributed.checkpoint as dcp

from distlab.labs.checkpoint.async_views import stall_table
from distlab.labs.checkpoint.refusals import checked_folder
from distlab.labs.checkpoint.saving import save_group, step_folder

# %% nbgrader={"grade": false, "grade_id": "checkpoint_functions", "locked": true, "schema_version": 3, "solution": false, "task": false}
def save_checkpoint(trainer, root):
    """Your whole state under root/step_NNNNNN, every rank its own shards (blocking)."""
    folder = step_folder(root, trainer.steps_done)
    dcp.save(whole_state(trainer), checkpoint_id=folder)
    return folder


def load_checkpoint(trainer, folder):
    """A complete checkpoint of this model into a fresh trainer, with your restore."""
    state = whole_state(trainer)     # the shapes and shards this rank wants, filled in place
    checked_folder(folder, state)    # refused whole (file and reason) before anything is read
    dcp.load(state, checkpoint_id=folder)
    restore(trainer, state)

# %% nbgrader={"grade": false, "grade_id": "async_save_checkpoint", "locked": false, "schema_version": 3, "solution": true, "task": false}
def async_save_checkpoint(trainer, root):
    """Start saving the trainer's whole state under root/step_NNNNNN; return (future, folder)."""
    ### BEGIN SOLUTION
    folder = step_folder(root, trainer.steps_done)
    future = dcp.async_save(whole_state(trainer), checkpoint_id=folder,
                            process_group=save_group())
    return future, folder
    ### END SOLUTION


# %% [markdown]
# ### The stall, measured
#
# Below, the same run trains 8 steps three times on 2 ranks: without saving, with your blocking
# `save_checkpoint` every 4 steps, and with your `async_save_checkpoint` every 4 steps, each on
# fresh ranks in a folder of its own (removed after). The model is larger than the rest of the
# lab's (2 blocks of 256 × 1024 in float32, 12.8 MB a checkpoint with AdamW's moments), so
# that a write takes long enough to see. Per mode, on the slowest rank: the median stall per
# save (the call; for async also any wait for the save before), the median step (a write in
# a thread takes its share of the cores: on a busy machine the steps it overlaps slow down),
# the wait for the last save at the end, and the whole run.

# %% nbgrader={"grade": false, "grade_id": "async_stall", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
# Sections 3 and 4's checkpoints, under the lab's folder; removed at the end of Section 4
RESTART_WORK = tempfile.mkdtemp(prefix="lab12-restart-", dir=".")
print(stall_table(save_checkpoint, async_save_checkpoint, under=RESTART_WORK))

# %% [markdown]
# Read the table with the machine's line above it. The asynchronous save stalls training for its
# staging only, a copy in memory; the blocking one for the whole write. Where does the rest of the
# asynchronous write go? Into the steps after the save, as a thread competing for the same
# cores (compare the median steps), and into the wait at the end, where the last save must be
# finished before the run may stop. On a laptop's two shared cores the thread can cost the steps
# nearly what it saves the stall; on a GPU node, whose training runs on the GPU while the CPUs
# mostly wait, the thread costs the steps little, which is why large runs save asynchronously
# (torchtitan's `checkpoint.async_mode`, Megatron-LM's `--async-save`), provided the steps
# between two saves outlast a write: on one H200, a save of 806 MB every four 30 ms steps waited
# for the write before it and stalled longer than a blocking save
# (`bench/reports/gpu-2026-11-28-0140-lab12-vm.md`; Section 6 asks how often to save). Staging
# itself is not free either: it needs CPU memory for a whole copy of the rank's state.

# %% [markdown]
# ## 4. Restart
#
# A rank that dies takes the run with it: its peers wait in their next collective for a rank
# that will never come, and are stopped (here by the launcher, on a cluster by torchrun's agent
# or the scheduler). What can be saved is what was checkpointed. A restart is then the same
# program started again on the same folder: it finds the **newest complete** checkpoint, loads it
# and trains on, and it must land on the run that never died, step for step.
#
# Complete matters: a rank killed while a save was being written leaves a step folder without
# `.metadata` (rank 0 writes it last, once every rank's files are there). Such a folder is the
# newest, and it is unusable; loading it fails, or worse, loads half.

# %% nbgrader={"grade": false, "grade_id": "restart_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab12 import check_train_resumable
from distlab.labs.checkpoint.restart_views import (kill_and_relaunch, plot_restart,
                                                   same_to_the_bit, torchrun_restart)
from distlab.labs.checkpoint.run_state import RunSpec, Trainer

# %% [markdown]
# ### Exercise 4 — a loop that survives the loss of a rank (4 points)
#
# **Build** `train_resumable(rank, world_size, root, steps, save_every, save, load,
# spec=RunSpec())`, a rank body for `distlab.run`.
#
# **Contract.** Make `Trainer(rank, world_size, spec)`. If `root` holds a complete checkpoint (a
# folder `step_NNNNNN` with a `.metadata` file in it), `load(trainer, folder)` the newest complete
# one, and skip any folder without `.metadata` (`root` may not exist yet, or be empty). Then
# train with `trainer.step()` (it returns the step's loss and counts `trainer.steps_done`) until
# `trainer.steps_done == steps`, and after every step that is a multiple of `save_every` call
# `save(trainer, root)`, which starts an asynchronous save and returns `(future, folder)`. At
# most one save in flight: wait on the previous save's future (`future.result()`) before you
# start the next, and on the last before you return. Return `{"resumed_from": the step loaded
# or None, "losses": {step: loss} for the steps this call trained, "params":
# trainer.full_params()}`. `save` and `load` are what the test passes: your
# `async_save_checkpoint` (Section 3) and `load_checkpoint` (Section 2). Allowed: anything on
# this rank; no collectives of your own.
#
# The check runs your loop on 2 ranks, 8 steps, a save every 2, each rank in a folder of its
# own. The launcher kills rank 1 with SIGKILL, from outside the rank and by its process id, as
# it starts training step 6 (it is not asked: the signal lands wherever the rank is, perhaps
# within a save). The grader merges the ranks' folders save by save; c is the newest complete
# save. It then relaunches your loop on the complete saves plus a newer folder without
# `.metadata`, and compares in the grader: the relaunch trained exactly 8 − c steps (counted
# in the launcher's record, one loss `all_reduce` per step), and its losses and parameters equal,
# bit for bit, your own clean restart from step c's checkpoint (a fresh `Trainer`, your `load`,
# `trainer.step()` to the end); and every save was waited for. Hidden: 10 steps; a fresh seed
# chooses the victim, the step (two or more after the second save, two before the end) and the
# run's data and initial weights.
#
# **Why it matters.** Llama 3's 466 interruptions in 54 days (§3.3.4) each cost the work since
# the last complete checkpoint plus the restart; a loop that restarts from step 0, or from a
# half-written folder, loses everything, or crashes again on every restart.
#
# <details><summary>Hint 1</summary>
#
# What does a folder need to be a checkpoint you can trust, and which of the folders has the
# highest step? The step is in the folder's name. What does your `load` put back, so that
# `trainer.steps_done` after it tells you where you are?
# </details>
#
# <details><summary>Hint 2</summary>
#
# Keep the future of the save in flight in one variable. When is it safe to start the next
# save, and what must happen before the function returns?
# </details>
#
# <details><summary>Hint 3</summary>
#
# List `root`, keep the `step_` folders holding `.metadata`, sort them (zero-padded names sort
# by step) and load the last. Then loop while `trainer.steps_done < steps`: step, note the loss
# under `trainer.steps_done`, and on a multiple of `save_every` wait for the pending future, if
# any, then save. After the loop, wait for the pending future.
# </details>

# %% nbgrader={"grade": false, "grade_id": "train_resumable", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_resumable(rank, world_size, root, steps, save_every, save, load, spec=RunSpec()):
    """Train to `steps` steps from the newest complete checkpoint under `root`, saving there."""
    ### BEGIN SOLUTION
    trainer = Trainer(rank, world_size, spec)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    complete = [n for n in names if n.startswith("step_")
                and os.path.exists(os.path.join(root, n, ".metadata"))]
    resumed_from = None
    if complete:
        load(trainer, os.path.join(root, complete[-1]))
        resumed_from = trainer.steps_done
    losses, pending = {}, None
    while trainer.steps_done < steps:
        loss = trainer.step()
        losses[trainer.steps_done] = loss
        if trainer.steps_done % save_every == 0:
            if pending is not None:
                pending.result()                 # one save in flight at a time
            pending, _ = save(trainer, root)
    if pending is not None:
        pending.result()                         # the last save complete before returning
    return {"resumed_from": resumed_from, "losses": losses, "params": trainer.full_params()}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_train_resumable", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_train_resumable(train_resumable, async_save_checkpoint, load_checkpoint)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_train_resumable(train_resumable, async_save_checkpoint, load_checkpoint, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ### A run that loses a rank
#
# Your loop, three times, on 2 ranks, 8 steps, a save every 2: uninterrupted; then from scratch
# in another folder with rank 1 killed by the launcher (SIGKILL, by process id) as it starts step
# 6; then relaunched on that folder. Printed: what the launcher reported, the step folders the
# kill left, and how many steps the relaunch trained on each rank (from the launcher's record).

# %% nbgrader={"grade": false, "grade_id": "restart_curve", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
restart = kill_and_relaunch(train_resumable, async_save_checkpoint, load_checkpoint,
                            os.path.join(RESTART_WORK, "restart"))
print(restart["message"])
for row in restart["left"]:
    print(f"  {row['folder']}: complete {row['complete']}")
print(f"relaunch: resumed from step {restart['relaunched']['resumed_from']}, trained "
      f"{restart['trained']} steps per rank; the same losses and parameters as the uninterrupted "
      f"run, bit for bit: {same_to_the_bit(restart)}")
plot_restart(restart);

# %% [markdown]
# The relaunch lands on the uninterrupted curve: every loss after the checkpoint is the
# uninterrupted run's to the last bit, because the checkpoint holds the whole state (Section 1).
# The shaded steps are the price of the failure: trained before the kill, lost with it, trained
# again after the relaunch. The checkpoint interval sets that price (Section 5). Note which
# folders the kill left: whether the save in flight at the kill finished depends on where the
# signal landed, and the relaunch must not care.
#
# ### Under torchrun: the agent restarts the workers
#
# On a cluster nobody relaunches by hand. `torchrun --max-restarts=N` runs an agent per node that
# watches its workers; when one dies, the agent stops the others and starts them all again (a new
# rendezvous, the same command), up to N times. Your loop then does the rest: the restarted
# workers find the newest complete checkpoint. Below, your loop under
# `torchrun --standalone --nproc-per-node=2 --max-restarts=1` (the job:
# `distlab.labs.checkpoint.torchrun_job`, your loop handed to it in a file); worker 1 kills
# itself (SIGKILL) as it is about to save step 6, once. Printed: the agent's lines about the
# failure and the restart, then what the restarted workers returned. (The environment variable
# `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` is set: torch 2.13's agent otherwise hands the
# restarted gloo workers its store, where the addresses of the attempt before are still found.)

# %% nbgrader={"grade": false, "grade_id": "restart_torchrun", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
under = torchrun_restart(train_resumable, async_save_checkpoint, load_checkpoint,
                         os.path.join(RESTART_WORK, "torchrun"), steps=8, save_every=2,
                         crash_at=(1, 6))
print(under["command"])
print("\n".join(under["agent"]))
result = under["result"]
print(f"restart {result['restart']}: resumed from step {result['resumed_from']}, trained steps "
      f"{sorted(result['losses'])}, final loss {result['losses'][8]:.6f}")

# %% [markdown]
# The agent saw worker 1 die by signal 9 (SIGKILL), stopped worker 0, and started both again
# (restart 1 of at most 1); the restarted workers resumed from the newest complete checkpoint
# and finished. `cluster/slurm/` runs the same on several nodes, one agent per node.

# %% nbgrader={"grade": false, "grade_id": "restart_cleanup", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
shutil.rmtree(RESTART_WORK)     # Sections 3 and 4's checkpoints and torchrun's files

# %% [markdown]
# ## 5. How often to save
#
# A save costs time, and so does a failure: the restart, and all the work since the last
# checkpoint, done again. Saving often makes the first large and the second small; saving
# rarely, the other way round. Before choosing, predict what a given interval loses.
#
# **The model** (Young 1974, "A first order approximation to the optimum checkpoint interval",
# CACM 17(9); Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart
# dumps", Future Generation Computer Systems 22(3)). The run computes for $\tau$ seconds, saves
# for $\delta$ (a blocking save: the training stops), computes for $\tau$, and so on. Failures
# come at random, independently, at a constant rate: the time to the next one is exponential
# with mean $M$, the mean time between failures of the whole job (every rank's failure stops
# it). A failure, whenever it comes (during compute, a save or a restart), costs a restart of
# $R$ seconds (relaunch, load) and every second of compute and save since the last save that
# completed: the run starts again from that checkpoint.
#
# ### Prediction — the fraction of time lost (2 points)
#
# **Build** `predict_lost_fraction(tau, delta, restart, mtbf) -> float`: the expected fraction
# of wall-clock time the run does not spend on progress (saves, restarts and work redone), over
# a long run, for an interval $\tau$, a save $\delta$, a restart $R$ and an MTBF $M$, all in
# seconds.
#
# **Contract.** The check compares your figure with the model's exact one on three visible cases
# and three hidden ones, where saves take a minute or two, intervals tens of minutes and $M$ is
# days (at the failure rate per GPU of the Llama 3 figures below, a job of a few hundred to two
# thousand GPUs), within the size of what a first-order model leaves out on each case (a few percent of
# the figure, printed with it): a model to first order in the small ratios passes, as does the
# exact one; a model that misses a cost does not. A simulated
# run, failures drawn at random, then measures the same cases and two where failures are
# frequent.
#
# **Why it matters.** Every plan of a long run starts from this number: what a checkpoint
# interval costs, and how it changes when the save gets faster or the cluster larger.
#
# <details><summary>Hint 1</summary>
#
# Take a long run of wall-clock time $T$. How many saves does it hold, and how long do they
# take together? How many failures does it see?
# </details>
#
# <details><summary>Hint 2</summary>
#
# What does one failure cost? Besides the restart, how much work since the last save is lost
# when a failure comes at a moment drawn uniformly within the time between two saves?
# </details>

# %% nbgrader={"grade": false, "grade_id": "interval_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab12 import check_lost_prediction
from distlab.labs.checkpoint.interval_views import llama3_figures, prediction_beside_simulation

# %% nbgrader={"grade": false, "grade_id": "predict_lost_fraction", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_lost_fraction(tau, delta, restart, mtbf):
    """The expected fraction of wall-clock time lost, saves every tau seconds of compute."""
    ### BEGIN SOLUTION
    period = tau + delta                      # from one save's start to the next's
    saves = delta / period                    # the share of time spent saving
    failures = (restart + period / 2) / mtbf  # per second: 1/M failures, each a restart and half a period redone
    return saves + failures
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_lost_fraction", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_lost_prediction(predict_lost_fraction)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_lost_prediction(predict_lost_fraction, seed=fresh_seed())   # three cases drawn afresh
### END HIDDEN TESTS

# %% [markdown]
# The measurement: each case run for 20,000 intervals, failures drawn from an exponential
# distribution (a fixed seed), the fraction of wall-clock time lost counted, beside your
# prediction. The last two cases have failures every 12 hours and every hour.

# %% nbgrader={"grade": false, "grade_id": "interval_measured", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(prediction_beside_simulation(predict_lost_fraction))

# %% [markdown]
# **What the simulation shows, and why.** Over a long run, a share $\delta/(\tau+\delta)$ of the
# time goes to saves. Failures come $1/M$ per second, each costing $R$ plus, on average, half a
# period $(\tau+\delta)/2$ of work redone. To first order,
# $$\text{lost} \approx \frac{\delta}{\tau+\delta} + \frac{R + (\tau+\delta)/2}{M},$$
# which the simulation confirms within its sampling error where $M$ is days. Where failures come
# every few intervals it drifts: it forgets that a failure can strike the restart and the work
# redone too. Daly (2006) counts that exactly: a period of $L = \tau + \delta$ that must run
# without failure takes, on average, $M e^{R/M}(e^{L/M} - 1)$ of wall-clock time, so the
# fraction lost is $1 - \tau / \left(M e^{R/M}(e^{L/M}-1)\right)$ (the simulation agrees with it
# on every case: `tests/test_lab12_interval.py`). Setting the first-order loss's derivative in
# $L$ to zero gives **Young's interval**, $L = \sqrt{2\delta M}$: the saves' share and the
# work redone's share are then equal (to first order it does not matter whether $L$ counts the
# save: the lab's checks take $\sqrt{2\delta M}$ as the compute time $\tau$, as Young did). Daly's higher-order estimate of the best compute time,
# $\sqrt{2\delta M}\,\bigl(1 + \tfrac13\sqrt{\delta/2M} + \tfrac19\,\delta/2M\bigr) - \delta$
# (for $\delta < 2M$), corrects it where saves are not short beside $M$. Note what $R$ does: it
# adds $R/M$ to the loss whatever the interval, and does not move the best one.
#
# ### The Llama 3 numbers, worked through
#
# Llama 3 405B's pre-training saw 466 job interruptions in a 54-day snapshot on up to 16,384
# GPUs (Dubey et al. 2024, arXiv 2407.21783, §3.3.4, Table 5); 419 were unexpected, about 78% of
# them from confirmed hardware issues. Below: the job's MTBF, then, with your
# `predict_lost_fraction`, what Young's interval loses for a few save and restart times, and the
# write speed a save of that length needs, whole and per GPU, for a checkpoint of fp32 master
# weights and Adam's two moments (12 bytes per parameter, ZeRO §3.1: an estimate, the paper does
# not state its checkpoint's size). The restart times are assumptions.

# %% nbgrader={"grade": false, "grade_id": "interval_llama3", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(llama3_figures(predict_lost_fraction))

# %% [markdown]
# With an interruption every 2.8 hours, a restart alone costs $R/M$ of the run: at 10 minutes,
# 6%, whatever the checkpoints do. Keeping the loss under a few percent asks for restarts of a
# minute or two *and* saves of seconds, and a save of a few seconds of a ~5 TB state is a write
# of about 1 TB/s across the cluster, tens of MB/s per GPU. That is why the paper reports
# reducing job start-up and checkpointing time (§3.3.4), and why large runs save
# asynchronously: the training stalls only while the state is copied to CPU memory (Section 3),
# and the write to storage runs beside the next steps.

# %% [markdown]
# ## 6. Open design: the checkpoint interval
#
# An asynchronous save changes the bargain. It stalls the training only for the copy to CPU
# memory, far less than a blocking save; but the checkpoint counts only once its write to
# storage has ended, and the next save cannot start before that write is done.

# %% nbgrader={"grade": false, "grade_id": "plan_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab12 import check_checkpoint_plan, check_checkpoint_plan_bar
from distlab.checks.lab12_interval import design_figures, plan_verdict
from distlab.labs.checkpoint.interval import daly_interval, young_period
from distlab.labs.checkpoint.interval_views import measured_problem, plan_on_measured
from distlab.labs.checkpoint.save_costs import measure_save_costs

# %% [markdown]
# ### Exercise 6 — a checkpoint plan (open design, 2 + 1 points)
#
# **Goal.** Write `plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write) ->
# (interval, mode)`: how many seconds of compute between saves, and whether to save blocking
# (`"blocking"`) or asynchronously (`"async"`), so that the run loses as little of its time as
# you can make it.
#
# **Contract.** All figures in seconds: $M$ = `mtbf`, $R$ = `restart`; a blocking save stops the
# training for `blocking_stall` and its checkpoint is complete when it returns; an asynchronous
# save stops it for `async_stall`, then writes for `async_write` while training goes on. The
# model is Section 5's, with two rules for asynchronous saves: a checkpoint counts only once its
# write has ended (a failure during the write sends the run back to the checkpoint before), and
# a save waits for the previous save's write to end (the training stops meanwhile, as in
# Section 3's loop). The checks call your function on three problems, each where a plain plan
# falls short: an asynchronous write longer than the interval the stall alone suggests, failures
# frequent beside the write, and failures every few saves. Each plan is scored by its expected
# fraction of time lost under the model, computed exactly by the grader, on a scale:
# `test_checkpoint_plan` (2 points) wants at most the loss of the design the hints lead to, on
# the visible problems and three hidden ones; `test_checkpoint_plan_bar` (1 point) at most the
# **bar**, halfway from that design's loss to the least loss a search over both modes and every
# interval finds. Both print your loss beside the hinted design's, the bar and the best.
#
# **Why it matters.** This is the choice every long run makes, and the numbers that decide it
# (failure rate, stall, write time, restart) are measured, as in the last cell of this section,
# never given.
#
# <details><summary>Hint 1</summary>
#
# For one mode at a time: which interval minimises your Section 5 loss? Which stall plays the
# part of $\delta$ in each mode?
# </details>
#
# <details><summary>Hint 2</summary>
#
# With an asynchronous save, what does the training do when the interval is shorter than the
# write? And what does a failure cost in that mode that it does not cost with a blocking save?
# </details>
#
# <details><summary>Hint 3</summary>
#
# Young's interval $\sqrt{2\delta M}$, with $\delta$ the stall of the mode that stalls less, in
# that mode: that design meets the first test.
# </details>
#
# <details><summary>Hint 4</summary>
#
# Write the expected loss of each mode as a function of the interval, exactly, as Section 5's
# explanation did for blocking saves, with the two rules above. From the moment a checkpoint
# counts, how long until the next one counts if nothing fails? And after a failure and its
# restart? Then search: the loss is cheap to evaluate.
# </details>

# %% nbgrader={"grade": false, "grade_id": "plan_figures", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(design_figures())    # the visible problems and their scale

# %% nbgrader={"grade": false, "grade_id": "plan_checkpoints", "locked": false, "schema_version": 3, "solution": true, "task": false}
def plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write):
    """(interval, mode): seconds of compute between saves, "blocking" or "async"."""
    ### BEGIN SOLUTION
    import math
    M, R = mtbf, restart

    def lost(tau, stall, write):
        period = max(tau, write) + stall     # a save waits for the previous write
        fail = -math.expm1(-period / M)      # a failure before the next checkpoint counts
        # after a failure: the restart (failures strike it too), then a period and a write
        # without failure, from the last checkpoint that counts (Daly's expected time)
        again = M * math.expm1(R / M) + M * math.exp(R / M) * math.expm1((period + write) / M)
        return 1 - tau / (M * fail + fail * again)

    def best(stall, write):
        taus = [stall * 1e-2 * 1.02 ** k for k in range(1200)]   # up to ~2e8 stalls: every scale
        tau = min((t for t in taus if t < 10 * M), key=lambda t: lost(t, stall, write))
        lo, hi = tau / 1.02, tau * 1.02                          # golden section around it
        for _ in range(80):
            a, b = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
            lo, hi = (lo, b) if lost(a, stall, write) < lost(b, stall, write) else (a, hi)
        tau = (lo + hi) / 2
        return lost(tau, stall, write), tau

    plans = {"blocking": best(blocking_stall, 0.0), "async": best(async_stall, async_write)}
    mode = min(plans, key=lambda m: plans[m][0])
    return plans[mode][1], mode
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_checkpoint_plan", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_checkpoint_plan(plan_checkpoints)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_checkpoint_plan(plan_checkpoints, seed=fresh_seed())   # three problems drawn afresh
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_checkpoint_plan_bar", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_checkpoint_plan_bar(plan_checkpoints)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_checkpoint_plan_bar(plan_checkpoints, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Your plans on the scale: each problem's expected loss beside the hinted design's, the bar
# and the best plan's.

# %% nbgrader={"grade": false, "grade_id": "plan_verdict", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(plan_verdict(plan_checkpoints))

# %% [markdown]
# ### Checked with real saves on real ranks
#
# The costs the problems gave are measured here: two ranks train the course's `Trainer` (FSDP2)
# and save its model and optimizer shards with `dcp.save`, then with `dcp.async_save` (its
# stall, then the wait on its future: the write), and load one back (the part of a restart a
# checkpoint decides; the relaunch is left out). On this laptop a save takes tens of
# milliseconds, so the failures come every 10 seconds: a blocking save is then about the same
# fraction of the MTBF as a save of a minute on a job that fails every few hours. Your plan for
# these costs, and the run simulated with failures drawn at random, beside half and twice your
# interval in both modes:

# %% nbgrader={"grade": false, "grade_id": "plan_measured", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
costs = measure_save_costs(world_size=2)
print({k: f"{1e3 * v:.1f} ms" for k, v in costs.items()})
print(plan_on_measured(plan_checkpoints, measured_problem(costs, mtbf=10.0)))

# %% [markdown]
# **What the design shows.** Young's interval is the right start and, where failures are rare
# beside the save, nearly the end: the loss is flat near its minimum, so a first-order interval
# loses little more than the best. It falls short in three places, one per problem. An
# asynchronous save whose write outlasts the interval makes the training wait: the interval
# must be at least the write. A failure during an asynchronous write falls back one checkpoint
# more, costing about a write's length per failure: where failures are frequent beside the
# write, the blocking save, though it stalls longer, loses less. And where failures come every
# few saves, first order itself is off (Daly 2006): the exact model, minimised, is the plan.

# %% [markdown]
# ## Summary
#
# * A resume is a continuation only if it restores everything a step reads: the model's and the
#   optimizer's shards, the step, every random generator (torch's global one, each rank's own,
#   Python's) and the data position. Each part left out forks the run, some at once and some
#   only later (Python's shuffle at the next epoch), and nothing crashes; float64 and
#   `torch.equal` make the fork visible.
# * `get_state_dict` gives the model's and optimizer's state as `DTensor` shards keyed by
#   parameter name; `torch.distributed.checkpoint` writes them with every rank its own file and
#   one `.metadata` that maps each tensor's global shape to the chunks the ranks wrote. Loading
#   reads that map, so a checkpoint written by 4 ranks loads on 2 and back: each rank asks for
#   the rows it owns now. A flat copy of each rank's shards cannot be resharded, and optimizer
#   state saved by one rank is one rank's. A folder that cannot be loaded whole (a save that did
#   not finish, another model's) is refused before anything is touched, naming the file.
#
# * **Asynchronous saves** (Section 3): `dcp.async_save` stops training only to copy the state
#   to CPU memory; a thread writes it, on a gloo group of its own, while the next steps run.
#   Wait for a save before the next and before the end. The stall measured beside a blocking
#   save: the write moves from the stall into the overlapped steps, but only where the steps
#   between saves outlast the write. On one H200 (`bench/reports/gpu-2026-11-28-0140-lab12-vm.md`:
#   806 MB a save, every four 30 ms steps) each asynchronous save waited for the write before it
#   and stalled 1.36 s against the blocking save's 1.11 s; on 16 CPU cores, with 2.2 s steps,
#   0.17 s against 0.63 s.
# * **Restart** (Section 4): a loop that resumes from the newest *complete* checkpoint (with
#   `.metadata`) lands bit for bit on the run that never died; the steps since that checkpoint
#   are trained twice. A rank killed from outside (SIGKILL) is a death the launcher reports as
#   such, not a hang; `torchrun --max-restarts` restarts the workers and the same loop resumes.
# * **How often to save** (Sections 5 and 6): a run that saves for $\delta$ every $\tau$ of compute, and
#   fails every $M$ on average with a restart of $R$, loses to first order
#   $\delta/(\tau+\delta) + (R + (\tau+\delta)/2)/M$ of its time, minimised at Young's
#   interval $\sqrt{2\delta M}$ (Young 1974); Daly (2006) gives the exact loss,
#   $1 - \tau/\bigl(M e^{R/M}(e^{(\tau+\delta)/M}-1)\bigr)$, which a simulation with failures
#   drawn at random confirms, and a higher-order interval. The restart adds $R/M$ whatever the
#   interval. At Llama 3's scale (466 interruptions in 54 days on 16,384 GPUs, §3.3.4: an MTBF of
#   2.8 hours), losing under a few percent takes restarts of a minute or two and saves of
#   seconds, about 1 TB/s of writes for a ~5 TB state.
# * An asynchronous save stalls only for the copy to CPU memory, but its checkpoint counts once
#   written: the interval must outlast the write, and a failure during a write costs about a
#   write more. Where failures are frequent beside the write a blocking save loses less; where
#   they come every few saves, only the exact model, minimised, finds the best plan.
#
# ### What this lab does not cover
#
# * **Surviving a failure without a restart.** Every recovery here stops the whole job and
#   restarts it from the last checkpoint, losing the restart and the work since the save. With
#   replicated training (data parallelism, or the replicas of HSDP), the replicas that are still
#   healthy could go on instead: the failed one leaves, the others carry on between steps with a
#   smaller quorum, and a replacement rejoins by copying the weights from a live peer rather
#   than from disk. That is torchft, PyTorch's library for per-step fault tolerance of replica
#   groups; it changes how gradients are reduced and who agrees on each step, which is a lab of
#   its own.
# * **Silent data corruption.** Everything here assumes a failure announces itself: a rank dies,
#   a collective times out. A chip that computes a wrong number and carries on raises nothing,
#   and a checkpoint saves the wrong number faithfully; bit-identical resumes then reproduce it
#   exactly. Meta and Google have measured such cores in their fleets (Dixit et al. 2021,
#   "Silent Data Corruptions at Scale", arXiv 2102.11245; Hochschild et al. 2021, "Cores that
#   don't count", HotOS), and Llama 3 lists it among its interruptions (Table 5). Catching it
#   takes other tools: redundant computation, checks on losses and gradient norms, comparisons
#   across replicas, and keeping checkpoints from before the corruption.
