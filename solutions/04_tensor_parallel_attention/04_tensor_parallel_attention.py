# ---
# jupyter:
#   distlab:
#     summary: "Attention heads sharded across ranks, a tensor-parallel transformer block, vocab-parallel cross-entropy, and scaling measured on 1, 2 and 4 ranks."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 4 — Tensor-parallel attention
#
# Lab 3 split a transformer's MLP over p ranks: the first layer by output features, the second by
# input features, one all-reduce each way. The other half of a transformer layer is attention, and
# it splits even more naturally: its **heads** never exchange information until the output
# projection, so each rank can own a group of heads outright.
#
# In this lab you build Megatron-LM's tensor-parallel attention by hand on real `torch.distributed`
# ranks and check it against single-device attention:
#
# 1. cut a **fused QKV** weight into each rank's heads (and the matching key/value heads of
#    grouped-query attention) — the step where the classic bug lives;
# 2. write `TensorParallelAttention`: column-parallel QKV, local causal attention, row-parallel
#    output projection; forward equal to the dense layer within 1e-3;
# 3. confirm the backward: every rank's shard gets exactly its slice of the dense gradient;
# 4. assemble a whole **transformer block** (attention + Lab 3's MLP) and read its collectives:
#    two all-reduces forward, two backward;
# 5. compute the cross-entropy of logits **sharded over the vocabulary** without ever gathering
#    them (loss parallelism);
#
# and finally measure how the block scales on 1, 2 and 4 ranks.
#
# **Notation.** Activations are (b, s, h): batch, sequence, hidden. nh query heads of size
# hs = h / nh; nkv key/value heads (nkv = nh is ordinary multi-head attention, nkv < nh is
# grouped-query attention, GQA). p is the tensor-parallel degree. `nn.Linear` stores its weight as
# **(out_features, in_features)**.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.labs.attention import (Attention, attend, block_comms_table, plot_scaling,
                               qkv_split_table, scaling_table)
from distlab.checks.assertions import fresh_seed
from distlab.checks.lab04 import (check_split_qkv, check_tp_attention_backward,
                                  check_tp_attention_forward, check_tp_block,
                                  check_vocab_parallel_cross_entropy)
from distlab.labs.tensor_parallel import RowParallelLinear, TensorParallelMLP, copy_to_tp

# %% [markdown]
# ## 1. Attention, head by head
#
# Causal self-attention projects the input to queries, keys and values, lets each head attend
# separately, and projects the concatenated heads back to h:
#
# * $Q = X W_q^\top$ (nh heads), $K = X W_k^\top$ and $V = X W_v^\top$ (nkv heads each);
# * head $i$: $O_i = \mathrm{softmax}(Q_i K_g^\top / \sqrt{hs} + \mathrm{mask})\, V_g$, where
#   $g = \lfloor i / (nh / nkv) \rfloor$ is the key/value head that query head $i$ shares with its
#   group, and the mask hides future positions;
# * $Y = [O_0 \mid O_1 \mid \dots \mid O_{nh-1}]\, W_o^\top$.
#
# Nothing in the second line mixes heads. So give rank r the query heads
# r·nh/p … (r+1)·nh/p − 1 and the key/value heads they read, r·nkv/p … (r+1)·nkv/p − 1 (with GQA
# a group of query heads and its key/value head stay together on one rank). Then:
#
# * the Q, K, V projections are **column parallel**: rank r computes only its heads' columns;
# * attention is **local**: each rank runs ordinary attention on nh/p and nkv/p heads;
# * the output projection is **row parallel**: rank r holds the rows of W_oᵀ (columns of
#   `proj.weight`) that read its heads, produces a full-size partial Y, and **one all-reduce**
#   sums the partials — the g of Lab 3. In the backward, f in front of the QKV projection
#   all-reduces dL/dX.
#
# Every head count must divide by p. (When p exceeds nkv, real systems replicate key/value heads
# on several ranks; we keep p ≤ nkv here.)
#
# Implementations fuse the three projections into one `nn.Linear` of (nh + 2·nkv)·hs outputs, one
# big matmul instead of three. The dense module of this lab, `distlab.labs.attention.Attention`, lays the
# fused rows out as **[all Q heads | all K heads | all V heads]**, each head a block of hs rows.
# `attend(qkv, n_heads, n_kv_heads)` is the per-head part: it splits the fused projections, runs
# `F.scaled_dot_product_attention` with a causal mask, and returns (b, s, nh·hs). On a rank you call
# it with that rank's head counts.

