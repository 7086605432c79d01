"""Context parallelism (CP) in the planner: each sequence cut over ``cfg.cp`` GPUs. Lab 10.

The CP scheme planned is Llama 3's (arXiv 2407.21783 §3.3.2): all-gather based. Each of the cp
GPUs holds s/cp tokens of every sequence; per layer it all-gathers K and V of the whole sequence,
attends for its own queries, and in backward reduce-scatters dK and dV. Ranks are laid out
[TP, CP, PP, DP] as Llama 3 does, so a CP group spans t·cp consecutive GPUs.

What changes against Lab 7's three axes (``cp = 1`` changes nothing; tests/test_lab10_measured.py
holds Lab 7's numbers to that):
- **memory**: a GPU keeps the activations of s/cp tokens: ``memory_per_gpu`` at s/cp. Two
  corrections: without recompute the attention scores of its s/cp queries span all s keys, cp
  times the (s/cp)² that s/cp tokens alone would keep; and the layer being computed holds K and V
  of the whole sequence, gathered (``gathered_kv_bytes``). The cp GPUs of a group hold the same
  weights, so ZeRO shards the model states over d·cp GPUs (as Megatron-LM's distributed optimizer
  does over its data-and-context group).
- **traffic**: TP and PP move activations of s/cp tokens; DP's collectives span the d·cp GPUs
  that hold the same weights; and the CP axis moves K/V (``cp_bytes_per_step``).
"""
from __future__ import annotations

import math
from dataclasses import replace

from distlab.labs.planning.communication import comm_bytes_per_step
from distlab.labs.planning.memory import (activation_bytes_per_layer, inflight_microbatches,
                                          logits_bytes, memory_per_gpu)
from distlab.labs.planning.shapes import GB, Job, Model, ParallelConfig, TERMS
from distlab.labs.planning.step_time import bubble_fraction
from distlab.labs.tables import format_table

CP_DEGREES = (1, 2, 4, 8, 16, 32, 64, 128)       # powers of two, as CP groups are laid out

# Llama 3 405B's long-context stage (Llama 3 paper, Table 4 and Section 3.4.2): 16,384 H100 80GB,
# TP 8, CP 16, PP 16, hence DP 8; sequences of 131,072 tokens, 16M tokens per batch (128
# sequences, 16 per DP rank); 380 TFLOP/s per GPU (38% MFU). The job is the course's 405B job
# (LLAMA3_405B_JOB: ZeRO-1, full recompute, as Lab 7 explains) at 128K tokens.
LLAMA3_405B_128K_JOB = Job(seq_len=131072, global_batch=128, micro_batch=1, zero_stage=1,
                           recompute="full")
LLAMA3_405B_128K_PUBLISHED = ParallelConfig(tp=8, pp=16, dp=8, job=LLAMA3_405B_128K_JOB, cp=16)
LLAMA3_405B_128K_GPUS = 16384
LLAMA3_405B_128K_TFLOPS = 380.0       # per GPU, measured (Table 4)


def rank_view(cfg: ParallelConfig) -> ParallelConfig:
    """The three-axis layout that holds what one CP rank holds: sequences of s/cp tokens, weights
    replicated over d·cp GPUs, the same m = B/(b·d) micro-batches per pipeline (the batch is
    scaled by cp so that B/(b·d·cp) stays m)."""
    job = cfg.job
    if job.seq_len % cfg.cp:
        raise ValueError(f"seq_len {job.seq_len} does not split over CP = {cfg.cp} GPUs")
    return ParallelConfig(cfg.tp, cfg.pp, cfg.dp * cfg.cp,
                          replace(job, seq_len=job.seq_len // cfg.cp,
                                  global_batch=job.global_batch * cfg.cp))


def gathered_kv_bytes(model: Model, cfg: ParallelConfig) -> float:
    """K and V of the whole sequence for the layer being computed, on one GPU (0 without CP):
    2 · s · b · (kv_heads/t) · head_dim · weight_bytes; TP splits the KV heads, down to one head
    per GPU (more TP ranks than KV heads replicate them)."""
    if cfg.cp == 1:
        return 0.0
    job, head_dim = cfg.job, model.hidden // model.heads
    heads = max(model.kv_heads / cfg.tp, 1)
    return 2 * job.seq_len * job.micro_batch * heads * head_dim * job.weight_bytes


def _scores_beyond(model: Model, cfg: ParallelConfig, view: ParallelConfig) -> float:
    """Per layer and micro-batch: the score bytes all-gather CP keeps beyond what s/cp tokens
    alone would (no recompute only): (cp − 1) times the scores of s/cp tokens."""
    if cfg.job.recompute != "none" or cfg.cp == 1:
        return 0.0
    scores = activation_bytes_per_layer(model, cfg.tp, view.job) - \
        activation_bytes_per_layer(model, cfg.tp, replace(view.job, recompute="selective"))
    return (cfg.cp - 1) * scores


