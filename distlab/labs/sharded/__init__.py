"""Plumbing for Lab 8, sharded data parallelism: the problem and its single-process baseline
(``problem``), ZeRO-3's storage helpers (``flat``), the rank-side harness the checks and tables
run (``harness``), activation checkpointing measured (``checkpointing``), the memory and
communication tables (``accounting``) and the figures (``figures``).

ZeRO in one paragraph (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", arXiv:1910.02054). Data parallelism replicates the model states on
every rank: parameters, gradients, optimizer state. ZeRO shards them over the W data-parallel
ranks, one more kind per stage: stage 1 the optimizer state, stage 2 also the gradients (each
rank keeps the reduce-scattered gradient of its shard only), stage 3 also the parameters (each
block gathered just before it computes and freed after). Stages 1 and 2 move what data
parallelism moves (reduce-scatter + all-gather = all-reduce: 2 Psi); stage 3 gathers the
parameters twice per step (forward and backward) and reduce-scatters the gradients: 3 Psi.
"""
from __future__ import annotations

from distlab.labs.sharded.checkpointing import (CheckpointProblem, best_checkpoint_choice,
                                                block_profile, budget_of, recompute_flops,
                                                run_stack, saved_bytes)
from distlab.labs.sharded.flat import alloc_storage, bind_params, free_storage, storage_bytes
from distlab.labs.sharded.harness import (grad_bytes, wrap_blocks, wrap_model, zero2_training,
                                          zero3_training)
from distlab.labs.sharded.problem import (MLPBlock, ShardSetup, block_flats, padded_flat,
                                          rank_batch, reference_sharded_training, shard_numel)

__all__ = ["CheckpointProblem", "best_checkpoint_choice", "block_profile", "budget_of",
           "recompute_flops", "run_stack", "saved_bytes", "alloc_storage", "bind_params",
           "free_storage", "storage_bytes", "grad_bytes", "wrap_blocks", "wrap_model",
           "zero2_training", "zero3_training", "MLPBlock", "ShardSetup", "block_flats",
           "padded_flat", "rank_batch", "reference_sharded_training", "shard_numel"]
