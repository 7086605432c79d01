# ---
# jupyter:
#   distlab:
#     summary: "Naive, GPipe and 1F1B pipelines on real ranks, the bubble measured against (p-1)/(m+p-1), activation memory, and torch.distributed.pipelining."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 5 — Pipeline parallelism
#
# Tensor parallelism cuts every layer across ranks and pays an all-reduce in every layer. Pipeline
# parallelism (PP) cuts the model the other way: **by depth**. Rank s holds a contiguous run of
# layers, a *stage*; activations flow forward from stage to stage with point-to-point `send`/`recv`,
# and gradients flow back the same way. Only stage boundaries communicate.
#
# The price is idle time. A stage cannot start before the previous one hands it an activation, and
# cannot start its backward before the next one hands back a gradient. In this lab you build three
# schedules on real ranks, measure when every forward and backward ran on every rank, and compare:
#
# | schedule | idea | idle share (the *bubble*) | activations held per stage |
# | --- | --- | --- | --- |
# | naive | the whole batch, stage after stage | (p-1)/p | 1 batch |
# | GPipe (Huang et al., 2019) | m microbatches: all forwards, then all backwards | (p-1)/(m+p-1) | m microbatches |
# | 1F1B (PipeDream-Flush, Narayanan et al., 2021) | after a short warm-up, alternate one forward and one backward | (p-1)/(m+p-1) | at most p |
#
# Every stage function you write gets a `stage` module (this rank's layers) that **records its own
# schedule**: each call `stage(a)` is one microbatch's forward, and the backward through its output
# is that microbatch's backward; start and end times land in `stage.events`. The checks compare your
# gradients with the plain single-process step of the same model, and read the events to see which
# schedule you actually ran.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import collections

import torch
import torch.distributed as dist

from distlab.checks.assertions import fresh_seed
from distlab.checks.lab05 import (check_1f1b, check_gpipe, check_library_matches, check_naive,
                                  check_partition)
from distlab.labs.pipeline import (PipeSpec, boundary_traffic, library_step, loss_fn, plot_runs,
                              plot_simulations, run_schedules, schedule_explorer, schedule_table)

# %% [markdown]
# ## 1. Exercise 1 — cutting L layers into p stages (1 point)
#
# The model here is a stack of L identical residual blocks, `x + gelu(x Wᵀ + c)`, each mapping a
# `(b, h)` activation to a `(b, h)` activation. Stage s gets a contiguous range of blocks. Equal
# blocks should be spread as evenly as possible: the slowest stage sets the pace of the whole
# pipeline, so a stage with one layer too many makes every other stage wait.
#
# Write `partition(num_layers, num_stages)` returning a list of `num_stages` pairs `(start, stop)`
# (stage s runs blocks `start..stop-1`): contiguous, in order, covering all layers, sizes differing
# by at most one. When p does not divide L, some stages get one block more.