# %% nbgrader={"grade": false, "grade_id": "dense_attention", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
Attention(hidden=32, n_heads=4, n_kv_heads=2)

# %% [markdown]
# Here qkv has (4 + 2·2)·8 = 64 output rows: q0–q3, then k0–k1, then v0–v1. Which rows should each
# of 2 ranks get? The table names each block of hs rows by its head. Cutting the fused weight into
# p contiguous blocks of rows — what Lab 3's column split would do — hands rank 0 four queries and
# no keys at all.

# %% nbgrader={"grade": false, "grade_id": "split_table", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
qkv_split_table(n_heads=4, n_kv_heads=2, world_size=2);

# %% [markdown]
# ## 2. Exercise 1 — splitting the fused QKV weight by heads (2 points)
#
# **Build** `split_qkv(weight, bias, rank, world_size, n_heads, n_kv_heads)`.
#
# **Contract.** Input: the fused ((nh + 2·nkv)·hs, h) weight and its bias (hs = h / nh, h =
# `weight.shape[1]`), identical on every rank. Output: rank `rank`'s shard of both, copies, in the
# local order **[its q heads | its k heads | its v heads]**: the dense layout with nh/p query and
# nkv/p key/value heads, so that `attend` works on the shard unchanged. No communication. The check
# compares the shard with the dense weight's rows on 2 ranks with grouped-query heads (hidden: 4
# ranks too), and names the heads your shard holds when they are the wrong ones.
#
# **Why it matters.** Cutting by heads is what lets each rank attend with no communication at all.
#
# <details><summary>Hint 1</summary>
#
# The fused weight is three blocks stacked by rows: Q (nh·hs rows), K and V (nkv·hs each).
# </details>
#
# <details><summary>Hint 2</summary>
#
# Cut each of the three blocks into p equal row slices, take slice `rank` of each, and stack the
# three again (`split`, then `cat`); the bias follows the same rows.
# </details>

