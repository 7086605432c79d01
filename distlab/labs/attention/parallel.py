"""Tensor-parallel attention (heads sharded across ranks), the tensor-parallel transformer
block, and the vocabulary-parallel cross-entropy (Megatron-LM, section 3)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.labs import tensor_parallel as tp
from distlab.labs.attention.dense import Attention, TransformerBlock, attend
from distlab.labs.attention.layout import split_qkv


class TensorParallelAttention(nn.Module):
    """`Attention` with nh/p query heads and nkv/p key/value heads per rank.

    Input and output are replicated (b, s, h), equal to the dense `attn`'s; the parameters of
    the rank's heads only. Collectives: one all-reduce of (b, s, h) forward and one backward.
    """

    def __init__(self, attn: Attention, group=None):
        super().__init__()
        self.group = group
        p, r = dist.get_world_size(group), dist.get_rank(group)
        attn.layout.check_degree(p)
        self.n_heads, self.n_kv_heads = attn.n_heads // p, attn.n_kv_heads // p
        has_bias = attn.qkv.bias is not None
        self.qkv = tp.ColumnParallelLinear(attn.qkv.in_features, attn.qkv.out_features, has_bias,
                                           group=group)
        weight, bias = split_qkv(attn.qkv.weight, attn.qkv.bias, r, p, attn.n_heads, attn.n_kv_heads)
        with torch.no_grad():
            self.qkv.weight.copy_(weight)
            if has_bias:
                self.qkv.bias.copy_(bias)
        self.proj = tp.RowParallelLinear.from_linear(attn.proj, group)

    def forward(self, x):
        qkv = self.qkv(x)                                               # (b, s, (nh+2nkv) hs/p)
        return self.proj(attend(qkv, self.n_heads, self.n_kv_heads))    # (b, s, nh hs/p) -> (b, s, h)


class TensorParallelTransformerBlock(nn.Module):
    """`TransformerBlock` on tensor-parallel ranks: replicated (b, s, h) input and output, equal
    to the dense `block`'s. Collectives: two all-reduces of (b, s, h) forward, two backward."""

    def __init__(self, block: TransformerBlock, group=None, attention_cls=TensorParallelAttention):
        super().__init__()
        self.norm1, self.norm2 = _copy_norm(block.norm1), _copy_norm(block.norm2)
        self.attn = attention_cls(block.attn, group)
        self.mlp = tp.TensorParallelMLP(block.mlp, group)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


def _copy_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    copy.load_state_dict(norm.state_dict())
    return copy


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits sharded over the vocabulary, equal to the dense one's.

    forward: logits (..., V/p) for vocabulary ids [r V/p, (r+1) V/p), target (...) global ids;
    returns the replicated mean loss. Collectives: three all-reduces of one float per token.
    backward: the gradient of this rank's slice of the logits; no communication.
    """

    @staticmethod
    def forward(ctx, logits, target, group=None):
        part = logits.shape[-1]
        start = dist.get_rank(group) * part
        z = logits.detach().reshape(-1, part).float()                   # (N, V/p)
        t = target.reshape(-1)                                          # (N,)
        m = z.max(dim=-1).values                                        # (N,)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = z - m[:, None]                                              # (N, V/p), <= 0
        mine = (t >= start) & (t < start + part)
        target_z = torch.where(mine, z.gather(1, (t - start).clamp(0, part - 1)[:, None])[:, 0],
                               torch.zeros_like(m))                     # (N,), 0 off this rank
        dist.all_reduce(target_z, group=group)
        e = z.exp()                                                     # (N, V/p)
        total = e.sum(dim=-1)                                           # (N,)
        dist.all_reduce(total, group=group)
        ctx.save_for_backward(e / total[:, None], t - start, mine)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return (total.log() - target_z).mean().to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        softmax, local_t, mine = ctx.saved_tensors                      # (N, V/p), (N,), (N,)
        g = softmax.clone()
        rows = torch.nonzero(mine)[:, 0]
        g[rows, local_t[rows]] -= 1.0
        g = g * (grad / softmax.shape[0])
        return g.reshape(ctx.shape).to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(logits, target, group=None):
    return VocabParallelCrossEntropy.apply(logits, target, group)