# %% nbgrader={"grade": false, "grade_id": "partition", "locked": false, "schema_version": 3, "solution": true, "task": false}
def partition(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous, balanced [start, stop) layer ranges, one per stage."""
    ### BEGIN SOLUTION
    base, extra = divmod(num_layers, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        stop = start + base + (s < extra)    # the first `extra` stages take one block more
        ranges.append((start, stop))
        start = stop
    return ranges
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_partition", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_partition(partition)
print("partition(7, 2) =", partition(7, 2), " partition(10, 4) =", partition(10, 4))
### BEGIN HIDDEN TESTS
check_partition(partition, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# From here on, the runner cuts the model with the same rule and gives each rank its stage.
#
# ## 2. Exercise 2 — the naive pipeline (2 points)
#
# One step of the whole batch `x` (shape `(b, h)`), on every rank `rank` of `world_size`:
#
# 1. **Input.** Stage 0 uses `x`. Every other stage receives its input from `rank - 1`:
#    `a = torch.empty_like(x); dist.recv(a, src=rank - 1)` (every boundary carries a `(b, h)`
#    tensor, the shape of `x`). Then `a.requires_grad_()`: we will need ∂loss/∂a to send back.
# 2. **Forward.** `y = stage(a)`.
# 3. **Loss or send.** The last stage computes `loss = loss_fn(y, target)` and calls
#    `loss.backward()`. Every other stage sends `y.detach()` to `rank + 1`, receives ∂loss/∂y
#    from `rank + 1` (a tensor shaped like `y`) and calls `y.backward(grad)`: autograd continues the
#    chain rule through this stage exactly as if the next stages were in the same process.
# 4. **Send the gradient back.** Every stage but the first sends `a.grad` to `rank - 1`.
# 5. Return `loss.item()` on the last stage (the checks read it there), None elsewhere.
#
# Every stage's parameter gradients must equal the single-process ones: the pipeline changes where
# the work runs, not what is computed.

# %% nbgrader={"grade": false, "grade_id": "naive_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def naive_step(rank, world_size, stage, x, target):
    """Forward and backward of the whole batch, one stage after another, blocking send/recv."""
    ### BEGIN SOLUTION
    first, last = rank == 0, rank == world_size - 1
    if first:
        a = x
    else:
        a = torch.empty_like(x)                     # (b, h), the activation of stage rank-1
        dist.recv(a, src=rank - 1)
        a.requires_grad_()
    y = stage(a)
    if last:
        loss = loss_fn(y, target)
        loss.backward()
    else:
        dist.send(y.detach(), dst=rank + 1)
        grad = torch.empty_like(y)                  # (b, h), d loss / d y from stage rank+1
        dist.recv(grad, src=rank + 1)
        y.backward(grad)
    if not first:
        dist.send(a.grad, dst=rank - 1)
    return loss.item() if last else None
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_naive_step", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_naive(naive_step, world_size=2)
check_naive(naive_step, world_size=4)
print("naive_step: gradients and loss equal the single-process step on 2 and 4 stages")
### BEGIN HIDDEN TESTS
check_naive(naive_step, world_size=4, num_layers=7, seed=fresh_seed())
check_naive(naive_step, world_size=2, num_layers=3, batch=6, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 3 — GPipe: microbatches (2 points)
#
# In the naive pipeline only one stage works at a time. GPipe splits the batch into **m
# microbatches** (`x.chunk(m)`, each `(b/m, h)`): while stage 1 works on microbatch 0, stage 0
# already runs microbatch 1. All m forwards run first, then all m backwards; the gradients of the
# m backward passes **accumulate** in the parameters' `.grad`.
#
# For the sum of the microbatch gradients to be the gradient of the batch loss (a mean over the
# batch), each microbatch's backward must start from `loss_fn(y_i, t_i) / m`. Keep each
# microbatch's stage input `a` and output `y` in lists for the backward phase. Return the sum of the
# scaled microbatch losses (the batch loss) on the last stage.

# %% nbgrader={"grade": false, "grade_id": "gpipe_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpipe_step(rank, world_size, stage, x, target, num_microbatches):
    """GPipe: forward all microbatches, then backward all of them; gradients accumulate."""
    ### BEGIN SOLUTION
    first, last, m = rank == 0, rank == world_size - 1, num_microbatches
    xs, ts = x.chunk(m), target.chunk(m)            # m x (b/m, h)
    inputs, outputs = [], []
    for i in range(m):
        if first:
            a = xs[i]
        else:
            a = torch.empty_like(xs[i])
            dist.recv(a, src=rank - 1)
            a.requires_grad_()
        y = stage(a)
        if last:
            y = loss_fn(y, ts[i]) / m               # the batch loss is the mean of m equal parts
        else:
            dist.send(y.detach(), dst=rank + 1)
        inputs.append(a)
        outputs.append(y)
    for a, y in zip(inputs, outputs):
        if last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)                        # accumulates into the parameters' .grad
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return sum(y.item() for y in outputs) if last else None
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_gpipe_step", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_gpipe(gpipe_step, world_size=2, num_microbatches=4)
check_gpipe(gpipe_step, world_size=4, num_microbatches=2)
print("gpipe_step: gradients equal the single-process step; all forwards before all backwards")
### BEGIN HIDDEN TESTS
check_gpipe(gpipe_step, world_size=4, num_microbatches=8, batch=16, num_layers=9, seed=fresh_seed())
check_gpipe(gpipe_step, world_size=2, num_microbatches=3, batch=6, num_layers=5, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise 4 — 1F1B (3 points)
#
# GPipe holds the activations of **all m microbatches** until the backward phase: activation
# memory grows with m, yet m must be large for a small bubble. 1F1B bounds it. Stage s:
#
# 1. **warm-up**: runs `w = min(p - s - 1, m)` forwards (the last stage runs none);
# 2. **steady state**: for each remaining microbatch, one forward, then one backward of the
#    oldest microbatch still waiting;
# 3. **cool-down**: the `w` backwards left.
#
# A microbatch's activations are freed by its backward, so stage s never holds more than
# min(p - s, m) microbatches — independent of m once m ≥ p. The bubble is the same as GPipe's.
# The check reads the passes your stages recorded: at most min(p - s, m) microbatches alive on
# stage s, and, after the warm-up, forward and backward strictly alternating (stage 0 of 3 with
# m = 4 runs F F F B F B B B).
#
# **Deadlocks.** In the steady state stage s sends an activation to s+1 and then waits for a
# gradient from s+1, while s+1 sends a gradient to s and waits for the next activation. With
# blocking `send` on both sides both wait for each other forever. On gloo a large `send` blocks
# the calling thread until the peer posts its `recv`. On NCCL `dist.send` returns to the host at
# once; the deadlock is on the GPU, where the send kernel waits for the matching receive on its
# stream and everything queued behind it waits too, so the hang shows up at the next
# synchronisation (a `.item()`, a `wait()`, the optimizer step). Post sends with `dist.isend`,
# keep the returned work objects, and `wait()` them all at the end. Likewise, never `recv` a gradient for a backward
# before sending the activation that the next stage needs to produce it.

# %% nbgrader={"grade": false, "grade_id": "one_f_one_b_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def one_f_one_b_step(rank, world_size, stage, x, target, num_microbatches):
    """1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    ### BEGIN SOLUTION
    first, last, m = rank == 0, rank == world_size - 1, num_microbatches
    xs, ts = x.chunk(m), target.chunk(m)            # m x (b/m, h)
    waiting = collections.deque()                   # (a, y) of microbatches awaiting backward
    sends, losses = [], []

    def forward(i):
        if first:
            a = xs[i]
        else:
            a = torch.empty_like(xs[i])
            dist.recv(a, src=rank - 1)
            a.requires_grad_()
        y = stage(a)
        if last:
            y = loss_fn(y, ts[i]) / m
            losses.append(y.item())
        else:
            sends.append(dist.isend(y.detach(), dst=rank + 1))   # never block on the next stage
        waiting.append((a, y))

    def backward():
        a, y = waiting.popleft()                    # oldest first: microbatches finish in order
        if last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)
        if not first:
            sends.append(dist.isend(a.grad, dst=rank - 1))

    warmup = min(world_size - rank - 1, m)
    for i in range(warmup):
        forward(i)
    for i in range(warmup, m):
        forward(i)
        backward()
    for _ in range(warmup):
        backward()
    for work in sends:                              # all were received: the peers finished
        work.wait()
    return sum(losses) if last else None
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_one_f_one_b_step", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_1f1b(one_f_one_b_step, world_size=2, num_microbatches=4)
check_1f1b(one_f_one_b_step, world_size=4, num_microbatches=8)
print("one_f_one_b_step: gradients equal the single-process step; at most p microbatches in flight")
### BEGIN HIDDEN TESTS
check_1f1b(one_f_one_b_step, world_size=4, num_microbatches=8, batch=16, num_layers=7, seed=fresh_seed())
check_1f1b(one_f_one_b_step, world_size=2, num_microbatches=6, batch=12, num_layers=4, seed=fresh_seed())
check_1f1b(one_f_one_b_step, world_size=4, num_microbatches=3, batch=6, num_layers=5, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The schedules on paper
#
# Before measuring, the ideal: every forward takes one time unit, every backward two, messages are
# free. Each stage runs its list of ops as early as its inputs allow. Count the idle slots of one
# stage: it waits for p-1 forwards of the pipeline's fill (stage s before its first forward, the
# last stages' forwards after it) and for p-1 backwards of the drain, whatever the schedule. With
# t_b = 2 t_f that is **(p-1)(t_f + t_b) = 3(p-1) units on every stage**, not 2(p-1): the
# backwards' slots are idle too. The step lasts (m+p-1)(t_f + t_b), of which the stage computes
# m(t_f + t_b), hence a bubble of **(p-1)/(m+p-1) of the step** (Huang et al. 2019, §2.3;
# Narayanan et al. 2021, §2.2). GPipe and 1F1B have the same bubble; they differ in how many
# microbatches each stage holds (read "in flight" in the titles).
#
# **Two conventions, one idle time.** This lab states the bubble as a share of the step,
# (p-1)/(m+p-1). Labs 6 and 7 follow the Megatron paper and state it relative to the *compute*:
# (p-1)/m, the factor 1 + (p-1)/m by which the compute time is stretched. Same idle time, other
# denominator: a ratio r = (p-1)/m is r/(1+r) = (p-1)/(m+p-1) of the step.

# %% nbgrader={"grade": false, "grade_id": "bubble_accounting", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.labs.pipeline import simulate
from distlab.labs.pipeline_bubble import bubble_accounting, idle_per_stage
print(bubble_accounting(num_stages=4, num_microbatches=8))
print("idle per stage, simulated 1F1B:", idle_per_stage(simulate("1f1b", 4, 8, t_bwd=2.0), 4))

# %% nbgrader={"grade": false, "grade_id": "simulated", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
plot_simulations(["naive", "gpipe", "1f1b"], num_stages=4, num_microbatches=8);

# %% [markdown]
# Explore: how large must m be for a bubble under 10% with p = 8? What does a backward twice as
# slow as the forward change? (The chart redraws from a running kernel; on the rendered course
# site a JavaScript copy of the same simulator redraws it, tested against `simulate`.)

# %% nbgrader={"grade": false, "grade_id": "explorer", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
schedule_explorer()

# %% [markdown]
# ## 6. The schedules measured, and `torch.distributed.pipelining`
#
# Now your three functions and the two classic schedules of PyTorch's own pipelining library
# (`PipelineStage` + `ScheduleGPipe` / `Schedule1F1B`, given the same stage module) run on the same
# 8-block model (width 512, batch 256, m = 4) on 2 ranks: one untimed warm-up step, then one timed
# step. Each chart is what the stages recorded.

# %% nbgrader={"grade": false, "grade_id": "measure", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
spec = PipeSpec(num_layers=8, hidden=512, batch=256, seed=0)
runs = run_schedules({"naive": (naive_step, None), "GPipe": (gpipe_step, 4),
                      "1F1B": (one_f_one_b_step, 4),
                      "torch GPipe": (library_step("ScheduleGPipe"), 4),
                      "torch 1F1B": (library_step("Schedule1F1B"), 4)}, 2, spec, warmup=1)
plot_runs(runs);

# %% [markdown]
# The table: step time; bubble measured (1 − busy time / (p × step span)) against (p-1)/(m+p-1);
# the most microbatches alive at once on each rank; the most activation memory autograd held on
# rank 0 (measured by counting the tensors saved for backward); the bytes rank 0 sent; and the
# largest difference of any gradient from the single-process step.

# %% nbgrader={"grade": false, "grade_id": "table", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(schedule_table(runs, spec))
check_library_matches(runs, spec)

# %% [markdown]
# Read the charts and the table together:
#
# - **The bubble is larger than theory.** The formula counts only compute. Here every message
#   costs time, Python adds overhead per op, the two ranks share a 2-core machine, and a blocking
#   `send` (the naive and GPipe functions) waits until the next stage posts its `recv`: look at
#   the gaps between rank 0's GPipe forwards, each waiting for rank 1 to finish one. 1F1B's
#   `isend` lets a stage run on.
# - **Activations.** GPipe and the library's GPipe hold all m microbatches on every rank; 1F1B
#   holds at most p - s, and the measured activation memory on rank 0 drops accordingly.
# - **Bytes sent are the same for every schedule**: microbatching cuts the same `(b, h)` batch into
#   m messages of `(b/m, h)`; it changes when data moves, not how much.
# - The library's schedules compute the same gradients (the last column) with the same stage.
#
# ## 7. Where pipelines sit in 3D parallelism
#
# Per microbatch, a stage boundary carries one `(b, s, h)` activation forward and one gradient
# back, for a transformer with sequence length s — independent of the number of layers in the
# stage. Tensor parallelism, within a stage, all-reduces a `(b, s, h)` tensor twice per layer
# forward and twice backward. For a GPT-3-sized layer (h = 12288, s = 2048, bf16), 12 layers per
# stage and TP = 8:

# %% nbgrader={"grade": false, "grade_id": "traffic", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(boundary_traffic(batch=1, seq=2048, hidden=12288, layers_per_stage=12, tp=8))

# %% [markdown]
# This is why large trainings put TP inside a node (NVLink, hundreds of GB/s), PP across nodes
# (its few, point-to-point messages tolerate the slower inter-node network) and DP outermost (one
# gradient reduction per step, overlapped with backward). The bubble is the price: keep
# m ≥ 4p or so, or use interleaved 1F1B (each rank holds several smaller stages, dividing the
# bubble by their number) or zero-bubble schedules (`torch.distributed.pipelining` has both:
# `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`).
#
# ## Closing note: what we measured
#
# `python bench/pipeline.py` on a shared 2-core CPU (gloo; 8 blocks of width 512, batch 256;
# median of 3 steps). Bubble measured from the recorded events, against (p-1)/(m+p-1):
#
# | p | m | schedule | step ms | bubble | theory | in flight per rank | activations KiB, rank 0 |
# | --- | --- | --- | --- | --- | --- | --- | --- |
# | 2 | 1 | naive | 151 | 0.54 | 0.50 | 1/1 | 4096 |
# | 2 | 4 | GPipe | 210 | 0.45 | 0.20 | 4/4 | 4096 |
# | 2 | 4 | 1F1B | 198 | 0.37 | 0.20 | 2/1 | 2304 |
# | 2 | 4 | torch GPipe | 205 | 0.47 | 0.20 | 4/4 | 4096 |
# | 2 | 4 | torch 1F1B | 208 | 0.40 | 0.20 | 2/1 | 2304 |
# | 2 | 8 | 1F1B | 225 | 0.34 | 0.11 | 2/1 | 1408 |
# | 4 | 8 | GPipe | 204 | 0.75 | 0.27 | 8/8/8/8 | 2048 |
# | 4 | 8 | 1F1B | 215 | 0.70 | 0.27 | 4/3/2/1 | 1280 |
#
# What held: gradients equal to the single-process step to ~1e-6 for every schedule, the library's
# included; 1F1B's microbatches in flight are exactly p - s and its activation memory falls with
# them, while GPipe's grows with m; every schedule sends the same 512 KiB per step. What did not:
# the bubble is far above theory and microbatching made the step *slower* than the naive one. On
# this machine a microbatch's forward is a few milliseconds, so per-message latency and Python
# overhead are a large share of it, smaller matrix products run less efficiently, and with p = 4
# four ranks share two cores, so "idle" ranks are really waiting for a core. The formula holds
# when a microbatch's compute dwarfs a message's latency: on GPUs, with real layer sizes.
