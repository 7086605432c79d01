# ---
# jupyter:
#   distlab:
#     summary: "The sequence itself sharded over ranks: merging partial attention by log-sum-exp, ring attention forward and backward, a balanced causal split, and DeepSpeed-Ulysses's all-to-alls."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 10 — Context parallelism
#
# Every parallelism so far split the batch, the weights or the layers; each rank still saw whole
# sequences. Long-context training runs out of memory along the one axis left: the **sequence**.
# The activations a transformer layer keeps for its backward grow linearly with the sequence
# length s (Korthikanti et al., 2022, arXiv 2205.05198, §4.1: s·b·h·(34 + 5·a·s/h) bytes per
# layer for batch b, hidden size h and a heads; the quadratic 5·a·s/h term is the attention
# scores, which FlashAttention (Dao et al., 2022) never stores, but the linear term stays).
# Tensor parallelism with sequence parallelism (Lab 3) divides them by its degree t, but t stays
# inside one node. **Context parallelism** (CP) gives each of p ranks s/p of every sequence's
# tokens, and so s/p of its activations, on any number of nodes. Llama 3 trains its final
# long-context stage this way (Dubey et al., 2024, arXiv 2407.21783, §3.3.2 and Table 4).
#
# Almost every layer of a transformer acts on each token alone (the MLP, the norms, the
# projections): on s/p tokens it needs nothing from the other ranks. **Attention is the one layer
# that mixes tokens**: a query needs every key and value of the sequence. This lab is about
# computing exact attention when no rank holds all of them.
#
# In this lab you:
#
# 1. **merge** two partial attention results through their log-sum-exps (the online softmax);
# 2. write **ring attention**'s forward: K/V blocks travel around a ring of ranks, the next one in
#    flight while the current one computes (Liu et al., 2023, arXiv 2310.01889);
# 3. write its **backward**: dK and dV travel the ring too and come home;
# 4. predict what a contiguous causal split costs a ring, then design a **causal split** that
#    shortens the ring's critical path (open design, graded on a scale);
# 5. write **DeepSpeed-Ulysses**: an all-to-all from sequence shards to head shards and back
#    (Jacobs et al., 2023, arXiv 2309.14509);
#
# and measure what each sends and holds.
#
# **Notation.** Batch b, heads h, sequence length s, head dimension d, p ranks; every tensor is
# (b, h, tokens, d), float64 in the checks. Rank r holds the tokens at global positions
# `positions[r]`, a row of a (p, s/p) table that every rank knows (by default the contiguous
# split: positions [r·s/p, (r+1)·s/p)). `block_attention(q, k, v, q_pos, k_pos)` from
# `distlab.labs.context` is attention of q over *these* keys only and returns `(out, lse)`; it
# is causal when positions are given (query i sees key j when `k_pos[j] <= q_pos[i]`), and a
# query that sees none of the keys gets out = 0 and lse = −∞.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch
import torch.distributed as dist

from distlab.checks.lab10 import (check_causal_layout, check_merge, check_ring_backward,
                                  check_ring_forward, check_ulysses)
from distlab.labs.context import (block_attention, causal_mask, ring_gradients, ring_with_layout,
                                  work_table)
from distlab.labs.context.layout import contiguous_layout
from distlab.labs.tables import format_table

# %% [markdown]
# ## 1. Exercise 1 — merging partial attention (2 points)
#
# For one query with scores $z_j = q \cdot k_j / \sqrt{d}$ over keys $j$, attention is
# $\mathrm{out} = \sum_j \mathrm{softmax}(z)_j \, v_j$. Split the keys into two disjoint blocks A
# and B. Attention over A alone gives $\mathrm{out}_A$ and its **log-sum-exp**
# $\mathrm{lse}_A = \log \sum_{j \in A} e^{z_j}$; the same for B. The two partial results hold
# everything needed for the whole row: the softmax over $A \cup B$ is the softmax over A reweighted
# by $e^{\mathrm{lse}_A} / (e^{\mathrm{lse}_A} + e^{\mathrm{lse}_B})$. This is the **online
# softmax** (Milakov & Gimelshein, 2018, arXiv 1805.02867), the identity FlashAttention (Dao et
# al., 2022, arXiv 2205.14135, §3.1) and every ring-attention kernel is built on.
#
# **Build** `merge_partials(out_a, lse_a, out_b, lse_b) -> (out, lse)`.
#
# **Contract.** Inputs: `out_a`, `out_b` $(b, h, s_q, d)$ and `lse_a`, `lse_b` $(b, h, s_q)$,
# attention of the same queries over two disjoint key blocks. Output: attention over both blocks,
# out $(b, h, s_q, d)$ and lse $(b, h, s_q)$. A query that sees no key of a block has lse = −∞
# and out = 0 there; one that sees no key of either must come out as lse = −∞, out = 0 (not nan).
# No collective.
# The check compares out and lse with attention over the union of the blocks on three cases:
# causal halves (fully masked rows in one block), two blocks fully masked for half the queries,
# and **large logits**, scores up to 1000, where exp overflows even in float64.
#
# **Why it matters.** A rank that holds one block of keys at a time can only ever produce partial
# results; this merge is what makes p partial results one exact answer, in any order, without
# holding a score matrix for the whole sequence.
#
# <details><summary>Hint 1</summary>
#
# $\mathrm{lse} = \log(e^{\mathrm{lse}_a} + e^{\mathrm{lse}_b})$, and out is the average of
# $\mathrm{out}_a$ and $\mathrm{out}_b$ weighted by $e^{\mathrm{lse}_a - \mathrm{lse}}$ and
# $e^{\mathrm{lse}_b - \mathrm{lse}}$. Now make it survive $e^{1000}$.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Subtract $m = \max(\mathrm{lse}_a, \mathrm{lse}_b)$ before exponentiating: the weights become
# $e^{\mathrm{lse}_a - m}$ and $e^{\mathrm{lse}_b - m}$, at most 1. Where m is −∞ (both blocks
# masked) use 0 for m instead, so that no −∞ − (−∞) appears; divide only where the sum of the
# weights is positive.
# </details>

