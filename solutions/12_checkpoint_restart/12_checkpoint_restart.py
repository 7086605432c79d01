# ---
# jupyter:
#   distlab:
#     summary: "LAB12-SUMMARY (l12state writes it: one line, the site's summary; see Lab 11's)"
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 12 — When a rank dies
#
# LAB12-INTRO (owner: l12state). The failure numbers of Llama 3 (§3.3.4, Table 5), what the lab
# builds, section by section, and the notation (a run's step, the checkpoint interval, the save
# cost, the mean time between failures).

# %% [markdown]
# ## 1. The whole training state
#
# LAB12-STATE (owner: l12state): Exercise 1, the whole training state, graded by resuming from it.

# %% [markdown]
# ## 2. Saving with torch.distributed.checkpoint, and resharding
#
# LAB12-RESHARD (owner: l12state): Exercise 2, save and load with DCP, each rank its own shards;
# the files and the metadata shown; 4 -> 2 and 2 -> 4; refusals shown.

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
# `async_save_checkpoint(trainer, root)` below is Section 2's save made asynchronous: the same
# state (your `training_state`), the same folder (`step_folder(root, trainer.steps_done)`,
# `root/step_NNNNNN`), `dcp.async_save` with `process_group=save_group()`; it returns
# `(future, folder)`. Section 4's loop saves with it.

# %% nbgrader={"grade": false, "grade_id": "async_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import os
import shutil
import tempfile

import torch.distributed.checkpoint as dcp

from distlab.labs.checkpoint.async_views import stall_table
from distlab.labs.checkpoint.saving import save_group, step_folder

# %% nbgrader={"grade": false, "grade_id": "async_save_checkpoint", "locked": false, "schema_version": 3, "solution": true, "task": false}
def async_save_checkpoint(trainer, root):
    """Start saving the trainer's whole state under root/step_NNNNNN; return (future, folder)."""
    ### BEGIN SOLUTION
    folder = step_folder(root, trainer.steps_done)
    future = dcp.async_save(training_state(trainer), checkpoint_id=folder,
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
# mostly wait, the write is close to free, which is why large runs save asynchronously
# (torchtitan's `checkpoint.async_mode`, Megatron-LM's `--async-save`). Staging itself is not
# free either: it needs CPU memory for a whole copy of the rank's state.

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
# `trainer.step()` to the end); and every save was waited for. Hidden: a fresh seed chooses
# the victim, the step (after the second save, two before the end) and the run's data and
# initial weights.
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
# Your loop, three times, on 2 ranks, 10 steps, a save every 2: uninterrupted; then from scratch
# in another folder with rank 1 killed by the launcher (SIGKILL, by process id) as it starts step
# 7; then relaunched on that folder. Printed: what the launcher reported, the step folders the
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
# LAB12-SUMMARY-BULLETS (each owner adds its sections' bullets, in section order; l12state
# writes the closing "what this lab does not cover": torchft, silent data corruption).
#
# - **Asynchronous saves** (Section 3): `dcp.async_save` stops training only to copy the state
#   to CPU memory; a thread writes it, on a gloo group of its own, while the next steps run.
#   Wait for a save before the next and before the end. The stall measured beside a blocking
#   save: the write moves from the stall into the overlapped steps, nearly free where the CPUs
#   are idle (a GPU run), not on a busy laptop.
# - **Restart** (Section 4): a loop that resumes from the newest *complete* checkpoint (with
#   `.metadata`) lands bit for bit on the run that never died; the steps since that checkpoint
#   are trained twice. A rank killed from outside (SIGKILL) is a death the launcher reports as
#   such, not a hang; `torchrun --max-restarts` restarts the workers and the same loop resumes.
