# ---
# jupyter:
#   distlab:
#     summary: "Pipelines without bubbles: the backward split into input and weight gradients, schedules written as tables (interleaved 1F1B, ZB-H1, a V-shaped zero-bubble) replayed on paper and run on real ranks beside torch's own, and a schedule designed under a memory cap."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 11 — Pipelines without bubbles
#
# LAB11-INTRO (owner: l11tables): what Lab 5 left (1F1B's bubble (p−1)/(m+p−1) of the step),
# what this lab adds, the list of exercises, notation (p ranks, m microbatches, v virtual stages,
# unit times t_F = t_B = t_W), with sources.

# %% [markdown]
# ## 1. The backward, split in two
#
# LAB11-SECTION-1 (owner: l11split): Exercise 1, split backward (B then W), hooks, memory held
# between B and W, measured.

# %% [markdown]
# ## 2. Schedules as tables
#
# LAB11-SECTION-2 (owner: l11tables): the action table, the replay, interleaved 1F1B (prediction
# first), ZB-H1, the V-shaped placement; the course's and torch's tables side by side.

# %% [markdown]
# ## 3. Running a table on real ranks
#
# A table is a plan; on real ranks every arrow of it is a message. Rank r runs its row in
# order, but an F can only start once the activation from the stage before it has arrived, and a
# B once the gradient from the stage after it has: the ranks never talk about the table, only
# exchange tensors. What can go wrong is the order of those exchanges. On gloo a send completes
# only when its receiver has posted the matching receive, at every message size (Lab 5's probe
# before its Exercise 4), so a rank that blocks on a receive before it has posted the sends its
# peer is waiting for freezes both. And with virtual stages, two stages of one rank exchange
# messages with the same peer: in interleaved 1F1B on 4 ranks, rank 0 holds stages 0 and 4, and
# the gradients for both come from rank 1 (stages 1 and 5); in a V, rank 0 sends rank 1 both
# stage 0's activations and stage 7's gradients. A message must say which one it is.
#
# The compute of each action is the course's: a `TableStage` (`distlab.labs.pipeline.table_stages`)
# runs F, B and W of one microbatch on one stage of Lab 5's model, in float64, and keeps what the
# later actions need. Its B and W are split by hand for this model (a residual block's input
# gradient and weight gradient written out), so this section needs nothing of your Exercise 1.
# For stage `st = stages[s]`:
#
# | call | what it does | input | returns |
# | --- | --- | --- | --- |
# | `st.forward(i, x)` | F of microbatch i | `x`: the activation from stage s−1; `None` on stage 0 (it reads its own microbatch) | the output for stage s+1; `None` on the last stage (it keeps the loss) |
# | `st.backward(i, grad, weights)` | B of microbatch i | `grad`: the gradient of the output, from stage s+1; `None` on the last stage | the gradient of the input, for stage s−1; `None` on stage 0 |
# | `st.weights(i)` | W of microbatch i | after `backward(i, ..., weights=False)` | `None` (adds into `.grad`) |
# | `st.buffer()` | an empty tensor of a message's shape and dtype | | every boundary's message has it |
#
# `backward(..., weights=True)` is a whole backward (B and W at once); with `weights=False` the
# weights' gradient waits for `weights(i)`. A `TableStage` refuses an action whose inputs are not
# there (a B before its F, a W before its B) and says which.

# %% nbgrader={"grade": false, "grade_id": "executor_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch.distributed as dist

from distlab.checks.lab11 import check_executor
from distlab.labs.pipeline.compare import compare_tables
from distlab.labs.pipeline.on_ranks import (gradient_table, plot_timelines, run_on_ranks,
                                           stored_problem)
from distlab.labs.pipeline.schedules import schedule_order
from distlab.labs.pipeline.torch_tables import torch_table

