"""Memory per GPU: model states under ZeRO, activations (Korthikanti's GPT constants, and Llama's
beside them), the last stage's logits, and the heaviest pipeline stage. Lab 7.

Mixed-precision Adam (bytes per parameter, ZeRO paper, Rajbhandari et al. 2020, arXiv:1910.02054):
bf16 weights 2, gradients 2 (bf16) or 4 (fp32, as Hugging Face counts them), fp32 master weights 4,
Adam first moment 4, second moment 4: 16 or 18 bytes per parameter. ZeRO-1 shards the optimizer
state (master + moments) over the d data-parallel ranks, ZeRO-2 also the gradients, ZeRO-3 (= FSDP)
also the weights. Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198, Section 4), whose constants are a GPT layer's.
"""
from __future__ import annotations

import math

from distlab.labs.planning.shapes import TERMS, Job, Model, ParallelConfig

GATHERED_LAYERS = 2  # ZeRO-3/FSDP holds a layer's gathered weights and prefetches the next
LOGIT_BYTES = 4     # the cross-entropy keeps fp32 logits (upcast from bf16) for its backward


def stage_params(model: Model, tp: int, pp: int) -> float:
    """Parameters one GPU holds before data-parallel sharding, on the first (or last) stage.

    A stage holds ceil(L/p) layers; the first stage also holds the embedding and the last the
    output head (V x h each; both when p = 1). Tensor parallelism splits all of it t ways (the
    norms are replicated, a negligible error).
    """
    layers = math.ceil(model.layers / pp) * model.layer_params
    vocab = (2 if pp == 1 else 1) * model.vocab * model.hidden
    return (layers + vocab) / tp


