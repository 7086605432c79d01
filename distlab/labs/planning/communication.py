"""Communication per step: the bytes each axis (TP, PP, DP) sends per GPU and the links it runs
on. Lab 7.

Bus-bandwidth convention (Lab 1, nccl-tests): over k ranks a ring all-reduce of S bytes sends
2 (k-1)/k S per rank, a reduce-scatter or an all-gather (k-1)/k S.
"""
from __future__ import annotations

import math

from distlab.labs.planning.memory import stage_params, zero_divides
from distlab.labs.planning.shapes import GB, Cluster, Model, ParallelConfig


def axis_bandwidth(cluster: Cluster, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes/s each axis's links carry. Ranks are laid out TP innermost, then PP, then DP (the
    order Llama 3 used: [TP, CP, PP, DP]), so a TP group is t consecutive GPUs, a PP group spans
    t*p and a DP group t*p*d; an axis stays on NVLink only while that span fits in a node."""
    g = cluster.gpus_per_node

    def bw(span: int) -> float:
        return (cluster.intra_node_gbs if span <= g else cluster.inter_node_gbs) * GB

    return {"tp": bw(cfg.tp), "pp": bw(cfg.tp * cfg.pp), "dp": bw(cfg.gpus)}


def tp_collectives_per_layer(cfg: ParallelConfig) -> int:
    """(t-1)/t-sized collectives of one b*s*h activation per layer and micro-batch (an all-reduce
    counts 2: a reduce-scatter plus an all-gather).

    Without sequence parallelism: two all-reduces forward (attention, MLP) and two backward: 8.
    With it (Korthikanti et al. 2022, Section 4.2.2; Lab 3): each all-reduce becomes a
    reduce-scatter and an all-gather (the same 8), and the backward all-gathers the sequence shard
    of each block's input once more, to compute the weight gradients of the column-parallel
    linears, because only the shard was kept: 8 + 2 = 10.
    Full recompute runs the forward again in backward: + 4.
    """
    calls = 10 if cfg.job.sequence_parallel else 8
    return calls + (4 if cfg.job.recompute == "full" else 0)


def dp_traffic(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """The data-parallel collectives of one step, as bytes each GPU sends, by kind.

    Plain DP (ZeRO-0): an all-reduce of the gradients, 2 (d-1)/d phi g.
    ZeRO-1/2: a reduce-scatter of the gradients and an all-gather of the updated bf16 weights,
      (d-1)/d phi (g + w) (ZeRO paper, arXiv:1910.02054, Section 7.2: the same volume as DP).
    ZeRO-3: a reduce-scatter of the gradients and two all-gathers of the weights (forward and
      backward), (d-1)/d phi (g + 2w): 1.5x DP in the paper's units (g = w).
    With m > 1 micro-batches and ZeRO-2/3 regathering (Job.zero_accumulation), every micro-batch
    reduce-scatters its gradients (ZeRO-2, 3) and gathers the weights twice (ZeRO-3): those terms
    are paid m times. Resident ZeRO-2/3 move what ZeRO-1 moves (and keep full states).
    """
    job, d, m = cfg.job, cfg.dp, max(cfg.microbatches, 1)
    phi = stage_params(model, cfg.tp, cfg.pp)
    share = (d - 1) / d * phi
    if job.zero_stage == 0:
        return {"all_reduce": 2 * share * job.grad_bytes}
    div = zero_divides(job, m)
    return {"reduce_scatter": share * job.grad_bytes * (m if div["gradients"] else 1),
            "all_gather": share * job.weight_bytes * (2 * m if div["weights"] else 1)}


def zero_charge(job, microbatches: int) -> str:
    """In words, what dp_traffic and memory_per_gpu charge for the job's ZeRO stage over
    ``microbatches`` micro-batches per step: which states are sharded, which collectives, how often."""
    if job.zero_stage == 0:
        return "ZeRO-0 (plain DP): nothing sharded; one all-reduce of the gradients per step"
    div = zero_divides(job, max(microbatches, 1))
    sharded = ", ".join(label for name, label in (("optimizer", "optimizer state"),
                                                   ("gradients", "gradients"),
                                                   ("weights", "weights")) if div[name])
    if job.zero_stage == 1 or (microbatches <= 1 or job.zero_accumulation == "resident"):
        how = "one reduce-scatter of the gradients and one all-gather of the weights per step"
        if job.zero_stage == 3 and div["weights"]:
            how = ("one reduce-scatter of the gradients and two all-gathers of the weights "
                   "(forward, backward) per step")
        kept = "" if job.zero_stage == 1 or microbatches <= 1 else \
            f", full {'weights and ' if job.zero_stage == 3 else ''}gradients kept resident " \
            f"over the {microbatches} micro-batches"
        return f"ZeRO-{job.zero_stage}: {sharded} sharded over DP{kept}; {how}"
    per = "reduce-scatter of the gradients" + (" and two all-gathers of the weights"
                                               if job.zero_stage == 3 else "")
    once = "" if job.zero_stage == 3 else "; one all-gather of the weights per step"
    return (f"ZeRO-{job.zero_stage}, regathering: {sharded} sharded over DP; a {per} "
            f"for each of the {microbatches} micro-batches{once}")


def comm_bytes_per_step(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes one GPU sends per optimizer step on each axis.

    tp: m * ceil(L/p) * tp_collectives_per_layer * (t-1)/t * b s h * weight_bytes.
    pp: per micro-batch each stage boundary sends b*s*h activations forward and the same-size
        gradient backward: m * 2 * b s h * weight_bytes (zero when p = 1).
    dp: the sum of dp_traffic.
    """
    job, t, p, m = cfg.job, cfg.tp, cfg.pp, cfg.microbatches
    act = job.micro_batch * job.seq_len * model.hidden * job.weight_bytes
    return {
        "tp": m * math.ceil(model.layers / p) * tp_collectives_per_layer(cfg) * (t - 1) / t * act,
        "pp": m * 2 * act if p > 1 else 0.0,
        "dp": sum(dp_traffic(model, cfg).values()),
    }
