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
# LAB11-SECTION-2 (owner: l11tables): the action table, the replay, interleaved 1F1B (prediction
# first), ZB-H1, the V-shaped placement; the course's and torch's tables side by side.

# %% [markdown]
# ## 3. Running a table on real ranks
#
# LAB11-SECTION-3 (owner: l11exec): the executor exercise (isend/irecv, deadlock-free, equal to
# single-process training), torch's schedules on the same model, DualPipeV shown, timelines, and
# where zero-bubble schedules cost (DeepSeek-V3 §3.2.1).

# %% [markdown]
# ## 4. Open design: a schedule under a memory cap
#
# LAB11-SECTION-4 (owner: l11design): the open design, graded on a scale.

# %% [markdown]
# ## Summary
#
# LAB11-SUMMARY (owner: l11tables, with one bullet from each section's owner).
