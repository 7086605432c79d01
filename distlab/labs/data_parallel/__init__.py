"""Plumbing for lab 2, data parallelism: the problem, the single-process baseline, the rank-side
trainer, optimizer-state memory, DDP, and the step-time comparison (the submodules ``problem``,
``ddp``, ``step_times`` and ``memory``; the names a lab cell uses are re-exported here).

Data parallelism in one paragraph. Every rank holds the whole model and its own slice of the batch:
with a global batch of B rows and W ranks, rank r takes rows [r*B/W, (r+1)*B/W). Each rank's loss
is the mean over its own rows, so the losses differ. Because the slices are equal in size,

    grad of the full-batch mean loss = (1/W) * sum_r grad of rank r's mean loss,

so one all-reduce (sum) per gradient followed by a division by W gives every rank the gradient of
single-process training on the full batch; the ranks then take identical optimizer steps and their
parameters stay identical. Communication per step: an all-reduce of every gradient, i.e. the
parameter bytes P; a ring moves 2*(W-1)/W * P bytes in and out of each rank for it.

The students write the gradient synchronisation themselves (lab 2), and these helpers run it,
time it and compare it with PyTorch's DDP. The single-process baseline (``reference_training``)
and the gradient-average computation are the course's answers: a Lab 2 handout leaves them out,
and its cells show their stored outputs (``stored``, data/02_data_parallel/) instead.
"""
from __future__ import annotations

from distlab.labs.data_parallel.ddp import (backend_features, compare_with_ddp, ddp_model,
                                            ddp_training, show_backend_features)
from distlab.labs.data_parallel.memory import format_memory, optimizer_memory, plot_optimizer_memory
from distlab.labs.data_parallel.problem import (Setup, final_state, flat, format_gradient_average,
                                                gradient_average, gradient_average_demo,
                                                optimizer_state_bytes, param_bytes, rank_problem,
                                                rank_rows, reference_training, shard_bounds,
                                                stored, train_steps)
from distlab.labs.data_parallel.step_times import (BENCH_SETUP, compare_step_times,
                                                   format_step_times, overlap_beside_gpu,
                                                   plot_step_times, step_time_ranks)
from distlab.labs.losses import loss_fn
from distlab.runtime.devices import device

__all__ = ["backend_features", "compare_with_ddp", "ddp_model", "ddp_training",
           "show_backend_features", "format_memory", "optimizer_memory", "plot_optimizer_memory",
           "Setup", "final_state", "flat", "format_gradient_average", "gradient_average",
           "gradient_average_demo", "optimizer_state_bytes", "param_bytes", "rank_problem",
           "rank_rows", "reference_training", "shard_bounds", "stored", "train_steps",
           "BENCH_SETUP", "compare_step_times", "format_step_times", "overlap_beside_gpu",
           "plot_step_times", "step_time_ranks", "loss_fn", "device"]
