# ---
# jupyter:
#   distlab:
#     summary: "The backward split into input and weight gradients; interleaved 1F1B, ZB-H1 and a zero-bubble V as tables, replayed and run on real ranks beside torch's own; a schedule under a memory cap."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 11 — Pipelines without bubbles
#
# Lab 5 ended at 1F1B: with p stages and m microbatches, every rank idles for p−1 forward and
# backward times per step, $(p-1)/(m+p-1)$ of the step (GPipe, Huang et al. 2019, §2.3), and
# 1F1B only bounds the activations a rank holds, not that idle time. The only cure Lab 5 had was
# more microbatches. Large runs today do better on three fronts, and this lab builds each:
#
# * **virtual stages**: each rank holds several thin stages instead of one thick one, so the ramp
#   up and down is made of shorter steps (interleaved 1F1B; Narayanan et al. 2021, "Efficient
#   Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (PTD-P), §2.2; the
#   schedule Llama 3 trains with, Dubey et al. 2024, arXiv 2407.21783, §3.3.2);
# * **a split backward**: the gradient of a stage's input (B) is what the previous stage waits
#   for; the gradient of its weights (W) nobody waits for, so it can fill the idle time (Qi et al.
#   2023, "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241: ZB-H1 in §2.1, ZB-V in §6);
# * **a V-shaped placement**: rank r holds stage r and stage 2p−1−r, so a microbatch goes down
#   the ranks and back, and the last stage sits beside the first (ZB-V; DeepSeek-V3's DualPipe,
#   DeepSeek-AI 2024, arXiv 2412.19437, §3.2.1, and its "cut-in-half" DualPipeV).
#
# torch 2.13 ships all of these (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`,
# `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) as tables of actions that a runtime executes.
# You will write such tables yourself, replay them on paper, compare them with torch's own, and
# run them on real ranks.
#
# In this lab you:
#
# 1. split a stage's **backward** into B and W and measure the memory held between them
#    (Section 1);
# 2. write **schedules as tables**: predict interleaved 1F1B's bubble and peak activations, then
#    write its table, ZB-H1's and a zero-bubble V's, each replayed on paper and set beside
#    torch's (Section 2);
# 3. write an **executor** that runs any table on real ranks with isend/irecv and trains exactly
#    as one process does, beside torch's schedules (Section 3);
# 4. **design** a schedule under a memory cap (open design, graded on a scale; Section 4).
#
# **Notation.** p ranks (pipeline degree), m microbatches per step, v stages per rank ("virtual
# stages" or chunks; the model is cut into v·p stages, stage s on rank `placement[s]`). An
# **action** is `(op, i, s)`: op `"F"` (forward), `"B"` (backward: the input's gradient when the
# table also has a `"W"` for that stage and microbatch, the whole backward when it has not) or
# `"W"` (the weights' gradient) of microbatch i on stage s. A **table** is one list of actions per
# rank, in the order the rank runs them. **Unit times**: a rank's forward, input-gradient and
# weight-gradient over its layers take $t_F = t_B = t_W = 1$ (the equal times Qi et al. 2023
# assume) unless said otherwise; a stage of v per rank takes 1/v of each, and a whole backward
# $t_B + t_W$. Messages are free on paper.

# %% [markdown]
# ## 1. The backward, split in two
#
# A stage's backward does two jobs. For one of Lab 5's layers, $z = x W^\top + c$,
# $y = x + \mathrm{gelu}(z)$, given $\partial L / \partial y$ from the next stage it computes
# - **B**, the gradient of the stage's *input*, $\partial L/\partial x$: through
#   $\partial L / \partial z \cdot W$ and the residual. The previous stage is waiting for it: its
#   own backward cannot start without it.
# - **W**, the gradient of the stage's *weights*,
#   $\partial L / \partial W = (\partial L / \partial z)^\top x$ and
#   $\partial L / \partial c = \sum_{\text{rows}} \partial L / \partial z$. Nobody waits for it
#   but the optimizer step, at the end of the whole batch.
#
# Lab 5's 1F1B runs B and W together, as one backward. Qi et al. (2023, "Zero Bubble Pipeline
# Parallelism", arXiv 2401.10241, §2) split them: B goes as early as it can, since the pipeline
# waits on it, and W goes wherever a rank would otherwise idle. That is the whole trick of the
# zero-bubble schedules of Section 2 (ZB-H1, the V shape) and of DeepSeek-V3's DualPipe: every
# one of them needs a backward that can be run as B now and W later. This section builds it for
# one stage, on one process.
#
# ### Exercise 1 — B now, W later (3 points)
#
# **Build** `backward_input(output, grad_output, stage_input) -> (grad_input, kept)` (B) and
# `backward_weight(kept, params)` (W) for any stage module, with autograd
# (`torch.autograd.grad`, whose `inputs=` says which gradients to compute and no others).
#
# **Contract.**
# - `output` is what the stage's forward returned; `grad_output` the gradient of the loss with
#   respect to it, from the next stage. On the last stage `output` is the loss (a scalar) and
#   `grad_output` is None. `stage_input` is the tensor the forward ran on: it requires grad,
#   except on the first stage, where it is the batch.
# - `backward_input` returns the gradient of the loss with respect to `stage_input` (None where
#   `stage_input` does not require grad), and `kept`: whatever W will need, yours to choose. While
#   it runs, **no parameter's gradient is computed** and no `.grad` changes.
# - `backward_weight(kept, params)`, called once for each B, later (other microbatches' B and W
#   may run in between): adds to each `p.grad` of `params` (None counts as zero) the gradient of
#   the loss with respect to `p`, as a full backward would accumulate it. It computes **no input
#   gradient**: `stage_input.grad` stays None and the tensor B returned does not change.
# - Together, on every microbatch, they give exactly what one `torch.autograd.backward(output,
#   grad_output)` gives. Section 3's executor runs a table's B and W with this very pair (its
#   `split_backward=` argument).
#
# The check cuts Lab 5's model (float64) into three stages of 2 layers and runs the first, a
# middle and the last, two microbatches each, B and W in three orders (B0 B1 W0 W1, B0 W0 B1 W1,
# B0 B1 W1 W0), against one full backward per microbatch, with hooks on the parameters and the
# input that count which gradients each of your calls computed. Hidden tests draw other models,
# inputs and sizes.
#
# **Why it matters.** W is the only work in a pipeline that nothing waits for, so it is what a
# schedule can move into its bubble. A B that sneaks the weights' gradients in costs the waiting
# stage W's time; a W that recomputes the input's gradient does B's work twice.
#
# <details><summary>Hint 1</summary>
#
# Which tensors must `torch.autograd.grad` be given as `inputs` in B, and which in W? What does
# autograd do to a graph after a pass over it, unless told otherwise?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The simplest `kept` is what W needs to start a second pass: the output and its gradient. Then
# B is `torch.autograd.grad(output, [stage_input], grad_output, retain_graph=True)` (the first
# stage skips it), and W the same call with the parameters as inputs, its results added into
# `.grad`. Does W's call need `retain_graph`?
# </details>

