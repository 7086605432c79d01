# ---
# jupyter:
#   distlab:
#     summary: "Column- and row-parallel layers with their two autograd operators, one all-reduce per block each way, sequence parallelism, and the same plan in DTensor."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 3 — Tensor-parallel MLP
#
# Data parallelism (Lab 2) copies the whole model to every rank. When one layer's weights, or
# its activations, no longer fit on one device, the layer itself has to be split: **tensor
# parallelism** (TP) gives each of p ranks a slice of every weight matrix and lets the ranks
# exchange just enough to compute exactly what the dense layer computes.
#
# This lab builds the Megatron-LM recipe (Shoeybi et al., 2019) for the MLP of a transformer
# block, by hand, on real `torch.distributed` ranks:
#
# 1. shard a dense weight into each rank's slice (column and row parallel);
# 2. write the two conjugate autograd operators that make the backward pass correct;
# 3. assemble `ColumnParallelLinear`, `RowParallelLinear` and the tensor-parallel MLP (plain GELU
#    and SwiGLU), equal to the dense one in outputs *and* gradients, with one all-reduce each way;
# 4. add **sequence parallelism**: norm and dropout on sequence shards, the all-reduce replaced by
#    a reduce-scatter and an all-gather, and measure the activation memory it saves.
#
# Then you write the same plan in three lines of PyTorch's DTensor `parallelize_module`, compare
# the collectives it issues with yours, and time dense vs hand-written vs DTensor.
#
# **Notation.** Activations are (b, s, h): batch, sequence, hidden. The MLP widens to f = 4h and
# back. p is the tensor-parallel degree (world size here). `nn.Linear` stores its weight as
# **(out_features, in_features)** and computes y = x Wᵀ + b.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.checks.assertions import fresh_seed
from distlab.checks.lab03 import (check_copy_to_tp, check_gather_from_sp, check_parallel_linears,
                                  check_predicted_ring_bytes, check_reduce_from_tp,
                                  check_reduce_scatter_to_sp,
                                  check_sequence_parallel_block, check_shard_column,
                                  check_shard_row, check_tp_mlp, check_tp_swiglu)
from distlab.labs.tensor_parallel import (compare_activation_memory, compare_with_dtensor,
                                     megatron_comm_bytes, mlp_comm_record, timing_table)

# %% [markdown]
# ## 1. Splitting a matrix multiply two ways
#
# The MLP computes $Y = \mathrm{GELU}(XA)\,B$ with $A$: (h, f) and $B$: (f, h). There are two
# ways to split a product $XW$ over $p$ ranks:
#
# * **Column parallel**: cut $W$ by columns, $W = [W_0 \mid W_1 \mid \dots]$. Rank $r$ computes
#   $X W_r$, a block of the *output features*. Every rank needs the whole input $X$; no
#   communication is needed to get its block of the output.
# * **Row parallel**: cut $W$ by rows, $W = [W_0; W_1; \dots]$, and the input by the matching
#   columns, $X = [X_0 \mid X_1 \mid \dots]$. Then $XW = \sum_r X_r W_r$: each rank computes a
#   full-size *partial* output, and an **all-reduce** (sum) finishes the job.
#
# Megatron's observation: cut $A$ by columns and $B$ by rows. GELU acts elementwise, so rank $r$
# can apply it to its own block $\mathrm{GELU}(X A_r)$ — which is exactly the input block that
# the row-parallel $B_r$ needs. The whole MLP then needs a single all-reduce at the end:
#
# $$Y = \sum_r \mathrm{GELU}(X A_r)\, B_r.$$
#
# In `nn.Linear`'s (out, in) layout, A's columns are the *rows* of `fc1.weight` (dim 0) and B's
# rows are the *columns* of `fc2.weight` (dim 1). Rank r owns the r-th contiguous block of p.
#
# ## 2. Exercise 1 — sharding a dense weight (2 points)
#
# Write `shard_column(weight, bias, rank, world_size)` returning rank `rank`'s block of output
# features: `(weight[(f/p) r : (f/p)(r+1), :], the same block of bias)`, and `shard_row(...)`
# returning its block of input features `weight[:, block]` and the **whole** bias (a
# row-parallel layer adds its bias once, after the sum). Return copies (`.clone()`), not views:
# each rank should own only its slice.

