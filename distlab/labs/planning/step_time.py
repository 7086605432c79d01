"""Time per step: compute, the pipeline bubble and each axis's communication, and the MFU that
such a step would measure. Lab 7."""
from __future__ import annotations

from distlab.labs.planning.communication import axis_bandwidth, comm_bytes_per_step
from distlab.labs.planning.shapes import Cluster, Model, ParallelConfig


def bubble_fraction(pp: int, microbatches: int) -> float:
    """Idle share of a 1F1B/GPipe pipeline step: (p - 1) / (m + p - 1). (PTD-P writes the bubble
    as (p - 1) / m of the ideal time; the two say the same thing.)"""
    return (pp - 1) / (microbatches + pp - 1)


def model_flops(model: Model, cfg: ParallelConfig) -> float:
    """6 N tokens per step (forward 2, backward 4; attention FLOPs left out): the numerator of MFU,
    which does not count recomputation."""
    return 6 * model.params * cfg.job.global_batch * cfg.job.seq_len


def step_time(model: Model, cluster: Cluster, cfg: ParallelConfig) -> dict[str, float]:
    """Estimated seconds per optimizer step, by part; "total" is the cost choose_degrees minimises.

    compute = 6 N tokens / (n * peak * kernel_efficiency)   (8 N tokens with full recompute;
              attention FLOPs and the selective recompute's few percent are left out). The
              efficiency is inside the kernels: bubble and communication come on top.
    bubble  = compute * (p - 1) / m            (PTD-P, non-interleaved 1F1B)
    tp, pp, dp = comm_bytes_per_step / axis_bandwidth, counted as if nothing overlapped: TP sits
              on the critical path; PP and DP overlap partly in practice, so this is an upper bound.
    """
    flops = model_flops(model, cfg) * (8 / 6 if cfg.job.recompute == "full" else 1)
    compute = flops / (cfg.gpus * cluster.peak_tflops * 1e12 * cluster.kernel_efficiency)
    comm = comm_bytes_per_step(model, cfg)
    bw = axis_bandwidth(cluster, cfg)
    parts = {"compute": compute, "bubble": compute * (cfg.pp - 1) / cfg.microbatches}
    parts.update({axis: comm[axis] / bw[axis] for axis in ("tp", "pp", "dp")})
    parts["total"] = sum(parts.values())
    return parts


def model_mfu(model: Model, cluster: Cluster, cfg: ParallelConfig) -> float:
    """The MFU a run would measure if it took step_time's total: 6 N tokens over (n * peak *
    seconds), end to end like the published figures (Llama 3's 43%), bubble and communication
    included."""
    seconds = step_time(model, cluster, cfg)["total"]
    return model_flops(model, cfg) / (cfg.gpus * cluster.peak_tflops * 1e12 * seconds)


def measured_step_seconds(model: Model, cfg: ParallelConfig, tflops_per_gpu: float) -> float:
    """The whole step a measured throughput implies: 6 N tokens / (n * TFLOP/s per GPU)."""
    return model_flops(model, cfg) / (cfg.gpus * tflops_per_gpu * 1e12)