# %% nbgrader={"grade": false, "grade_id": "merge", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_partials(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key blocks from each block's (out, lse)."""
    ### BEGIN SOLUTION
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both masked: any finite m
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)             # (b, h, s_q), at most 1
    total = w_a + w_b
    lse = m + torch.log(total)                                        # -inf where total == 0
    total = torch.where(total > 0, total, torch.ones_like(total))
    return (w_a[..., None] * out_a + w_b[..., None] * out_b) / total[..., None], lse
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_merge", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_merge(merge_partials)
print("merge_partials: out and lse equal attention over both blocks on the visible cases, masked rows and large logits included")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_merge(merge_partials, seed=fresh_seed(), batch=1, heads=3, seq=24, dim=8)
check_merge(merge_partials, seed=fresh_seed(), batch=2, heads=2, seq=12, dim=4)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The ring, and what it sends
#
# Arrange the p ranks in a ring. Each starts with its own K/V block; at every step it computes
# its queries against the block it holds, merges the result into its running (out, lse), and
# passes the block to its right neighbour while receiving the left one's, until every rank has
# seen every block. The transfer of the next block runs while the current one computes (Ring
# Attention, Liu et al., 2023, §3): if a block's compute takes longer than its transfer, the
# communication costs no time at all.
#
# Real models differ from the blocks of the checks in one respect: Llama 3 405B has 128 query
# heads but only **8 key/value heads** of 128 dimensions (grouped-query attention, Llama 3 paper,
# arXiv 2407.21783, Table 3): each K/V head serves 16 query heads.
#
# ### Prediction — the ring's bytes (2 points)
#
# **Build** `predict_ring_bytes(seq_len, world_size, q_heads, kv_heads, head_dim, batch,
# itemsize)`: the bytes one rank sends in one ring-attention forward, for a model with `q_heads`
# query heads and `kv_heads` key/value heads, before you write the ring and before the cell that
# measures it.
#
# **Contract.** Every argument is an int; `seq_len` is divisible by `world_size`; return a
# number of bytes. The check compares it with the formula on the sizes measured after Exercise 2,
# on the K/V of Llama 3 405B's 128K stage (8 K/V heads of 128 dimensions, CP 16, bf16) and on an
# odd case (hidden: sizes drawn afresh); the measurement after Exercise 2 prints your prediction
# beside the bytes of every rank's `isend`s in `out.comms`.
#
# **Why it matters.** A volume you can predict is a volume you can plan: the planner at the end
# of this lab charges context parallelism by such a formula.
#
# <details><summary>Hint 1</summary>
#
# Which of q, k and v travel around the ring, and which stay home? How many heads does each have?
# </details>
#
# <details><summary>Hint 2</summary>
#
# One block first: how many elements does a K block of s/p tokens hold? Per step a rank sends
# two blocks (K and V, stacked or not); which steps need to send at all?
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_ring_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_ring_bytes(seq_len, world_size, q_heads, kv_heads, head_dim, batch, itemsize):
    """Bytes one rank sends in one ring-attention forward."""
    ### BEGIN SOLUTION
    # only K and V travel: (b, h_kv, s/p, d) each; the queries stay on their rank
    block = batch * kv_heads * (seq_len // world_size) * head_dim * itemsize
    return (world_size - 1) * 2 * block
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_ring_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab10 import check_ring_bytes_prediction
check_ring_bytes_prediction(predict_ring_bytes)
print("predict_ring_bytes: the formula's bytes on the visible cases")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_ring_bytes_prediction(predict_ring_bytes, seed=fresh_seed())   # sizes drawn afresh
### END HIDDEN TESTS

# %% [markdown]
# ## Exercise 2 — ring attention, forward (4 points)
#
# Now write the ring of the prediction above.
#
# **Build** `ring_attention(q, k, v, positions=None, group=None) -> (out, lse)`.
#
# **Contract.** Inputs: this rank's q, k, v (b, h, s/p, d); `positions` None (not causal) or the
# (p, s/p) table of every rank's global positions (causal: query i sees key j when
# $\mathrm{pos}_j \le \mathrm{pos}_i$; the block that came from rank r has positions `positions[r]`). Output: out
# (b, h, s/p, d) and lse (b, h, s/p) of this rank's queries over the **whole** sequence.
# Allowed: `dist.isend` / `dist.irecv` (or `dist.batch_isend_irecv`) only, each rank sending to
# rank (r+1) mod p and receiving from (r−1) mod p. The check reads the collective record
# (`out.comms`): per rank and forward, exactly (p−1)·2·B bytes sent, your prediction's count
# (B = b·(s/p)·h·d·8 bytes, one K block in float64: K and V, p−1 times), all to the right
# neighbour. It also watches every tensor your function makes: none may be larger than a score
# block (b·h·(s/p)² elements) or a
# stacked K/V block (2·b·h·(s/p)·d), so no rank ever holds the scores of a whole row; and
# whenever a receive starts, the receive buffers still alive may hold at most two K/V blocks
# (2·2·B bytes: the block being computed and the one arriving), besides the rank's own.
# It runs not causal, causal on the contiguous split, and causal on a random permutation of the
# positions (any split must work; exercise 4 needs that).
#
# **Why it matters.** Memory per rank stays that of s/p tokens whatever s is, and each step's
# transfer can hide behind a block of compute: p ranks attend over p times the context.
#
# <details><summary>Hint 1</summary>
#
# Write a small `exchange(tensor, right, left, group)` that *starts* sending `tensor` to `right`
# and receiving a buffer of the same shape from `left`, and returns the buffer and the requests
# (`dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])`). With a
# group, peers are global ranks: `dist.get_global_rank(group, r)`.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Stack K and V into one (2, b, h, s/p, d) tensor: one message per step. At step t (0 … p−1),
# rank r holds the block of rank (r − t) mod p. Start the exchange of that block *before*
# computing on it (except at the last step), compute, then wait and swap in the received one.
# A finished request still holds the tensors it sent or received until you drop it: let go of
# the requests once waited for, or the previous block stays alive.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Each step: `block_attention(q, kv[0], kv[1], positions[r], positions[src])` (or no positions
# when not causal), then `merge_partials` into the running result.
# </details>

# %% nbgrader={"grade": false, "grade_id": "ring_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def exchange(tensor, right, left, group=None):
    """Start sending `tensor` to `right` and receiving one like it from `left`: (buffer, requests)."""
    ### BEGIN SOLUTION
    buffer = torch.empty_like(tensor)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, right, group),
                                       dist.P2POp(dist.irecv, buffer, left, group)])
    return buffer, requests
    ### END SOLUTION


