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
# 4. write the **load-balancing loss** of the Switch Transformer;
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

from distlab.checks.lab09 import check_aux_loss, check_capacity, check_dispatch, check_moe_layer
from distlab.labs.experts import (DispatchPlan, ToyTask, compare_training, ep_dp_step,
                                  format_wire_bytes, measure_traffic, moe_closing_note, phase_times,
                                  profile_moe_step, show_routing, traffic_summary)

# %% [markdown]
# ## 1. The layer on one process
#
# For a token x (a row of h numbers) the router computes probabilities p = softmax(W_r x) over
# the E experts and picks the k largest, i₁ … i_k. The output is the sum of those experts'
# outputs, each weighted by its probability, the **gate**:
#
# y = Σ_j p[i_j] · expert_{i_j}(x).
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
# equal. Section 6 measures the consequences, section 7 fixes them.
#
# ## 2. Exercise 1 — dispatch (3 points)
#
# Each rank has its tokens x (T, h) and their chosen experts `expert_idx` (T, k). Assignment
# (t, j) — token t's j-th choice — has the flat index t·k + j. Dispatch in three steps:
#
# 1. **Sort** the T·k assignments by expert, stably (`torch.argsort(..., stable=True)`): the
#    blocks for ranks 0, 1, …, p−1 then follow each other, and inside each block the
#    destination's experts. `order` is that permutation of flat indices.
# 2. **Exchange counts.** Count the assignments per expert (`torch.bincount`, E numbers) and send
#    rank d the E/p counts of its experts with one `all_to_all_single` of the (E,) tensor. What
#    comes back, viewed as (p, E/p), says how many rows each source rank will send you for each
#    of your experts. Without it no rank could size its receive buffer.
# 3. **Send the tokens** with one `dist.all_to_all_single(output, input, output_split_sizes,
#    input_split_sizes)`: `input` is `x[order // k]` (T·k, h), `input_split_sizes` the rows for
#    each destination (`send_splits`), `output_split_sizes` the rows from each source
#    (`recv_splits`).
#
# What rank r receives is ordered by source rank, then local expert, then the source's flat index.
# Return `(recv, plan)` with `plan = DispatchPlan(order, send_splits, recv_splits, recv_expert)`:
# the splits as lists of p ints, `recv_expert` the local expert (0 … E/p−1) of each received row
# (`torch.repeat_interleave` of the local expert ids by the received counts).
#
# An all-gather of every rank's tokens would give each rank what it needs too, but it sends every
# token to every rank: the gathered p·T rows against the T·k an all-to-all sends, p/k times the
# bytes, and memory that grows with p. The check reads the
# collective record (`out.comms`) and accepts the count exchange and **one** token all-to-all.

# %% nbgrader={"grade": false, "grade_id": "dispatch", "locked": false, "schema_version": 3, "solution": true, "task": false}
def plan_dispatch(expert_idx, num_experts, group=None):
    """Sort this rank's assignments by expert and exchange per-expert counts -> DispatchPlan."""
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
check_dispatch(dispatch, world_size=4, seed=fresh_seed(), tokens=10, hidden=6, ffn=12, experts=8, k=2)
check_dispatch(dispatch, world_size=2, seed=fresh_seed(), tokens=9, hidden=6, ffn=12, experts=6, k=1)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 2 — combine, forward and backward (4 points)
#
# After the local experts ran on the received rows, the results go back where they came from: the
# same all-to-all with the splits swapped (send `recv_splits`, receive `send_splits`). Each row
# then returns to its slot (t, j) — `order` says which — and the slots are weighted by their
# gates and summed over j.
#
# For training, autograd must know that the gradient of a row received from rank s belongs on rank
# s: **the backward of an all-to-all is the reverse all-to-all**. Write it as
# `AllToAll.apply(x, out_splits, in_splits, group)`: forward `all_to_all_single` receiving
# `out_splits` and sending `in_splits`, backward the same with the two swapped (`backward`
# returns one gradient per forward input: `(grad_x, None, None, None)`).
#
# Then `moe_forward(x, router, experts, num_experts, k, group)`: the router is the (replicated)
# `nn.Linear(h, E)`, `experts` this rank's E/p expert modules. Route (softmax, top-k), plan with
# your `plan_dispatch`, send `x[order // k]` with `AllToAll`, run each local expert on its rows,
# send the results back with `AllToAll`, put them in their slots (`index_copy` into a zero
# (T·k, h) tensor), weight by the gates, sum over k. Four token all-to-alls per step: two
# forward, two backward (plus the small count exchange). The check compares outputs, input
# gradients and every expert's gradient with the plain layer on all p·T tokens, and the router's
# gradients summed over the ranks (each rank's router sees only its own tokens; in training a DP
# all-reduce sums them, section 5).
#
# **A rank whose experts get no tokens** must still take part in both all-to-alls of the
# backward, or every other rank waits in them forever. Autograd calls `AllToAll.backward` only
# for outputs that lie in the graph, so run every local expert even on zero rows
# (`expert(recv[rows])` with `rows` empty): its empty output keeps the combine in the graph.
# A hidden test routes so that this happens.

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
check_moe_layer(moe_forward, world_size=4, seed=fresh_seed(), tokens=10, hidden=6, ffn=12, experts=8, k=2)
check_moe_layer(moe_forward, world_size=4, seed=fresh_seed(), tokens=7, hidden=6, ffn=12, experts=4, k=1,
                starve=True)   # top-1; rank 3's experts get no token: it must still join the backward
