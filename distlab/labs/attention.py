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
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs import tensor_parallel as tp
from distlab.runtime.devices import device as rank_device

# --------------------------------------------------------------------------------------------
# The fused QKV weight: which rows are which head, and which rows a rank owns.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QKVLayout:
    """Row layout of a fused ((nh + 2 nkv) hs, h) QKV weight: [q0..q(nh-1) | k0.. | v0..]."""

    hidden: int
    n_heads: int
    n_kv_heads: int

    def __post_init__(self):
        if self.hidden % self.n_heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def rows(self) -> int:
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def heads(self) -> list[str]:
        """Names of the hs-row blocks in fused order: ["q0", ..., "k0", ..., "v0", ...]."""
        return ([f"q{i}" for i in range(self.n_heads)] + [f"k{i}" for i in range(self.n_kv_heads)]
                + [f"v{i}" for i in range(self.n_kv_heads)])

    def check_degree(self, world_size: int) -> None:
        """Each rank needs whole query heads and whole key/value heads."""
        if self.n_heads % world_size or self.n_kv_heads % world_size:
            raise ValueError(f"{self.n_heads} query heads and {self.n_kv_heads} key/value heads "
                             f"cannot be split over {world_size} ranks: both counts must be "
                             f"divisible by the tensor-parallel degree")

    def rank_heads(self, rank: int, world_size: int) -> list[str]:
        """The blocks rank `rank` owns, in its local [q | k | v] order."""
        self.check_degree(world_size)
        nq, nkv = self.n_heads // world_size, self.n_kv_heads // world_size
        return ([f"q{i}" for i in range(rank * nq, (rank + 1) * nq)]
                + [f"{kind}{i}" for kind in "kv" for i in range(rank * nkv, (rank + 1) * nkv)])

    def rank_rows(self, rank: int, world_size: int) -> torch.Tensor:
        """Indices into the fused rows of rank `rank`'s shard, in its local order."""
        where = {name: i for i, name in enumerate(self.heads())}
        hs = self.head_dim
        return torch.cat([torch.arange(where[n] * hs, (where[n] + 1) * hs)
                          for n in self.rank_heads(rank, world_size)])


def split_qkv(weight: torch.Tensor, bias: torch.Tensor | None, rank: int, world_size: int,
              n_heads: int, n_kv_heads: int):
    """Rank `rank`'s head shard of a fused QKV projection: ((nh+2nkv) hs/p, h) rows, same bias rows."""
    layout = QKVLayout(weight.shape[1], n_heads, n_kv_heads)
    rows = layout.rank_rows(rank, world_size)
    return (weight.detach()[rows].clone(),
            None if bias is None else bias.detach()[rows].clone())


def identify_heads(shard: torch.Tensor, weight: torch.Tensor, layout: QKVLayout) -> list[str]:
    """Name each hs-row block of `shard` by the dense head block it equals ("?" for none).

    The dense weight's rows are random and distinct, so equality identifies a block; this is how
    a check tells a student *which* heads they gave a rank.
    """
    hs, names = layout.head_dim, layout.heads()
    dense_blocks = weight.detach().reshape(len(names), hs, -1)          # (nh+2nkv, hs, h)
    if shard.dim() != 2 or shard.shape[1] != weight.shape[1] or shard.shape[0] % hs:
        return ["?"]
    found = []
    for block in shard.detach().reshape(-1, hs, weight.shape[1]):       # (hs, h) each
        match = [n for n, d in zip(names, dense_blocks) if torch.allclose(block, d, atol=1e-6)]
        found.append(match[0] if match else "?")
    return found


def qkv_split_table(n_heads: int = 4, n_kv_heads: int = 2, world_size: int = 2) -> list[dict]:
    """Print who owns which head under the right split (by heads) and the one-block split."""
    layout = QKVLayout(n_heads * 8, n_heads, n_kv_heads)
    names, per = layout.heads(), len(layout.heads()) // world_size
    rows = [{"rank": r, "by heads (right)": " ".join(layout.rank_heads(r, world_size)),
             "one block of rows (wrong)": " ".join(names[r * per:(r + 1) * per])}
            for r in range(world_size)]
    print(f"fused rows: {' '.join(names)}   (each name = head_dim rows)")
    print(tp.format_table(rows))
    return rows


# --------------------------------------------------------------------------------------------
# Dense references: what every check compares against.
# --------------------------------------------------------------------------------------------