# %% nbgrader={"grade": false, "grade_id": "split_qkv", "locked": false, "schema_version": 3, "solution": true, "task": false}
def split_qkv(weight, bias, rank, world_size, n_heads, n_kv_heads):
    """Rank `rank`'s ((nh + 2 nkv) hs / p, h) rows of a fused [Q | K | V] weight, and its bias rows."""
    ### BEGIN SOLUTION
    hs = weight.shape[1] // n_heads
    sizes = [n_heads * hs, n_kv_heads * hs, n_kv_heads * hs]
    w_parts, b_parts = [], []
    for w, b in zip(weight.split(sizes), bias.split(sizes)):   # Q, K, V in turn
        block = w.shape[0] // world_size                       # this rank's heads of Q (or K, V)
        rows = slice(rank * block, (rank + 1) * block)
        w_parts.append(w[rows])
        b_parts.append(b[rows])
    return torch.cat(w_parts).clone(), torch.cat(b_parts).clone()
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_split_qkv", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_split_qkv(split_qkv)
print("split_qkv: every rank holds its query heads and the key/value heads they read")
### BEGIN HIDDEN TESTS
check_split_qkv(split_qkv, world_size=4, seed=fresh_seed(), batch=3, seq=12, hidden=48, n_heads=8, n_kv_heads=4)
check_split_qkv(split_qkv, world_size=2, seed=fresh_seed(), batch=2, seq=8, hidden=32, n_heads=4, n_kv_heads=4)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 2 — the tensor-parallel attention forward (3 points)
#
# **Build** `TensorParallelAttention(dense, group)`, a module, from a dense `Attention`
# (identical on every rank, as if loaded from a checkpoint; `dense.n_heads`, `dense.n_kv_heads`,
# `dense.qkv`, `dense.proj`).
#
# **Contract.** Attributes `qkv` (a module whose `weight` and `bias` are this rank's `split_qkv`
# shard) and `proj` (the output projection, row parallel). `forward(x)`: x (b, s, h) replicated on
# every rank → the dense attention's (b, s, h) output, replicated, within 1e-3. Rank and degree
# come from the group (`dist.get_rank(group)`, `dist.get_world_size(group)`). Allowed: Lab 3's
# operators and layers; the check reads the collective record: **exactly one all-reduce of b·s·h
# floats in the forward**, none of the weights.
#
# **Why it matters.** This is Megatron-LM's attention (Shoeybi et al. 2019, §3): heads split
# across ranks, one all-reduce per attention forward.
#
# <details><summary>Hint 1</summary>
#
# Column parallel in, row parallel out, as Lab 3's MLP: which of Lab 3's operators goes before
# the local projection, and which layer is the output projection?
# </details>
#
# <details><summary>Hint 2</summary>
#
# `self.qkv` can be an `nn.Linear` of the shard's size, filled under `torch.no_grad()`;
# `self.proj = RowParallelLinear.from_linear(dense.proj, group)` all-reduces the partial outputs
# and adds the bias once.
# </details>
#
# <details><summary>Hint 3</summary>
#
# `forward`: `copy_to_tp(x, group)` (Lab 3's f), the local projection → (b, s, (nh+2nkv)·hs/p),
# `attend` with the **local** head counts → (b, s, nh·hs/p), then `self.proj` → (b, s, h).
# </details>

# %% nbgrader={"grade": false, "grade_id": "tp_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
class TensorParallelAttention(nn.Module):
    """proj(attend(qkv(f(x)))) with this rank's nh/p query and nkv/p key/value heads."""

    def __init__(self, dense, group=None):
        super().__init__()
        self.group = group
        ### BEGIN SOLUTION
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        self.n_heads, self.n_kv_heads = dense.n_heads // p, dense.n_kv_heads // p
        weight, bias = split_qkv(dense.qkv.weight.detach(), dense.qkv.bias.detach(), rank, p,
                                 dense.n_heads, dense.n_kv_heads)
        self.qkv = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.qkv.weight.copy_(weight)
            self.qkv.bias.copy_(bias)
        self.proj = RowParallelLinear.from_linear(dense.proj, group)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        x = copy_to_tp(x, self.group)                        # f: identity now, all-reduce backward
        qkv = self.qkv(x)                                    # (b, s, (nh + 2 nkv) hs / p)
        heads = attend(qkv, self.n_heads, self.n_kv_heads)   # (b, s, nh hs / p)
        return self.proj(heads)                              # (b, s, h), summed over ranks by g
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_tp_attention_forward", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_tp_attention_forward(TensorParallelAttention)
print("TensorParallelAttention forward: equals dense attention; one all-reduce")
### BEGIN HIDDEN TESTS
check_tp_attention_forward(TensorParallelAttention, world_size=4, seed=fresh_seed(), batch=3, seq=12,
                           hidden=48, n_heads=8, n_kv_heads=4)
check_tp_attention_forward(TensorParallelAttention, world_size=2, seed=fresh_seed(), batch=2, seq=8,
                           hidden=32, n_heads=4, n_kv_heads=4)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise 3 — the backward (2 points)