### END HIDDEN TESTS

# %% [markdown]
# ## 4. What expert parallelism sends
#
# Per layer and rank, the dispatch sends the rank's T·k assignments, T·k·h·b bytes (b bytes per
# element), and the combine sends back what the rank received, which is T·k·h·b on average over
# the ranks; the backward repeats both. (GShard dispatches and combines with the same two
# all-to-alls. Under balanced routing (p−1)/p of the bytes leave the rank; the rest is the rank's
# own, which all_to_all_single still counts.) Tensor parallelism of the same layer
# (every expert's f split over the ranks, Lab 3) assumes instead that every rank **already holds
# all p·T tokens** (as the activations of a TP group are replicated between its blocks): each rank
# computes its f/p slice of every expert for all of them and all-reduces the (p·T, h) output:
# p·T·h·b bytes per all-reduce, one forward and one backward. Bringing the tokens together first
# would be another collective, not counted here.
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
#
# ## 5. EP × DP on a 2 × 2 mesh
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
# ## 6. Exercise 3 — capacity (2 points)
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
# T·k assignments spread over E experts, times a margin c (Switch Transformer trains with 1.0 to 2.0).
# Assignments beyond an expert's capacity are **dropped**: they contribute nothing, and a token
# whose every assignment is dropped leaves the block through the residual connection unchanged.
# Who is dropped: fill each expert with every token's *first* choice in token order, then the
# second choices (GShard's Algorithm 1 fills top-1 before top-2).
#
# Write `expert_capacity(tokens, k, num_experts, capacity_factor)` and
# `capacity_mask(expert_idx, num_experts, capacity_factor)` → `(keep, dropped_fraction)`: `keep`
# (T, k) booleans, `dropped_fraction` the share of the T·k assignments dropped (a float). Each
# rank applies it to its own tokens. Hint: in slot-major order (`expert_idx.t().reshape(-1)`), an
# assignment's place in its expert's queue is a cumulative sum of one-hot rows.

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
# ## 7. Exercise 4 — the load-balancing loss (2 points)
#
# Nothing in the task loss keeps the router from sending most tokens to one expert; an expert that
# is chosen more gets trained more and is chosen still more. Switch Transformer (§2.2, eq. 4) adds
# an auxiliary loss
#
# L_aux = E · Σᵢ fᵢ · Pᵢ,
#
# with fᵢ the fraction of assignments sent to expert i (here: of the T·k, so Σ fᵢ = 1) and Pᵢ the
# mean router probability of expert i over the tokens. fᵢ is a count and has no gradient; the
# gradient flows through Pᵢ and pushes probability away from the experts that get more than their
# share. Under uniform routing fᵢ = Pᵢ = 1/E and L_aux = 1: the factor E makes the loss's scale
# independent of the number of experts. Write `load_balancing_loss(probs, expert_idx,
# num_experts)` for probs (T, E) and expert_idx (T, k), returning a 0-dimensional tensor.

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
# ## 8. Training with and without the balancing loss
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
# ## 9. One step on the timeline
#
# The profiler's view of one step of **your** EP layer (`moe_forward`) on 2 ranks (T = 512,
# h = 128, f = 512, E = 4, k = 2), in Lab 6's timeline: the named ranges "dispatch all-to-all"
# (from the call to the first local expert, routing and count exchange included), "experts" and
# "combine all-to-all" (from the last expert to the return), coloured, the compute, and gloo's
# all-to-alls in the communication row (the first is the count exchange). A rank whose experts got fewer tokens
# finishes its compute early and waits in the combine for the other: the load imbalance of
# section 1 becomes idle time. As in section 5, the backward holds one all-to-all, the combine's.

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
#   dropped tokens (static shapes need it; dropless GPU layers do without); the
#   auxiliary loss E·Σ fᵢPᵢ (Switch Transformer §2.2) keeps the load, and the drops, down.
#
# The numbers this lab measured:

# %% nbgrader={"grade": false, "grade_id": "moe_closing_note", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(moe_closing_note(traffic, TRAFFIC["world_size"], TRAFFIC["tokens"], TRAFFIC["hidden"], TRAFFIC["k"],
                   mesh_run["max_diff"], {name: float(run["dropped"][-10:].mean())
                                          for name, run in runs.items()}))