# %% [markdown]
# ### Exercise — an executor for any table (5 points)
#
# **Build** `run_table(row, stages, placement, num_microbatches)`: one rank's part of a step.
#
# **Contract.** Inputs: `row`, this rank's actions in order, each `(op, i, s)` with op `"F"`,
# `"B"` or `"W"`; `stages`, this rank's stages (stage index → `TableStage`); `placement`, the
# rank of every stage (stage s lives on rank `placement[s]`; `dist.get_rank()` is this rank);
# `num_microbatches`, m. Run the actions in the row's order: F calls `forward`, B calls
# `backward` with `weights=False` exactly when the row holds a W of the same stage and
# microbatch (a stage's W runs on its own rank), W calls `weights`. An F's output goes to stage
# s+1 and a B's returned gradient to stage s−1; between two stages of one rank nothing is sent
# (hand the tensor over). Allowed: `dist.isend` and `dist.irecv` only, one message per
# activation or gradient that crosses ranks; every send completed before you return; no
# `dist.barrier()` (the check puts one between tables). Any table whose replay finishes must
# run without deadlock.
#
# The check runs your function on every rank of p = 4 for the course's three tables of
# Section 2 at m = 8 (interleaved 1F1B with v = 2, ZB-H1, the zero-bubble V; stored), one after
# another, in float64, and compares in the grader: the loss and every parameter's gradient with
# one process's step, within 1e-6; your record (`out.comms`): only `isend`/`irecv`, and per rank
# exactly the table's messages to and from each peer. Ranks that stop making progress for 10 s
# are reported as deadlocked, with what each was waiting in. Hidden: a fresh model and batch, at
# p = 2 and m = 4.
#
# **Why it matters.** A schedule's bubble on paper is only a promise; what runs is a loop like
# this one on every GPU. Megatron-LM and `torch.distributed.pipelining` each have one: torch's
# schedules compile their tables into per-rank actions with the sends and receives written in,
# and run them with batched `isend`/`irecv`.
#
# <details><summary>Hint 1</summary>
#
# For an action (op, i, s): which stage does its input come from, and is that stage on this rank?
# Which stage does its output go to? Between two stages of one rank a dictionary keyed by the
# message is enough.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Both ends of a message must compute the same tag without talking. gloo hands a receive the
# sends from its peer with the same tag in the order they were posted. In a V, rank 0 sends
# rank 1 activations (into stage 1) and gradients (into stage 6), two streams each in an order
# of its own: what must the tag hold so that neither takes the other's place? Three numbers name
# every message of a step once: the kind, the stage, the microbatch; make one integer of them.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Never wait for a send: keep its work, wait for all of them after the last action. Post the
# receive an action needs before you compute the action before it (one ahead), and wait for it
# only when the action runs. Then each rank waits in the table's order, which is the replay's,
# and the replay finishes.
# </details>

# %% nbgrader={"grade": false, "grade_id": "executor", "locked": false, "schema_version": 3, "solution": true, "task": false}
def run_table(row, stages, placement, num_microbatches):
    """Run this rank's actions `row` on its `stages`, stage s on rank placement[s]."""
    ### BEGIN SOLUTION
    rank, m, last = dist.get_rank(), num_microbatches, len(placement) - 1
    with_w = {(s, i) for op, i, s in row if op == "W"}
    local, posted, sends = {}, {}, []

    def tag(kind, stage, i):                  # one tag per message of a step
        return 2 * (stage * m + i) + (kind == "B")

    def source(k):                            # (kind, stage) of what action k needs, or None
        op, i, s = row[k]
        if op == "F" and s > 0:
            return "F", s - 1
        if op == "B" and s < last:
            return "B", s + 1
        return None

    def post(k):                              # start action k's receive, if it crosses ranks
        if k < len(row) and k not in posted and source(k) and placement[source(k)[1]] != rank:
            (kind, frm), (_, i, s) = source(k), row[k]
            buf = stages[s].buffer()
            posted[k] = buf, dist.irecv(buf, placement[frm], tag=tag(kind, s, i))

    def receive(k):
        if source(k) is None:
            return None
        (kind, frm), (_, i, s) = source(k), row[k]
        if placement[frm] == rank:
            return local.pop((kind, s, i))
        buf, work = posted.pop(k)
        work.wait()
        return buf

    def send(kind, stage, i, tensor):
        if placement[stage] == rank:
            local[(kind, stage, i)] = tensor
        else:
            sends.append(dist.isend(tensor, placement[stage], tag=tag(kind, stage, i)))

    post(0)
    for k, (op, i, s) in enumerate(row):
        post(k + 1)                           # the next message travels while this action runs
        got = receive(k)
        if op == "F":
            y = stages[s].forward(i, got)
            if s < last:
                send("F", s + 1, i, y)
        elif op == "B":
            g = stages[s].backward(i, got, weights=(s, i) not in with_w)
            if s > 0:
                send("B", s - 1, i, g)
        else:
            stages[s].weights(i)
    for work in sends:                        # a send's buffer lives until it is received
        work.wait()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_executor", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
check_executor(run_table)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_executor(run_table, seed=fresh_seed(), world_size=2, num_microbatches=4)
### END HIDDEN TESTS

# %% [markdown]
# ### torch's schedules on the same model
#
# torch 2.13 runs its own multi-stage schedules from tables too. Below, your `run_table` runs
# six tables on 4 ranks, m = 8, on the stored model: the course's three, and torch's own tables
# for `ScheduleInterleaved1F1B`, `ScheduleZBVZeroBubble` and `ScheduleDualPipeV` (read without
# running them, Section 2). Beside your gradients: one process's, and those of torch's schedules
# themselves, each run with its own `PipelineStage`s on the same model, weights and batch (two
# stages per rank; stored: `distlab.labs.pipeline.torch_runs.torch_grads` made them when the
# course's references were built, as running torch's runtime on 4 ranks here would take most of
# this section's time). `ScheduleDualPipeV` is shown, not an exercise: DeepSeek's V-shaped
# DualPipe, which runs a forward and a backward of two stages of one rank together.

# %% nbgrader={"grade": false, "grade_id": "executor_beside_torch", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
runs = run_on_ranks(run_table)
print(gradient_table(runs))