def attend(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Causal attention of fused projections (b, s, (nh + 2 nkv) hs) -> (b, s, nh hs).

    Per head: softmax(q k^T / sqrt(hs) + causal mask) v, by `F.scaled_dot_product_attention`.
    Key/value head g serves query heads g*(nh/nkv) .. (g+1)*(nh/nkv)-1. Pure per-head
    computation: on a rank, call it with that rank's head counts nh/p and nkv/p.
    """
    b, s, width = qkv.shape
    hs = width // (n_heads + 2 * n_kv_heads)
    q, k, v = qkv.split([n_heads * hs, n_kv_heads * hs, n_kv_heads * hs], dim=-1)
    q = q.view(b, s, n_heads, hs).transpose(1, 2)                       # (b, nh, s, hs)
    k = k.view(b, s, n_kv_heads, hs).transpose(1, 2)                    # (b, nkv, s, hs)
    v = v.view(b, s, n_kv_heads, hs).transpose(1, 2)                    # (b, nkv, s, hs)
    if n_kv_heads != n_heads:
        # Explicit repeat rather than SDPA's enable_gqa: same result, on every torch and kernel.
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)           # (b, nh, s, hs)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)           # (b, nh, s, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)         # (b, nh, s, hs)
    return y.transpose(1, 2).reshape(b, s, n_heads * hs)                # (b, s, nh hs)


class Attention(nn.Module):
    """Dense causal self-attention: y = proj(attend(qkv(x))), (b, s, h) -> (b, s, h)."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True):
        super().__init__()
        self.layout = QKVLayout(hidden, n_heads, n_kv_heads or n_heads)
        self.n_heads, self.n_kv_heads = n_heads, self.layout.n_kv_heads
        self.qkv = nn.Linear(hidden, self.layout.rows, bias=bias)
        self.proj = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x):
        return self.proj(attend(self.qkv(x), self.n_heads, self.n_kv_heads))


class TransformerBlock(nn.Module):
    """Dense pre-norm block: h = x + attn(norm1(x)); y = h + mlp(norm2(h)), MLP from Lab 3."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int | None = None, ffn: int | None = None):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(hidden), Attention(hidden, n_heads, n_kv_heads)
        self.norm2, self.mlp = nn.LayerNorm(hidden), tp.MLP(hidden, ffn or 4 * hidden)

    def forward(self, x):
        h = x + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


def dense(kind: str, seed: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int) -> nn.Module:
    """A dense "attention" or "block" whose weights depend only on the seed."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if kind == "attention":
            return Attention(hidden, n_heads, n_kv_heads)
        return TransformerBlock(hidden, n_heads, n_kv_heads, ffn)


# --------------------------------------------------------------------------------------------
# Tensor-parallel versions (the lab's reference solution; the checks never compare against them).
# --------------------------------------------------------------------------------------------


class TensorParallelAttention(nn.Module):
    """`Attention` with nh/p query heads and nkv/p key/value heads per rank.

    qkv: column parallel by heads (weight ((nh+2nkv) hs/p, h) from `split_qkv`), behind f
    (`copy_to_tp`: backward all-reduce of dL/dx). proj: Lab 3's `RowParallelLinear`, whose g
    all-reduces the (b, s, h) partial outputs forward. One all-reduce each way.
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
    """`TransformerBlock` with tensor-parallel attention and MLP: norms and residuals replicated,
    two all-reduces of (b, s, h) forward (attention's proj, the MLP's fc2) and two backward."""

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
    """Mean cross-entropy of logits sharded over the vocabulary (the module docstring has the math).

    forward: logits (..., V/p) for vocabulary ids [r V/p, (r+1) V/p), target (...) global ids.
    Three all-reduces of one float per token (max, target logit, sum of exponentials).
    backward: (softmax - onehot) / tokens on the local slice; no communication.
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


# --------------------------------------------------------------------------------------------
# Demonstration: the collectives of one block step, from the record.
# --------------------------------------------------------------------------------------------


def _block_step_rank(rank, world_size, block_cls, config, shape):
    block = dense("block", 0, **config)
    model = block_cls(block, None)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, config["hidden"], generator=g).requires_grad_(True)   # (b, s, h)
    y = model(x)
    dist.barrier()                      # marks the end of the forward in the record
    y.sum().backward()
    return None