# %% nbgrader={"grade": false, "grade_id": "split_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from distlab.checks.lab11 import check_held_prediction, check_split_backward
from distlab.labs.pipeline.split_backward import held_rows
from distlab.labs.tables import format_table

# %% nbgrader={"grade": false, "grade_id": "split_backward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def backward_input(output, grad_output, stage_input):
    """B: the gradient of the loss with respect to stage_input, and what W will need."""
    ### BEGIN SOLUTION
    kept = (output, grad_output)
    if not stage_input.requires_grad:   # the first stage: nobody waits for an input gradient
        return None, kept
    # retain_graph: W walks the same graph again, from the output to the weights
    (grad_input,) = torch.autograd.grad(output, [stage_input], grad_output, retain_graph=True)
    return grad_input, kept
    ### END SOLUTION


def backward_weight(kept, params):
    """W: add the loss's gradient with respect to each of params into its .grad."""
    ### BEGIN SOLUTION
    output, grad_output = kept
    params = list(params)
    # the graph's last use: without retain_graph its saved tensors are freed here
    grads = torch.autograd.grad(output, params, grad_output, allow_unused=True)
    for p, g in zip(params, grads):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_split_backward", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_split_backward(backward_input, backward_weight, seed=fresh_seed(), layers=3, hidden=5,
                     batch=4)
### END HIDDEN TESTS
check_split_backward(backward_input, backward_weight)

# %% [markdown]
# ### What W needs, and where it waits
#
# Between a microbatch's B and its W, which may be many actions apart in a zero-bubble schedule,
# the stage holds whatever W will start from. There are two ways to make that.
#
# - **Recompute** (the hinted answer above, and Section 3's executor): B leaves the autograd
#   graph alive, with every tensor the forward saved for the backward, and `kept` holds the
#   output and its gradient. W runs autograd a second time, from the output down to the weights:
#   it walks the chain of activation gradients again, layer by layer.
# - **Keep**: B keeps what it computed on its way down. A hook on each Linear's output
#   (`Tensor.register_hook`) saves the gradient of that output as B's pass goes by; the forward
#   records each Linear's input. Then B lets autograd free the graph (no `retain_graph`), and W
#   needs no autograd at all: per Linear, one local product, $(\partial L/\partial z)^\top x$, and
#   a sum over rows. (`keep_forward`, `keep_backward_input` and `keep_backward_weight` in
#   `distlab.labs.pipeline.split_backward` do this.)
#
# Which one holds more between B and W, and by how much, is a question of which tensors each
# keeps alive.
#
# ### Prediction — bytes held between B and W (2 points)
#
# **Build** `predict_held_bytes(num_layers, batch, hidden, itemsize)`: for a stage of
# `num_layers` of Lab 5's layers ($y = x + \mathrm{gelu}(x W^\top + c)$, activations of shape
# (batch, hidden), `itemsize` bytes a number) that is **not the last** (its output is an
# activation, `grad_output` given), the bytes each way holds between B and W, as
# `{"recompute": ..., "keep": ...}`.
#
# **Contract.** Count every tensor that is alive between B and W because of the way (saved in
# the graph, or reached from `kept`), each storage once: the stage's input included, parameters
# excluded (they live anyway). The recompute way keeps exactly the output and its gradient in
# `kept`, as the hints did. The check compares with the count on the stage measured next
# (2 layers, batch 8, hidden 16, float64) and on others (hidden: drawn afresh); the measurement
# below prints your prediction beside what `held_between` measures.
#
# <details><summary>Hint 1</summary>
#
# What does the backward of `x + gelu(z)` need from the forward? Of `z = x Wᵀ + c` (the weight is
# a parameter)? You can look: after a forward, `y.grad_fn` has `_saved_*` attributes, and
# `y.grad_fn.next_functions` leads to the nodes below it.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Once the graph is freed, W's local product for one Linear needs two tensors. How big is each?
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_held_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_held_bytes(num_layers, batch, hidden, itemsize):
    """Bytes held between B and W, {"recompute": ..., "keep": ...}, by a stage not the last."""
    ### BEGIN SOLUTION
    act = batch * hidden * itemsize   # one (batch, hidden) activation or gradient
    # recompute: per layer addmm saves its input x, gelu its input z; kept: output, its gradient
    # keep: per Linear its input and the gradient of its output; the graph is freed
    return {"recompute": (2 * num_layers + 2) * act, "keep": 2 * num_layers * act}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_held_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_held_prediction(predict_held_bytes, seed=fresh_seed())   # sizes drawn afresh
### END HIDDEN TESTS
check_held_prediction(predict_held_bytes)