def ring_attention(q, k, v, positions=None, group=None):
    """This rank's (out, lse) of attention of its queries over every rank's keys."""
    ### BEGIN SOLUTION
    p, me = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    right, left = peer((me + 1) % p), peer((me - 1) % p)
    kv = torch.stack([k, v])                                          # (2, b, h, s/p, d)
    out = lse = None
    for step in range(p):
        if step < p - 1:
            incoming, requests = exchange(kv, right, left, group)     # the next block in flight
        src = (me - step) % p                                         # whose block kv is
        block = (block_attention(q, kv[0], kv[1]) if positions is None else
                 block_attention(q, kv[0], kv[1], positions[me], positions[src]))
        out, lse = block if out is None else merge_partials(out, lse, *block)
        if step < p - 1:
            for request in requests:
                request.wait()
            kv, requests = incoming, None   # a finished request still holds the block it sent
    return out, lse
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_ring_forward", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_ring_forward(ring_attention)
check_ring_forward(ring_attention, world_size=4)   # the same sequence over 4 ranks
print("ring_attention: every rank's out and lse equal plain attention; K/V went around the ring once")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_ring_forward(ring_attention, world_size=4, seed=fresh_seed(), batch=1, heads=2, seq=32, dim=16)   # 2 KiB blocks: more than the record's slack
check_ring_forward(ring_attention, world_size=2, seed=fresh_seed(), batch=1, heads=3, seq=20, dim=4)
### END HIDDEN TESTS

# %% [markdown]
# ## What a ring forward sends, predicted and measured
#
# **The ring.** At each of the first p−1 steps a rank passes the blocks it holds to its right
# neighbour; at the last step it keeps them (every rank has then seen all p blocks), and every
# rank sends the same (Liu et al., 2023, §3).
#
# **The all-gather (Llama 3).** Llama 3's long-context stage does not use a ring: every rank
# all-gathers K and V of the whole sequence, then attends for its own queries (Llama 3 paper,
# arXiv 2407.21783, §3.3.2). The course's `allgather_attention` (in
# `distlab.labs.context.traffic`) does exactly that with two `all_gather`s. An all-gather of p
# blocks hands each rank the p−1 blocks it lacks: it *receives* (p−1)/p of the gathered
# s·h·d·b·i bytes, for K and for V, 2·(p−1)/p·s·h·d·b·i bytes in all. The record counts the whole
# gathered buffer (nccl-tests' convention, Lab 1), so the table below takes (p−1)/p of it.
#
# One forward of your `ring_attention` and of the course's `allgather_attention` on 2 and 4 ranks
# (float32, b = 2, h = 4, d = 8, s/p from 8 to 32 tokens), each rank's bytes read from its
# record: the ring's `isend`s (formula: your prediction), (p−1)/p of the all-gathers' buffers.

# %% nbgrader={"grade": false, "grade_id": "ring_bytes", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.traffic import bytes_table, measure_bytes
byte_rows = measure_bytes(ring_attention, None, ring_formula=predict_ring_bytes,
                          methods=("ring", "all-gather"))
print(bytes_table(byte_rows))

# %% [markdown]
# The two columns agree on every rank, and the ring and the all-gather move **the same bytes**:
# (p−1)·2·(s/p) = 2·(p−1)/p·s. The ring's advantage is not volume. It is that no rank ever holds
# more than two K/V blocks, and that each block's transfer can run while the previous block
# computes. It hides when a step's compute, 4·(s/p)²·h·d FLOPs for a full block (q·kᵀ and the
# weights times v, 2·(s/p)²·d each per head), takes longer than its transfer, 2·(s/p)·h·d·i bytes:
# their ratio, 2·(s/p)·β/(F·i) at F FLOP/s and β bytes/s of link bandwidth, grows with s/p. The
# transfer hides from s/p = F·i/(2β) tokens on: in bf16 (i = 2), a block of F/β tokens, Liu et
# al.'s condition (§3). Under a causal mask a block is not full: a split that balances the ring's
# steps (section 4) gives each step half the score pairs of a full block, half the compute
# against the same transfer, and the crossover **doubles**, to F·i/β. The table puts numbers on
# that causal case for the H100s of Lab 7 (`H100_16x8`: 989 TFLOP/s at the course's 40% kernel
# efficiency, 450 GB/s over NVLink, 50 GB/s between nodes), one layer of 128 heads of 128
# dimensions.

# %% nbgrader={"grade": false, "grade_id": "ring_overlap", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.traffic import ring_overlap_table
from distlab.labs.planning import H100_16x8
print(ring_overlap_table(H100_16x8))

