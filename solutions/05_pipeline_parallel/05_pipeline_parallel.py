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
# | naive | the whole batch, stage after stage | $(p-1)/p$ | 1 batch |
# | GPipe (Huang et al., 2019) | $m$ microbatches: all forwards, then all backwards | $(p-1)/(m+p-1)$ | $m$ microbatches |
# | 1F1B (PipeDream-Flush, Narayanan et al., 2021) | after a short warm-up, alternate one forward and one backward | $(p-1)/(m+p-1)$ | at most $p$ |
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
from distlab.checks.lab05 import (check_1f1b, check_bubble_bar, check_gpipe, check_memory_budget,
                                  check_naive, check_partition, check_predicted_traffic,
                                  design_budgets, stored_library_runs)
from distlab.labs.pipeline import (PipeSpec, boundary_traffic, loss_fn, plot_runs,
                              plot_simulations, run_schedules, schedule_explorer, schedule_table)

# %% [markdown]
# ## 1. Exercise 1 — cutting L layers into p stages (1 point)
#
# The model here is a stack of L identical residual blocks, `x + gelu(x Wᵀ + c)`, each mapping a
# `(b, h)` activation to a `(b, h)` activation. Stage s gets a contiguous range of blocks. Equal
# blocks should be spread as evenly as possible: the slowest stage sets the pace of the whole
# pipeline, so a stage with one layer too many makes every other stage wait.
#
# **Build** `partition(num_layers, num_stages)`. **Contract:** it returns `num_stages` pairs
# `(start, stop)` (stage s runs blocks `start..stop-1`): contiguous, in order, covering all
# layers, sizes differing by at most one. The check tries L from 4 to 13 on 2 to 4 stages (hidden:
# up to 8 stages). **Why it matters:** the runner cuts every model below with this rule.
#
# <details><summary>Hint 1</summary>
#
# When p does not divide L, some stages get one block more: how many, and which ones?
# </details>

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
# From here on, the runner cuts the model with the same rule and gives each rank its stage (in
# section 6, with your `partition`).
#
# ## 2. Exercise 2 — the naive pipeline (2 points)
#
# **Build** `naive_step(rank, world_size, stage, x, target)`: one training step of the whole
# batch, this rank running its `stage`.
#
# **Contract.** `x` and `target` are the whole `(b, h)` batch, on every rank (stage 0 reads `x`,
# the last stage `target`); `stage(a)` is this rank's forward, `loss_fn(y, target)` the loss.
# After the step every stage's parameters hold the single-process gradients; the last stage
# returns the loss as a float, every other stage None. Allowed: blocking `dist.send` /
# `dist.recv` between neighbouring ranks; every boundary carries one `(b, h)` tensor forward and
# one back. The check compares every gradient and the loss with the single-process step on 2
# and 4 ranks, and counts one forward and one backward per stage.
#
# **Why it matters.** Every schedule in this lab is this step with its work reordered. The
# pipeline changes where the work runs, not what is computed: autograd continues the chain rule
# across processes once you hand it the right tensors.
#
# <details><summary>Hint 1</summary>
#
# Where does a stage's input come from, on stage 0 and on the others? To run its backward, what
# does a stage need from the next one, and what must it hand to the previous one?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The gradient to send back is ∂loss/∂a for the input `a` that the stage received: receive into
# `torch.empty_like(x)`, then `a.requires_grad_()`, and autograd fills `a.grad`. Given a
# gradient for the output `y`, `y.backward(grad)` continues the chain rule through this stage.
# </details>
#
# <details><summary>Hint 3</summary>
#
# 1. Input: stage 0 uses `x`; the others `dist.recv(a, src=rank - 1)` and `a.requires_grad_()`.
# 2. Forward: `y = stage(a)`.
# 3. The last stage: `loss = loss_fn(y, target)`, `loss.backward()`. The others: send
#    `y.detach()` to `rank + 1`, receive ∂loss/∂y from `rank + 1`, `y.backward(grad)`.
# 4. Every stage but the first sends `a.grad` to `rank - 1`.
# 5. Return `loss.item()` on the last stage, None elsewhere.
# </details>

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
# In the naive pipeline only one stage works at a time. GPipe (Huang et al. 2019, sec. 2.2) splits
# the batch into **m microbatches**: while stage 1 works on microbatch 0, stage 0 already runs
# microbatch 1.
#
# **Build** `gpipe_step(rank, world_size, stage, x, target, num_microbatches)`.
#
# **Contract.** Same inputs and outputs as `naive_step`, the batch cut into m = `num_microbatches`
# equal microbatches `x.chunk(m)`: every stage runs **all m forwards, then all m backwards**, and
# ends with the gradients of the *batch* loss (the single-process ones); the last stage returns
# the batch loss. Allowed: `send`/`recv` between neighbours, one `(b/m, h)` message per microbatch
# per direction. The check compares the gradients and loss, counts one forward and one backward
# of each microbatch on every stage, and reads from the recorded events that no backward started
# before the stage's last forward ended.
#
# **Why it matters.** Microbatches are what lets a pipeline's stages work at the same time; their
# price, in this schedule, is that every stage holds m microbatches' activations at once.
#
# <details><summary>Hint 1</summary>
#
# Gradients accumulate in `.grad` over the m backward passes. `loss_fn` is a mean over the rows:
# what must each microbatch's loss be multiplied by for the m gradients to sum to the batch's?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The backward phase needs, for each microbatch, the stage input `a` (to send `a.grad` back) and
# output `y` (to call backward on): keep them in lists during the forward phase.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Run `naive_step`'s forward half once per microbatch, keeping `(a, y)`; on the last stage `y` is
# `loss_fn(y_i, t_i) / m`. Then, in the same order, its backward half for each kept pair. Return
# the sum of the scaled losses.
# </details>

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
# ### Before 1F1B: when does a blocking `send` return?
#
# Your naive and GPipe steps used blocking `dist.send`. Does it return once the data is handed to
# the backend, or only once the peer has posted its `recv`? Measure it rather than assume it:
# below, rank 0 times a send of each size while rank 1 posts its `recv` 200 ms late. Predict
# first: at which sizes will the send take about 200 ms?

