"""Tensor-parallel attention and the vocabulary-parallel loss: Lab 4's plumbing and references.

Attention (Shoeybi et al. 2019, "Megatron-LM", section 3). A fused projection computes queries,
keys and values for every head at once, then each head attends on its own and the heads' outputs
are concatenated and projected back:

    [Q | K | V] = X W_qkv^T          X: (b, s, h), W_qkv: ((nh + 2 nkv) hs, h), hs = h / nh
    O_i = softmax(Q_i K_g(i)^T / sqrt(hs) + causal mask) V_g(i)      for head i = 0 .. nh-1
    Y = [O_0 | ... | O_{nh-1}] W_o^T

with nkv key/value heads shared by groups of nh / nkv query heads (grouped-query attention;
nkv = nh is plain multi-head attention, g(i) = i // (nh / nkv)). Heads never look at each other,
so p ranks can each own nh/p query heads and the nkv/p key/value heads those heads read: the QKV
projection is column parallel *by heads*, the output projection row parallel, and the whole
attention block costs one all-reduce of (b, s, h) forward (after W_o) and one backward (of dL/dX).

The fused weight's rows are laid out [Q heads 0..nh-1 | K heads 0..nkv-1 | V heads 0..nkv-1],
each head a block of hs rows. A rank's shard takes its heads out of *each* of Q, K and V and keeps
the same [q | k | v] order locally, so the local attention is the dense code with nh/p and nkv/p
heads. Cutting the fused rows into p contiguous blocks instead (what `ColumnParallelLinear` does)
gives rank 0 only queries and the last rank only values: the classic fused-QKV bug.

Vocab-parallel cross-entropy (Megatron-LM's loss parallelism). The LM head is column parallel, so
rank r holds logits z[:, V_r] for its V/p vocabulary entries. For each token
    loss = log sum_v exp(z_v - m) + m - z_target,     m = max_v z_v
needs the global max (all-reduce MAX), the global sum of exponentials (all-reduce SUM) and the
target's logit, which lives on one rank (all-reduce SUM of a zero-elsewhere vector): three
all-reduces of one number per token, never the (tokens, V) logits. The gradient,
softmax(z) - onehot(target), is local to each rank's vocabulary slice: no backward collective.

Run this module's checks with `python -m pytest tests/test_lab04.py`; the scaling benchmark with
`python bench/tp_attention.py` (CPU) or `torchrun --standalone --nproc-per-node=4
bench/tp_attention.py` (GPUs, NCCL).

The submodules: ``layout`` (the fused QKV rows and a rank's heads), ``dense`` (the single-process
references), ``parallel`` (the tensor-parallel modules and the vocab-parallel loss) and ``measure``
(the collectives of a block step, strong scaling). The names a lab cell uses are re-exported here.
"""
from __future__ import annotations

from distlab.labs.attention.dense import Attention, TransformerBlock, attend, dense_transformer
from distlab.labs.attention.layout import QKVLayout, identify_heads, qkv_split_table, split_qkv
from distlab.labs.attention.measure import block_comms_table, plot_scaling, scaling_table
from distlab.labs.attention.parallel import (TensorParallelAttention, TensorParallelTransformerBlock,
                                             VocabParallelCrossEntropy, vocab_parallel_cross_entropy)

__all__ = ["Attention", "TransformerBlock", "attend", "dense_transformer", "QKVLayout",
           "identify_heads", "qkv_split_table", "split_qkv", "block_comms_table", "plot_scaling",
           "scaling_table", "TensorParallelAttention", "TensorParallelTransformerBlock",
           "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy"]