def block_comms_table(block_cls=TensorParallelTransformerBlock, world_size: int = 2, batch=2, seq=8,
                      hidden=32, n_heads=4, n_kv_heads=2, ffn=64) -> list[dict]:
    """Print rank 0's collectives in one forward and backward of `block_cls(dense block, group)`."""
    import distlab
    config = dict(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    out = distlab.run(_block_step_rank, world_size, block_cls, config, (batch, seq))
    rows = [{"pass": phase, "op": c.op, "shape": list(c.shapes[0]), "bytes": c.bytes}
            for phase, part in zip(("forward", "backward"), tp.split_at_barriers(out.comms[0]))
            for c in part]
    print(f"one block step on {world_size} ranks, b={batch} s={seq} h={hidden}: "
          f"b*s*h*4 = {batch * seq * hidden * 4} bytes per activation")
    print(tp.format_table(rows))
    return rows


# --------------------------------------------------------------------------------------------
# Scaling benchmark: one code path for distlab.run on a laptop and for torchrun on GPUs.
# --------------------------------------------------------------------------------------------


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _time_steps(model, x, steps: int, warmup: int, dev) -> tuple[list[float], list[tuple]]:
    """Seconds of each timed forward+backward, and its (start, end) on perf_counter."""
    times, windows = [], []
    for i in range(warmup + steps):
        _sync(dev)
        t0 = time.perf_counter()
        model(x).sum().backward()
        _sync(dev)
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
            windows.append((t0, t1))
    return times, windows


def _scaling_rank(rank, world_size, sizes, config, shape, steps, warmup):
    """For each N in `sizes`, ranks 0..N-1 time the block on a group of N ranks (N = 1: the dense
    block); the others wait. Returns {N: (median seconds of the slowest rank, windows)}."""
    dev = rank_device()
    groups = {n: dist.new_group(list(range(n))) for n in sizes if n > 1}   # every rank creates all
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, config["hidden"], generator=g).to(dev).requires_grad_(True)  # (b, s, h)
    result = {}
    for n in sizes:
        if rank < n:
            block = dense("block", 0, **config).to(dev)
            model = block if n == 1 else TensorParallelTransformerBlock(block, groups[n]).to(dev)
            times, windows = _time_steps(model, x, steps, warmup, dev)
            worst = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
            if n > 1:   # a step is over when the slowest rank is done
                dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=groups[n])
            result[n] = (worst.item(), windows)
        dist.barrier()
    return result


def _comm_seconds(comms, windows) -> float | None:
    """Median over steps of the seconds rank 0 spent inside all-reduce calls during a step."""
    per_step = [sum(c.end - c.start for c in comms
                    if c.op == "all_reduce" and c.end is not None and t0 <= c.start and c.end <= t1)
                for t0, t1 in windows]
    return statistics.median(per_step) if per_step else None


def scaling_table(world_sizes=(1, 2, 4), batch=4, seq=64, hidden=128, n_heads=8, n_kv_heads=8,
                  ffn=None, steps=5, warmup=2) -> list[dict]:
    """Forward+backward time of one tensor-parallel transformer block on 1, 2, 4 ranks; print a
    table with speedup T1/TN and scaling efficiency T1/(N TN) against the dense 1-rank block.

    One thread per rank: a core stands in for a device. "all-reduce ms" is rank 0's time inside
    all-reduce calls per step, from the collective record (on NCCL that is only the launch: the
    collective runs asynchronously on the GPU; see Lab 6 for the real timeline).
    """
    import distlab
    ffn = ffn or 4 * hidden
    config = dict(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv_heads, ffn=ffn)
    sizes = sorted(set(world_sizes))
    QKVLayout(hidden, n_heads, n_kv_heads).check_degree(max(sizes))   # fail here, not on every rank
    out = distlab.run(_scaling_rank, max(sizes), sizes, config, (batch, seq), steps, warmup,
                      threads=1, timeout=600)
    t1 = out[0][sizes[0]][0] * sizes[0] if sizes[0] == 1 else None
    rows = []
    for n in sizes:
        seconds, windows = out[0][n]
        comm = _comm_seconds(out.comms[0], windows)
        rows.append({"ranks": n, "ms per step": f"{seconds * 1e3:.2f}",
                     "all-reduce ms": "-" if n == 1 or comm is None else f"{comm * 1e3:.2f}",
                     "speedup T1/TN": f"{t1 / seconds:.2f}" if t1 else "-",
                     "efficiency T1/(N TN)": f"{t1 / (n * seconds):.2f}" if t1 else "-",
                     "backend": out.backend})
    if os.environ.get("RANK", "0") == "0":   # under torchrun every process has the rows
        print(f"transformer block b={batch} s={seq} h={hidden} heads={n_heads}/{n_kv_heads} "
              f"ffn={ffn}, {steps} steps (median, slowest rank), one thread per rank")
        print(tp.format_table(rows))
    return rows


def plot_scaling(rows: list[dict]):
    """Step time and scaling efficiency against the number of ranks, with the ideal lines."""
    import matplotlib.pyplot as plt
    n = [r["ranks"] for r in rows]
    ms = [float(r["ms per step"]) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    comm = [float(r["all-reduce ms"]) if r["all-reduce ms"] != "-" else 0.0 for r in rows]
    ax1.plot(n, ms, "o-", label="measured step")
    ax1.plot(n, comm, "s:", label="inside all-reduce (rank 0)")
    ax1.plot(n, [ms[0] / k for k in n], "--", color="grey", label="ideal T1/N")
    ax1.set(xlabel="ranks N", ylabel="ms per step", xticks=n, title="step time")
    ax1.legend(fontsize="small")
    eff = [float(r["efficiency T1/(N TN)"]) for r in rows if r["efficiency T1/(N TN)"] != "-"]
    ax2.bar([str(k) for k in n[:len(eff)]], eff)
    ax2.axhline(1.0, ls="--", color="grey")
    ax2.set(xlabel="ranks N", ylabel="T1 / (N TN)", title="scaling efficiency", ylim=(0, 1.1))
    fig.tight_layout()
    return fig