# %% [markdown]
# ### Measured: the bytes between B and W, and what W computes
#
# `held_rows` runs one microbatch through a middle stage of 2 layers (batch 8, hidden 16,
# float64) three ways: yours (recompute), keep, and torch 2.13's own split
# (`torch.distributed.pipelining._backward`). Between B and W it counts what autograd still holds
# of what the forward saved (through `torch.autograd.graph.saved_tensors_hooks`, as Lab 5's
# activation meter does) and every tensor `kept` reaches, each storage once; around B and W it
# counts the matrix-multiply FLOPs (`torch.utils.flop_counter.FlopCounterMode`).

# %% nbgrader={"grade": false, "grade_id": "split_held", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(format_table(held_rows(backward_input, backward_weight, predict_held_bytes)))

# %% [markdown]
# Counted in (batch, hidden) activations $a = b·h·8$ bytes, a stage of $L$ layers holds:
# - **recompute**, $(2L + 2)\,a$: the graph keeps, per layer, the Linear's input (saved by
#   `addmm` for the weight's gradient) and gelu's input $z$ (saved for gelu's derivative), and
#   `kept` adds the output and its gradient. W then walks the chain again: its FLOPs are
#   $(2L-1)$ matrix products of $2bh^2$, against $L$ for the others, since reaching layer
#   $\ell$'s weight takes the input-gradient products of the layers above it, again.
# - **keep**, $2L\,a$: per Linear its input and the gradient of its output. The gradient of $z$
#   takes the place of $z$ itself, which only gelu's derivative needed, and B has used it; the
#   output and its gradient go. W is $L$ local products.
# - **torch 2.13**, $(3L - 1)\,a$ (measured, and checked for $L$ = 1 to 3 by
#   `tests/test_lab11_split.py`): `stage_backward_input` finds the autograd nodes where each
#   parameter's branch joins the path from the stage's input to its output, registers
#   pre-hooks there that save the gradients arriving at those nodes, runs
#   `torch.autograd.grad` for the inputs with `retain_graph=True`, and detaches the stage's
#   outputs; `stage_backward_weight` calls `torch.autograd.grad` from those nodes
#   (`GradientEdge`s) with the saved gradients to the weights, `retain_graph=False`. So torch
#   keeps what B computed, as the keep way does (its W's FLOPs are keep's), *and* the graph
#   below the top layer (the detached output frees only what hangs above the last `addmm`): a
#   general mechanism for any module, which pays for its generality in bytes.
#
# Keeping the gradients is not dearer than keeping the graph here: each kept gradient replaces an
# activation the graph no longer needs. Where the two ways part is compute (recompute's W nearly
# doubles) and generality (keep needs to know which local product each weight is: here every
# weight is a Linear's). Either way a zero-bubble schedule pays these bytes for every microbatch
# whose W it postpones, which is why Section 2 counts activations until W and not until B.

# %% [markdown]
# ## 2. Schedules as tables
#
# A pipeline schedule is, for each rank, the order of its actions; everything else follows. Lab 5
# wrote that order as `("F", i)` / `("B", i)` per stage; with several stages per rank and a split
# backward an action names its stage too: `(op, i, s)`. Sends and receives are not in the table:
# a forward whose next stage lives on another rank sends its output there, a backward whose
# previous stage does sends its input's gradient back, and the executor of Section 3 posts them.
#
# Given a table, **`replay`** (`distlab.labs.pipeline.replay`, Lab 5's, extended) times it on
# paper: each rank runs its list in order, each action as soon as its input is ready:
#
# * `F(i, s)` waits for `F(i, s−1)` (the previous stage's output);
# * `B(i, s)` waits for `B(i, s+1)` (the gradient of its output), the last stage's for its own
#   `F(i, s)`;
# * `W(i, s)` waits for `B(i, s)` (the output gradient that B received).
#
# A table is **valid** when every stage runs F and B (and W, where the backward is split) of
# every microbatch exactly once, on its own rank, and every rank completes: an action listed
# before what it needs on its own rank, or two ranks each waiting for the other, never complete.
# `replay_table(table, placement, m)` checks that first and names the first violated dependency.
#
# Two figures tell a table's cost:
#
# * the **bubble**: idle time summed over the ranks, over their compute time (PTD-P's
#   convention, §2.2; Lab 5's share of the step is $b/(1+b)$ of it);
# * the **peak activations**: the most stage-microbatches whose activations one rank holds at
#   once, from the start of a microbatch's F on a stage to the end of its W (of its B, where the
#   backward is whole). With v stages per rank, a stage-microbatch is 1/v of a rank's layers.
#
# Here is Lab 5's 1F1B as a table, replayed (p = 4, m = 8, unit times, whole backwards of 2).

# %% nbgrader={"grade": false, "grade_id": "tables_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab11 import (check_interleaved_1f1b, check_interleaved_prediction,
                                  check_zb_h1, check_zb_v)
from distlab.labs.pipeline.compare import compare_tables
from distlab.labs.pipeline.table_view import plot_table, replay_table, table_summary
from distlab.labs.pipeline.tables import one_f_one_b, round_robin, v_shape
from distlab.labs.pipeline.torch_tables import torch_table

# %% nbgrader={"grade": false, "grade_id": "tables_1f1b", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
table = one_f_one_b(4, 8)
print(table[3][:6], "...   (rank 3's first actions)")
print(table_summary(table, [0, 1, 2, 3], 8, "1F1B"))
plot_table(table, [0, 1, 2, 3], 8, title="1F1B, p = 4, m = 8");