#
# You wrote no backward, yet the gradients must come out right: autograd differentiates the local
# computation, and the two operators supply the communication. Predict before you run the check:
#
# * `qkv.weight.grad` on rank r must be the dense gradient's rows of rank r's heads, in your
#   [q | k | v] order — the same rows `split_qkv` picked;
# * `proj.weight.grad` is the dense gradient's block of columns r; `proj.bias.grad` the whole one
#   (g's backward is the identity: the output was replicated, so its gradient already is);
# * dL/dX is a sum over ranks — each rank's heads contribute a part — so the backward issues
#   exactly one all-reduce of b·s·h floats, in f.
#
# If this check fails while the forward passes, look at f.

# %% nbgrader={"grade": true, "grade_id": "test_tp_attention_backward", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_tp_attention_backward(TensorParallelAttention)
print("TensorParallelAttention backward: every shard's gradient is its slice of the dense one")
### BEGIN HIDDEN TESTS
check_tp_attention_backward(TensorParallelAttention, world_size=4, seed=fresh_seed(), batch=3, seq=12,
                            hidden=48, n_heads=8, n_kv_heads=4)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Exercise 4 — a tensor-parallel transformer block (3 points)
#
# The dense block (`distlab.labs.attention.TransformerBlock`) is pre-norm:
#
# h = x + attn(norm1(x)),  y = h + mlp(norm2(h)),
#
# with `mlp` Lab 3's `MLP` (`fc2(gelu(fc1(x)))`).
#
# **Build** `TensorParallelTransformerBlock(dense, group)`.
#
# **Contract.** Attributes `norm1`, `attn`, `norm2`, `mlp`; the forward equals the dense block's
# on every rank, and so do the gradients of every shard and of the input. Allowed: your
# `TensorParallelAttention` and `TensorParallelMLP(dense.mlp, group)` from
# `distlab.labs.tensor_parallel` (Lab 3's reference); the check reads the collective record:
# exactly **two all-reduces forward and two backward**, each of b·s·h floats.
#
# **Why it matters.** A whole transformer layer at Megatron's cost: a fixed number of
# all-reduces per layer, whatever the number of ranks.
#
# <details><summary>Hint 1</summary>
#
# Which activations in the block are replicated on every rank? What do the LayerNorms and the
# residual adds need, then?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The LayerNorms are copies (replicated: every rank normalises the full activation, with the
# dense weights and eps); the residual adds need no communication.
# </details>

# %% nbgrader={"grade": false, "grade_id": "tp_block", "locked": false, "schema_version": 3, "solution": true, "task": false}
class TensorParallelTransformerBlock(nn.Module):
    """h = x + attn(norm1(x)); y = h + mlp(norm2(h)), attention and MLP tensor parallel."""

    def __init__(self, dense, group=None):
        super().__init__()
        ### BEGIN SOLUTION
        self.norm1 = nn.LayerNorm(dense.norm1.normalized_shape, eps=dense.norm1.eps)
        self.norm1.load_state_dict(dense.norm1.state_dict())
        self.norm2 = nn.LayerNorm(dense.norm2.normalized_shape, eps=dense.norm2.eps)
        self.norm2.load_state_dict(dense.norm2.state_dict())
        self.attn = TensorParallelAttention(dense.attn, group)
        self.mlp = TensorParallelMLP(dense.mlp, group)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        h = x + self.attn(self.norm1(x))                     # (b, s, h), replicated
        return h + self.mlp(self.norm2(h))                   # (b, s, h), replicated
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_tp_block", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_tp_block(TensorParallelTransformerBlock)
print("TensorParallelTransformerBlock: equals the dense block; two all-reduces each way")
### BEGIN HIDDEN TESTS
check_tp_block(TensorParallelTransformerBlock, world_size=4, seed=fresh_seed(), batch=3, seq=12,
               hidden=48, n_heads=8, n_kv_heads=4, ffn=96)
### END HIDDEN TESTS

# %% [markdown]
# Rank 0's collective record for one forward and backward of your block. Two all-reduces of the
# full (b, s, h) activation in each direction per layer, whatever p is: per rank, a ring all-reduce
# moves 2(p−1)/p of those bytes, so the traffic per layer stays at about 4·b·s·h·4 bytes each way
# while the compute per rank shrinks as 1/p. That ratio is why tensor parallelism lives inside
# one node, on NVLink.

