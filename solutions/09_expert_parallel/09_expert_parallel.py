# ---
# jupyter:
#   distlab:
#     summary: "A mixture-of-experts layer across ranks: all-to-all dispatch and combine with autograd, capacity and dropped tokens, the load-balancing loss, EP × DP on a mesh."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 9 — Expert parallelism
#
# A **mixture-of-experts** (MoE) layer replaces one MLP by E MLPs, the *experts*, and a *router*
# that sends each token to only k of them (Shazeer et al., 2017). In Switch Transformer (Fedus et
# al., 2021, k = 1) and GShard (Lepikhin et al., 2020, k = 2) every expert is the size of the
# dense MLP it replaces: the model has E times the MLP weights, but each token pays for only k
# experts. Fine-grained MoEs split them into smaller experts and route each token to more of them
# (DeepSeekMoE, Dai et al., 2024, arXiv:2401.06066); this lab's experts are small only to run on a
# laptop.
#
# When the experts no longer fit on one device, **expert parallelism** (EP) puts E/p of them on
# each of p ranks. Every rank still holds its own tokens (as in data parallelism, Lab 2), so each
# token must travel to the rank of its expert and its result must come back: two **all-to-alls**
# per layer, with *uneven* sizes, since the router decides how many tokens go where. Lab 1 met
# all-to-all as a collective; here it carries the whole layer.
#
# In this lab you:
#
# 1. route and **dispatch** tokens with a count exchange and one `all_to_all_single`;
# 2. write the **combine** and an autograd function whose backward is the reverse all-to-all, so
#    that the layer trains exactly like the single-process one;
# 3. bound each expert's load with a **capacity** and drop the overflow;
# 4. predict, then 5. design, an expert-parallel layer whose all-to-alls have a **fixed size**
#    and need no count exchange, as GShard and Switch Transformer ran;
# 6. write the **load-balancing loss** of the Switch Transformer;
#
# and then measure what EP sends compared with tensor parallelism, run EP × DP on a 2 × 2 mesh,
# train a toy task with and without the balancing loss, and read a profiler timeline of one step.
#
# **Notation.** T tokens per rank, hidden size h, expert width f, E experts, top-k routing,
# p ranks; rank r holds tokens [rT, (r+1)T) of the batch and experts [rE/p, (r+1)E/p).

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.checks.lab09 import (check_aux_loss, check_capacity, check_dispatch, check_moe_layer,
                                  check_padded_moe, check_padded_moe_bar, check_predicted_bytes,
                                  padded_scale)
from distlab.labs.experts import (DispatchPlan, ToyTask, compare_training, ep_dp_step,
                                  format_wire_bytes, measure_traffic, moe_closing_note,
                                  padded_traffic, phase_times, profile_moe_step, show_routing,
                                  traffic_summary)

# %% [markdown]
# ## 1. The layer on one process
#
# For a token x (a row of h numbers) the router computes probabilities
# $p = \mathrm{softmax}(W_r x)$ over the E experts and picks the k largest, $i_1, \dots, i_k$.
# The output is the sum of those experts' outputs, each weighted by its probability, the **gate**:
#
# $$y = \sum_j p_{i_j} \cdot \mathrm{expert}_{i_j}(x).$$
#
# This lab does not renormalise the gates over the k chosen experts, and that is a choice. With
# k = 1 it is required: renormalised, the one gate would be the constant 1, and the router would
# get no gradient from the task (Switch Transformer §2.1 weights the expert's output by its
# probability). With k ≥ 2 both are used: GShard renormalises its top-2 gates (Algorithm 1 divides
# g₁ and g₂ by their sum), and so does Mixtral (Jiang et al., 2024, arXiv:2401.04088: a softmax
# over the top-k logits); renormalised gates still pass gradient to the router, through their
# ratios. Each expert is a small MLP w₂(GELU(w₁ x)). `distlab.labs.experts.MoE` is this layer, written plainly with a loop
# over experts; it is the reference every check of this lab compares with (its forward is not in
# your handout: the lab shows its outputs as the course stored them). Below: six tokens, their two
# experts and gates, and the layer's output checked against the formula token by token.

# %% nbgrader={"grade": false, "grade_id": "routing", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
show_routing(tokens=6, hidden=8, ffn=16, experts=4, k=2);

