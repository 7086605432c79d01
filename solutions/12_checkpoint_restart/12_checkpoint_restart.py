# ---
# jupyter:
#   distlab:
#     summary: "The whole training state for a bit-identical resume; torch.distributed.checkpoint with every rank its own shards, resharded across world sizes; asynchronous saves; a rank killed and the run restarted, under torchrun too; the checkpoint interval by Young, Daly and simulation."
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
# **fresh** `Trainer` of the same run and world size (weights, generators and data as at step 0)
# with the state it took, saved and loaded; from then on the fresh trainer's steps give the
# same losses and parameters as the uninterrupted run's, to the last bit, and
# `trainer.steps_done` is the step the state was taken after.
#
# The check runs your functions on 2 ranks: they train 3 steps, take your state, write it with
# `torch.save` to bytes and read it back (so a reference to a live object cannot pass), restore
# it into a fresh trainer and train steps 4 to 6. In the grader, beside the course's
# uninterrupted run of 6 steps (stored; made again on the grader's machine if this machine
# rounds otherwise), the three losses and every parameter gathered at the end must be equal
# with `torch.equal`: not close, equal. Hidden: the same run stopped after step 3 or 4, then
# two or three steps more (a new epoch always starts after the resume).
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
# LAB12-ASYNC (owner: l12restart): dcp.async_save overlapped with the next steps, the stall
# beside a blocking save, measured side by side.

# %% [markdown]
# ## 4. Restart
#
# LAB12-RESTART (owner: l12restart): the resumable loop, a rank killed from outside with SIGKILL
# at a random step, the restart, the loss curve beside the uninterrupted run's; the same loop
# under torchrun --max-restarts.

# %% [markdown]
# ## 5. How often to save
#
# LAB12-INTERVAL (owner: l12interval): the graded prediction of the fraction of time lost, the
# simulated run that measures it; Young's and Daly's interval; the Llama 3 numbers worked through.

# %% [markdown]
# ## 6. Open design: the checkpoint interval
#
# LAB12-DESIGN (owner: l12interval): the interval (and sync or async) that minimises expected
# lost time, graded on a scale.

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
# LAB12-SUMMARY-BULLETS (l12restart and l12interval add their sections' bullets here, in
# section order)
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