# %% [markdown]
# Rank 3 starts after three forwards and rank 0 ends three backwards after rank 3: every
# rank idles p−1 forward-and-backward times, $(p-1)/m$ of its compute (PTD-P §2.2), whatever the
# order in between.
#
# ### Interleaving: v stages per rank
#
# Cut the model into v·p stages instead of p and deal them to the ranks **round-robin**: stage s
# on rank s mod p, so rank r holds stages r, r+p, …, r+(v−1)p (`round_robin(p, v)`). A
# microbatch now visits every rank v times, and each visit does 1/v of the rank's layers: a
# stage's forward takes $t_F/v$, its backward $(t_B + t_W)/v$. The ramp at the start and the end
# of a step is made of those shorter steps.
#
# The schedule Megatron-LM runs (PTD-P §2.2) and torch's `ScheduleInterleaved1F1B` reproduces:
#
# * microbatches go through a rank's chunks in **rounds of p**: microbatches 0…p−1 on the rank's
#   first stage, the same p on its second, …, then the next p microbatches, and so on (so m must be
#   a multiple of p); backwards go through the chunks in the opposite order, the last chunk first;
# * rank r first runs forwards only, its **warm-up**: the last rank, p−1, runs v−1 rounds of
#   forwards, and each rank runs two more warm-up forwards than the rank after it (all of them
#   where there are fewer);
# * then it alternates one forward and one backward, and ends with the backwards left.
#
# ### Prediction — interleaved 1F1B's bubble and peak (2 points)
#
# **Build** `predict_interleaved(p, m, v) -> (bubble, peak)` from the description above and Lab
# 5, before you write the table and before its replay shows them.
#
# **Contract.** m is a multiple of p and m ≥ 2p; unit times ($t_F = t_B = t_W = 1$ for a rank's
# layers), whole backwards, messages free. `bubble`: the idle time summed over the ranks over
# their compute time, as `replay` and PTD-P count it. `peak`: the most stage-microbatches whose
# activations the busiest rank holds at once. The check compares both with the lesson's figures
# on three visible cases and three hidden ones (p up to 16, v up to 4), and the replay after the
# exercise shows your table's figures beside your prediction.
#
# **Why it matters.** A schedule is chosen on these two numbers: how much of the step is lost, and
# how much memory a rank needs to lose no more.
#
# <details><summary>Hint 1</summary>
#
# Lab 5: in 1F1B each rank idles p−1 times the time of one stage's forward and backward. What is
# one stage's forward and backward time now, and does the number of them in the ramp change?
# </details>
#
# <details><summary>Hint 2</summary>
#
# Which rank warms up longest? A rank releases nothing before its first backward ends, and its
# first steady-state forward starts before that.
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_interleaved", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_interleaved(p, m, v):
    """Interleaved 1F1B's (bubble, peak) for p ranks, m microbatches, v stages per rank."""
    ### BEGIN SOLUTION
    bubble = (p - 1) / (v * m)             # p-1 stage-times of (t_F + t_B + t_W)/v, over m of a rank's
    peak = (v - 1) * p + 2 * (p - 1) + 1   # rank 0: its warm-up, and its first steady forward
    return bubble, peak
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_interleaved", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_interleaved_prediction(predict_interleaved)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_interleaved_prediction(predict_interleaved, seed=fresh_seed())   # p, m, v drawn afresh
### END HIDDEN TESTS

# %% [markdown]
# ### Exercise 2.1 — interleaved 1F1B as a table (3 points)
#
# **Build** `interleaved_1f1b(p, m, v)`: the table of the schedule described above.
#
# **Contract.** m a multiple of p. Return p lists, list r the actions of rank r in order: F and
# a whole B (no W) of every microbatch on every stage, stage s on rank s mod p. The check replays
# your table (unit times) on two visible and three hidden (p, m, v), m = p among them: it must be
# valid, and its bubble and peak activations no worse than the schedule's (which are torch's
# `ScheduleInterleaved1F1B`'s). An order other than torch's is fine if it does as well.
#
# **Why it matters.** Interleaving is how Megatron-LM and Llama 3 (§3.3.2) shrink the bubble
# without more microbatches; the table is what a runtime (torch's, or yours in Section 3) executes.
#
# <details><summary>Hint 1</summary>
#
# Write rank r's forwards alone first, in the order they run: which microbatch and which of the
# rank's chunks is its k-th forward? Its backwards likewise. Then interleave the two lists.
# </details>
#
# <details><summary>Hint 2</summary>
#
# The k-th forward is microbatch $p\lfloor k/(vp)\rfloor + (k \bmod p)$ on chunk
# $\lfloor k/p\rfloor \bmod v$ (stage chunk·p + r); the k-th backward the same microbatch on chunk
# $v-1-(\lfloor k/p\rfloor \bmod v)$.
# </details>
#
# <details><summary>Hint 3</summary>
#
# With w the warm-up count of the description (capped at v·m): the first w forwards, then for
# each k the forward w+k and the backward k, then the backwards left.
# </details>