# %% nbgrader={"grade": false, "grade_id": "send_probe", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
import time
from distlab.labs.pipeline.probe import send_probe
from distlab.runtime.devices import device

def send_times(rank, world_size, sizes, delay):
    took = []
    for size in sizes:
        buf = torch.zeros(size // 4, device=device())      # float32: `size` bytes
        if rank == 1:
            time.sleep(delay)                               # the receiver is busy elsewhere
            dist.recv(buf, src=0)
        else:
            start = time.perf_counter()
            dist.send(buf, dst=1)
            took.append(time.perf_counter() - start)
    return took

print(send_probe(send_times, sizes=[64, 4096, 2**16, 2**20, 16 * 2**20], delay=0.2))

# %% [markdown]
# ## 4. Exercise 4 — 1F1B (3 points)
#
# GPipe holds the activations of **all m microbatches** until the backward phase: activation
# memory grows with m, yet m must be large for a small bubble. 1F1B (PipeDream-Flush, Narayanan
# et al. 2021, sec. 2.2) bounds it at the same bubble.
#
# **Build** `one_f_one_b_step(rank, world_size, stage, x, target, num_microbatches)`, same inputs
# and outputs as `gpipe_step`.
#
# **Contract.** Gradients and loss as GPipe's. Stage $s$ never holds more than $\min(p-s, m)$
# microbatches' activations at once (forward started, backward not yet finished), independent of
# $m$ once $m \ge p$. After its warm-up a stage strictly alternates one forward and one backward
# (stage 0 of 3 with $m = 4$ runs F F F B F B B B). Allowed: `send`/`recv`/`isend`/`irecv` between
# neighbours; the step must not deadlock on gloo or NCCL. The check reads the passes your stages
# recorded, on 2 and 4 stages (hidden: 3 to 8 microbatches).
#
# **Why it matters.** Activation memory, not parameters, is what usually limits a pipeline
# stage; this is the schedule Megatron-LM runs.
#
# <details><summary>Hint 1</summary>
#
# A microbatch's activations are freed by its backward. How many forwards can stage s run before
# the gradient of its first microbatch can possibly come back from the last stage?
# </details>
#
# <details><summary>Hint 2</summary>
#
# Three phases: a warm-up of `w = min(p - s - 1, m)` forwards (none on the last stage); a steady
# state of one forward then one backward of the oldest microbatch still waiting; a cool-down of
# the `w` backwards left. A `collections.deque` of waiting `(a, y)` pairs serves them oldest first.
# </details>
#
# <details><summary>Hint 3</summary>
#
# **Deadlocks.** In the steady state stage $s$ sends an activation to $s+1$ and then waits for a
# gradient from $s+1$, while $s+1$ sends a gradient to $s$ and waits for the next activation.
# What did the probe above show a blocking `send` on gloo doing until the peer posts its `recv`,
# and at which sizes? Then both sides' blocking sends wait for each other forever. On NCCL
# `dist.send` returns to the host at once; the deadlock is on the GPU, where the send kernel waits for the matching receive on its
# stream and everything queued behind it waits too, so the hang shows up at the next
# synchronisation (a `.item()`, a `wait()`, the optimizer step). Post sends with `dist.isend`,
# keep the returned work objects, and `wait()` them all at the end. Likewise, never `recv` a
# gradient for a backward before sending the activation that the next stage needs to produce it.
# </details>

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
# stage: it waits for $p-1$ forwards of the pipeline's fill (stage $s$ before its first forward,
# the last stages' forwards after it) and for $p-1$ backwards of the drain, whatever the schedule.
# With $t_b = 2t_f$ that is **$(p-1)(t_f + t_b) = 3(p-1)$ units on every stage**, not $2(p-1)$:
# the backwards' slots are idle too. The step lasts $(m+p-1)(t_f + t_b)$, of which the stage
# computes $m(t_f + t_b)$, hence a bubble of **$(p-1)/(m+p-1)$ of the step** (Huang et al. 2019,
# §2.3; Narayanan et al. 2021, §2.2). GPipe and 1F1B have the same bubble; they differ in how many
# microbatches each stage holds (read "in flight" in the titles).
#
# **Two conventions, one idle time.** This lab states the bubble as a share of the step,
# $(p-1)/(m+p-1)$, the form of GPipe (Huang et al. 2019, §2.3); so does Lab 7. Megatron's PTD-P
# paper (Narayanan et al. 2021, §2.2) states it relative to the *compute*: $(p-1)/m$, the factor
# $1 + (p-1)/m$ by which the compute time is stretched, and Lab 7's step-time estimate adds the
# bubble in that form. Same idle time, other denominator: a ratio $r = (p-1)/m$ is
# $r/(1+r) = (p-1)/(m+p-1)$ of the step.

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
# ### Exercise 5 — a schedule of your own under a memory budget (open design, 5 points)
#
# 1F1B beat GPipe's memory at the same bubble, but its stage 0 still holds $p$ microbatches.
# Suppose your stages can afford only $k < p$ microbatches' activations each. GPipe and 1F1B
# break that budget; running microbatches one at a time keeps it and idles most of the step. Find
# something better.
#
# **Goal.** Write `budget_step(rank, world_size, stage, x, target, num_microbatches,
# max_in_flight)`: a schedule of your own design, same inputs and outputs as `one_f_one_b_step`.
#
# **How low can the bubble go?** Two floors hold for every schedule. The flushed pipeline's: the
# step lasts at least $(m+p-1)(t_f+t_b)$. And stage 0's: it holds a microbatch from the start of
# its forward until the end of its backward, at least $p(t_f+t_b)$, since the forward crosses all
# $p$ stages and the backward comes all the way back. With at most $k$ alive at once, its $m$
# microbatches' holding times split into $k$ chains that never overlap, one of them at least
# $\lceil m/k \rceil$ long: the step lasts at least $\lceil m/k \rceil\, p\,(t_f+t_b)$. Every
# stage computes $m(t_f+t_b)$ of it, so the bubble is at least
# $1 - m / \max(m+p-1,\ \lceil m/k \rceil\, p)$ (`budget_bound(p, m, k)`).
#
# **Budget, as the checks measure it on real ranks:**
# - *memory:* no stage ever holds more than `max_in_flight` microbatches (forward started,
#   backward not yet finished, read from the events your stages record);
# - *bubble:* the order in which your stages ran their passes, replayed on paper like the chart
#   above (forward 1 unit, backward 2, messages free: `distlab.labs.pipeline.replay`). Two tests
#   grade it on a scale: the first (3 points) wants no more than the *budget*, the bubble of the
#   design the hints below lead to; the second (2 points) wants no more than the *bar*, halfway
#   from that budget down to the bound. Both are printed below for the visible cases;
# - *values and traffic:* the single-process gradients and loss, and each rank sends exactly its
#   activations forward and its gradients back (`send`/`isend`/`recv`/`irecv` between
#   neighbours), no more; no deadlock on gloo or NCCL.
#
# **Why it matters.** Real pipelines run under a memory cap per GPU; the schedule decides how
# much of the step that cap costs. Try your ideas on paper first: `replay(orders)` times any list
# of per-stage orders `[[("F", 0), ("B", 0), ...], ...]`, and `measured_bubble(events, p)` and
# `peak_in_flight(events)` read it.
#
# <details><summary>Hint 1</summary>
#
# Count, for stage $s$, how long it waits for its first gradient if it runs one forward and then
# waits; what can it usefully do in that wait without breaking the cap?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The stages need not all behave the same: the last stage can run each backward right after its
# forward, the stages far from it wait longest. `replay` tells you the bubble of an idea in a
# millisecond.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Your 1F1B's three phases still work; only the warm-up changes. How many warm-up forwards does
# the cap allow on stage $s$? (That design meets the budget, the first test.)
# </details>
#
# <details><summary>Hint 4</summary>
#
# Replay Hint 3's design and print each stage's order. The bound says which stage sets the pace:
# what is that stage waiting for, each time it stops? When a stage between it and the last could
# run either a forward or a backward next, which of the two ends that wait sooner, and does the
# same fixed pattern suit every stage?
# </details>

# %% nbgrader={"grade": false, "grade_id": "design_budgets", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.labs.pipeline import measured_bubble, peak_in_flight, replay
from distlab.labs.pipeline_bubble import budget_bound
print(design_budgets())    # the visible tests' budget (the hinted design's bubble), bar and bound
gpipe_on_paper = replay([[("F", i) for i in range(8)] + [("B", i) for i in range(8)]] * 4)
print("GPipe on paper, p = 4, m = 8: bubble", round(measured_bubble(gpipe_on_paper, 4), 3),
      "in flight", peak_in_flight(gpipe_on_paper))

# %% nbgrader={"grade": false, "grade_id": "budget_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def budget_step(rank, world_size, stage, x, target, num_microbatches, max_in_flight):
    """A schedule that never holds more than ``max_in_flight`` microbatches on a stage."""
    ### BEGIN SOLUTION
    def budget_plan(p, m, k):
        """Per stage, its passes in order, each stage greedy on paper within the cap."""
        free, next_f, done = [0.0] * p, [0] * p, {}
        alive = [collections.deque() for _ in range(p)]     # per stage, microbatches held
        orders = [[] for _ in range(p)]
        while len(done) < 2 * p * m:
            options = []                                    # (start, forward?, stage, op, i)
            for s in range(p):
                if alive[s]:
                    i = alive[s][0]                         # the oldest finishes first
                    ready = done.get(("B", s + 1, i)) if s < p - 1 else done[("F", s, i)]
                    if ready is not None:
                        options.append((max(free[s], ready), 0, s, "B", i))
                i = next_f[s]
                if i < m and len(alive[s]) < k:
                    ready = 0.0 if s == 0 else done.get(("F", s - 1, i))
                    if ready is not None:
                        options.append((max(free[s], ready), 1, s, "F", i))
            start, _, s, op, i = min(options)
            free[s] = done[(op, s, i)] = start + (1.0 if op == "F" else 2.0)
            if op == "F":
                next_f[s] += 1
                alive[s].append(i)
            else:
                alive[s].popleft()
            orders[s].append((op, i))
        return orders

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
            sends.append(dist.isend(y.detach(), dst=rank + 1))
        waiting.append((a, y))

    def backward():
        a, y = waiting.popleft()
        if last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=rank + 1)
            y.backward(grad)
        if not first:
            sends.append(dist.isend(a.grad, dst=rank - 1))

    # The order is planned on paper (forward 1, backward 2), then run: every stage, whenever it
    # is free, starts the pass whose input is ready soonest, a backward before a forward, and
    # never a forward with max_in_flight alive. A backward hands stage 0 its gradient sooner:
    # stage 0, which holds each microbatch longest, frees its slots sooner.
    for op, i in budget_plan(world_size, m, max_in_flight)[rank]:
        if op == "F":
            forward(i)
        else:
            backward()                                  # the oldest held: the plan's i
    for work in sends:
        work.wait()
    return sum(losses) if last else None
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_budget_step", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
print(check_memory_budget(budget_step, world_size=4, num_microbatches=8, max_in_flight=2))
print(check_memory_budget(budget_step, world_size=4, num_microbatches=4, max_in_flight=3))
### BEGIN HIDDEN TESTS
print(check_memory_budget(budget_step, world_size=4, num_microbatches=6, max_in_flight=2,
                          batch=12, num_layers=7, seed=fresh_seed()))  # m = 6 on 7 layers: a budget never priced visibly