# %% [markdown]
# Inside a node the causal ring hides its transfers from about 1,760 tokens per rank on; between
# nodes it needs about 15,800, since the network is 9 times slower. Llama 3's CP 16 gives each
# rank 8,192 tokens of a 128K sequence: about half the crossover between nodes, well below it, so
# a ring with as many K/V heads as query heads would wait on the network there. Grouped-query
# attention changes the balance (your prediction's Llama case): with 8 K/V heads for 128 query
# heads, K and V are 16 times smaller than Q and the transfer 16 times cheaper against the same
# compute (the crossover between nodes falls to about 990 tokens); that is why Llama 3 can afford
# an all-gather, which does not overlap, and gains masks of any shape for it (§3.3.2).

# %% [markdown]
# ## 3. Exercise 3 — ring attention, backward (4 points)
#
# Training needs dQ, dK and dV. With the forward's out and lse kept, the backward of one key
# block needs only that block (FlashAttention's backward, Dao et al., 2022, Algorithm 4): with
# S = q kᵀ/√d masked, P = exp(S − lse) and δ = rowsum(dout ∘ out),
#
# dV = Pᵀ·dout,  dP = dout·vᵀ,  dS = P ∘ (dP − δ),  dQ = dS·k/√d,  dK = dSᵀ·q/√d.
#
# dQ collects a term from every block and stays on the rank. dK and dV of a block collect a term
# from **every rank's queries**, so they must travel: around the ring with their K and V,
# and home to the rank that owns the block at the end.
#
# **Build** `ring_attention_backward(dout, q, k, v, out, lse, positions=None, group=None) ->
# (dq, dk, dv)`.
#
# **Contract.** Inputs: this rank's dout, q, k, v, out (b, h, s/p, d) and lse (b, h, s/p) (the
# forward's results, as your forward returns them), positions as in exercise 2. Output: dq, dk, dv
# (b, h, s/p, d), the gradients of this rank's own tokens, equal to plain attention's. Allowed:
# isend/irecv to (r+1) mod p, from (r−1) mod p. The record must show K/V sent p−1 times and dK/dV
# p−1 or p times: between 4(p−1)·B and (4p−2)·B bytes sent per rank in all.
#
# **Why it matters.** A gradient left on the wrong rank trains the wrong tokens' weights silently:
# nothing crashes. (To train with it, wrap your forward and backward in a
# `torch.autograd.Function`: forward saves q, k, v, out, lse; backward calls this.)
#
# <details><summary>Hint 1</summary>
#
# Write the block gradients first, as a function of (`dout, q, k_block, v_block, lse, delta, masks`);
# check it on one rank against `torch.autograd.grad` of your own block computation.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Carry a zero (2, b, h, s/p, d) accumulator for dK/dV beside K/V. At step t rank r holds block
# (r − t) mod p and its accumulator: add this rank's terms, pass both right.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Count the hops: the accumulator of block j starts on rank j; after the step p−1 compute it sits
# on rank j − 1. One more exchange of the accumulators (not of K/V) brings each home.
# </details>

# %% nbgrader={"grade": false, "grade_id": "ring_backward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def block_gradients(dout, q, k, v, lse, delta, q_pos=None, k_pos=None):
    """(dq, dk, dv) of one key block, from the whole row's lse and delta = rowsum(dout * out)."""
    ### BEGIN SOLUTION
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale                          # (b, h, s_q, s_k)
    if q_pos is not None:
        scores = scores.masked_fill(~causal_mask(q_pos, k_pos), float("-inf"))
    finite_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores - finite_lse[..., None])                 # 0 where masked
    dscores = probs * (dout @ v.transpose(-2, -1) - delta[..., None]) * scale
    return dscores @ k, dscores.transpose(-2, -1) @ q, probs.transpose(-2, -1) @ dout
    ### END SOLUTION


def ring_attention_backward(dout, q, k, v, out, lse, positions=None, group=None):
    """(dq, dk, dv) of this rank's tokens; dK/dV travel the ring with K/V and come home."""
    ### BEGIN SOLUTION
    p, me = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    right, left = peer((me + 1) % p), peer((me - 1) % p)
    delta = (dout * out).sum(-1)                                      # (b, h, s/p)
    kv = torch.stack([k, v])                                          # (2, b, h, s/p, d)
    dkv = torch.zeros_like(kv)                                        # the travelling dK, dV
    dq = torch.zeros_like(q)
    for step in range(p):
        if step < p - 1:
            incoming, requests = exchange(kv, right, left, group)     # K/V in flight
        src = (me - step) % p
        pos = (None, None) if positions is None else (positions[me], positions[src])
        dq_part, dk_part, dv_part = block_gradients(dout, q, kv[0], kv[1], lse, delta, *pos)
        dq = dq + dq_part
        dkv, grad_requests = exchange(dkv + torch.stack([dk_part, dv_part]), right, left, group)
        for request in grad_requests + (requests if step < p - 1 else []):
            request.wait()
        if step < p - 1:
            kv = incoming
    return dq, dkv[0], dkv[1]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_ring_backward", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_ring_backward(ring_attention_backward)
print("ring_attention_backward: dq, dk, dv equal plain attention's on every rank; dK/dV came home")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_ring_backward(ring_attention_backward, world_size=4, seed=fresh_seed(), batch=1, heads=2, seq=32, dim=16)   # 2 KiB blocks: more than the record's slack
check_ring_backward(ring_attention_backward, world_size=2, seed=fresh_seed(), batch=1, heads=3, seq=20, dim=4)
### END HIDDEN TESTS

# %% [markdown]
# **Training through your ring.** `RingAttentionFunction` (in `distlab.labs.context.demos`) is
# the `torch.autograd.Function` of the note above: its forward calls your `ring_attention`, its
# backward your `ring_attention_backward`. Below, one attention layer on 2 ranks: each rank
# projects its own tokens to q, k, v with the same weight W (replicated over the CP ranks, as over
# data-parallel ones), runs causal ring attention, and backpropagates. Each rank's dL/dW holds
# only its own queries' terms, so the ranks all-reduce it (a sum), exactly as data parallelism
# does; the result is compared with plain attention's dL/dW on one process (stored).