# %% [markdown]
# Every row agrees with one process and with torch to about 1e-14, sums in another order: the
# same model trained by six schedules gives one set of gradients, as it must. A schedule is an
# order, never a different computation: a student's table that orders the actions otherwise is
# just as valid when every action's input is there when it runs, and it is then judged by its
# replay (bubble, peak activations), not by its gradients.
#
# ### Timelines
#
# The same runs as Lab 6 draws them: one lane per rank, F, B and W as coloured ranges, each
# timed by the `TableStage` that ran it. The title sets each run's bubble as measured (idle over
# compute, PTD-P's convention, summed over the ranks) beside the replay's ($t_F = t_B = t_W$).

# %% nbgrader={"grade": false, "grade_id": "executor_timelines", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
plot_timelines(runs, ["interleaved 1F1B (v = 2)", "ZB-H1", "zero-bubble V",
                      "torch ScheduleDualPipeV"]);

# %% [markdown]
# The measured bubbles are nothing like the replay's, and say nothing about the schedules: an
# action here multiplies a 2 × 16 block by a 16 × 16 matrix, microseconds, while a message
# through gloo's sockets and the Python around it take tens of microseconds, and four ranks
# share two cores with everything else on the machine. The lanes are mostly waiting for the
# scheduler. What a bubble means needs actions that dominate their messages: the replay gives
# it exactly for the stated unit times, and Lab 6's GPU traces show what real ones look like
# (kernels of milliseconds, NCCL's sends overlapped with them). What the real runs do show is
# the order: each lane's F, B and W come in the table's order, and nothing waits forever.
#
# ### Where a zero-bubble schedule costs
#
# The replay of each table ($t_F = t_B = t_W$ per rank's share of the layers) and what crosses the
# ranks, beside Lab 5's 1F1B:

# %% nbgrader={"grade": false, "grade_id": "executor_costs", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
course, _, _, _ = stored_problem()
lab5 = [[(op, i, r) for op, i in order] for r, order in enumerate(schedule_order("1f1b", 4, 8))]
print(compare_tables({"1F1B (Lab 5)": (lab5, [0, 1, 2, 3]), **course,
                      **{f"torch {n}": torch_table(n, 4, 8)
                         for n in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")}}))

# %% [markdown]
# - **W holds activations longer.** A stage keeps a microbatch's activations from its F to its
#   W, not to its B. ZB-H1 keeps 1F1B's peak (4 microbatches, rank 0's; Qi et al. 2023, §3)
#   but lets every rank reach it: 4/4/4/4 stage-microbatches where 1F1B holds 4/3/2/1. The
#   zero-bubble V holds 8 stage-microbatches of half a rank's layers each, 4 microbatches;
#   DualPipeV 9, 4.5.
# - **More messages.** Splitting B from W sends nothing new (ZB-H1: 48, as 1F1B). Virtual stages
#   do: every extra stage boundary is two more messages per microbatch, 112 for interleaved
#   v = 2, 96 for a V (its turn, stage 3 to 4, stays on rank 3). Each carries a whole
#   activation while its stage computes half a rank's layers, and each pays a latency (Lab 1's
#   alpha) that the bubble's formula does not count.
# - **A finer order to get right**: three kinds of action and twice the stages, which is what
#   your executor had to get right.
#
# **Why DeepSeek-V3 still chose DualPipe** (DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1). Its
# problem was not the bubble alone: cross-node expert parallelism made its computation to
# communication ratio about 1:1, so any schedule that only fills idle time with W would still
# wait on all-to-alls half the time. DualPipe splits each chunk into attention, all-to-all
# dispatch, MLP and all-to-all combine (with B and W split as in zero-bubble), pairs a forward
# chunk with a backward chunk, and overlaps one's communication with the other's computation;
# microbatches enter from both ends of the pipeline. The paper's Table 2 compares, with F, B, W
# the times of a forward, full backward and weight-backward chunk and F&B two overlapped chunks:
# 1F1B's bubble $(PP-1)(F+B)$, 1× parameters, PP activations; ZB1P's $(PP-1)(F+B-2W)$, 1×, PP;
# DualPipe's $(PP/2-1)(F\&B+B-3W)$, **2×** parameters, PP+1 activations. The second copy of the
# parameters is the cost it accepts: the paper notes it adds little memory since training uses a
# large EP degree. It also notes that DualPipe needs only the stages and the microbatches to be
# divisible by 2 (not the microbatches by the stages, as Chimera does), and that neither its
# bubbles nor its activations grow with the number of microbatches. DualPipeV (in the DualPipe
# repository, after Sea AI Lab's "cut-in-half" of DualPipe; torch's `ScheduleDualPipeV`) folds
# the two directions onto one copy of the parameters placed in a V: the table you ran above,
# whose replay gives the zero-bubble V's bubble at half a microbatch more activations.

# %% [markdown]
# ## 4. Open design: a schedule under a memory cap
#
# LAB11-SECTION-4 (owner: l11design): the open design, graded on a scale.

# %% [markdown]
# ## Summary
#
# LAB11-SUMMARY (owner: l11tables, with one bullet from each section's owner).