# %% nbgrader={"grade": false, "grade_id": "interleaved_1f1b", "locked": false, "schema_version": 3, "solution": true, "task": false}
def interleaved_1f1b(p, m, v):
    """Per rank, its actions ("F" or "B", microbatch, stage) of interleaved 1F1B."""
    ### BEGIN SOLUTION
    total = m * v                                             # forwards (and backwards) per rank

    def nth(k, backward):
        """(microbatch, chunk) of a rank's k-th forward or backward."""
        chunk = (k // p) % v
        return p * (k // (p * v)) + k % p, v - 1 - chunk if backward else chunk

    table = []
    for r in range(p):
        fwd = [("F", i, c * p + r) for i, c in (nth(k, False) for k in range(total))]
        bwd = [("B", i, c * p + r) for i, c in (nth(k, True) for k in range(total))]
        warm = min((v - 1) * p + 2 * (p - 1 - r), total)     # forwards before the first backward
        row = fwd[:warm]
        for k in range(total - warm):
            row += [fwd[warm + k], bwd[k]]                    # steady state: one F, one B
        table.append(row + bwd[total - warm:])                # cool-down: the backwards left
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_interleaved_1f1b", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_interleaved_1f1b(interleaved_1f1b)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_interleaved_1f1b(interleaved_1f1b, seed=fresh_seed())   # three of p, m, v drawn afresh
### END HIDDEN TESTS

# %% [markdown]
# Your table replayed, beside your prediction:

# %% nbgrader={"grade": false, "grade_id": "tables_interleaved_replay", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(table_summary(interleaved_1f1b(4, 8, 2), round_robin(4, 2), 8, "your interleaved 1F1B, v = 2"))
print("your prediction (bubble, peak):", predict_interleaved(4, 8, 2))
plot_table(interleaved_1f1b(4, 8, 2), round_robin(4, 2), 8, title="interleaved 1F1B, p = 4, m = 8, v = 2");

# %% [markdown]
# **What the replay shows, and why.** Every rank still idles p−1 times one stage's forward and
# backward, but a stage is now 1/v of the rank's layers: the idle time is
# $(p-1)(t_F+t_B+t_W)/v$ per rank against $m(t_F+t_B+t_W)$ of compute, a bubble of
# $(p-1)/(v\,m)$, v times smaller than 1F1B's (PTD-P §2.2, which states it with $t_f, t_b$ for any
# ratio of the two). The price is memory and messages. Rank r holds its warm-up plus one,
# $(v-1)p + 2(p-1-r) + 1$ stage-microbatches, at most $(v+1)p-1$ on rank 0: $p + (p-1)/v$ whole
# microbatches' activations, more than 1F1B's p. And every stage boundary is now a message, v·p−1
# of them each way per microbatch instead of p−1: PTD-P §2.2 notes that the communication grows
# by about v. The replay's figures equal these formulas on every case the tests try
# (tests/test_lab11_tables.py).
#
# ### Exercise 2.2 — ZB-H1 (2 points)
#
# Section 1 split the backward: B computes the gradient of the stage's input, which the previous
# stage waits for; W computes the gradient of its weights, which **no other action** waits for
# (only the optimizer step, after the whole pipeline). So W can move: Qi et al. 2023 (§2.1) keep
# 1F1B's order of F and B and move W into the idle time. Their **ZB-H1** keeps 1F1B's memory: no
# rank holds more than p microbatches' activations (1F1B's rank 0), counted until W ends. With
# $T_F, T_B, T_W$ the times of one stage, 1F1B idles $(p-1)(T_F + T_B + T_W)$ per rank and ZB-H1
# $(p-1)(T_F + T_B - T_W)$ (for $T_W$ no larger than $T_F$ and $T_B$): with equal times **a
# third**, $(p-1)/(3m)$ of the compute.
#
# **Build** `zb_h1(p, m)`: ZB-H1's table.
#
# **Contract.** m ≥ p. Stage r on rank r; F, B and W of every microbatch, each once. The check
# replays it (unit times) on two visible and three hidden (p, m), m not a multiple of p among
# them: valid, bubble at most $(p-1)/(3m)$ and peak at most p stage-microbatches on every rank
# (torch's `ScheduleInterleavedZeroBubble` at v = 1 does exactly that where m is a multiple of p).
#
# **Why it matters.** A third of 1F1B's bubble for no extra memory and no extra messages: the
# split backward pays for itself.
#
# <details><summary>Hint 1</summary>
#
# Start from 1F1B's table and split each B into B then W. Replay it: which ranks idle in the
# cool-down, and for how long? What could they run there?
# </details>
#
# <details><summary>Hint 2</summary>
#
# A rank that defers a W holds that microbatch's activations longer. Rank r holds p−r
# microbatches at most in 1F1B: how many W may it keep waiting without exceeding p?
# </details>
#
# <details><summary>Hint 3</summary>
#
# Rank r keeps up to r W waiting: after each B, while more than r wait, run the oldest one's W;
# at the end, run the W still waiting.
# </details>

# %% nbgrader={"grade": false, "grade_id": "zb_h1", "locked": false, "schema_version": 3, "solution": true, "task": false}
def zb_h1(p, m):
    """Per rank, its actions ("F", "B" or "W", microbatch, stage) of ZB-H1."""
    ### BEGIN SOLUTION
    table = []
    for r in range(p):
        warm = min(p - r - 1, m)
        row = [("F", i, r) for i in range(warm)]
        waiting = []                                     # microbatches whose W rank r deferred
        for i in range(m):
            if warm + i < m:
                row.append(("F", warm + i, r))           # steady state: one forward,
            row.append(("B", i, r))                      # one backward (the input's gradient)
            waiting.append(i)
            while len(waiting) > r:                      # rank r keeps up to r W waiting
                row.append(("W", waiting.pop(0), r))
        table.append(row + [("W", i, r) for i in waiting])
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_zb_h1", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_zb_h1(zb_h1)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_zb_h1(zb_h1, seed=fresh_seed())   # three of p, m drawn afresh
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "tables_zb_h1_replay", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(table_summary(zb_h1(4, 8), [0, 1, 2, 3], 8, "your ZB-H1"))
plot_table(zb_h1(4, 8), [0, 1, 2, 3], 8, title="ZB-H1, p = 4, m = 8");

# %% [markdown]
# ### Exercise 2.3 — a V: zero bubble at 1F1B's memory (3 points)
#
# ZB-H1 still idles at the start: rank p−1 waits for p−1 forwards, and rank 0 waits for the last
# gradients to come back. Give every rank **two** stages, placed in a **V**: rank r holds stage r
# on the way down the ranks and stage 2p−1−r on the way back (`v_shape(p)`), so rank 0 holds the
# first stage and the last. A microbatch's forward crosses the ranks and returns; its backward
# starts on rank 0 and returns to it. With the backward split, W fills what is left: Qi et al.
# (§6, ZB-V) and DeepSeek-V3's DualPipe and DualPipeV (§3.2.1) are schedules of this shape.
#
# On paper, with equal times $T_F = T_B = T_W = T$ per stage, no schedule of this placement can
# beat one bound: rank p−1 can start nothing before microbatch 0 has crossed p−1 stages,
# $(p-1)\,T$, and then has $2m \cdot 3T$ of work, so no step is shorter than $(p-1)T + 6mT$; every
# rank has the same work, so each idles at least $(p-1)T$: a bubble of at least $(p-1)/(6m)$. A
# V reaches it (the course's and torch's; tests/test_lab11_tables.py).
#
# **Build** `zb_v(p, m)`: a V-shaped zero-bubble table.
#
# **Contract.** m ≥ 2p. Stages s and 2p−1−s on rank s; F, B and W of every microbatch on every
# stage, each once. The check replays it (unit times for a rank's layers, so 1/2 per stage) on two
# visible and three hidden (p, m): valid, bubble no more than the bound above, and at most 2p
# stage-microbatches held per rank, 1F1B's peak (p whole microbatches). torch's
# `ScheduleZBVZeroBubble` meets both; compare with it (`torch_table("ScheduleZBVZeroBubble", p, m)`).
#
# **Why it matters.** The V keeps the first and the last stage on one rank (the embedding and the
# loss head sit together), halves ZB-H1's bubble at the same memory, and sends fewer messages than
# interleaving with the same two stages per rank.
#
# <details><summary>Hint 1</summary>
#
# A closed-form order is hard to find; a simulation finds one. Time runs in slots of one action
# (all actions take the same time here): in each slot, what can each rank start?
# </details>
#
# <details><summary>Hint 2</summary>
#
# In each slot, each rank starts the first action whose input ran in an earlier slot, in a fixed
# order of preference. Which should come first, a forward (it feeds the pipeline), a B (someone
# waits for it) or a W (nobody does)? And which of the rank's two stages?
# </details>
#
# <details><summary>Hint 3</summary>
#
# Prefer F, then B, then W; a forward only while the rank holds fewer than 2p; for F the rank's
# later stage first (2p−1−r), for B and W its earlier one (r); each stage takes its microbatches
# in order.
# </details>

# %% nbgrader={"grade": false, "grade_id": "zb_v", "locked": false, "schema_version": 3, "solution": true, "task": false}
def zb_v(p, m):
    """Per rank, its actions ("F", "B" or "W", microbatch, stage) of a V-shaped zero-bubble
    schedule: stages r and 2p-1-r on rank r."""
    ### BEGIN SOLUTION
    last = 2 * p - 1
    ran = {}                                             # action -> the time slot it ran in
    nxt = {(op, s): 0 for op in "FBW" for s in range(2 * p)}
    held, table, slot = [0] * p, [[] for _ in range(p)], 0

    def ready(op, s):
        """The next action of (op, s) if its input ran in an earlier slot, else None."""
        i = nxt[(op, s)]
        if i == m:
            return None
        need = {"F": ("F", i, s - 1) if s > 0 else None, "W": ("B", i, s),
                "B": ("F", i, s) if s == last else ("B", i, s + 1)}[op]
        return (op, i, s) if need is None or ran.get(need, slot) < slot else None

    while len(ran) < 3 * 2 * p * m:
        for r in range(p):
            up, down = r, last - r                       # rank r: stage r, and 2p-1-r on the way back
            choices = [("F", down), ("F", up)] if held[r] < 2 * p else []
            choices += [("B", up), ("B", down), ("W", up), ("W", down)]
            action = next((a for a in (ready(op, s) for op, s in choices) if a), None)
            if action is None:
                continue                                 # nothing ready: rank r idles this slot
            table[r].append(action)
            ran[action] = slot
            nxt[action[0], action[2]] += 1
            held[r] += {"F": 1, "W": -1}.get(action[0], 0)
        slot += 1
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_zb_v", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_zb_v(zb_v)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_zb_v(zb_v, seed=fresh_seed())   # three of p, m drawn afresh
### END HIDDEN TESTS

# %% [markdown]
# ### Your tables beside torch's
#
# torch builds each multi-stage schedule's table when the schedule object is made
# (`schedule.pipeline_order`); `torch_table` reads it without running anything, in this lab's
# form (torch's `I`, the input's gradient, is a B with a W of its own). Replayed with the same
# unit times, for p = 4, m = 8: your interleaved table beside `ScheduleInterleaved1F1B` (v = 2),
# your ZB-H1 beside `ScheduleInterleavedZeroBubble` at v = 1, your V beside `ScheduleZBVZeroBubble`.
# Peak activations are per rank in stage-microbatches, and in whole microbatches on the busiest
# rank; messages are those one step sends between ranks.

# %% nbgrader={"grade": false, "grade_id": "tables_beside_torch", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
p, m = 4, 8
print(compare_tables({
    "1F1B (Lab 5)": (one_f_one_b(p, m), list(range(p))),
    "interleaved 1F1B v=2 (yours)": (interleaved_1f1b(p, m, 2), round_robin(p, 2)),
    "ScheduleInterleaved1F1B (torch)": torch_table("ScheduleInterleaved1F1B", p, m, v=2),
    "ZB-H1 (yours)": (zb_h1(p, m), list(range(p))),
    "Interleaved ZB, v=1 (torch)": torch_table("ScheduleInterleavedZeroBubble", p, m, v=1),
    "V (yours)": (zb_v(p, m), v_shape(p)),
    "ScheduleZBVZeroBubble (torch)": torch_table("ScheduleZBVZeroBubble", p, m, v=2),
}))

# %% [markdown]
# Read the table by pairs: each of your schedules should match torch's bubble and peak, though
# its order of actions may differ (any valid order that does as well passes). Down the rows, the
# bubble falls from 1F1B's $(p-1)/m$ to interleaving's $(p-1)/(vm)$, ZB-H1's $(p-1)/(3m)$ and the
# V's $(p-1)/(6m)$; interleaving pays for its share in memory and messages, the zero-bubble
# schedules pay in neither at this scale: they hold W's activations longer instead, which
# Section 1 measured. Section 3 runs these tables on real ranks, where messages are not free.

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
# gradient and weight gradient written out), so this section needs nothing of your Exercise 1;
# `run_tables(..., split_backward=...)` builds the same stages under autograd with a pair of
# Section 1's instead. For stage `st = stages[s]`:
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
                                           stored_problem, stored_torch_tables)
from distlab.labs.pipeline.schedules import schedule_order

# %% [markdown]
# ### Exercise 3 — an executor for any table (5 points)
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
# running them, Section 2; stored with the course's). Beside your gradients: one process's, and those of torch's schedules
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
# Section 2's comparison, the course's tables run above and torch's DualPipeV in it: the replay
# of each ($t_F = t_B = t_W$ per rank's share of the layers) and what crosses the ranks, beside
# Lab 5's 1F1B:

# %% nbgrader={"grade": false, "grade_id": "executor_costs", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
course, _, _, _ = stored_problem()
lab5 = [[(op, i, r) for op, i in order] for r, order in enumerate(schedule_order("1f1b", 4, 8))]
theirs = stored_torch_tables()
print(compare_tables({"1F1B (Lab 5)": (lab5, [0, 1, 2, 3]), **course,
                      **{n: theirs[n] for n in ("torch ScheduleZBVZeroBubble",
                                                "torch ScheduleDualPipeV")}}))

# %% [markdown]
# - **W holds activations longer.** A stage keeps a microbatch's activations from its F to its
#   W, not to its B. ZB-H1 keeps 1F1B's peak (4 microbatches, rank 0's; Qi et al. 2023, §2.1)
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
# ZB-H1 kept 1F1B's memory and cut its bubble to a third by moving W into the idle time (Qi et
# al. 2023, "Zero Bubble Pipeline Parallelism", §2.1). Now
# suppose a rank can afford the activations of fewer than the $p$ microbatches 1F1B's rank 0
# holds. Lab 5 met such a cap with whole backwards; a split backward does much better, if you
# place each W well.

# %% nbgrader={"grade": false, "grade_id": "design_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab11 import check_capped_schedule, check_capped_schedule_bar
from distlab.checks.lab11_design import capped_figures, capped_verdict
from distlab.labs.pipeline.capped import cap_bound, whole_backward_bound
from distlab.labs.pipeline.schedules import replay

# %% [markdown]
# ### Exercise 4 — a schedule under a memory cap (open design, 2 + 1 points)
#
# **Goal.** Write `capped_schedule(num_ranks, num_microbatches, max_held) -> table`: a schedule
# of your own design for $p$ ranks and $m$ microbatches, one stage per rank, that never holds
# more than $k$ = `max_held` microbatches' activations on a rank, with as small a bubble as you
# can make it.
#
# **Contract.** The table is one list per rank $r$ of actions `(op, i, r)`, in the order rank
# $r$ runs them: op `"F"`, `"B"` or `"W"` of microbatch $i$ on stage $r$ (stage $r$ lives on rank
# $r$). Every microbatch's F and B appear once on every rank; a W at most once, after its B (a B
# without a W is the whole backward, as `replay` times it). The checks grade:
#
# - *dependencies:* `replay(table, t_fwd=1, t_bwd=1, t_wgt=1)` runs it to the end (no rank waits
#   forever: a W before its B, a B before the rank's own F, ...);
# - *memory:* on every rank, `Replay.peak` at most $k$: a microbatch's activations are held from
#   the start of its F to the end of its W (of its B when it has no W), as the replay counts
#   them; a W that ends at the instant a forward starts has freed its slot;
# - *values:* the course's executor runs your table on $p$ real ranks; the loss and every
#   gradient equal single-process training's;
# - *bubble:* `Replay.bubble` (idle over compute, $t_F = t_B = t_W$, messages free), on a scale:
#   `test_capped_schedule` (2 points) wants at most the bubble of the design the hints lead to,
#   for $p = 4$, $m = 8$, $k = 3$ (visible) and other cases (hidden);
#   `test_capped_schedule_bar` (1 point) at most the **bar**, halfway from that design's bubble to
#   the course's own design's. Both print your bubble beside the hinted design's, the bar, the
#   course's and the bound.
#
# **How low can it go?** Two floors hold for every table. The fill: rank $p-1$ starts after the
# $p-1$ forwards before it, then computes its $3m$ units, so the step lasts at least
# $p - 1 + 3m$. Rank 0's slots: it holds a microbatch from its F to its W, and in between the
# microbatch goes forward through all $p$ ranks and its gradient comes all the way back: at least
# $2p + 1$ units ($p$ forwards, $p$ B's, one W, in a chain). With at most $k$ held at once, the $m$
# holding times split into $k$ chains that never overlap, one of them $\lceil m/k \rceil$ long.
# Every rank computes $3m$ of the step $T \ge \max(p - 1 + 3m,\ \lceil m/k \rceil (2p+1))$, so the
# bubble is at least $T/3m - 1$ (`cap_bound(p, m, k)`). Lab 5's bound for whole backwards under the
# same cap (`whole_backward_bound`) is higher than the first test's limit on every graded case: a
# whole backward cannot meet it.
#
# **Why it matters.** A cap on activations is what decides a real pipeline's schedule: Qi et al.
# (§3) search their schedules automatically under a memory limit, and DeepSeek-V3 (§3.2.1,
# Table 2) sets DualPipe's bubble beside its activation memory. Try ideas on paper first:
# `replay` times any table in a millisecond.
#
# <details><summary>Hint 1</summary>
#
# Time one microbatch's stay on rank 0, from its F to the end of its backward, with the backward
# whole, then split. Which part of a rank's backward does the rank before it wait for?
# </details>
#
# <details><summary>Hint 2</summary>
#
# A W frees a slot, yet no other action waits for it. When must a rank run a W at the latest,
# and when is the cheapest moment to run it otherwise?
# </details>
#
# <details><summary>Hint 3</summary>
#
# Write the table by simulating it on paper, one unit of time after another. Whenever a rank is
# idle it starts one action whose input has ended: a forward if one is ready and the rank holds
# fewer than $k$; else a ready B; else a ready W. That design meets the first test.
# </details>
#
# <details><summary>Hint 4</summary>
#
# Replay Hint 3's table and print rank 0's actions with their start times. When rank 0 cannot
# start a forward, what is it waiting for? When a rank between it and the last could run either
# a forward or a B, which of the two hands rank 0 its gradient sooner?
# </details>

# %% nbgrader={"grade": false, "grade_id": "capped_figures", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(capped_figures())    # the visible tests' scale
print(f"cap_bound(4, 8, 3) = {cap_bound(4, 8, 3):.3f}; "
      f"whole_backward_bound(4, 8, 3) = {whole_backward_bound(4, 8, 3):.3f}")

# %% nbgrader={"grade": false, "grade_id": "capped_schedule", "locked": false, "schema_version": 3, "solution": true, "task": false}
def capped_schedule(num_ranks, num_microbatches, max_held):
    """One list per rank r of actions (op, i, r), never more than max_held microbatches held."""
    ### BEGIN SOLUTION
    p, m, k = num_ranks, num_microbatches, max_held

    def waits_for(op, i, r):
        if op == "F":
            return None if r == 0 else ("F", i, r - 1)
        if op == "B":
            return ("F", i, r) if r == p - 1 else ("B", i, r + 1)
        return ("B", i, r)

    ends = {}                                   # action -> when it ends, on paper (unit times)
    table = [[] for _ in range(p)]
    started = [dict(F=0, B=0, W=0) for _ in range(p)]
    busy_until = [0] * p
    now = 0
    while sum(map(len, table)) < 3 * p * m:
        for r in range(p):
            if busy_until[r] > now:
                continue
            held = started[r]["F"] - sum(1 for i in range(started[r]["W"])
                                         if ends[("W", i, r)] <= now)
            # A B first: the ranks before this one wait for it, and so does rank 0's slot.
            # Then a forward, while under the cap. A W last: only memory waits for it.
            for op in "BFW":
                i = started[r][op]
                if i == m or (op == "F" and held >= k):
                    continue
                before = waits_for(op, i, r)
                if before is None or ends.get(before, now + 1) <= now:
                    table[r].append((op, i, r))
                    started[r][op] += 1
                    ends[(op, i, r)] = busy_until[r] = now + 1
                    break
        now += 1
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_capped_schedule", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_capped_schedule(capped_schedule, world_size=4, num_microbatches=8, max_held=3)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_capped_schedule(capped_schedule, world_size=2, num_microbatches=6, max_held=2,
                      seed=fresh_seed())    # two ranks, the cap at 1F1B's own peak