# %% nbgrader={"grade": false, "grade_id": "ring_gradients", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
ring_gradients(ring_attention, ring_attention_backward);

# %% [markdown]
# ## 4. Balance on the ring's critical path
#
# Under causal attention a token at position i attends to i + 1 keys: late tokens cost more than
# early ones. In the ring, at step t rank r computes its queries against the block of rank
# (r − t) mod p, and the ranks move from step to step together: each step's exchange ties every
# rank to its neighbours, and no rank holds more than the block it computes and the one arriving
# (Exercise 2's contract), so none can run ahead. **Every step lasts as long as its slowest
# rank's block**, and the ring's time is its **critical path**: over the p steps, the largest
# block work of the step (in (query, key) score pairs), summed.
#
# **The bound.** At each step the largest block is at least the step's mean over the p ranks, and
# the means of the p steps add up to all the score pairs of the sequence divided by p. So no split
# does better than the **ideal**, $s(s+1)/2$ pairs spread evenly: $s(s+1)/(2p)$. The
# **penalty** of a split is its critical path over the ideal (1 at best).
# `distlab.labs.context.layout` counts them for any `positions`: `critical_path`, `ideal_path`,
# `penalty`, and `steps_table` (each rank's block work at each step).
#
# ### Prediction — the contiguous split's penalty (1 point)
#
# **Build** `predict_contiguous_penalty(world_size)`: the penalty of the contiguous split (rank r
# holds positions [r·s/p, (r+1)·s/p)) on p = `world_size` ranks, for a long sequence (s/p large),
# before the cell that counts it.
#
# **Contract.** `world_size` is an int ≥ 2; return a number. The check compares it with the
# layouts' own count as s/p grows, at p = 2, 4 and 8 (hidden: other p); the cell after it prints
# your prediction beside the count.
#
# **Why it matters.** The penalty is what a ring pays for an unbalanced split: the time of the
# attention layer, step after step.
#
# <details><summary>Hint 1</summary>
#
# At step 0 every rank computes its queries against its own block: how many score pairs is that,
# in units of (s/p)², for s/p large? At a later step, which ranks hold a block of earlier
# positions than their own, and what does such a block cost?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The ideal in the same units: all $s(s+1)/2 \approx s^2/2$ pairs over p ranks, with s = p·(s/p).
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_contiguous_penalty", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_contiguous_penalty(world_size):
    """The contiguous split's critical path over the ideal, for long sequences."""
    ### BEGIN SOLUTION
    # step 0: a half-full diagonal block; each later step: some rank has a full earlier block
    return (0.5 + (world_size - 1)) / (world_size / 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_contiguous_penalty", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab10 import check_penalty_prediction
check_penalty_prediction(predict_contiguous_penalty)
print("predict_contiguous_penalty: the layouts' count on the visible cases")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_penalty_prediction(predict_contiguous_penalty, seed=fresh_seed())   # other world sizes
### END HIDDEN TESTS

# %% [markdown]
# The contiguous split on 4 ranks (s = 64), step by step: each rank's block work and the step's
# slowest; then the contiguous split at p = 2, 4 and 8 with s/p = 1,024 tokens: the max/min of
# the ranks' total work, the critical path against the ideal, and your prediction.

# %% nbgrader={"grade": false, "grade_id": "contiguous_work", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.layout import penalty_table, steps_table
print(format_table(steps_table(contiguous_layout(64, 4))))
print()
print(format_table(penalty_table(contiguous_layout, predict_contiguous_penalty)))

# %% [markdown]
# Rank p−1 does about 2p−1 times rank 0's work in all (the max/min column), yet the ring takes
# only about 2 − 1/p times the ideal (1.75 at p = 4): a ring waits for the slowest block of each
# step, not for the busiest rank's total. At step 0 every rank computes a half-full diagonal
# block; at every later step some rank holds a full block of earlier positions, (s/p)² pairs:
# $(1/2 + (p-1))(s/p)^2$ against the ideal's $(p/2)(s/p)^2$. The steps table shows it: the
# slowest of every step after the first is a full block, while rank 0 sits idle.
#
# ## Exercise 4 — a causal split for the ring (open design, 2 + 1 points)
#
# **Goal.** Write `causal_layout(seq_len, world_size) -> positions`: any assignment of the s
# positions to the p ranks you like, with as short a critical path as you can make it.
#
# **Contract.** Input: s and p (the checks use s divisible by 2p). Output: a (p, s/p) integer
# tensor in which every position 0 … s−1 appears exactly once. Graded on a scale; each test
# prints your critical path beside the hinted design's (Hint 2), the bar and the bound:
#
# - `test_causal_layout` (2 points): a critical path at most the hinted design's, for p = 2
#   (s = 64, visible) and p = 2, 4, 8 at other lengths (hidden);
# - `test_causal_layout_better` (1 point): at most the **bar**, halfway from the hinted design's
#   critical path to the bound (the ideal), for p = 4 (s = 64, visible) and p = 4, 8 at other
#   lengths (hidden).
#
# Your ring attention must then give plain causal attention on your layout: the cell after the
# checks runs it on 4 ranks.
#
# **Why it matters.** Balance is speed: at every step the ring waits for its slowest rank, and a
# long-context job runs the ring in every layer. There is more than one good answer; the checks
# grade the critical path, not the method.
#
# <details><summary>Hint 1</summary>
#
# Which positions are cheap, and which expensive? How could every rank hold as many of each?
# </details>
#
# <details><summary>Hint 2</summary>
#
# Deal the positions out like cards: rank r takes r, r + p, r + 2p, … (Striped Attention, Brandon
# et al., 2023, arXiv 2311.09431). Its penalty is 1 + (p − 1)/(s + 1): at the lab's demo size
# (s = 64, p = 4) 1.046 on the critical path (1.097 by each rank's total work, max/min). It
# balances as s grows: within 5% of the ideal once s + 1 ≥ 20·(p − 1) (s ≥ 59 at p = 4, s ≥ 139
# at p = 8). It meets the first test, not the second.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Print `steps_table` of the dealt layout. At a step, what makes one rank's block cost more than
# another's? Could the blocks of every two *different* ranks cost the same, leaving the unequal
# part to the one step where every rank computes its own block?
# </details>

# %% nbgrader={"grade": false, "grade_id": "causal_layout", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_layout(seq_len, world_size):
    """positions (p, s/p): every position once, with a short ring critical path."""
    ### BEGIN SOLUTION
    chunks = torch.arange(seq_len).view(2 * world_size, -1)           # (2p, s/2p)
    return torch.stack([torch.cat([chunks[r], chunks[2 * world_size - 1 - r]])
                        for r in range(world_size)])                  # (p, s/p)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_causal_layout", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_causal_layout(causal_layout)
### BEGIN HIDDEN TESTS
check_causal_layout(causal_layout, sizes=((4, 256), (8, 512), (2, 128)))   # (world_size, seq_len)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_causal_layout_better", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab10 import check_causal_layout_better
check_causal_layout_better(causal_layout)
### BEGIN HIDDEN TESTS
check_causal_layout_better(causal_layout, sizes=((8, 128), (4, 96)))   # (world_size, seq_len)
### END HIDDEN TESTS

# %% [markdown]
# Your layout and your ring attention together, on 4 ranks (s = 64): every rank's output against
# plain causal attention (stored), and the work of both splits.

# %% nbgrader={"grade": false, "grade_id": "ring_with_layout", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
ring_with_layout(ring_attention, causal_layout);

# %% [markdown]
# ## 5. Exercise 5 — DeepSpeed-Ulysses (3 points)
#
# A ring keeps every rank's queries where they are and moves K/V. DeepSpeed-Ulysses (Jacobs et
# al., 2023, §3) moves everything once instead: an **all-to-all** turns the sequence shards of q,
# k and v into **head shards** (each rank then holds h/p heads of the *whole* sequence), each rank
# runs ordinary attention on its heads, and a second all-to-all turns the output back into
# sequence shards. Attention itself needs no change, not even for causal masks; the price is that
# p can be at most the number of heads (with grouped-query attention, of K/V heads).
#
# **Build** `ulysses_attention(q, k, v, group=None, causal=False) -> out`.
#
# **Contract.** Inputs: this rank's q, k, v (b, h, s/p, d), the contiguous split (rank r holds
# positions [r·s/p, (r+1)·s/p)). Output: out (b, h, s/p, d), plain attention's output for this
# rank's tokens (causal over the global positions when asked). When h is not divisible by p,
# raise a `ValueError` that says how many heads there are, on which rank, and what to do, before
# any collective. Allowed: all-to-alls only (`dist.all_to_all` or `dist.all_to_all_single`). The
# check reads the record: per call 4·B bytes in all (B = b·h·(s/p)·d·8: q, k and v into head
# shards, in one fused all-to-all or three, then the output back in one all-to-all of B bytes,
# the last call).
#
# **Why it matters.** Ulysses sends each element a fixed number of times whatever p is, and its
# attention is any single-device kernel; the ring sends K/V p−1 times but scales past the head
# count. Both exist side by side in practice; the measurements below compare them.
#
# <details><summary>Hint 1</summary>
#
# With `dist.all_to_all(outputs, inputs)`: inputs[j] (this rank's tokens, heads of rank j) goes
# to rank j; outputs[i] receives rank i's tokens of this rank's heads. Concatenate the outputs
# along the sequence: rank i's tokens come i-th.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Stack q, k, v into (3, b, h, s/p, d) and split along the heads: one all-to-all carries all
# three. After attention, split the (b, h/p, s, d) output along the sequence and concatenate what
# comes back along the heads.
# </details>

# %% nbgrader={"grade": false, "grade_id": "ulysses", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ulysses_attention(q, k, v, group=None, causal=False):
    """(b, h, s/p, d) in and out: heads scattered, sequence gathered, attention, and back."""
    ### BEGIN SOLUTION
    p, me = dist.get_world_size(group), dist.get_rank(group)
    if q.shape[1] % p:
        raise ValueError(f"ulysses_attention on rank {me}: {q.shape[1]} heads do not split over "
                         f"{p} ranks. Use a sequence-parallel degree that divides the number of "
                         f"heads, or ring attention.")

    def swap(x, split_dim, cat_dim):                                  # one all-to-all
        send = [t.contiguous() for t in x.chunk(p, dim=split_dim)]
        received = [torch.empty_like(t) for t in send]
        dist.all_to_all(received, send, group=group)
        return torch.cat(received, dim=cat_dim)

    qkv = swap(torch.stack([q, k, v]), 2, 3)                          # (3, b, h/p, s, d)
    pos = torch.arange(qkv.shape[3]) if causal else None
    out, _ = block_attention(qkv[0], qkv[1], qkv[2], pos, pos)        # (b, h/p, s, d)
    return swap(out, 2, 1)                                            # (b, h, s/p, d)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_ulysses", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_ulysses(ulysses_attention)
print("ulysses_attention: equal to plain attention, one all-to-all in and one back")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_ulysses(ulysses_attention, world_size=4, seed=fresh_seed(), batch=1, heads=4, seq=32, dim=16)   # 4 KiB blocks: more than the record's slack
check_ulysses(ulysses_attention, world_size=2, seed=fresh_seed(), batch=1, heads=6, seq=20, dim=4)
### END HIDDEN TESTS

# %% [markdown]
# ## What Ulysses sends, and when s and p grow together
#
# Ulysses sends q, k and v once into head shards and the output once back: four all-to-alls'
# worth, each of the rank's whole (b, h, s/p, d) tensor, B bytes. An all-to-all keeps 1/p of its
# input on the rank and sends the rest, so a rank sends 4·(p−1)/p·B bytes per forward, less than
# 4·B = 4·b·(s/p)·h·d·i whatever p is. DeepSpeed-Ulysses' claim (Jacobs et al., 2023, §3): its
# volume per link, 4·N·h/P for sequence N, hidden size h and P GPUs, stays **constant when the
# sequence and the GPUs grow together**. The ring and the all-gather send 2·(p−1)·(s/p)·h·d·b·i:
# at fixed s/p it grows with p. The cell measures your `ulysses_attention` on the same sizes and
# draws the three at s/p = 16 tokens, the formulas to p = 64 and the records at p = 2 and 4.

# %% nbgrader={"grade": false, "grade_id": "ulysses_bytes", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.traffic import plot_bytes_scaling
ulysses_rows = measure_bytes(None, ulysses_attention, methods=("Ulysses",))
print(bytes_table(ulysses_rows))
plot_bytes_scaling(byte_rows + ulysses_rows, tokens_per_rank=16);

# %% [markdown]
# At p = 2 the three send the same; from there the ring's bytes per rank grow as p−1 while
# Ulysses' approach 4·(s/p)·h·d·b·i. The price is the head count: Ulysses cannot use more ranks
# than K/V heads (8 for every Llama 3 model), the ring can. And Ulysses' all-to-alls cannot hide
# behind attention: the attention needs their result.
#
# ## The ring on a timeline
#
# Lab 6's view of one forward of your `ring_attention` on 4 ranks (s = 2,048, h = 4, d = 32:
# blocks of 512 tokens), inside a range named "ring forward". The communication row shows gloo's
# `send` and `recv` of each K/V block; the compute row the block's operators. On gloo an
# isend/irecv runs on gloo's threads while the rank's thread goes on computing, so compute under
# a `recv` span is a transfer hidden; a `recv` that outlasts the compute is the rank waiting. (Lab
# 6's reader would count operators under an open transfer as part of it; `profile_ring` reads
# them back as compute, since here they are the point.)

# %% nbgrader={"grade": false, "grade_id": "ring_timeline", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.timeline import profile_ring
ring_profile = profile_ring(ring_attention)

# %% [markdown]
# Every rank sends its K/V block p−1 = 3 times, 2·(s/p)·h·d·4 bytes (in one message or two), and
# receives as many, while it computes on the block it holds. How much hides depends on this machine: a CPU moving a block through
# gloo is far slower, against its own compute, than NVLink against a GPU, and four ranks share
# two cores, so on a busy machine the `recv` spans run past the compute. The overlap table above
# is the version for H100s.
#
# ## Memory against the sequence length
#
# Attention over s tokens on one rank computes an (s × s) score matrix per head, s²·h·i bytes
# per sequence, and keeps several of that size alive at once (the scores, their exponentials,
# the weights). A ring step computes the (s/p × s/p) scores of one block, p² times less, and
# holds besides its q, its K/V block, the next one arriving and the running output, each
# (s/p)·h·d·i bytes. The cell measures the peak of the bytes alive at once (Lab 8's
# `TensorsMade`, after every operation, the inputs left out) for attention on one rank and for
# your `ring_attention` on 2 and 4 ranks (float32, b = 1, h = 2, d = 16).

# %% nbgrader={"grade": false, "grade_id": "ring_memory", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.context.memory import (attention_memory_table, measure_memory,
                                         plot_attention_memory)