# %% [markdown]
# The load is uneven: the router decides, token by token, and nothing makes the experts' shares
# equal. Sections 5 and 6 bound the consequences, section 8 fixes the cause.
#
# ## 2. Exercise 1 — dispatch (3 points)
#
# **Build** `dispatch(x, expert_idx, num_experts, group)`, and the `plan_dispatch` it uses: send
# every assignment of this rank's tokens to the rank that holds its expert.
#
# **Contract.**
# - Inputs: this rank's tokens x (T, h) and their experts `expert_idx` (T, k). Assignment
#   (t, j), token t's j-th choice, has the flat index t·k + j.
# - `dispatch` returns `(recv, plan)`. `recv` (n_recv, h) holds the rows of every token, of
#   every rank, routed to one of this rank's experts, ordered by **source rank, then local
#   expert, then the source's flat index**.
# - `plan = DispatchPlan(order, send_splits, recv_splits, recv_expert)`: `order` (T·k,) the
#   flat indices in the order this rank sends them; `send_splits[d]` the rows it sends rank d
#   and `recv_splits[s]` the rows it receives from rank s (lists of p ints); `recv_expert`
#   (n_recv,) the local expert (0 … E/p−1) of each received row. `plan_dispatch(expert_idx,
#   num_experts, group)` returns it; Exercise 2 builds on it.
# - Collectives, read from each rank's record (`out.comms`): first **one** collective of
#   integers, at most p·E of them (the counts: without them no rank could size its receive
#   buffer), then exactly **one** `all_to_all_single` of the tokens, carrying each of this rank's
#   assignments once (no padding, no row twice; the check reads its bytes); no gather, broadcast
#   or all-reduce of tokens.
# - Visible test: the stored routing on 2 ranks (uneven splits). Hidden: 4 ranks with E = 8,
#   k = 2, and 2 ranks with top-1 over 6 experts.
#
# **Why it matters.** An all-gather of every rank's tokens would give each rank what it needs
# too, but it sends every token to every rank, whether or not that rank holds one of its
# experts: bytes and memory that grow with p (Exercise 4 counts what the all-to-all sends).
#
# <details><summary>Hint 1</summary>
#
# Sort the T·k assignments by expert. The experts of rank 0 then come first, those of rank 1
# next, …: each destination's rows are one contiguous block. Which kind of sort keeps the flat
# order among assignments to the same expert?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The receiver needs, from every source, how many rows come for each of its experts. Count your
# assignments per expert (E numbers): rank d needs the E/p counts of its own experts, which is
# exactly what an `all_to_all_single` of the (E,) tensor delivers. What comes back, viewed as
# (p, E/p), is (source rank, local expert).
# </details>
#
# <details><summary>Hint 3</summary>
#
# `order = torch.argsort(flat, stable=True)`; send `x[order // k]` with
# `dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes)`, the splits
# being the counts summed per rank; `recv_expert` is `torch.repeat_interleave` of the local
# expert ids by the received counts.
# </details>