# %% nbgrader={"grade": false, "grade_id": "shard", "locked": false, "schema_version": 3, "solution": true, "task": false}
def shard_column(weight: torch.Tensor, bias: torch.Tensor, rank: int, world_size: int):
    """(out/p, in) rows and (out/p,) bias of the output features rank `rank` computes."""
    ### BEGIN SOLUTION
    block = weight.shape[0] // world_size
    rows = slice(rank * block, (rank + 1) * block)
    return weight[rows].clone(), bias[rows].clone()
    ### END SOLUTION


def shard_row(weight: torch.Tensor, bias: torch.Tensor, rank: int, world_size: int):
    """(out, in/p) columns of the input features rank `rank` reads, and the whole bias."""
    ### BEGIN SOLUTION
    block = weight.shape[1] // world_size
    return weight[:, rank * block:(rank + 1) * block].clone(), bias.clone()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_shard", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_shard_column(shard_column)
check_shard_row(shard_row)
print("shard_column, shard_row: correct; the shards reproduce the dense layer")
### BEGIN HIDDEN TESTS
check_shard_column(shard_column, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24, ffn=48)
check_shard_row(shard_row, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24, ffn=48)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 2 — the conjugate operators f and g (3 points)
#
# Forward is settled; backward needs care. Take the column-parallel fc1: every rank reads the
# same $X$ but only through its own $A_r$, so rank $r$ can only compute its *share* of the
# gradient, $\partial L/\partial X = \sum_r (\partial L/\partial Y_r)\, A_r^\top$. The full
# gradient is a sum over ranks: an all-reduce **in the
# backward pass**, where the forward did nothing. The row-parallel fc2 is the mirror image: an
# all-reduce in the forward; its output is replicated, so its gradient already is, and the
# backward does nothing.
#
# Megatron packs these into two autograd functions, conjugate to each other:
#
# | operator | forward | backward | where |
# |---|---|---|---|
# | f = `CopyToTensorParallel` | identity | all-reduce | before a column-parallel layer |
# | g = `ReduceFromTensorParallel` | all-reduce | identity | after a row-parallel layer |
#
# Write both as `torch.autograd.Function`s with `forward(ctx, x, group=None)`; they are called as
# `Op.apply(x, group)`. `dist.all_reduce` works **in place**: never all-reduce the tensor you
# were given (clone it first), or you overwrite the caller's data. `backward` returns one
# gradient per forward input: `(grad_x, None)`.