memory_rows = measure_memory(ring_attention)
print(attention_memory_table(memory_rows))
plot_attention_memory(memory_rows);

# %% [markdown]
# One rank's peak is four score matrices (peak / scores = 4.0): it grows as s². The ring's peak
# grows as (s/p)², so the ring on p ranks at s holds what one rank holds at s/p, plus its blocks,
# whose share falls as d/(s/p) when s grows. Training kernels (FlashAttention) never store the
# scores at all; what remains per rank are the activations of s/p tokens, which is what the
# planner divides next.
#
# ## Planning: how much CP does Llama 3 405B's 128K stage need?
#
# Llama 3 405B's last pre-training stage trains on sequences of 131,072 tokens on 16,384 H100
# 80 GB: TP 8, **CP 16**, PP 16, hence DP 8, 16M tokens (128 sequences) per step, 380 TFLOP/s per
# GPU (Llama 3 paper, Table 4). The planner of Lab 7 now has a CP axis
# (`distlab.labs.planning.context`; `ParallelConfig(tp, pp, dp, job, cp=...)`, cp = 1 is Lab 7):
#
# - **memory** (`cp_memory_per_gpu`): a GPU keeps the activations of s/cp tokens (Lab 7's
#   `memory_per_gpu` at s/cp), plus the whole sequence's K and V of the layer being computed,
#   gathered; the CP ranks of a group hold the same weights, so ZeRO shards over DP × CP GPUs what
#   it shards over DP in Lab 7; without recompute the scores of s/cp queries span all s keys (cp
#   times what s/cp tokens alone would keep);
# - **traffic** (`cp_comm_bytes_per_step`): all-gather CP as Llama 3 runs it: per layer and
#   micro-batch an all-gather of K and V forward and a reduce-scatter of dK and dV backward (one
#   more all-gather with full recompute), each (cp−1)/cp of the sequence's K/V; TP and PP move
#   activations of s/cp tokens.
#
# ### Question — the smallest CP that fits (2 points)
#
# **Build** `smallest_cp(model, job, tp, pp, dp, gpu_mem_gb=80.0)`: the smallest power of two cp
# among `CP_DEGREES` (1, 2, …, 128) that divides the sequence and whose memory per GPU by the
# planner, `cp_memory_per_gpu(model, ParallelConfig(tp, pp, dp, job, cp=cp))["total"]`, is at
# most `gpu_mem_gb` GB (GB = 1e9 bytes); None if none is. Then set `cp_405b_128k` to its answer
# for Llama 3 405B at the published TP 8, PP 16 and DP 8 with `LLAMA3_405B_128K_JOB` (the course's
# 405B job of Lab 7, ZeRO-1 and full recompute, at 131,072 tokens and 128 sequences per step).
#
# **Contract.** The check compares your function with the planner's answer on the lab's case and
# two more (hidden: models, sequences, degrees and memories drawn afresh).
#
# **Why it matters.** A long-context stage is planned like any other layout: by what fits, then
# by what runs fast. The table after the check compares your answer with Meta's.
#
# <details><summary>Hint 1</summary>
#
# Loop over `CP_DEGREES` in order and return at the first that fits.
# </details>

