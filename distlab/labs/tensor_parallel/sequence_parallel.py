"""Sequence parallelism around a tensor-parallel MLP (Korthikanti et al. 2022, section 4.2.2):
the norm, dropout and residual run on sequence shards (b, s/p, h); what it saves in activation
memory (``compare_activation_memory``) and what it costs on the wire (``megatron_comm_bytes``)."""
from __future__ import annotations

import copy

import torch.nn as nn

from distlab.labs.activation_memory import ActivationMeter
from distlab.labs.tables import format_table
from distlab.labs.tensor_parallel.dense import Block, dense_mlp, random_batch
from distlab.labs.tensor_parallel.layers import TensorParallelMLP

class TensorParallelBlock(nn.Module):
    """`Block` with a tensor-parallel MLP; with `sequence_parallel` the norm, dropout and residual
    run on sequence shards (b, s/p, h) and the block's input and output are such shards.

    Dropout (Megatron-LM, section 3): a mask applied to activations that differ per rank (a
    sequence shard here, or features inside a TP region) must be drawn independently on each rank;
    one applied to replicated activations must be the same on every rank. Megatron keeps two RNG
    trackers for this (the model-parallel one seeded per TP rank); the checks use dropout 0.
    Norm weights are replicated, but with sequence parallelism each rank's gradient covers only its
    tokens: sum them over the group (one small all-reduce per step) before the optimizer step.
    """

    def __init__(self, block: Block, group=None, sequence_parallel=False):
        super().__init__()
        self.norm = nn.LayerNorm(block.norm.normalized_shape, eps=block.norm.eps)
        self.norm.load_state_dict(block.norm.state_dict())
        self.mlp = TensorParallelMLP(block.mlp, group, sequence_parallel)
        self.drop = nn.Dropout(block.drop.p)

    def forward(self, x):
        return x + self.drop(self.mlp(self.norm(x)))


def megatron_comm_bytes(batch: int, seq: int, hidden: int, itemsize: int = 4) -> dict:
    """Per MLP block and per rank, the collectives Megatron issues and their nccl-tests message
    bytes (the whole b*s*h buffer), as ``{variant: {pass: {op: bytes}}}``.

    tensor parallel (Megatron-LM, section 3): one all-reduce forward (g), one backward (f).
    sequence parallel (Korthikanti et al. 2022, section 4.2.2): forward an all-gather (entering
    the MLP) and a reduce-scatter (leaving it); backward their conjugates, a reduce-scatter and an
    all-gather, *plus* one more all-gather: Megatron keeps only fc1's sequence shard of input for
    the backward and all-gathers it again for fc1's weight gradient (Lab 3, section 7). So the
    backward all-gathers 2 * b*s*h bytes.

    What a rank sends of these on a ring is ``ring_bytes_per_rank``'s (Lab 3 asks the student to
    predict it, so neither docstring states the result). The course's hand-written
    ``ColumnParallelLinear`` keeps the gathered input instead, so its record shows TP's volume:
    the extra all-gather is what buys the activation memory that ``compare_activation_memory``
    reports for fc1's input.
    """
    n = batch * seq * hidden * itemsize
    return {"tp": {"forward": {"all_reduce": n}, "backward": {"all_reduce": n}},
            "sp": {"forward": {"all_gather": n, "reduce_scatter": n},
                   "backward": {"all_gather": 2 * n, "reduce_scatter": n}}}


RING_SHARE = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
              "reduce_scatter": lambda p: (p - 1) / p}


def ring_bytes_per_rank(comm_bytes: dict, world_size: int) -> dict:
    """Bytes each rank sends on a ring, per pass, for one variant of ``megatron_comm_bytes``:
    each op's message bytes times its ring share (2(p-1)/p all-reduce, (p-1)/p the others)."""
    return {phase: sum(RING_SHARE[op](world_size) * nbytes for op, nbytes in ops.items())
            for phase, ops in comm_bytes.items()}


def _memory_rank(rank, world_size, sp_cls, tp_mlp_cls, shape, dropout):
    """Rank body of `compare_activation_memory`: saved bytes of one forward, three ways."""
    batch, seq, hidden, ffn = shape
    block = dense_mlp("block", hidden, ffn, seed=0)
    block.drop.p = dropout
    x, _ = random_batch(batch, seq, hidden)
    shard_x = x.chunk(world_size, 1)[rank]                                   # (b, s/p, h)
    sp = sp_cls(block, None) if sp_cls is not None else TensorParallelBlock(block, None, True)
    if tp_mlp_cls is not None:   # the dense block around a tensor-parallel MLP: norm, dropout
        tp_block = copy.deepcopy(block)   # and residual stay replicated on every rank
        tp_block.mlp = tp_mlp_cls(block.mlp, None)
    else:
        tp_block = TensorParallelBlock(block)
    variants = [("dense (one device)", block, x), ("tensor parallel", tp_block, x),
                ("sequence parallel", sp, shard_x)]
    result = {}
    for name, model, inp in variants:
        inp = inp.clone().requires_grad_(True)
        with ActivationMeter(model) as saved:
            y = model(inp)
        y.sum().backward()   # every variant's collectives are issued on every rank, in step
        result[name] = saved.bytes
    return result


def compare_activation_memory(sp_cls=None, tp_mlp_cls=None, world_size: int = 2, batch=4,
                              seq=64, hidden=64, ffn=256, dropout: float = 0.1) -> list[dict]:
    """Bytes each rank keeps for backward in one `Block` forward: dense, tensor parallel (the
    block around `tp_mlp_cls(dense_mlp, group)`: replicated norm/dropout activations) and
    sequence parallel (`sp_cls(block, group)`). Without a class, the course's own modules."""
    import distlab
    out = distlab.run(_memory_rank, world_size, sp_cls, tp_mlp_cls, (batch, seq, hidden, ffn),
                      dropout)
    dense_bytes = out[0]["dense (one device)"]
    rows = [{"variant": name, "saved KiB per rank": f"{b / 1024:.1f}",
             "vs dense": f"{b / dense_bytes:.2f}"} for name, b in out[0].items()]
    print(f"Block b={batch} s={seq} h={hidden} f={ffn}, dropout {dropout}, {world_size} ranks")
    print(format_table(rows))
    return rows



def _record_rank(rank, world_size, mlp_cls, shape):
    """Rank body of `mlp_comm_record`: one forward, a barrier, one backward."""
    import torch.distributed as dist
    batch, seq, hidden, ffn = shape
    x, dy = random_batch(batch, seq, hidden)
    layer = mlp_cls(dense_mlp("mlp", hidden, ffn, seed=0), None)
    y = layer(x.requires_grad_(True))   # the input needs a gradient: f's backward all-reduce runs
    dist.barrier()
    y.backward(dy)


def mlp_comm_record(mlp_cls, world_size: int = 2, batch=2, seq=8, hidden=16, ffn=None) -> dict:
    """The collectives rank 0 issued in one forward and one backward of ``mlp_cls(dense_mlp,
    group)`` (e.g. your `TensorParallelMLP`): ``{"forward": [(op, bytes)], "backward": [...]}``,
    bytes as nccl-tests counts them (the whole buffer)."""
    import distlab
    out = distlab.run(_record_rank, world_size, mlp_cls, (batch, seq, hidden, ffn or 4 * hidden))
    phases = {"forward": [], "backward": []}
    phase = "forward"
    for c in out.comms[0]:                          # the barrier separates the two passes
        if c.op == "barrier":
            phase = "backward"
        else:
            phases[phase].append((c.op, c.bytes))
    return phases
