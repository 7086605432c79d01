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
# LAB12-SUMMARY-BULLETS (each owner adds its sections' bullets, in section order; l12state
# writes the closing "what this lab does not cover": torchft, silent data corruption).
#
# * **Asynchronous saves** (Section 3): `dcp.async_save` stops training only to copy the state
#   to CPU memory; a thread writes it, on a gloo group of its own, while the next steps run.
#   Wait for a save before the next and before the end. The stall measured beside a blocking
#   save: the write moves from the stall into the overlapped steps, nearly free where the CPUs
#   are idle (a GPU run), not on a busy laptop.
# * **Restart** (Section 4): a loop that resumes from the newest *complete* checkpoint (with
#   `.metadata`) lands bit for bit on the run that never died; the steps since that checkpoint
#   are trained twice. A rank killed from outside (SIGKILL) is a death the launcher reports as
#   such, not a hang; `torchrun --max-restarts` restarts the workers and the same loop resumes.
# * (Sections 5 and 6, l12interval) A run that saves for $\delta$ every $\tau$ of compute, and
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
