"""Which course code each graded exercise may not use, and which it may.

The distlab package ships working implementations of many exercises: later labs build on them
(Lab 4 on Lab 3's layers), the labs' figures use them, and the checks compute references with
them. A graded answer that *is*, subclasses, wraps or calls one of them earns nothing
(``distlab.runtime.call_guard`` notices it on the judge's ranks). Each checks module says, next
to its checks, in a table an instructor can read::

    COURSE_CODE = {
        "check_copy_to_tp": CourseCode(forbidden=LAB3_SHIPPED),
        "check_tp_block": CourseCode(forbidden=LAB4_SHIPPED, allowed=LAB3_SHIPPED),
    }

``forbidden`` names the shipped implementations of the exercise and the checks' own references
(``"module:qualname"``; a class covers its methods): the handout withholds them
(``distlab.grading.student_package``). ``allowed`` names course helpers the exercise builds on,
which stay usable even when a broader list forbids them. ``watched`` names code the handout must
keep (the lab's own cells use it, or it is torch's) but an answer may not call: the guard notices
it, nothing is withheld. A check the table does not name guards nothing.
"""
from __future__ import annotations

import dataclasses
import sys

from distlab.runtime.call_guard import Guard


@dataclasses.dataclass(frozen=True)
class CourseCode:
    forbidden: tuple[str, ...]       # "module:qualname": what the answer may not be or call
    allowed: tuple[str, ...] = ()    # course helpers the exercise builds on
    watched: tuple[str, ...] = ()    # kept in the handout (the lab's cells use it), not an answer


def guard_of(check) -> Guard | None:
    """The guard for a check function (the unwrapped one the judge runs); None when its module
    declares nothing for it."""
    module = sys.modules.get(getattr(check, "__module__", ""), None)
    entry = getattr(module, "COURSE_CODE", {}).get(getattr(check, "__name__", ""))
    if entry is None:
        return None
    return Guard(frozenset(entry.forbidden + entry.watched), exercise=check.__name__,
                 allowed=frozenset(entry.allowed))


def names(module: str, *qualnames: str) -> tuple[str, ...]:
    """``("module:a", "module:b", ...)``: a table's entries, shorter to read."""
    return tuple(f"{module}:{q}" for q in qualnames)


# ---------------------------------------------------------------------------------------------
# What the course ships, by lab (the tables in the checks modules combine these)

TP = "distlab.labs.tensor_parallel"
ATT = "distlab.labs.attention"
# Not listed: collectives.plain_fit, the ordinary least-squares line that Lab 1's fit figure draws
# beside the student's relative fit. It is the fit the exercise says not to use (absolute errors),
# implements no exercise and computes no reference: harness the figure needs in the handout.
LAB1_SHIPPED = (names("distlab.labs.collectives", "reference_fit", "reference_ring_fit")
                + names("distlab.checks.lab01", "reference_bandwidths", "reference_bus_factor"))
BASELINE = names("distlab.labs.baseline", "full_batch_training")
# Not listed: data_parallel.ddp's ddp_model and ddp_training, PyTorch's own DDP wrapped with a
# comm hook that records its buckets, and the rank body that trains with it. They implement no
# exercise (DDP's all-reduces run in C++, out of the record every check reads, so no check passes
# with them) and compute no reference: harness that Lab 2's DDP comparison and step times need.
LAB2_SHIPPED = (names("distlab.labs.data_parallel.problem", "reference_training",
                      "gradient_average")
                + BASELINE
                + names("distlab.checks.lab02", "_reference")
                + names("distlab.labs.sharded.accounting", "CourseZero1"))
LAB3_SHIPPED = (names(f"{TP}.ops", "CopyToTensorParallel", "ReduceFromTensorParallel",
                      "GatherFromSequenceParallel", "ReduceScatterToSequenceParallel",
                      "GatherFromTensorParallel", "copy_to_tp", "reduce_from_tp", "gather_from_sp",
                      "reduce_scatter_to_sp", "gather_from_tp", "_all_gather", "_reduce_scatter")
                + names(f"{TP}.layers", "shard", "column_shard", "row_shard",
                        "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP",
                        "TensorParallelSwiGLU")
                + names(f"{TP}.sequence_parallel", "TensorParallelBlock")
                + names(f"{TP}.dtensor", "parallelize"))
LAB4_SHIPPED = (names(f"{ATT}.layout", "split_qkv")
                + names("distlab.labs.tp_scaling", "reference_predicted_step",
                        "reference_strong_scaling_efficiency", "ring_all_reduce_time")
                + names(f"{ATT}.parallel", "TensorParallelAttention",
                        "TensorParallelTransformerBlock", "VocabParallelCrossEntropy",
                        "vocab_parallel_cross_entropy"))
LAB5_SHIPPED = (names("distlab.labs.pipeline.model", "partition_layers", "reference_step")
                + names("distlab.labs.pipeline.runs", "library_step", "_library_step")
                + names("distlab.checks.lab05", "_reference"))
INTERVALS = names("distlab.labs.timelines.intervals", "union", "clip", "length", "minus")
# read_kineto is not listed: it is the course's trace reader (every span kind, gloo and NCCL,
# CPU and GPU), the harness under merge_traces that every timeline the labs show is read with
# (Lab 6's runs, stored traces and shipped GPU traces; Lab 9's), so a handout without it shows
# nothing. Exercise 1's implementation, collective_events, stays listed; so do the references.
LAB6_SHIPPED = (names("distlab.labs.timelines.trace", "collective_events")
                + INTERVALS
                + names("distlab.checks.lab06", "_intervals", "reference_comm_share",
                        "reference_exposed_comm", "reference_overlap_fraction",
                        "reference_classify"))
LAB7_SHIPPED = (names("distlab.labs.planning.memory", "memory_per_gpu", "_stage_memory")
                + names("distlab.labs.planning.degrees", "reference_choose_degrees",
                        "valid_layouts")
                + names("distlab.labs.mesh", "megatron_plan")
                + names(f"{TP}.dtensor", "dtensor_plan")
                + names("distlab.labs.mesh_traffic", "megatron_layout", "stage_layout")
                + names("distlab.checks.lab07_prediction", "formula_traffic", "_stage_elements")
                + names("distlab.checks.lab07_design", "_budget", "least_crossing", "crossing",
                        "_calls", "_placements")
                + names("distlab.checks.lab07_scale", "call_table", "order_crossings",
                        "_figures", "hidden_model"))
LAB8_SHIPPED = (names("distlab.labs.sharded.problem", "reference_sharded_training")
                + BASELINE
                + names("distlab.labs.sharded.checkpointing", "best_checkpoint_choice")
                + names("distlab.labs.sharded.accounting", "CourseZero1")
                + names("distlab.checks.lab08", "_reference")
                + names("distlab.checks.lab08_prediction", "formula_step_bytes")
                + names("distlab.labs.sharded.budget", "course_design", "hinted_design"))
EXPERTS = "distlab.labs.experts"
LAB9_SHIPPED = (names(f"{EXPERTS}.parallel", "plan_dispatch", "AllToAll", "run_local_experts",
                      "ep_moe_forward")
                + names(f"{EXPERTS}.moe", "reference_capacity", "reference_keep",
                        "reference_aux_loss", "combine_reference", "MoE.forward"))