print(check_memory_budget(budget_step, world_size=2, num_microbatches=4, max_in_flight=1,
                          seed=fresh_seed()))  # the tightest cap: one microbatch alive per stage
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_budget_step_bar", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(check_bubble_bar(budget_step, world_size=4, num_microbatches=8, max_in_flight=2))
### BEGIN HIDDEN TESTS
print(check_bubble_bar(budget_step, world_size=4, num_microbatches=6, max_in_flight=3,
                       batch=12, num_layers=7, seed=fresh_seed()))  # m = 6, k = 3 on 7 layers: a bar never priced visibly
### END HIDDEN TESTS

# %% [markdown]
# ## 6. The schedules measured, and `torch.distributed.pipelining`
#
# Now your three functions run on an 8-block model (width 512, batch 256, $m = 4$) on 2 ranks, cut
# into stages by your `partition`: one untimed warm-up step, then five timed steps. One step's
# time on a shared CPU is noise as much as schedule (four single steps once put GPipe anywhere
# from 167 to 239 ms and 1F1B from 168 to 641 ms), so the table shows the median step and, in
# brackets, the spread over the five; each chart is the median step, as the stages recorded it.
# Beside them, the two classic schedules of PyTorch's own pipelining library (`PipelineStage` +
# `ScheduleGPipe` / `Schedule1F1B`, given the same stage module) on the same model, as the
# course's machine recorded them: one step, on another machine (the course's driver of the
# library would answer Exercises 3 and 4, so your handout has the recording, not the driver).
# Compare the library's rows with yours only in the columns that do not depend on time.