# %% nbgrader={"grade": false, "grade_id": "plan_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.labs.planning import GB, LLAMA3_405B, ParallelConfig
from distlab.labs.planning.context import (CP_DEGREES, LLAMA3_405B_128K_GPUS,
                                           LLAMA3_405B_128K_JOB, cp_layouts, cp_memory_per_gpu,
                                           cp_table)

# %% nbgrader={"grade": false, "grade_id": "smallest_cp", "locked": false, "schema_version": 3, "solution": true, "task": false}
def smallest_cp(model, job, tp, pp, dp, gpu_mem_gb=80.0):
    """The smallest CP degree of CP_DEGREES that fits in gpu_mem_gb GB per GPU, or None."""
    ### BEGIN SOLUTION
    for cp in CP_DEGREES:
        cfg = ParallelConfig(tp, pp, dp, job, cp=cp)
        if job.seq_len % cp == 0 and cp_memory_per_gpu(model, cfg)["total"] <= gpu_mem_gb * GB:
            return cp
    return None
    ### END SOLUTION


cp_405b_128k = smallest_cp(LLAMA3_405B, LLAMA3_405B_128K_JOB, tp=8, pp=16, dp=8)
print(f"Llama 3 405B, 131,072 tokens, TP 8 PP 16 DP 8: smallest CP that fits = {cp_405b_128k}")