def cp_memory_per_gpu(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes per GPU by term (TERMS and "total") on the heaviest pipeline stage, with CP: Lab 7's
    ``memory_per_gpu`` of ``rank_view(cfg)`` (s/cp tokens, ZeRO over d·cp), whose activations
    get the scores beyond (no recompute) and the gathered K/V of one layer."""
    view = rank_view(cfg)
    terms = dict(memory_per_gpu(model, view))
    per_layer = activation_bytes_per_layer(model, cfg.tp, view.job) + \
        _scores_beyond(model, cfg, view)
    layers, m = math.ceil(model.layers / cfg.pp), max(view.microbatches, 1)

    def stage(s: int) -> float:
        logits = logits_bytes(model, cfg.tp, view.job) if s == cfg.pp - 1 else 0.0
        return per_layer * layers * inflight_microbatches(cfg.pp, m, s) + logits

    terms["activations"] = max(stage(0), stage(cfg.pp - 1)) + gathered_kv_bytes(model, cfg)
    terms["total"] = sum(terms[t] for t in TERMS)
    return terms


def cp_bytes_per_step(model: Model, cfg: ParallelConfig) -> float:
    """Bytes one GPU receives per step on the CP axis (all-gather CP, ring bus convention):
    per layer of its stage and per micro-batch, an all-gather of K and V forward and a
    reduce-scatter of dK and dV backward, each (cp−1)/cp of the whole sequence's K/V,
    2 · s · b · (kv_heads/t) · head_dim · weight_bytes; full recompute gathers once more."""
    if cfg.cp == 1:
        return 0.0
    calls = 2 + (1 if cfg.job.recompute == "full" else 0)
    return cfg.microbatches * math.ceil(model.layers / cfg.pp) * calls * \
        (cfg.cp - 1) / cfg.cp * gathered_kv_bytes(model, cfg)


def cp_comm_bytes_per_step(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes one GPU sends per step on each axis, with CP: Lab 7's ``comm_bytes_per_step`` of
    ``rank_view(cfg)`` (TP and PP on s/cp tokens, DP over the d·cp GPUs that hold the same
    weights), and "cp" (``cp_bytes_per_step``) when cp > 1."""
    out = dict(comm_bytes_per_step(model, rank_view(cfg)))
    if cfg.cp > 1:
        out["cp"] = cp_bytes_per_step(model, cfg)
    return out


def cp_layouts(model: Model, job: Job, tp: int, pp: int, gpus: int | None = None, dp: int = 1,
               degrees=CP_DEGREES) -> list[ParallelConfig]:
    """Layouts at fixed TP and PP over CP degrees: with ``gpus`` given, DP = gpus/(t·p·cp) (the
    GPUs fixed, as in the published run); else DP = ``dp`` (the batch per DP rank fixed). Only
    degrees that split the sequence and leave at least one sequence per DP rank."""
    out = []
    for cp in degrees:
        d = gpus // (tp * pp * cp) if gpus else dp
        if d >= 1 and (not gpus or d * tp * pp * cp == gpus) and job.seq_len % cp == 0 \
                and job.global_batch // (job.micro_batch * d) >= 1:
            out.append(ParallelConfig(tp, pp, d, job, cp=cp))
    return out


def cp_table(model: Model, layouts: list[ParallelConfig], gpu_mem_gb: float = 80.0) -> str:
    """Per layout: tokens per GPU, memory per GPU by the planner, whether it fits, micro-batches
    per pipeline, the bubble, and the CP axis's bytes per step."""
    rows = []
    for cfg in layouts:
        mem = cp_memory_per_gpu(model, cfg)
        comm = cp_comm_bytes_per_step(model, cfg)
        rows.append({"layout": str(cfg), "GPUs": f"{cfg.gpus:,}",
                     "tokens/GPU": f"{cfg.job.seq_len // cfg.cp:,}",
                     "states GB": f"{(mem['total'] - mem['activations']) / GB:.1f}",
                     "activations GB": f"{mem['activations'] / GB:.1f}",
                     "total GB": f"{mem['total'] / GB:.1f}",
                     "fits": "yes" if mem["total"] <= gpu_mem_gb * GB else "no",
                     "m": cfg.microbatches,
                     "bubble": f"{bubble_fraction(cfg.pp, cfg.microbatches):.0%}",
                     "CP GB/step": f"{comm.get('cp', 0.0) / GB:.1f}"})
    return format_table(rows)