# %% [markdown]
# ### Exercise 6 — predict the bytes before measuring them (1 point)
#
# The table below prints, among other things, the bytes each schedule's rank 0 sent in the step.
# Predict them first, from what a stage boundary carries (the introduction: one activation
# forward and one gradient back per microbatch; float32, 4 bytes per element).
#
# **Build** `predict_sent_bytes(rank, world_size, batch, hidden, num_microbatches)`: the bytes
# stage `rank` of `world_size` sends (send/isend) in one step of a `(batch, hidden)` float32
# batch cut into `num_microbatches`. The check compares it with the formula on the measured
# section's case (2 ranks, batch 256, width 512, m = 4) and eight more (hidden: fresh ones), and
# the table's cell prints your prediction beside what each schedule's rank 0 sent.
#
# <details><summary>Hint 1</summary>
#
# Which directions does the first stage send in? The last? A middle one? Does cutting the batch
# into m microbatches change the sum?
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_sent_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_sent_bytes(rank: int, world_size: int, batch: int, hidden: int,
                       num_microbatches: int) -> int:
    """Bytes stage ``rank`` sends in one step: activations forward, gradients back."""
    ### BEGIN SOLUTION
    one_way = batch * hidden * 4                    # the (b, h) batch, in m pieces of (b/m, h)
    return one_way * ((rank < world_size - 1) + (rank > 0))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_sent_bytes", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
