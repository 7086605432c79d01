"""Megatron-style tensor parallelism for an MLP block: the reference implementation.

Lab 3 has students write these pieces themselves; this module is what later labs import (Lab 4
builds tensor-parallel attention from `ColumnParallelLinear` and `RowParallelLinear`) and what the
lab's demonstrations run. The graded checks never compare against it: they compare against the
dense single-process modules defined at the bottom (`MLP`, `SwiGLU`, `Block`).

The idea (Shoeybi et al. 2019, "Megatron-LM", section 3). An MLP computes Y = act(X A) B with
X: (b, s, h), A: (h, f), B: (f, h). Split A by columns (output features) and B by rows (input
features) over the p ranks of a tensor-parallel group:

    A = [A_0 | A_1 | ... | A_{p-1}]       B = [B_0; B_1; ...; B_{p-1}]
    Y = sum_r act(X A_r) B_r

The activation is elementwise, so each rank computes act(X A_r) B_r from its shards alone and one
all-reduce of a (b, s, h) tensor sums the partial outputs. Backward mirrors it: the gradient of X is
a sum over ranks of per-rank contributions, so one all-reduce of (b, s, h) again. Those two
collectives are the conjugate operators f and g of the paper:

    f = CopyToTensorParallel      forward: identity     backward: all-reduce
    g = ReduceFromTensorParallel  forward: all-reduce   backward: identity

Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2) keeps the norm and dropout, which are per token, on sequence
shards (b, s/p, h), and replaces f by an all-gather along the sequence (backward: reduce-scatter)
and g by a reduce-scatter (backward: all-gather). An all-reduce *is* a reduce-scatter followed by
an all-gather, so forward moves the bytes TP moves, and activations outside the MLP shrink
p-fold. The backward moves more: Megatron saves only the sequence shard of fc1's input and
all-gathers it again for fc1's weight gradient, one all-gather more than TP (``megatron_comm_bytes``).

The submodules: ``ops`` (the f/g operators and their sequence-parallel versions), ``dense``
(the single-process references), ``layers`` (column/row-parallel linears, the parallel MLPs),
``sequence_parallel`` (the block on sequence shards, its memory and bytes), ``dtensor`` (the same
plans for ``parallelize_module``) and ``demos`` (the lab's runs on real ranks). The names a lab
cell uses are re-exported here.

Process groups are passed explicitly (`group=None` means the default group). Run a quick
equality check of this module on 2 CPU ranks with
    python -m pytest tests/test_lab03.py
or in your own script under torchrun, e.g. `torchrun --nproc-per-node 2 my_tp_script.py`.
"""
from __future__ import annotations

from distlab.labs.tables import format_table
from distlab.labs.tensor_parallel.demos import compare_with_dtensor, split_at_barriers, timing_table
from distlab.labs.tensor_parallel.dense import MLP, Block, SwiGLU, dense_mlp, random_batch
from distlab.labs.tensor_parallel.dtensor import dtensor_plan, parallelize
from distlab.labs.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                 TensorParallelMLP, TensorParallelSwiGLU,
                                                 column_shard, row_shard, shard)
from distlab.labs.tensor_parallel.ops import (CopyToTensorParallel, GatherFromSequenceParallel,
                                              GatherFromTensorParallel, ReduceFromTensorParallel,
                                              ReduceScatterToSequenceParallel, copy_to_tp,
                                              gather_from_sp, gather_from_tp, reduce_from_tp,
                                              reduce_scatter_to_sp)
from distlab.labs.tensor_parallel.sequence_parallel import (TensorParallelBlock,
                                                            compare_activation_memory,
                                                            megatron_comm_bytes,
                                                            mlp_comm_record,
                                                            ring_bytes_per_rank)

__all__ = ["format_table", "compare_with_dtensor", "split_at_barriers", "timing_table", "MLP",
           "Block", "SwiGLU", "dense_mlp", "random_batch", "dtensor_plan", "parallelize",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "TensorParallelSwiGLU",
           "column_shard", "row_shard", "shard", "CopyToTensorParallel",
           "GatherFromSequenceParallel", "GatherFromTensorParallel", "ReduceFromTensorParallel",
           "ReduceScatterToSequenceParallel", "copy_to_tp", "gather_from_sp", "gather_from_tp",
           "reduce_from_tp", "reduce_scatter_to_sp", "TensorParallelBlock",
           "compare_activation_memory", "megatron_comm_bytes", "ring_bytes_per_rank",
           "mlp_comm_record"]