def activation_bytes_per_layer(model: Model, tp: int, job: Job) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, Section 4 (a GPT layer: 16-bit activations, dropout masks counted,
    GeLU MLP of width 4h, full multi-head attention), with S = s*b*h:
      no recompute:            S * (10 + 24/t + 5 a s/(h t))   (t = 1: S * (34 + 5 a s / h))
      + sequence parallelism:  S * (34 + 5 a s / h) / t
      selective recompute drops the 5 a s / h attention-score term;
      full recompute keeps only the layer input, 2 S bytes (2 S / t with sequence parallelism).
    llama_activation_bytes_per_layer counts a Llama layer the same way, for comparison.
    """
    s, b, h, a, t = job.seq_len, job.micro_batch, model.hidden, model.heads, tp
    sbh = s * b * h
    scores = 0.0 if job.recompute == "selective" else 5 * a * s / h
    if job.recompute == "full":
        return 2 * sbh / (t if job.sequence_parallel else 1)
    if job.recompute not in ("none", "selective"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {job.recompute!r}")
    if job.sequence_parallel:
        return sbh * (34 + scores) / t
    return sbh * (10 + 24 / t + scores / t)


def llama_activation_bytes_per_layer(model: Model, tp: int, job: Job) -> float:
    """Korthikanti's count redone for a Llama layer (no dropout, grouped-query attention with
    r = kv_heads/heads, SwiGLU of width f), 16-bit, in units of S = s*b*h bytes:
      two RMSNorm inputs 4; attention: its input 2, Q 2, K and V 4r, the o-projection's input 2;
      MLP: its input 2, the gate and up outputs 4 f/h, their product 2 f/h;
      total 12 + 4r + 6 f/h (GPT: 34), plus 2 a s/h of softmax output without selective recompute
      (GPT: 5 a s/h, the dropout's mask and output included).
    Without sequence parallelism the norms' inputs and the two blocks' inputs (8, GPT: 10 with two
    dropout masks) stay whole on every TP rank. Full recompute keeps the layer input, as for GPT.
    """
    s, b, h, a, t = job.seq_len, job.micro_batch, model.hidden, model.heads, tp
    sbh = s * b * h
    if job.recompute == "full":
        return 2 * sbh / (t if job.sequence_parallel else 1)
    r, f = model.kv_heads / model.heads, model.ffn / h
    scores = 0.0 if job.recompute == "selective" else 2 * a * s / h
    split = 2 + 4 * r + 2 + 6 * f + scores          # Q, K and V, o input, MLP products, scores
    if job.sequence_parallel:
        return sbh * (8 + split) / t
    return sbh * (8 + split / t)


def logits_bytes(model: Model, tp: int, job: Job) -> float:
    """The last stage's logits for one micro-batch, kept for the cross-entropy's backward: s*b*V
    fp32 values, split over TP ranks by vocabulary (Megatron's vocab-parallel cross-entropy)."""
    return LOGIT_BYTES * job.seq_len * job.micro_batch * model.vocab / tp


def inflight_microbatches(pp: int, microbatches: int, stage: int = 0) -> int:
    """With 1F1B stage s holds the activations of min(p - s, m) micro-batches at its peak: the
    first stage min(p, m), the last one."""
    return min(pp - stage, microbatches)


def zero_divides(job: Job, microbatches: int) -> dict[str, bool]:
    """Which states ZeRO divides by d. ZeRO-1 the optimizer's; ZeRO-2 also the gradients, ZeRO-3
    also the weights, except when they stay resident across m > 1 micro-batches
    (``Job.zero_accumulation == "resident"``)."""
    resident = job.zero_accumulation == "resident" and microbatches > 1
    if job.zero_accumulation not in ("regather", "resident"):
        raise ValueError(f"zero_accumulation must be 'regather' or 'resident', "
                         f"got {job.zero_accumulation!r}")
    return {"optimizer": job.zero_stage >= 1,
            "gradients": job.zero_stage >= 2 and not resident,
            "weights": job.zero_stage >= 3 and not resident}


def _stage_memory(model: Model, cfg: ParallelConfig, stage: int) -> dict[str, float]:
    job, d, m = cfg.job, cfg.dp, max(cfg.microbatches, 1)
    phi = stage_params(model, cfg.tp, cfg.pp)
    div = zero_divides(job, m)
    opt = d if div["optimizer"] else 1
    activations = activation_bytes_per_layer(model, cfg.tp, job) * math.ceil(model.layers / cfg.pp) \
        * inflight_microbatches(cfg.pp, m, stage)
    if stage == cfg.pp - 1:
        activations += logits_bytes(model, cfg.tp, job)
    weights = job.weight_bytes * phi / (d if div["weights"] else 1)
    if div["weights"] and d > 1:
        # ZeRO-3 computes on whole layers: the one gathered now and the next, prefetched.
        weights += job.weight_bytes * GATHERED_LAYERS * model.layer_params / cfg.tp
    terms = {
        "weights": weights,
        "gradients": job.grad_bytes * phi / (d if div["gradients"] else 1),
        "master_weights": 4 * phi / opt,
        "adam_m": 4 * phi / opt,
        "adam_v": 4 * phi / opt,
        "activations": activations,
    }
    terms["total"] = sum(terms.values())
    return terms


def memory_per_gpu(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes one GPU holds to train ``model`` with the layout ``cfg``, by term (``TERMS``) and
    their "total", on whichever pipeline stage holds the most: section 1's count of Lab 7, with
    the conventions of Exercise 1's contract (ZeRO stage and accumulation, recompute, sequence
    parallelism, 1F1B)."""
    stages = {0, cfg.pp - 1}
    return max((_stage_memory(model, cfg, s) for s in sorted(stages)), key=lambda t: t["total"])


def rule_of_thumb_gpus(params: float, gpu_mem_gb: float) -> float:
    """num_GPUs = params_in_B * 18 * 1.25 / GPU_GB: 18 bytes per parameter (2 + 4 + 4 + 4 + 4:
    bf16 weights, fp32 gradients, master weights and both Adam moments) times 1.25 for activations.
    It assumes states are split evenly over all GPUs (as ZeRO-3 or t * p = n would) and activations
    of a quarter of the states: it breaks for long sequences (activations grow with s^2 without
    recompute, with s with it) and large batches, and ignores replication from data parallelism."""
    return params / 1e9 * 18 * 1.25 / gpu_mem_gb