print(check_predicted_traffic(predict_sent_bytes))
print("rank 0 of the measured run will send", predict_sent_bytes(0, 2, 256, 512, 4) // 1024, "KiB")
### BEGIN HIDDEN TESTS
print(check_predicted_traffic(predict_sent_bytes, seed=fresh_seed()))  # 8 cases drawn afresh: 2-8 stages, m from 1 to 16
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "measure", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
spec = PipeSpec(num_layers=8, hidden=512, batch=256, seed=0)
runs = run_schedules({"naive": (naive_step, None), "GPipe": (gpipe_step, 4),
                      "1F1B": (one_f_one_b_step, 4)}, 2, spec,
                     bounds=partition(spec.num_layers, 2), warmup=1, steps=5)
runs |= stored_library_runs()    # torch GPipe and torch 1F1B, recorded on the course's machine
plot_runs(runs);

# %% [markdown]
# The table: step time; bubble measured ($1 - \text{busy time} / (p \times \text{step span})$) against $(p-1)/(m+p-1)$;
# the most microbatches alive at once on each rank; the most activation memory autograd held on
# rank 0 (measured by counting the tensors saved for backward); the bytes rank 0 sent; and the
# largest difference of any gradient from the single-process step: for your schedules, from your
# naive schedule's gradients (the whole batch, layer after layer: the single-process arithmetic,
# which its check compared with the single-process step), for the library's, as recorded. A
# difference that is float32 rounding (under 32 ulps of the largest gradient) shows as its bound,
# "< 1e-04": its own digits depend on the CPU's kernels; a mistake shows its digits.

# %% nbgrader={"grade": false, "grade_id": "table", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(schedule_table(runs, baseline="naive"))
predicted = predict_sent_bytes(0, 2, spec.batch, spec.hidden, 4)
print(f"rank 0 sent, your prediction: {predicted / 1024:.0f} KiB; measured: "
      + ", ".join(f"{name} {run.sent_bytes[0] / 1024:.0f} KiB" for name, run in runs.items()))

# %% [markdown]
# Read the charts and the table together:
#
# - **Time: read the spread before the median.** Where two schedules' brackets overlap, this
#   machine cannot tell them apart, whatever their medians say. What stays above the noise: every
#   measured bubble is far above theory. The formula counts only compute; here every message
#   costs time, Python adds overhead per op, the two ranks share a 2-core machine, and a blocking
#   `send` (the naive and GPipe functions) waits until the next stage posts its `recv`, as the
#   probe before Exercise 4 showed.
# - **Activations** (independent of time): GPipe and the library's GPipe hold all $m$
#   microbatches on every rank; 1F1B holds at most $p-s$, and the measured activation memory on
#   rank 0 drops accordingly.
# - **Bytes sent are the same for every schedule**: microbatching cuts the same `(b, h)` batch into
#   $m$ messages of `(b/m, h)`; it changes when data moves, not how much.
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
# median of 3 steps; single steps of one schedule on this machine spread from 167 to 239 ms
# for GPipe and from 168 to 641 ms for 1F1B over four runs, so a few tens of ms between two rows
# is noise). The two torch rows are the
# recording the lab shows (one step, the course's machine), not the bench's. Bubble measured from
# the recorded events, against $(p-1)/(m+p-1)$:
#
# | p | m | schedule | step ms | bubble | theory | in flight per rank | activations KiB, rank 0 |
# | --- | --- | --- | --- | --- | --- | --- | --- |
# | 2 | 1 | naive | 151 | 0.54 | 0.50 | 1/1 | 4096 |
# | 2 | 4 | GPipe | 210 | 0.45 | 0.20 | 4/4 | 4096 |
# | 2 | 4 | 1F1B | 198 | 0.37 | 0.20 | 2/1 | 2304 |
# | 2 | 4 | torch GPipe | 291 | 0.59 | 0.20 | 4/4 | 4096 |
# | 2 | 4 | torch 1F1B | 190 | 0.44 | 0.20 | 2/1 | 2304 |
# | 2 | 8 | 1F1B | 225 | 0.34 | 0.11 | 2/1 | 1408 |
# | 4 | 8 | GPipe | 204 | 0.75 | 0.27 | 8/8/8/8 | 2048 |
# | 4 | 8 | 1F1B | 215 | 0.70 | 0.27 | 4/3/2/1 | 1280 |
#
# What held: gradients equal to the single-process step up to float32 rounding (the table's bound,
# < 1e-04) for every schedule, the library's included; 1F1B's microbatches in flight are exactly
# $p-s$ and its activation memory falls with them, while GPipe's grows with $m$; every schedule
# sends the same bytes per step, the figure you predicted in Exercise 6. What did not: the bubble
# is far above theory, and microbatching did not make the step faster than the naive one. On this
# machine a microbatch's forward is a few
# milliseconds, so per-message latency and Python overhead are a large share of it, smaller matrix
# products run less efficiently, and with $p = 4$ four ranks share two cores, so "idle" ranks are
# really waiting for a core. The formula holds when a microbatch's compute dwarfs a message's
# latency: on GPUs, with real layer sizes.