# %% nbgrader={"grade": false, "grade_id": "conjugate_ops", "locked": false, "schema_version": 3, "solution": true, "task": false}
class CopyToTensorParallel(torch.autograd.Function):
    """f: forward identity; backward all-reduce (sum) of the gradient over `group`."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        ctx.group = group
        return x.view_as(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        ### END SOLUTION


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward all-reduce (sum) over `group`; backward identity."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return grad, None
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_copy_to_tp", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_copy_to_tp(CopyToTensorParallel)
print("CopyToTensorParallel: identity forward, one all-reduce backward")
### BEGIN HIDDEN TESTS
check_copy_to_tp(CopyToTensorParallel, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_reduce_from_tp", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_reduce_from_tp(ReduceFromTensorParallel)
print("ReduceFromTensorParallel: one all-reduce forward, identity backward")
### BEGIN HIDDEN TESTS
check_reduce_from_tp(ReduceFromTensorParallel, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise 3 — parallel layers and the tensor-parallel MLP (6 points)
#
# Now the layers. Each is built from the dense layer (identical on every rank, as if loaded
# from a checkpoint) and keeps only its shard, as `nn.Parameter`s named `weight` and `bias`:
#
# * `ColumnParallelLinear(dense, group)`: input (b, s, in) replicated → f → `F.linear` with the
#   column shard → output (b, s, out/p), this rank's features. No gather: the next layer is
#   row parallel and wants exactly this block.
# * `RowParallelLinear(dense, group)`: input (b, s, in/p) → `F.linear` with the row shard and
#   **no bias** → g (sum of partial outputs) → add the bias once → (b, s, out).
# * `TensorParallelMLP(dense_mlp, group)`: `fc1` column parallel, `fc2` row parallel, GELU in
#   between; the dense MLP is `fc2(gelu(fc1(x)))`.
# * `TensorParallelSwiGLU(dense, group)`: Llama's gated MLP `w2(silu(w1 x) * w3 x)` (no
#   biases). `w1` and `w3` read the same input, so both are column parallel behind **one** f;
#   `w2` is row parallel. Name them `w1`, `w2`, `w3`, each with a `weight`.
#
# The rank and world size come from the group: `dist.get_rank(group)`,
# `dist.get_world_size(group)`. Use your `shard_column`/`shard_row`. The checks compare every
# shard's gradient with the matching slice of the dense gradient, within 1e-3 (float32: the
# ranks add the same products in another order, which moves results by about 1e-6 here; a
# wrong slice or a missing partial sum moves them by 0.1 or more), and count the collectives.

# %% nbgrader={"grade": false, "grade_id": "parallel_layers", "locked": false, "schema_version": 3, "solution": true, "task": false}
class ColumnParallelLinear(nn.Module):
    """y_r = x A_rᵀ + b_r: rank r's block of output features; f before the matmul."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
        ### BEGIN SOLUTION
        weight, bias = shard_column(dense.weight.detach(), dense.bias.detach(),
                                    dist.get_rank(group), dist.get_world_size(group))
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = CopyToTensorParallel.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)              # (b, s, out/p)
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """y = Σ_r x_r B_rᵀ + b: partial products summed by g, the bias added once."""

    def __init__(self, dense: nn.Linear, group=None):
        super().__init__()
        self.group = group
        ### BEGIN SOLUTION
        weight, bias = shard_row(dense.weight.detach(), dense.bias.detach(),
                                 dist.get_rank(group), dist.get_world_size(group))
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        partial = F.linear(x, self.weight)                      # (b, s, out), this rank's share
        return ReduceFromTensorParallel.apply(partial, self.group) + self.bias
        ### END SOLUTION


class TensorParallelMLP(nn.Module):
    """fc2(gelu(fc1(x))) with fc1 column parallel and fc2 row parallel."""

    def __init__(self, dense, group=None):
        super().__init__()
        ### BEGIN SOLUTION
        self.fc1 = ColumnParallelLinear(dense.fc1, group)
        self.fc2 = RowParallelLinear(dense.fc2, group)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return self.fc2(F.gelu(self.fc1(x)))
        ### END SOLUTION


class TensorParallelSwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): w1, w3 column parallel behind one f, w2 row parallel."""

    def __init__(self, dense, group=None):
        super().__init__()
        self.group = group
        ### BEGIN SOLUTION
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        block = dense.w1.out_features // p
        rows = slice(rank * block, (rank + 1) * block)
        self.w1 = nn.Linear(dense.w1.in_features, block, bias=False)
        self.w3 = nn.Linear(dense.w3.in_features, block, bias=False)
        with torch.no_grad():
            self.w1.weight.copy_(dense.w1.weight[rows])
            self.w3.weight.copy_(dense.w3.weight[rows])
        self.w2 = nn.Linear(block, dense.w2.out_features, bias=False)
        with torch.no_grad():
            self.w2.weight.copy_(dense.w2.weight[:, rows])
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = CopyToTensorParallel.apply(x, self.group)
        hidden = F.silu(self.w1(x)) * self.w3(x)                # (b, s, f/p)
        return ReduceFromTensorParallel.apply(self.w2(hidden), self.group)
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_parallel_linears", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_parallel_linears(ColumnParallelLinear, RowParallelLinear)
print("ColumnParallelLinear, RowParallelLinear: outputs, gradients and collectives correct")
### BEGIN HIDDEN TESTS
check_parallel_linears(ColumnParallelLinear, RowParallelLinear, world_size=4, seed=fresh_seed(),
                       batch=3, seq=24, hidden=24, ffn=48)   # KiBs a rank: see distlab.checks.crossed
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_tp_mlp", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_tp_mlp(TensorParallelMLP)
print("TensorParallelMLP: equals the dense MLP; one all-reduce forward, one backward")
### BEGIN HIDDEN TESTS
check_tp_mlp(TensorParallelMLP, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24, ffn=48)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_tp_swiglu", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_tp_swiglu(TensorParallelSwiGLU)
print("TensorParallelSwiGLU: equals the dense SwiGLU; one all-reduce forward, one backward")
### BEGIN HIDDEN TESTS
check_tp_swiglu(TensorParallelSwiGLU, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24, ffn=48)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. What it costs: the formula against the wire
#
# Per MLP block and per pass, TP moves one all-reduce of the block's activation, b·s·h elements
# (Megatron-LM §3: two per transformer layer each way, one for attention and one for the MLP).
# On a ring each rank sends and receives a share of it (Lab 1's ring), and that share does
# **not** shrink as p grows —
# the compute per rank does — which is why TP stays inside a node, on NVLink. The table below
# puts the formula next to what the hand-written MLP issued (captured in `out.comms`) and what
# DTensor issued for the same plan (seen by `CommDebugMode`; functional collectives bypass
# `torch.distributed`'s Python API, so `out.comms` never sees them). Defaults: b=2, s=8, h=16,
# float32, so b·s·h·4 = 1024 bytes.

# %% nbgrader={"grade": false, "grade_id": "formula", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
megatron_comm_bytes(batch=2, seq=8, hidden=16)

# %% [markdown]
# ## 6. The same plan in DTensor
#
# PyTorch expresses the plan as data: `ColwiseParallel` shards a Linear's weight along its
# output features (`Shard(0)` of the (out, in) weight) and turns a replicated input into the
# local input; `RowwiseParallel` shards along input features and all-reduces the output
# (`Partial` → `Replicate`). For our MLP the plan is
# `{"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}` (see `distlab.labs.tensor_parallel.dtensor_plan`),
# applied with `parallelize_module(model, mesh, plan)` on a 1-D `DeviceMesh`. The run below uses
# **your** `TensorParallelMLP` as the hand-written side, on the same model and input as DTensor's
# run, which the course recorded (your handout holds no DTensor plans: writing one is Lab 7's
# exercise).

# %% nbgrader={"grade": false, "grade_id": "dtensor_mlp", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
compare_with_dtensor(TensorParallelMLP, "mlp", world_size=2);

# %% [markdown]
# Same numbers, same collectives. Now SwiGLU. Look at the backward column: DTensor's
# `ColwiseParallel` converts each layer's input on its own, so w1 and w3 each all-reduce their
# input gradient — one all-reduce more than your single f in front of both. (The fix in DTensor
# is to prepare the MLP's input once with `PrepareModuleInput` and keep it a DTensor,
# `use_local_output=False`; the point is that the plan decides the collectives, and
# `CommDebugMode` is how you find out.)

# %% nbgrader={"grade": false, "grade_id": "dtensor_swiglu", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
compare_with_dtensor(TensorParallelSwiGLU, "swiglu", world_size=2);

# %% [markdown]
# ## 7. Exercise 4 — sequence parallelism (4 points)
#
# Inside the MLP the activations are split (b, s, f/p). Outside it — the LayerNorm, dropout and
# the residual — every rank holds the same full (b, s, h) tensors: p copies of identical
# activations kept for backward. Those operations act on each token independently, so they can
# run on a **sequence shard** (b, s/p, h) instead (Korthikanti et al., 2022).
#
# Entering the MLP, the ranks all-gather the sequence; leaving it, instead of all-reducing the
# partial sums and keeping all of them, they **reduce-scatter**: sum and keep only their own
# tokens. All-reduce = reduce-scatter + all-gather, so the forward moves the bytes TP moves. The
# backward need not: your block keeps fc1's gathered input for fc1's weight gradient and moves
# TP's bytes again, but Megatron keeps only the sequence shard (section 7 shows why) and
# all-gathers it once more in the backward: one collective more than TP's backward (what that
# costs on a ring is yours to predict at the end of this section). The operators, with the
# sequence on dim 1:
#
# | operator | forward | backward |
# |---|---|---|
# | `GatherFromSequenceParallel` | all-gather (b, s/p, h) → (b, s, h) | reduce-scatter |
# | `ReduceScatterToSequenceParallel` | reduce-scatter (b, s, h) → (b, s/p, h) | all-gather |
#
# `dist.all_gather_single(out, inp)` and `dist.reduce_scatter_single(out, inp)` (torch 2.13's
# names for `all_gather_into_tensor` and `reduce_scatter_tensor`, as in Lab 1) work on dim 0, so move the sequence there first (`x.movedim(1, 0).contiguous()`) and back after.
#
# Then `SequenceParallelBlock(dense_block, group)` for the dense `x + dropout(fc2(gelu(fc1(norm(x)))))`
# (`dense_block.norm`, `dense_block.mlp.fc1`, `.mlp.fc2`, `.drop`): input and output are this
# rank's sequence block (b, s/p, h). Keep a copy of the norm as `self.norm`, the shards as
# `self.fc1` and `self.fc2` (modules with `weight` and `bias`, e.g. `nn.Linear`s you fill with your
# shards), and call the two operators yourself around them. fc2's bias is added to the sequence
# block *after* the reduce-scatter.
#
# The norm's weights (and fc2's bias) are replicated but now see only this rank's tokens, so their
# gradient on each rank is a partial sum: the check adds them over ranks. In training one small
# all-reduce of these gradients per step completes them (DTensor leaves them `Partial` for the
# same reason). Dropout RNG follows the same split (Megatron-LM, arXiv 1909.08053, Appendix B.2). Where an
# activation is *sharded* (the sequence shards here, or the columns and heads inside the TP
# region) each rank holds different elements, so its masks must be *independent*: Megatron seeds
# a model-parallel RNG differently on every TP rank. Only where an activation is *replicated*
# (outside TP and SP regions, e.g. after the all-reduce in plain TP) must the ranks draw the
# *same* mask, from an RNG seeded alike on every rank. The check uses dropout 0.

# %% nbgrader={"grade": false, "grade_id": "sequence_parallel", "locked": false, "schema_version": 3, "solution": true, "task": false}
def all_gather_seq(x, group=None):
    """(b, s/p, h) on every rank -> (b, s, h), blocks in rank order."""
    ### BEGIN SOLUTION
    p = dist.get_world_size(group)
    front = x.movedim(1, 0).contiguous()                             # (s/p, b, h)
    out = front.new_empty((p * front.shape[0], *front.shape[1:]))    # (s, b, h)
    dist.all_gather_single(out, front, group=group)
    return out.movedim(0, 1)                                         # (b, s, h)
    ### END SOLUTION


def reduce_scatter_seq(x, group=None):
    """(b, s, h) partial sums on every rank -> this rank's (b, s/p, h) block of their sum."""
    ### BEGIN SOLUTION
    p = dist.get_world_size(group)
    front = x.movedim(1, 0).contiguous()                             # (s, b, h)
    out = front.new_empty((front.shape[0] // p, *front.shape[1:]))   # (s/p, b, h)
    dist.reduce_scatter_single(out, front, group=group)
    return out.movedim(0, 1)                                         # (b, s/p, h)
    ### END SOLUTION


class GatherFromSequenceParallel(torch.autograd.Function):
    """Forward all-gather along the sequence (dim 1); backward reduce-scatter along it."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        ctx.group = group
        return all_gather_seq(x, group)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return reduce_scatter_seq(grad, ctx.group), None
        ### END SOLUTION


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Forward reduce-scatter along the sequence (dim 1); backward all-gather along it."""

    @staticmethod
    def forward(ctx, x, group=None):
        ### BEGIN SOLUTION
        ctx.group = group
        return reduce_scatter_seq(x, group)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return all_gather_seq(grad, ctx.group), None
        ### END SOLUTION


class SequenceParallelBlock(nn.Module):
    """x + dropout(fc2(gelu(fc1(norm(x))))) on sequence shards (b, s/p, h) in and out."""

    def __init__(self, dense, group=None):
        super().__init__()
        self.group = group
        ### BEGIN SOLUTION
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        self.norm = nn.LayerNorm(dense.norm.normalized_shape, eps=dense.norm.eps)
        self.norm.load_state_dict(dense.norm.state_dict())
        fc1, fc2 = dense.mlp.fc1, dense.mlp.fc2
        self.fc1 = nn.Linear(fc1.in_features, fc1.out_features // p)
        self.fc2 = nn.Linear(fc2.in_features // p, fc2.out_features)
        w1, b1 = shard_column(fc1.weight.detach(), fc1.bias.detach(), rank, p)
        w2, b2 = shard_row(fc2.weight.detach(), fc2.bias.detach(), rank, p)
        with torch.no_grad():
            self.fc1.weight.copy_(w1), self.fc1.bias.copy_(b1)
            self.fc2.weight.copy_(w2), self.fc2.bias.copy_(b2)
        self.drop = nn.Dropout(dense.drop.p)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        h = GatherFromSequenceParallel.apply(self.norm(x), self.group)     # (b, s, h)
        h = F.gelu(self.fc1(h))                                            # (b, s, f/p)
        h = F.linear(h, self.fc2.weight)                                   # (b, s, h), partial
        h = ReduceScatterToSequenceParallel.apply(h, self.group) + self.fc2.bias   # (b, s/p, h)
        return x + self.drop(h)
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_sp_ops", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_gather_from_sp(GatherFromSequenceParallel)
check_reduce_scatter_to_sp(ReduceScatterToSequenceParallel)
print("sequence-parallel operators: correct values, gradients and collectives")
### BEGIN HIDDEN TESTS
check_gather_from_sp(GatherFromSequenceParallel, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24)
check_reduce_scatter_to_sp(ReduceScatterToSequenceParallel, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=24)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_sp_block", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_sequence_parallel_block(SequenceParallelBlock)
print("SequenceParallelBlock: equals the dense block; all-gather + reduce-scatter each way")
### BEGIN HIDDEN TESTS
check_sequence_parallel_block(SequenceParallelBlock, world_size=4, seed=fresh_seed(),
                              batch=3, seq=12, hidden=24, ffn=48)
### END HIDDEN TESTS

# %% [markdown]
# ### What sequence parallelism saves
#
# `ActivationMeter` counts the bytes autograd keeps for backward (parameters excluded) in one
# forward of the block, on each rank: the dense block on one device, the block with your
# `TensorParallelMLP` (norm, dropout mask and residual input replicated), and your
# sequence-parallel block. Dropout 0.1 here, so the masks count too.

# %% nbgrader={"grade": false, "grade_id": "memory", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
compare_activation_memory(SequenceParallelBlock, TensorParallelMLP, world_size=2);

# %% [markdown]
# Tensor parallelism already divides the MLP's inner activations (b, s, f/p) by p; sequence
# parallelism divides the norm's input and output, the dropout mask and the residual's input
# too. What is left un-divided is fc1's input, the gathered (b, s, h), which autograd keeps for
# fc1's weight gradient. Megatron saves only the shard and all-gathers it again in the backward,
# trading one more all-gather of b·s·h (the `2 * n` all-gather bytes in `megatron_comm_bytes`'s
# backward) for (p−1)/p of that tensor. DTensor's version of the same block:

# %% nbgrader={"grade": false, "grade_id": "dtensor_sp", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
compare_with_dtensor(SequenceParallelBlock, "block_sp", world_size=2);

# %% [markdown]
# ### Predict the bytes on the wire (1 point)
#
# The record counts messages as nccl-tests does: the whole b·s·h buffer (section 5). What a rank
# actually sends on a ring is a share of it (Lab 1): 2(p−1)/p of an all-reduce, (p−1)/p of an
# all-gather or a reduce-scatter. Write `predict_ring_bytes(batch, seq, hidden, world_size,
# variant)`: the bytes one rank sends per MLP block on a ring, as `{"forward": ..., "backward":
# ...}`, for tensor parallelism (`variant="tp"`) and for Megatron's sequence parallelism
# (`"sp"`, with the extra all-gather of fc1's input in the backward described above), float32.
# The check compares it with the formula on the lab's sizes and a GPT-3 layer's (b=1, s=2048,
# h=12288) on 2, 4 and 8 ranks; the cell after it sets your numbers beside the messages your own
# `TensorParallelMLP` issued.

# %% nbgrader={"grade": false, "grade_id": "predict_ring_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_ring_bytes(batch: int, seq: int, hidden: int, world_size: int, variant: str) -> dict:
    """Bytes one rank sends per MLP block on a ring: {"forward": ..., "backward": ...}."""
    ### BEGIN SOLUTION
    n, p = batch * seq * hidden * 4, world_size             # one (b, s, h) float32 message
    if variant == "tp":                                     # one all-reduce each way
        return {"forward": 2 * (p - 1) / p * n, "backward": 2 * (p - 1) / p * n}
    # SP: all-gather + reduce-scatter forward; reduce-scatter + two all-gathers backward
    return {"forward": 2 * (p - 1) / p * n, "backward": 3 * (p - 1) / p * n}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_ring_bytes", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_predicted_ring_bytes(predict_ring_bytes)
print("predict_ring_bytes: equals the formula")
### BEGIN HIDDEN TESTS
check_predicted_ring_bytes(predict_ring_bytes, seed=fresh_seed())  # sizes drawn afresh, up to 16 ranks
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "prediction_vs_record", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
record = mlp_comm_record(TensorParallelMLP, world_size=2, batch=2, seq=8, hidden=16)
for phase, messages in record.items():
    sent = sum(2 * (2 - 1) / 2 * nbytes for op, nbytes in messages if op == "all_reduce")
    print(f"TP {phase}: your prediction {predict_ring_bytes(2, 8, 16, 2, 'tp')[phase]:.0f} bytes per "
          f"rank; your TensorParallelMLP issued {messages}, {sent:.0f} bytes on a ring")

# %% [markdown]
# ## 8. Timing, honestly
#
# One forward+backward of a bigger MLP (b=4, s=64, h=128, f=512), median of a few steps, slowest
# rank, for 1, 2 and 4 ranks, each rank limited to one thread (one core stands in for one
# device). Read it with the machine in mind: two ranks split the matmuls over two cores, but pay
# for two gloo all-reduces per step through the loopback TCP stack, which at these sizes cost as
# much as the matmuls they save; four ranks on two cores take turns, so they cannot be faster. DTensor (timed where your package holds
# the course's plans, i.e. not in your handout) pays a per-op dispatch overhead that matters at
# these tiny sizes. On GPUs joined by NVLink, the same code splits real matmul work p ways and the
# all-reduce moves at hundreds of GB/s; `bench/tp_mlp.py` runs larger shapes.

# %% nbgrader={"grade": false, "grade_id": "timing", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
timing_table(TensorParallelMLP, world_sizes=(1, 2, 4), batch=4, seq=64, hidden=128, ffn=512, steps=3);

# %% [markdown]
# ## Summary
#
# * Column parallel splits output features and needs the whole input; row parallel splits input
#   features and sums partial outputs. Column then row makes an MLP with one all-reduce forward
#   (g) and one backward (f), b·s·h elements each — independent of p.
# * The backward collectives come from autograd: each forward data movement has a conjugate.
# * Sequence parallelism swaps each all-reduce for a reduce-scatter plus an all-gather (the
#   same bytes) and divides the norm/dropout activations by p; keeping only the shard of fc1's
#   input costs one more all-gather in the backward (1.5× TP's backward bytes, as Megatron does).
# * DTensor's `parallelize_module` expresses the plan as a dict; `CommDebugMode` shows what it
#   costs, which is how you notice an extra collective.
#
# Lab 4 reuses these layers for attention: Q, K, V column parallel (heads split across ranks),
# the output projection row parallel.