# %% nbgrader={"grade": false, "grade_id": "block_comms", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
block_comms_table(TensorParallelTransformerBlock, world_size=2);

# %% [markdown]
# ## 6. Exercise 5 — vocabulary-parallel cross-entropy (4 points)
#
# The language-model head maps h to the vocabulary, V entries (128,256 for Llama 3). Made column
# parallel, it leaves rank r with the logits of its V/p vocabulary ids, z[:, r·V/p : (r+1)·V/p].
# Gathering them for the loss would be expensive: b = 1, s = 8192, V = 128,256 in float32 is
# 4.2 GB per rank. The loss needs far less. For one token with target t,
#
# $$\mathrm{loss} = \log \sum_v e^{z_v} - z_t = \log \sum_v e^{z_v - m} + m - z_t,
#   \qquad m = \max_v z_v,$$
#
# and each piece is a reduction over the vocabulary, which splits over ranks:
#
# 1. m: the local max, then an **all-reduce with `op=dist.ReduceOp.MAX`**. (Subtracting m keeps
#    exp() finite: float32 overflows above exp(88.7), and the check's logits reach 150.)
# 2. $z_t - m$: only the rank whose slice contains $t$ has it; the others contribute 0, and an
#    **all-reduce (sum)** gives every rank the value.
# 3. $\sum_v e^{z_v - m}$: local sums, **all-reduce (sum)**.
#
# Three all-reduces of one number per token, instead of the (tokens, V) logits. The gradient
# needs no communication: $\partial L / \partial z_v = \mathrm{softmax}(z)_v - [v = t]$, and every rank has what it takes to
# compute its slice of softmax once it holds m and the sum.
#
# **Build** `vocab_parallel_cross_entropy(logits, target, group)`.
#
# **Contract.** Inputs: logits (b, s, V/p) of this rank's slice (rank r holds ids r·V/p …
# (r+1)·V/p − 1), target (b, s) of global ids. Output: the **mean** loss over the b·s tokens as a
# 0-d tensor, the same on every rank, differentiable with respect to `logits`, without modifying
# them in place. Allowed: at most three all-reduces in forward, each of one number per token (sum
# or max), and nothing larger in either direction: the logits are never gathered. The check compares loss and gradient with the dense
# cross-entropy on logits that reach 150 (a naive `exp` overflows) and reads the record.
#
# **Why it matters.** The (tokens, V) logits are the largest activation of a language model; this
# loss never moves them.
#
# <details><summary>Hint 1</summary>
#
# `dist.all_reduce` is not differentiable: write a `torch.autograd.Function` with its own
# backward, saving what it needs with `ctx.save_for_backward`.
# </details>
#
# <details><summary>Hint 2</summary>
#
# The backward needs each rank's slice of softmax(z) and where the target sits; the upstream
# gradient of a mean spreads 1/(b·s) to each token.
# </details>
#
# <details><summary>Hint 3</summary>
#
# Forward: local max → all-reduce MAX; subtract it; $z_t$ where this rank owns the target, else
# 0 → all-reduce sum; local sums of exp → all-reduce sum; loss = log(sum) − $z_t$, averaged.
# Backward:
# softmax − one-hot of the target on its owner, times grad / N.
# </details>