check_capped_schedule(capped_schedule, world_size=4, num_microbatches=4, max_held=3,
                      seed=fresh_seed())    # as many microbatches as ranks
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_capped_schedule_bar", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_capped_schedule_bar(capped_schedule, world_size=4, num_microbatches=8, max_held=3)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_capped_schedule_bar(capped_schedule, world_size=4, num_microbatches=4, max_held=3,
                          seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Your table on the scale: its replay beside the hinted design's, the bar, the course's and the
# bound, and how many microbatches each rank held at its peak.

# %% nbgrader={"grade": false, "grade_id": "capped_verdict", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(capped_verdict(capped_schedule))

# %% [markdown]
# ## Summary
#
# * A stage's backward is two computations: B, the gradient of its input, which the stage
#   before waits for, and W, the gradient of its weights, which only the optimizer step needs
#   (Qi et al. 2023, §2). `torch.autograd.grad(..., inputs=...)` computes either alone. W can
#   run the graph again from the stage's output, which keeps the graph alive from B to W, or
#   start from the gradients B left at each layer's output (hooks), which holds less and
#   computes less; torch 2.13's own split keeps what B computed.
# * A schedule is a table: per rank, the order of its actions (F, B, W of a microbatch on a
#   stage); sends and receives follow from the placement. A replay on paper tells whether it is
#   valid (every dependency respected, every rank completes) and what it costs, with unit times:
#   the bubble (idle over compute) and the peak activations. Interleaving v stages per rank
#   divides 1F1B's bubble by v, $(p-1)/(vm)$ (PTD-P §2.2), for $(v+1)p-1$ stage-microbatches on
#   rank 0 and about v times the messages; ZB-H1 fills the cool-down with deferred W, a third of
#   1F1B's bubble at 1F1B's memory (Qi et al. 2023, §2.1); a V (stage r and 2p−1−r on rank r)
#   reaches the bound $(p-1)/(6m)$ at the same memory. torch's own tables
#   (`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`) replay
#   to the same figures.
# * An executor makes a table real: each rank runs its row in order, posts each receive ahead and
#   waits for it only when its action runs, never waits for a send before its row is done, and
#   tags every message with its kind and stage, since in a V one pair of ranks carries two
#   streams. Any table whose replay finishes then runs without deadlock and trains exactly as one
#   process does (to about 1e-14 in float64), as torch's own `ScheduleInterleaved1F1B`,
#   `ScheduleZBVZeroBubble` and `ScheduleDualPipeV` do on the same model. Zero-bubble schedules
#   pay in activations held from F to W and, with virtual stages, in messages (96 to 112 per
#   step against 1F1B's 48 at p = 4, m = 8); DeepSeek-V3 chose DualPipe to overlap a 1:1
#   ratio of computation to all-to-all communication, at twice the parameters (§3.2.1).
# * Under a memory cap, splitting the backward shortens how long rank 0 holds a microbatch,
#   from 3p to 2p+1 units; the order of F, B and W on each rank decides how much of that gain
#   a schedule keeps.