# %% nbgrader={"grade": false, "grade_id": "dispatch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def plan_dispatch(expert_idx, num_experts, group=None):
    """This rank's DispatchPlan for its experts ``expert_idx`` (T, k), as the contract says."""
    ### BEGIN SOLUTION
    p = dist.get_world_size(group)
    flat = expert_idx.reshape(-1)                                     # (T*k,)
    order = torch.argsort(flat, stable=True)                          # (T*k,) by expert
    counts = torch.bincount(flat, minlength=num_experts)              # (E,)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)          # (E,) = (p, E/p)
    recv_counts = recv_counts.view(p, -1)                             # (source, local expert)
    send_splits = counts.view(p, -1).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()
    local = torch.arange(num_experts // p, device=flat.device).repeat(p)
    recv_expert = local.repeat_interleave(recv_counts.reshape(-1))    # (n_recv,)
    return DispatchPlan(order, send_splits, recv_splits, recv_expert)
    ### END SOLUTION


def dispatch(x, expert_idx, num_experts, group=None):
    """x (T, h), expert_idx (T, k) -> (recv (n_recv, h), plan): one count exchange, one all-to-all."""
    ### BEGIN SOLUTION
    plan = plan_dispatch(expert_idx, num_experts, group)
    k = expert_idx.shape[1]
    send = x[plan.order // k]                                         # (T*k, h)
    recv = send.new_empty((sum(plan.recv_splits), x.shape[1]))        # (n_recv, h)
    dist.all_to_all_single(recv, send, plan.recv_splits, plan.send_splits, group=group)
    return recv, plan
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_dispatch", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_dispatch(dispatch)
print("dispatch: every rank received exactly its experts' tokens, with one all-to-all")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_dispatch(dispatch, world_size=4, seed=fresh_seed(), tokens=10, hidden=128, ffn=12, experts=8, k=2)   # 5 KiB of tokens a rank: more than the record's slack
check_dispatch(dispatch, world_size=2, seed=fresh_seed(), tokens=9, hidden=6, ffn=12, experts=6, k=1)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 2 — combine, forward and backward (4 points)
#
# **Build** `AllToAll`, an autograd function, and `moe_forward(x, router, experts, num_experts,
# k, group)`: the whole layer on expert-parallel ranks, trainable.
#
# **Contract.**
# - `AllToAll.apply(x, out_splits, in_splits, group)`: forward, an `all_to_all_single` that
#   sends `in_splits[d]` rows to rank d and receives `out_splits[s]` rows from rank s; backward,
#   whatever puts the gradient of every row on the rank the row came from. `backward` returns one
#   gradient per forward input: `(grad_x, None, None, None)`.
# - `moe_forward`: `router` is the replicated `nn.Linear(h, E)`, `experts` this rank's E/p
#   expert modules (local expert i is expert r·E/p + i). It returns this rank's outputs (T, h),
#   $y_t = \sum_j p_{i_j} \cdot \mathrm{expert}_{i_j}(x_t)$ as in section 1, with gradients
#   reaching x, the router and the experts.
# - Collectives per rank: in the forward, the count exchange and exactly **two** token
#   all-to-alls (dispatch, combine); in the backward, exactly two token all-to-alls; no gather.
# - The check compares every rank's outputs, input gradients and experts' gradients with the
#   plain layer on all p·T tokens, and the router's gradients summed over the ranks (each rank's
#   router sees only its own tokens; in training a DP all-reduce sums them, section 4).
# - Hidden tests: 4 ranks with E = 8, k = 2; and 4 ranks, top-1, routed so that **rank 3's
#   experts get no token at all**. That rank must still take part in every all-to-all of the
#   backward, or every other rank waits in them forever.
#
# **Why it matters.** With this backward the distributed layer trains exactly like the
# single-process one: the EP × DP step of section 4 and the training of section 9 run on your
# `moe_forward`.
#
# <details><summary>Hint 1</summary>
#
# A row that rank s sent you in the forward: on which rank does its gradient belong, and which
# splits describe that exchange? The combine asks the same question of the expert outputs.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Route (softmax, top-k), plan with your `plan_dispatch`, send `x[order // k]` with `AllToAll`,
# run each local expert on its rows, send the results back with `AllToAll`, splits swapped.
# `order` says which slot (t, j) each returned row belongs to: `index_copy` into a zero
# (T·k, h) tensor, weight by the gates, sum over k.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Autograd calls `AllToAll.backward` only for outputs that lie in the graph. If the starved rank
# skips its experts, its combine's input no longer depends on its dispatch. Run every local
# expert even on zero rows (`expert(recv[rows])` with `rows` empty): its empty output keeps the
# combine in the graph.
# </details>

# %% nbgrader={"grade": false, "grade_id": "moe_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
class AllToAll(torch.autograd.Function):
    """Forward: all_to_all_single receiving out_splits, sending in_splits; backward: reversed."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group=None):
        ### BEGIN SOLUTION
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))              # (n_out, h)
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))        # (n_in, h)
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None
        ### END SOLUTION


def moe_forward(x, router, experts, num_experts, k, group=None):
    """This rank's MoE output (T, h) for its tokens x (T, h), experts sharded over `group`."""
    ### BEGIN SOLUTION
    tokens, h = x.shape
    probs = torch.softmax(router(x), dim=-1)                          # (T, E)
    gates, idx = probs.topk(k, dim=-1)                                # (T, k)
    plan = plan_dispatch(idx, num_experts, group)
    recv = AllToAll.apply(x[plan.order // k], plan.recv_splits, plan.send_splits, group)  # (n_recv, h)
    out = recv.new_zeros(recv.shape)
    for e, expert in enumerate(experts):        # every expert, even on no rows (see the text)
        rows = (plan.recv_expert == e).nonzero().squeeze(1)
        out = out.index_copy(0, rows, expert(recv[rows]))
    back = AllToAll.apply(out, plan.send_splits, plan.recv_splits, group)              # (T*k, h)
    per_slot = back.new_zeros(tokens * k, h).index_copy(0, plan.order, back)           # (T*k, h)
    return (per_slot.view(tokens, k, h) * gates.unsqueeze(-1)).sum(1)                  # (T, h)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_moe_layer", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_moe_layer(moe_forward)
print("moe_forward: outputs and gradients equal the plain layer; two token all-to-alls each way")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_moe_layer(moe_forward, world_size=4, seed=fresh_seed(), tokens=10, hidden=128, ffn=12, experts=8, k=2)   # 5 KiB of tokens a rank
check_moe_layer(moe_forward, world_size=4, seed=fresh_seed(), tokens=7, hidden=6, ffn=12, experts=4, k=1,
                starve=True)   # top-1; rank 3's experts get no token: it must still join the backward
### END HIDDEN TESTS

# %% [markdown]
# ## 4. EP × DP on a 2 × 2 mesh
#
# Four ranks on a (dp = 2, ep = 2) `DeviceMesh`, each with its own T tokens. Along **ep** the
# experts are split (ranks (d, 0) hold experts 0–1, ranks (d, 1) experts 2–3) and your
# `moe_forward` runs with `group` = the ep group. Along **dp** they are replicated: the two
# copies of an expert saw different tokens, so their gradients are all-reduced over dp. The
# router, the layer's dense weight, saw different tokens on every rank, so its gradient is
# all-reduced over all four (DeepSpeed-MoE treats non-expert weights the same way). One SGD step
# must equal the plain layer's step on all 4·T tokens. Count the all-to-alls in rank 0's record:
# the backward has only the combine's reverse. The layer's input here is data, which needs no
# gradient, so autograd never calls the dispatch's backward; inside a deep model it would.

# %% nbgrader={"grade": false, "grade_id": "ep_dp", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
mesh_run = ep_dp_step(moe_forward)

# %% [markdown]
# ## 5. Exercise 3 — capacity (2 points)
#
# Compilers that need static shapes (XLA on the TPUs where GShard and Switch Transformer ran) give
# every expert a buffer of fixed size. GPU stacks can be **dropless** instead: MegaBlocks (Gale et
# al., 2022, arXiv:2211.15841) computes the experts as block-sparse products of whatever size the
# router makes, and Megatron-Core's MoE layer is dropless by default. A capacity trades dropped
# tokens for bounded compute and memory per expert. GShard (§2.2) fixes each expert's capacity
# per group of tokens; Switch Transformer (§2.2, eq. 3) sets it from a **capacity factor** c:
# tokens per batch / experts × c. With k assignments per token:
#
# capacity = ⌈c · T · k / E⌉,
#
# T·k assignments spread over E experts, times a margin c (Switch Transformer trains with 1.0 to
# 2.0). Assignments beyond an expert's capacity are **dropped**: they contribute nothing, and a
# token whose every assignment is dropped leaves the block through the residual connection
# unchanged.
#
# **Build** `expert_capacity(tokens, k, num_experts, capacity_factor)` and
# `capacity_mask(expert_idx, num_experts, capacity_factor)`.
#
# **Contract.**
# - `expert_capacity` returns the capacity above, an int.
# - `capacity_mask` returns `(keep, dropped_fraction)`: `keep` (T, k) booleans, at most
#   capacity assignments kept per expert, **first come first served in GShard's order**
#   (Algorithm 1 fills top-1 before top-2): every token's first choice in token order, then
#   every token's second choice in token order, and so on; `dropped_fraction` the share of the
#   T·k assignments dropped, a float. Each rank applies it to its own tokens.
# - The check compares both with the course's: `expert_capacity` on five cases, the mask on the
#   stored routing at c = 1.0 (hidden: 4 ranks with E = 8 at c = 1.25, and top-1 at c = 1.0).
#
# **Why it matters.** Exercise 5 pads every expert's buffer to exactly this capacity, and section
# 9's training drops by this mask.
#
# <details><summary>Hint 1</summary>
#
# Visit the assignments in order of priority: `expert_idx.t().reshape(-1)` lists every first
# choice, then every second choice, each in token order.
# </details>
#
# <details><summary>Hint 2</summary>
#
# An assignment's place in its expert's queue is how many assignments before it, in that order,
# chose the same expert: a cumulative sum of one-hot rows, read at the row's own expert. No loop
# is needed.
# </details>

# %% nbgrader={"grade": false, "grade_id": "capacity", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_capacity(tokens, k, num_experts, capacity_factor):
    """ceil(c · T · k / E): how many assignments one expert takes."""
    ### BEGIN SOLUTION
    return math.ceil(capacity_factor * tokens * k / num_experts)
    ### END SOLUTION


def capacity_mask(expert_idx, num_experts, capacity_factor):
    """keep (T, k) bool: first choices in token order first; and the fraction dropped."""
    ### BEGIN SOLUTION
    tokens, k = expert_idx.shape
    cap = expert_capacity(tokens, k, num_experts, capacity_factor)
    onehot = F.one_hot(expert_idx.t().reshape(-1), num_experts)         # (k*T, E) slot-major
    place = (onehot.cumsum(0) * onehot).sum(1) - 1                      # (k*T,) place in queue
    keep = (place < cap).view(k, tokens).t()                            # (T, k)
    return keep, 1 - keep.float().mean().item()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_capacity", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_capacity(expert_capacity, capacity_mask)
print("capacity: the same assignments dropped as the reference, and the fraction right")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_capacity(expert_capacity, capacity_mask, world_size=4, seed=fresh_seed(), tokens=16, hidden=6,
               ffn=12, experts=8, k=2, capacity_factor=1.25)
check_capacity(expert_capacity, capacity_mask, world_size=2, seed=fresh_seed(), tokens=20, hidden=6,
               ffn=12, experts=4, k=1, capacity_factor=1.0)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Capacity without a count exchange
#
# The count exchange of Exercise 1 is small, but it is one more synchronisation per layer: no
# rank can size its token buffer before every rank has routed, and the sizes change from step to
# step, which a compiler that needs static shapes cannot express. GShard (§2.2) and Switch
# Transformer (§2.2) instead give every expert exactly C = ⌈c·T·k/E⌉ slots in every rank's send
# buffer: the slots no token filled are zeros, and the assignments beyond C are dropped, as in
# Exercise 3. Every rank then sends every rank the same number of rows, known before the router
# has run: the all-to-all has **equal splits**.
#
# ### Exercise 4 — predict the padded all-to-all (1 point)
#
# **Build** `predict_all_to_all_bytes(tokens, hidden, experts, k, world_size, capacity_factor)`,
# a dict of three numbers of bytes, in float32, for one rank and one dispatch:
# - `"padded"`: the message the rank hands to a capacity-padded dispatch;
# - `"padding"`: the fewest of those bytes that are zeros, over every routing the router could
#   make;
# - `"padded_off_rank"`: the part of the padded message that leaves the rank.
#
# A message is counted as nccl-tests and `out.comms` count it: the input tensor's bytes. The
# check compares your numbers with the formulas at the lab's sizes and at others (hidden: sizes
# drawn afresh, up to 8 ranks); the table after Exercise 5 prints them beside the bytes your
# padded layer's records hold.
#
# **Why it matters.** Padding buys the end of the count exchange with bytes. Before you measure:
# at c = 1.0 is the padded dispatch bigger than the dropless one? At c = 1.25? Does either depend
# on the routing?
#
# <details><summary>Hint 1</summary>
#
# Padded: every expert gets C slots from this rank, kept assignment or zeros. How many experts
# are there across all destinations, and how is C rounded?
# </details>
#
# <details><summary>Hint 2</summary>
#
# Padding: a slot is zeros when no assignment fills it. How many assignments does a rank have to
# fill slots with, whatever the router decides, and which routing fills the most slots?
# </details>
#
# <details><summary>Hint 3</summary>
#
# With equal splits, which share of the message does a rank address to itself?
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_all_to_all_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_all_to_all_bytes(tokens, hidden, experts, k, world_size, capacity_factor) -> dict:
    """Bytes of one rank's padded dispatch message (float32): the message, its fewest zeros, its
    part off the rank."""
    ### BEGIN SOLUTION
    capacity = math.ceil(capacity_factor * tokens * k / experts)
    padded = experts * capacity * hidden * 4                          # E·C rows of h floats
    filled = min(tokens * k, experts * capacity)                      # rows T·k assignments fill
    return {"padded": padded, "padding": padded - filled * hidden * 4,
            "padded_off_rank": padded * (world_size - 1) / world_size}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_all_to_all_bytes", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_predicted_bytes(predict_all_to_all_bytes)
print("predict_all_to_all_bytes: equals the formulas")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_predicted_bytes(predict_all_to_all_bytes, seed=fresh_seed())  # sizes drawn afresh, up to 8 ranks
### END HIDDEN TESTS

# %% [markdown]
# ## 7. What expert parallelism sends
#
# Exercise 1's contract in bytes, in the layer you wrote: per layer and rank, the dispatch sends
# the rank's T·k assignments, T·k·h·b bytes (b bytes per element), and the combine sends back
# what the rank received, which is T·k·h·b on average over the ranks; the backward repeats both.
# (GShard dispatches and combines with the same two all-to-alls. Under balanced routing (p−1)/p
# of the bytes leave the rank; the rest is the rank's own, which `all_to_all_single` still
# counts.) Tensor parallelism of the same layer (every expert's f split over the ranks, Lab 3)
# assumes instead that every rank **already holds all p·T tokens** (as the activations of a TP
# group are replicated between its blocks): each rank computes its f/p slice of every expert for
# all of them and all-reduces the (p·T, h) output: p·T·h·b bytes per all-reduce, one forward and
# one backward. Bringing the tokens together first would be another collective, not counted here.
#
# The table runs **your** `moe_forward` and a TP version of the same layer, one forward and
# backward each, and lists every collective from the records (`out.comms`) beside the formula.
# Defaults: p = 2, T = 64, h = 32, E = 4, k = 2, float32.

# %% nbgrader={"grade": false, "grade_id": "traffic", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
TRAFFIC = dict(world_size=2, tokens=64, hidden=32, ffn=64, experts=4, k=2)
traffic_rows = measure_traffic(moe_forward, **TRAFFIC)
traffic = traffic_summary(traffic_rows)
print(format_wire_bytes(TRAFFIC["tokens"], TRAFFIC["hidden"], TRAFFIC["k"]))
traffic

# %% [markdown]
# Every dispatch sends exactly T·k·h·4 bytes; the combines differ between ranks by the router's
# imbalance and add up to the same total. The table counts messages: per rank, EP's four
# all-to-alls carry 4·T·k·h·b per step against TP's two all-reduces of 2·p·T·h·b. **On the wire**
# the two differ less: an all-to-all sends (p−1)/p of its message off the rank (balanced routing),
# a ring all-reduce 2(p−1)/p of its message, so per rank EP sends 4·T·k·h·b·(p−1)/p and TP
# 4·T·h·b·(p−1): EP sends **k/p of TP's bytes**, the same at k = p = 2 and less with more ranks
# (the second table above, `wire_bytes` for p = 2, 4, 8). TP also computes every token's slice of
# every expert on every rank; EP keeps each rank's tokens and each expert's weights whole and
# local, but its all-to-alls are uneven and wait for the busiest rank. Where each goes is a
# trade-off, not a rule: many setups keep the EP group inside a node's NVLink domain, where
# all-to-all is cheap; DeepSeek-V3 (arXiv:2412.19437, §3.2) runs 64-way EP across 8 nodes and
# bounds the cross-node traffic by node-limited routing (§2.1.2: each token's experts on at most
# 4 nodes).

# %% [markdown]
# ### Exercise 5 — a capacity-padded all-to-all (open design, 3 points)
#
# **Goal.** Write `padded_moe_forward(x, router, experts, num_experts, k, capacity_factor, group)`
# → `(y, keep)`: the expert-parallel layer that dispatches with **one** all-to-all and combines
# with **one**, both of a size fixed before routing, and exchanges **no counts or sizes**; and,
# within that, drops as few assignments as you can.
#
# **Contract.**
# - Arguments as `moe_forward`'s, plus the capacity factor c; C = ⌈c·T·k/E⌉ with T this rank's
#   tokens, and S = (E/p)·C: the rows this rank's send buffer holds for each destination rank.
# - `keep` (T, k) bool: the assignments kept. Every assignment Exercise 3's rule keeps (per
#   expert, the first C of this rank's assignments, first choices first, in token order) stays
#   kept; on each destination rank, itself included, at most S of this rank's tokens have a kept
#   assignment (a row carries one token; capacity bounds what each rank's experts compute).
# - `y` (T, h): $y_t = \sum_j \mathrm{gate}_{tj} \cdot \mathrm{expert}_{i_{tj}}(x_t)$ over the
#   kept assignments only; a token with none kept gets zeros (the residual carries it).
#
# **Budget**, read from every rank's record (`out.comms`): exactly two collectives, each an
# `all_to_all_single` (or `all_to_all`) of floats moving exactly p·S·h elements (E·C·h·4
# bytes); nothing else, no integers, no gather. The check runs the forward only (under
# `torch.no_grad()`) and compares `y` with the plain layer restricted to your kept assignments.
# Visible: the stored routing on 2 ranks at c = 1.0; hidden: 4 ranks with E = 8 at c = 1.25, and
# 2 ranks, top-1, at c = 1.0.
#
# **Drops, on a scale.** The bytes are fixed: with no count exchange the buffer must hold the
# worst routing. What a layout decides at that price is how many assignments it drops. Two tests
# grade the drops over all ranks: the first (2 points) wants no more than Exercise 3's rule drops
# (the design the hints below lead to); the second (1 point) no more than the *bar*, halfway from
# there to the *bound*. The bound: the S rows bound for rank d can only carry assignments on d,
# one token each, so destinations are independent; on each, the tokens holding an assignment
# Exercise 3 keeps need a row, and the rows left over cover at most the assignments of the tokens
# with the most assignments on d. No layout within the contract drops fewer. The cell below prints
# the three for the visible case; the feedback shows your drops beside them.
#
# The layout of the buffers and how a row finds its slot are yours to design.
#
# **Why it matters.** This is the layer GShard and Switch Transformer ran: a static shape and no
# synchronisation before the tokens move, paid for with padding and dropped tokens. The table
# after the tests measures both.
#
# <details><summary>Hint 1</summary>
#
# Decide what row r of a rank's send buffer means, so that sender and receiver agree without
# talking. Who needs to know which token filled a slot: the sender, the receiver, both?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The receiver need not know which token a row is, nor whether it is padding: it can run expert
# e on all of e's rows, zeros included, and send everything back in place. Only the sender maps
# (t, j) to a slot, to fill the buffer and to pick the results out of the combine.
# </details>
#
# <details><summary>Hint 3</summary>
#
# A kept assignment's slot is expert · C + its place in the expert's queue (Exercise 3's
# cumulative sum). A received buffer viewed as (p, E/p, C, h) is (source rank, local expert,
# slot). (That design meets the first test.)
# </details>
#
# <details><summary>Hint 4</summary>
#
# With Hint 3's layout, count, for one destination rank, the rows that go out as zeros while
# assignments bound for that same rank are dropped. Why can the sender not put a dropped
# assignment in one of those rows? What would the receiver need to know about a row to use it
# anyway, and does it hold anything that could tell it without a message? And a token with two
# experts on the same rank: how many rows does it need there?
# </details>

# %% nbgrader={"grade": false, "grade_id": "padded_scale", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(padded_scale())    # the visible test's drops: Exercise 3's rule (first test), the bar (second), the bound

# %% nbgrader={"grade": false, "grade_id": "padded_moe_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def padded_moe_forward(x, router, experts, num_experts, k, capacity_factor, group=None):
    """(y (T, h), keep (T, k)): one fixed-size all-to-all each way, no count exchange."""
    ### BEGIN SOLUTION
    p, me = dist.get_world_size(group), dist.get_rank(group)
    tokens, h = x.shape
    per = num_experts // p
    gates, idx = torch.softmax(router(x), dim=-1).topk(k, dim=-1)     # (T, k)
    cap = math.ceil(capacity_factor * tokens * k / num_experts)
    rows = per * cap                                                  # slots for each rank
    # Exercise 3's keep (its own copy of the rule: this cell stands alone).
    onehot = F.one_hot(idx.t().reshape(-1), num_experts)              # (k*T, E) slot-major
    place = ((onehot.cumsum(0) * onehot).sum(1) - 1).view(k, tokens).t()   # (T, k)
    first = place < cap
    # The slots bound for one rank are shared by its experts, one row per token (the receiver
    # routes the row again). A token Exercise 3 keeps there comes first; the rest, most
    # assignments on that rank first, fill the slots it leaves empty.
    dest = idx // per                                                 # (T, k) rank of each expert
    slot = torch.full((tokens, p), -1, dtype=torch.long, device=x.device)
    send = x.new_zeros(p, rows, h)
    for d in range(p):
        on_d = (dest == d).sum(1)                                     # (T,) assignments there
        must = ((dest == d) & first).any(1)
        order = sorted((t for t in range(tokens) if on_d[t]), key=lambda t: (not must[t], -on_d[t]))
        chosen = torch.tensor(order[:rows], dtype=torch.long, device=x.device)
        slot[chosen, d] = torch.arange(len(chosen), device=x.device)
        send[d, :len(chosen)] = x[chosen]
    keep = slot.gather(1, dest) >= 0                                  # (T, k)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)                   # equal splits
    recv = recv.view(p * rows, h)
    # Receiver: the router is replicated, so a row's experts and gates are its own to compute.
    r_gates, r_idx = torch.softmax(router(recv), dim=-1).topk(k, dim=-1)
    out = torch.zeros_like(recv)
    for e, expert in enumerate(experts):
        hit = r_idx == me * per + e                                   # (p*rows, k)
        at = hit.any(1).nonzero().squeeze(1)
        out = out.index_add(0, at, (r_gates * hit)[at].sum(1, keepdim=True) * expert(recv[at]))
    back = torch.empty_like(send)
    dist.all_to_all_single(back, out.view(p, rows, h), group=group)
    t, d = (slot >= 0).nonzero(as_tuple=True)
    y = x.new_zeros(tokens, h).index_add(0, t, back[d, slot[t, d]])
    return y, keep
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_padded_moe", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(check_padded_moe(padded_moe_forward))   # your drops beside Exercise 3's, the bar and the bound
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
print(check_padded_moe(padded_moe_forward, world_size=4, seed=fresh_seed(), tokens=10, hidden=128, ffn=12,
                       experts=8, k=2, capacity_factor=1.25))   # 4 ranks; c·T·k/E not whole: C rounds up
print(check_padded_moe(padded_moe_forward, world_size=2, seed=fresh_seed(), tokens=20, hidden=6, ffn=12,
                       experts=4, k=1, capacity_factor=1.0))    # top-1
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_padded_moe_bar", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
print(check_padded_moe_bar(padded_moe_forward))   # the same run, against the bar
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
print(check_padded_moe_bar(padded_moe_forward, world_size=4, seed=fresh_seed(), tokens=10, hidden=128,
                           ffn=12, experts=8, k=2, capacity_factor=1.25))   # 4 ranks, C rounds up (the first test's run)
print(check_padded_moe_bar(padded_moe_forward, world_size=2, seed=fresh_seed(), tokens=20, hidden=6,
                           ffn=12, experts=4, k=1, capacity_factor=1.0))    # top-1 (the first test's run)
### END HIDDEN TESTS

# %% [markdown]
# Your prediction beside the records: the padded layer on the traffic table's problem (section 7)
# at three capacity factors, against the dropless dispatch measured there.

# %% nbgrader={"grade": false, "grade_id": "padded_traffic", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
padded_rows = padded_traffic(padded_moe_forward, predict_all_to_all_bytes, traffic_rows, **TRAFFIC)

# %% [markdown]
# Both directions move the same fixed size on every rank, whatever the router did, and the
# received buffer needs no size from anyone. The price is in the last three columns: at c = 1.0
# the padded message equals the dropless one when E divides T·k, yet where the uneven routing
# overflows the slots, the excess is dropped; a larger c drops less and sends more zeros. A
# dropless layer pays neither, with the count exchange and buffers whose size changes every
# step.
#
# ## 8. Exercise 6 — the load-balancing loss (2 points)
#
# Nothing in the task loss keeps the router from sending most tokens to one expert; an expert that
# is chosen more gets trained more and is chosen still more. Switch Transformer (§2.2, eq. 4) adds
# an auxiliary loss
#
# $$L_\text{aux} = E \cdot \sum_i f_i \, P_i,$$
#
# with fᵢ the fraction of assignments sent to expert i (here: of the T·k, so Σ fᵢ = 1) and Pᵢ the
# mean router probability of expert i over the tokens. fᵢ is a count and has no gradient; the
# gradient flows through Pᵢ and pushes probability away from the experts that get more than their
# share. Under uniform routing $f_i = P_i = 1/E$ and $L_\text{aux} = 1$: the factor E makes the loss's scale
# independent of the number of experts.
#
# **Build** `load_balancing_loss(probs, expert_idx, num_experts)`.
#
# **Contract.** `probs` (T, E) the router's probabilities (they carry gradient), `expert_idx`
# (T, k) the chosen experts; returns $L_\text{aux}$ as a 0-dimensional tensor. The check compares the
# value and its gradient with respect to the router's logits with the course's on each rank's
# tokens (hidden: 4 ranks with E = 8, k = 2; 2 ranks, top-1 over 6 experts).
#
# **Why it matters.** Section 9 trains with your loss and without it, and measures the drops.
#
# <details><summary>Hint 1</summary>
#
# fᵢ needs the number of assignments to each of the E experts, zeros included, as a float
# tensor that autograd does not see.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Test it on a uniform router with perfectly balanced routing: it must give exactly 1, whatever
# E and k.
# </details>

# %% nbgrader={"grade": false, "grade_id": "aux_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def load_balancing_loss(probs, expert_idx, num_experts):
    """E · Σ_i f_i · P_i (Switch Transformer §2.2, eq. 4)."""
    ### BEGIN SOLUTION
    f = torch.bincount(expert_idx.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = f / expert_idx.numel()                                        # (E,) share of assignments
    return num_experts * (f * probs.mean(0)).sum()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_aux_loss", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_aux_loss(load_balancing_loss)
print("load_balancing_loss: value and gradient equal the reference")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_aux_loss(load_balancing_loss, world_size=4, seed=fresh_seed(), tokens=10, hidden=6, ffn=12, experts=8, k=2)
check_aux_loss(load_balancing_loss, world_size=2, seed=fresh_seed(), tokens=16, hidden=6, ffn=12, experts=6, k=1)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Training with and without the balancing loss
#
# A toy task whose tokens come from four clusters, each with its own target map, so four experts
# could each take one cluster. The clusters share one large direction, as real token embeddings
# share a mean, and the router starts with a preference for expert 0 along it (exaggerated, so
# that 60 steps show the effect). The block is x + MoE(x), top-1, capacity factor 1.0. Without
# the auxiliary loss, expert 0 keeps every token, its capacity holds a quarter of them, and three
# quarters pass through the residual only. With **your** `load_balancing_loss` (weight α = 0.3;
# Switch Transformer uses 0.01 over far longer training) the load spreads out and few tokens
# are dropped. The block is yours too: your `moe_forward` on one rank (every expert local, the
# all-to-alls rank to itself) and your `capacity_mask`; with top-1 routing a dropped assignment
# is its token's only one, so the kept output is the layer's output times the mask.

# %% nbgrader={"grade": false, "grade_id": "training", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
runs = compare_training(ToyTask(), aux_weight=0.3, aux_loss=load_balancing_loss,
                        capacity_mask=capacity_mask, moe_forward=moe_forward)

# %% [markdown]
# ## 10. One step on the timeline
#
# The profiler's view of one step of **your** EP layer (`moe_forward`) on 2 ranks (T = 512,
# h = 128, f = 512, E = 4, k = 2), in Lab 6's timeline: the named ranges "dispatch all-to-all"
# (from the call to the first local expert, routing and count exchange included), "experts" and
# "combine all-to-all" (from the last expert to the return), coloured, the compute, and gloo's
# all-to-alls in the communication row (the first is the count exchange). A rank whose experts got fewer tokens
# finishes its compute early and waits in the combine for the other: the load imbalance of
# section 1 becomes idle time. As in section 4, the backward holds one all-to-all, the combine's.

# %% nbgrader={"grade": false, "grade_id": "timeline", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
profile = profile_moe_step(moe_forward, world_size=2)
phase_times(profile.timeline)

# %% [markdown]
# ## Summary
#
# * An MoE layer gives each token k of E experts; expert parallelism puts E/p experts on each rank
#   and moves tokens with two all-to-alls each way, sized by a count exchange.
# * The backward of an all-to-all is the all-to-all reversed; with it the distributed layer trains
#   exactly like the plain one, and EP × DP needs only the usual gradient all-reduces: experts
#   over dp, dense weights over every rank.
# * Capacity ⌈c·T·k/E⌉ (Switch Transformer §2.2, eq. 3) bounds each expert's work at the price of
#   dropped tokens (static shapes need it; dropless GPU layers do without). Padding every
#   expert's buffer to it gives all-to-alls of a fixed size, E·C·h elements, that need no count
#   exchange; the auxiliary loss E·Σ fᵢPᵢ (Switch Transformer §2.2) keeps the load, and the
#   drops, down.
#
# The numbers this lab measured:

# %% nbgrader={"grade": false, "grade_id": "moe_closing_note", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(moe_closing_note(traffic, TRAFFIC["world_size"], TRAFFIC["tokens"], TRAFFIC["hidden"], TRAFFIC["k"],
                   mesh_run["shown"], {name: float(run["dropped"][-10:].mean())
                                       for name, run in runs.items()}))