# %% nbgrader={"grade": true, "grade_id": "test_smallest_cp", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab10 import check_cp_degree
check_cp_degree(smallest_cp)
print("smallest_cp: the planner's answer on the 3 visible cases (the hidden ones follow)")
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_cp_degree(smallest_cp, seed=fresh_seed())   # other models, sequences and degrees
### END HIDDEN TESTS

# %% [markdown]
# The layouts at the published TP 8 and PP 16: first at DP 8 (the GPUs grow with CP), then on
# the 16,384 GPUs of the published run (CP × DP = 128: every CP degree takes DP from the batch).

# %% nbgrader={"grade": false, "grade_id": "cp_layouts", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(cp_table(LLAMA3_405B, cp_layouts(LLAMA3_405B, LLAMA3_405B_128K_JOB, 8, 16, dp=8)))
print()
print(cp_table(LLAMA3_405B, cp_layouts(LLAMA3_405B, LLAMA3_405B_128K_JOB, 8, 16,
                                       gpus=LLAMA3_405B_128K_GPUS)))

# %% [markdown]
# **The planner says CP 2; Meta used CP 16.** By the planner, without CP the first stage needs
# 94.6 GB (68.7 GB of it activations), and CP 2 brings it to 57.7 GB: under the course's job,
# with full recompute, memory alone asks for CP 2. That job is the course's assumption, not
# Meta's, and Llama 3 says it uses CP to improve memory efficiency (§3.3.2): with selective
# recompute instead of full (the course's count, as in Lab 7), CP 16 needs 94.1 GB and the
# smallest CP that fits is 32, and Llama 3's own memory tricks (fewer layers on the first and
# last stages, buffers freed early) are not modelled. So memory may well have asked for 16; the
# second table shows what pushes the same way whatever the recompute: the GPUs are fixed at
# 16,384 = TP 8 × PP 16 × CP × DP, and a step holds only 128 sequences, so every CP degree not
# taken becomes data parallelism, and each DP rank's pipeline gets 128/DP micro-batches. There
# even CP 1 fits (one micro-batch in flight per pipeline), but a pipeline of 16 stages running
# one micro-batch idles 94% of the step; at CP 2 (DP 64) it runs 2 and idles 88%; at CP 16
# (DP 8) it runs 16 and idles 48% (the course's non-interleaved count; Llama 3 interleaves its
# stages, which shrinks it, §3.3.2). One more reading is the planner's inference, not the
# paper's: CP 16 gives every GPU 8,192 tokens, the sequence length of the initial pre-training
# (§3.4.1), so each GPU would run the shapes it ran there. The paper gives no such reason, and it
# grows the context to 128K in six stages (§3.4.2), so the stage before the last was not 8K.

# %% [markdown]
# ## Summary
#
# * Attention is the only layer that mixes tokens; with each rank holding s/p of the sequence,
#   every other layer runs unchanged, and activation memory per rank falls by p.
# * Two partial attentions merge exactly through their log-sum-exps, with the larger one
#   subtracted first (the online softmax); ring attention is that merge, p times, while K/V
#   blocks move one neighbour to the right, and its backward sends dK/dV home.
# * Causal work grows with position, and a ring waits at every step for its slowest rank: a
#   split is judged by its critical path against the ideal, s(s+1)/(2p) score pairs. The
#   contiguous split costs about 2 − 1/p times the ideal (not the 2p − 1 of its busiest rank's
#   total); dealing positions like cards costs 1 + (p − 1)/(s + 1); a better split reaches the
#   bound (Llama 3 balances its causal split too, §3.3.2).
# * Ulysses trades the ring's p−1 transfers for two all-to-alls and a limit of p ≤ heads.
# * Llama 3 uses neither ring nor Ulysses in the end: it all-gathers K and V and computes its own
#   query chunks, since the all-gather supports any attention mask (document masks) and its
#   latency is small when grouped-query attention makes K and V much smaller than Q
#   (arXiv 2407.21783, §3.3.2).