# %% nbgrader={"grade": false, "grade_id": "vocab_parallel_ce", "locked": false, "schema_version": 3, "solution": true, "task": false}
class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of vocabulary-sharded logits: three all-reduces forward, none backward."""

    @staticmethod
    def forward(ctx, logits, target, group=None):
        ### BEGIN SOLUTION
        part = logits.shape[-1]
        start = dist.get_rank(group) * part                  # first vocabulary id of this rank
        z = logits.detach().reshape(-1, part)                # (N, V/p), N = b*s tokens
        t = target.reshape(-1)                               # (N,)
        m = z.max(dim=-1).values                             # (N,)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = z - m[:, None]                                   # (N, V/p), all <= 0
        mine = (t >= start) & (t < start + part)             # tokens whose target is here
        local_t = (t - start).clamp(0, part - 1)
        z_t = torch.where(mine, z.gather(1, local_t[:, None])[:, 0], torch.zeros_like(m))  # (N,)
        dist.all_reduce(z_t, group=group)
        e = z.exp()                                          # (N, V/p)
        total = e.sum(dim=-1)                                # (N,)
        dist.all_reduce(total, group=group)
        ctx.save_for_backward(e / total[:, None], local_t, mine)
        ctx.shape = logits.shape
        return (total.log() - z_t).mean()
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        softmax, local_t, mine = ctx.saved_tensors           # (N, V/p), (N,), (N,)
        g = softmax.clone()
        rows = torch.nonzero(mine)[:, 0]
        g[rows, local_t[rows]] -= 1.0                        # the target's -1, on its owner only
        return (g * grad / g.shape[0]).reshape(ctx.shape), None, None
        ### END SOLUTION


def vocab_parallel_cross_entropy(logits, target, group=None):
    return VocabParallelCrossEntropy.apply(logits, target, group)


# %% nbgrader={"grade": true, "grade_id": "test_vocab_parallel_ce", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy)
print("vocab_parallel_cross_entropy: equals the dense loss and gradient; logits never gathered")
### BEGIN HIDDEN TESTS
check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy, world_size=4, seed=fresh_seed(),
                                   batch=3, seq=16, vocab=192)   # KiBs a rank: see distlab.checks.crossed
### END HIDDEN TESTS

# %% [markdown]
# PyTorch ships the same idea as `torch.distributed.tensor.parallel.loss_parallel()`: with the LM
# head's output left as a DTensor sharded on the vocabulary dimension, `F.cross_entropy` inside
# that context runs this algorithm instead of gathering.
#
# ## 7. Scaling on 1, 2 and 4 ranks
#
# How much faster is one block step on $N$ ranks? With $T_N$ the step time on $N$ ranks,
# **speedup** $= T_1 / T_N$ and **strong-scaling efficiency** $= T_1 / (N\,T_N)$ — *strong* scaling
# because the problem (b, s, h) stays the same while N grows (weak scaling would grow the problem
# with N, as data parallelism does): 1.0 means every added rank pays for itself. Below: one forward+backward of your `TensorParallelTransformerBlock` (b=4, s=64, h=128, 8 heads,
# f=512), median of 3 steps on the slowest rank, one thread per rank (a core standing in for a
# device); N = 1 is the dense block. "all-reduce ms" is the time rank 0 spent inside
# `all_reduce` calls per step, from the collective record — transfer *and* waiting for slower
# ranks.

# %% nbgrader={"grade": false, "grade_id": "scaling", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
rows = scaling_table(world_sizes=(1, 2, 4), batch=4, seq=64, hidden=128, n_heads=8, n_kv_heads=8, steps=3,
                     block_cls=TensorParallelTransformerBlock)
plot_scaling(rows);

# %% [markdown]
# ### Exercise 7 — predict $T_N$ before measuring it (2 points)
#
# A block step on one rank takes $T_1$. On $N$ ranks, how long does it take? Build the model
# from what you know: the compute splits $N$ ways; the communication is the collectives your
# `TensorParallelTransformerBlock` issues in one forward and backward (count them, and what each
# carries: float32 activations), each costed by Lab 1's ring model with α (seconds per ring step)
# and $B$ (bytes/s) from `fit_ring_model`. Assume no collective overlaps compute: does the next
# operation need its result?
#
# Write `predict_step_time(t1, n, alpha, bandwidth, batch, seq, hidden)` (no communication on one
# rank) and `strong_scaling_efficiency(t1, tn, n)`: the share of the ideal $N$-fold speedup
# reached. Below, α and $B$ are fitted again on this machine's `all_reduce` on 2 and 4 ranks
# (Lab 1's code), and your prediction is set beside the measurement.

# %% nbgrader={"grade": false, "grade_id": "tp_scaling", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_step_time(t1: float, n: int, alpha: float, bandwidth: float, batch: int, seq: int,
                      hidden: int) -> float:
    """Seconds of one TP block step on ``n`` ranks, by the model above (``t1`` on one rank)."""
    ### BEGIN SOLUTION
    if n == 1:
        return t1
    nbytes = batch * seq * hidden * 4
    return t1 / n + 4 * (2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth)
    ### END SOLUTION


def strong_scaling_efficiency(t1: float, tn: float, n: int) -> float:
    """The share of the ideal ``n``-fold speedup that a step of ``tn`` seconds reaches."""
    ### BEGIN SOLUTION
    return t1 / (n * tn)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_tp_scaling", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab04 import check_tp_scaling
check_tp_scaling(predict_step_time, strong_scaling_efficiency)
print("predict_step_time and strong_scaling_efficiency: correct")
### BEGIN HIDDEN TESTS
check_tp_scaling(predict_step_time, strong_scaling_efficiency, seed=fresh_seed())
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "tp_prediction", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
from distlab.labs.tp_scaling import link_fit, prediction_table
alpha, bandwidth = link_fit(world_sizes=(2, 4))
prediction_table(rows, predict_step_time, strong_scaling_efficiency, alpha, bandwidth,
                 batch=4, seq=64, hidden=128);

# %% [markdown]
# Where the prediction and the measurement part, the model left something out: here, mostly
# that 4 ranks share 2 cores (the model assumes N devices), and that a rank also waits in an
# all-reduce for slower peers. On GPUs the same prediction, with NVLink's α and B, is how one
# chooses the TP degree before running.
#
# **Reading it honestly.** This machine cannot show what tensor parallelism is for, and the
# numbers say so:
#
# * The ranks share a laptop's cores. With 2 cores, 4 ranks take turns: T4 can at best match T2,
#   so the efficiency at N = 4 is at most about 0.5 by construction.
# * gloo all-reduces go through the loopback TCP stack. At these sizes (b·s·h·4 = 128 KiB per
#   message, four messages a step) the time inside all-reduce calls — transfer plus waiting for
#   the other ranks — is a large share of each step, half or more at N = 4: the dotted line.
# * Timings on a shared machine are noisy: rerun the cell and the numbers can move by 2x.
#
# On GPUs the same code — `bench/tp_attention.py`, unchanged, under
# `torchrun --standalone --nproc-per-node=4 bench/tp_attention.py` with NCCL — splits real matmul
# work N ways and all-reduces over NVLink at hundreds of GB/s. Per layer and pass, the compute per
# rank falls as b·s·h²/N while the all-reduce traffic stays near b·s·h: efficiency improves with h
# and falls with N, which is why tensor parallelism is used with large hidden sizes and at most
# within one NVLink domain (typically 8 GPUs), with data and pipeline parallelism across nodes.
#
# ## Summary
#
# * Heads are independent, so attention splits by heads: column-parallel QKV (each rank its query
#   heads and the key/value heads of their groups), local attention, row-parallel output
#   projection; one all-reduce forward (g) and one backward (f).
# * A fused QKV weight must be split **by heads within each of Q, K and V**; a contiguous split
#   of the fused rows gives ranks the wrong kinds of heads.
# * A tensor-parallel transformer block costs two all-reduces of (b, s, h) each way, independent
#   of p.
# * The cross-entropy over a sharded vocabulary needs three all-reduces of one number per token
#   and a local backward; the logits are never gathered.
# * Strong-scaling efficiency $T_1/(N\,T_N)$ depends on compute per byte communicated and on the link: poor
#   on CPU processes sharing two cores, good on NVLink-connected GPUs with large h.
