"""Planning 3D parallelism: memory per GPU, the choice of (TP, PP, DP) degrees, the pipeline
bubble and the communication each axis moves per step. Lab 7.

Notation (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", the PTD-P paper): ``t, p, d`` tensor-, pipeline- and data-parallel degrees with
``t * p * d = n`` GPUs; ``B`` global batch (sequences per step), ``b`` micro-batch, ``m = B / (b d)``
micro-batches per pipeline per step; ``s`` sequence length, ``h`` hidden size, ``a`` attention
heads, ``L`` layers.

Memory per GPU for mixed-precision Adam (bytes per parameter, ZeRO paper, Rajbhandari et al. 2020):
bf16 weights 2, gradients 2 (bf16) or 4 (fp32, as Hugging Face counts them), fp32 master weights 4,
Adam first moment 4, second moment 4: 16 or 18 bytes per parameter. ZeRO-1 shards the optimizer
state (master + moments) over the d data-parallel ranks, ZeRO-2 also the gradients, ZeRO-3 (= FSDP)
also the weights. Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models").

GPU memory and bandwidths use decimal units (GB = 1e9 bytes): a "80 GB" H100 holds 80 GiB, so
comparing with 80e9 bytes leaves about 7% for the CUDA context, allocator fragmentation and
communication buffers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GB = 1e9

# The terms of memory_per_gpu, in the order a breakdown is shown.
TERMS = ("weights", "gradients", "master_weights", "adam_m", "adam_v", "activations")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer (Llama layout: grouped-query attention, SwiGLU MLP, untied
    embedding and output head)."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def layer_params(self) -> int:
        """q and o are h x h; k and v are h x (kv_heads * head_dim); SwiGLU has three h x ffn
        matrices; two norms of h."""
        kv = self.kv_heads * (self.hidden // self.heads)
        return 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.ffn \
            + 2 * self.hidden

    @property
    def params(self) -> int:
        """All layers, the embedding and the output head (V x h each), the final norm."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden + self.hidden


@dataclass(frozen=True)
class Cluster:
    """GPUs, their memory, and what they achieve: ``mfu`` is the fraction of peak bf16 FLOP/s a
    well-tuned run sustains; bandwidths are per-GPU bus bandwidths (nccl-tests' busbw) inside a node
    (NVLink) and between nodes (one NIC per GPU)."""
    name: str
    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    peak_tflops: float = 989.0       # H100 SXM dense bf16
    mfu: float = 0.40
    intra_node_gbs: float = 450.0    # NVLink 4: 900 GB/s both directions, 450 each way
    inter_node_gbs: float = 50.0     # one 400 Gb/s NIC per GPU

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Job:
    """What one optimizer step trains, independent of how it is split.

    recompute: "none" keeps every activation; "selective" recomputes the attention core
    (softmax and dropout over a x s x s scores) in backward; "full" keeps only each layer's input
    and recomputes the layer. sequence_parallel shards the norm/dropout activations over TP ranks.
    """
    seq_len: int = 4096
    global_batch: int = 1024          # sequences per step
    micro_batch: int = 1
    zero_stage: int = 1
    recompute: str = "selective"
    sequence_parallel: bool = True
    grad_bytes: int = 4               # fp32 gradients (2 for bf16)
    weight_bytes: int = 2             # bf16 weights and activations


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of the three axes and the job they run. ``tp * pp * dp`` is the GPU count."""
    tp: int
    pp: int
    dp: int
    job: Job = field(default_factory=Job)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """m = B / (b d): micro-batches each pipeline runs per step."""
        return self.job.global_batch // (self.job.micro_batch * self.dp)

    def __str__(self) -> str:
        return f"TP={self.tp} PP={self.pp} DP={self.dp}"


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------

def stage_params(model: Model, tp: int, pp: int) -> float:
    """Parameters one GPU holds before data-parallel sharding, on the heaviest pipeline stage.

    A stage holds ceil(L/p) layers; the first stage also holds the embedding and the last the
    output head (V x h each; both when p = 1). Tensor parallelism splits all of it t ways (the
    norms are replicated, a negligible error).
    """
    layers = math.ceil(model.layers / pp) * model.layer_params
    vocab = (2 if pp == 1 else 1) * model.vocab * model.hidden
    return (layers + vocab) / tp


def activation_bytes_per_layer(model: Model, tp: int, job: Job) -> float:
    """Activation bytes one transformer layer keeps for backward, per micro-batch, per GPU.

    Korthikanti et al. 2022 (16-bit activations, dropout masks counted), with S = s*b*h:
      no recompute:            S * (10 + 24/t + 5 a s/(h t))   (t = 1: S * (34 + 5 a s / h))
      + sequence parallelism:  S * (34 + 5 a s / h) / t
      selective recompute drops the 5 a s / h attention-score term;
      full recompute keeps only the layer input, 2 S bytes (2 S / t with sequence parallelism).
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


def inflight_microbatches(pp: int, microbatches: int) -> int:
    """With 1F1B the first stage holds the activations of min(p, m) micro-batches at its peak."""
    return min(pp, microbatches)


def memory_per_gpu(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes per GPU by term (see TERMS) and their "total", on the heaviest pipeline stage.

    With phi = stage_params(model, t, p) and d the data-parallel degree:
      weights        = weight_bytes * phi        / (d if ZeRO-3)
      gradients      = grad_bytes * phi          / (d if ZeRO >= 2)
      master_weights = 4 * phi                   / (d if ZeRO >= 1)
      adam_m, adam_v = 4 * phi each              / (d if ZeRO >= 1)
      activations    = activation_bytes_per_layer * ceil(L/p) * min(p, m)
    """
    job, d = cfg.job, cfg.dp
    phi = stage_params(model, cfg.tp, cfg.pp)
    opt_shard = d if job.zero_stage >= 1 else 1
    terms = {
        "weights": job.weight_bytes * phi / (d if job.zero_stage >= 3 else 1),
        "gradients": job.grad_bytes * phi / (d if job.zero_stage >= 2 else 1),
        "master_weights": 4 * phi / opt_shard,
        "adam_m": 4 * phi / opt_shard,
        "adam_v": 4 * phi / opt_shard,
        "activations": activation_bytes_per_layer(model, cfg.tp, job)
        * math.ceil(model.layers / cfg.pp) * inflight_microbatches(cfg.pp, max(cfg.microbatches, 1)),
    }
    terms["total"] = sum(terms.values())
    return terms


def rule_of_thumb_gpus(params: float, gpu_mem_gb: float) -> float:
    """num_GPUs = params_in_B * 18 * 1.25 / GPU_GB: 18 bytes per parameter (2 + 4 + 4 + 4 + 4:
    bf16 weights, fp32 gradients, master weights and both Adam moments) times 1.25 for activations.
    It assumes states are split evenly over all GPUs (as ZeRO-3 or t * p = n would) and activations
    of a quarter of the states: it breaks for long sequences (activations grow with s^2 without
    recompute, with s with it) and large batches, and ignores replication from data parallelism."""
    return params / 1e9 * 18 * 1.25 / gpu_mem_gb


# ---------------------------------------------------------------------------------------------
# Time and communication per step
# ---------------------------------------------------------------------------------------------

def axis_bandwidth(cluster: Cluster, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes/s each axis's links carry. Ranks are laid out TP innermost, then PP, then DP (the
    order Llama 3 used: [TP, CP, PP, DP]), so a TP group is t consecutive GPUs, a PP group spans
    t*p and a DP group t*p*d; an axis stays on NVLink only while that span fits in a node."""
    g = cluster.gpus_per_node

    def bw(span: int) -> float:
        return (cluster.intra_node_gbs if span <= g else cluster.inter_node_gbs) * GB

    return {"tp": bw(cfg.tp), "pp": bw(cfg.tp * cfg.pp), "dp": bw(cfg.gpus)}


def bubble_fraction(pp: int, microbatches: int) -> float:
    """Idle share of a 1F1B/GPipe pipeline step: (p - 1) / (m + p - 1). (PTD-P writes the bubble
    as (p - 1) / m of the ideal time; the two say the same thing.)"""
    return (pp - 1) / (microbatches + pp - 1)


def comm_bytes_per_step(model: Model, cfg: ParallelConfig) -> dict[str, float]:
    """Bytes one GPU sends per optimizer step on each axis (bus-bandwidth convention: a ring
    all-reduce of S bytes over k ranks sends 2 (k-1)/k S per rank).

    tp: each layer all-reduces its b*s*h activations twice forward and twice backward (with
        sequence parallelism: a reduce-scatter and an all-gather each time, the same volume):
        m * ceil(L/p) * 4 * 2 (t-1)/t * b s h * weight_bytes; full recompute adds the two forward
        all-reduces again.
    pp: per micro-batch each stage boundary sends b*s*h activations forward and the same-size
        gradient backward: m * 2 * b s h * weight_bytes (zero when p = 1).
    dp: the gradients of the GPU's shard, phi = stage_params: 2 (d-1)/d * phi * grad_bytes
        (reduce-scatter + all-gather under ZeRO, same volume); ZeRO-3 also all-gathers the weights
        in forward and again in backward: + 2 (d-1)/d * phi * weight_bytes.
    """
    job, t, p, d, m = cfg.job, cfg.tp, cfg.pp, cfg.dp, cfg.microbatches
    act = job.micro_batch * job.seq_len * model.hidden * job.weight_bytes
    tp_calls = 6 if job.recompute == "full" else 4
    phi = stage_params(model, t, p)
    dp = 2 * (d - 1) / d * phi * job.grad_bytes
    if job.zero_stage >= 3:
        dp += 2 * (d - 1) / d * phi * job.weight_bytes
    return {
        "tp": m * math.ceil(model.layers / p) * tp_calls * 2 * (t - 1) / t * act,
        "pp": m * 2 * act if p > 1 else 0.0,
        "dp": dp,
    }


def step_time(model: Model, cluster: Cluster, cfg: ParallelConfig) -> dict[str, float]:
    """Estimated seconds per optimizer step, by part; "total" is the cost choose_degrees minimises.

    compute = 6 N tokens / (n * peak * mfu)   (8 N tokens with full recompute; attention FLOPs
              and the selective recompute's few percent are left out)
    bubble  = compute * (p - 1) / m            (PTD-P, non-interleaved 1F1B)
    tp, pp, dp = comm_bytes_per_step / axis_bandwidth, counted as if nothing overlapped: TP sits
              on the critical path; PP and DP overlap partly in practice, so this is an upper bound.
    """
    job = cfg.job
    tokens = job.global_batch * job.seq_len
    flops = (8 if job.recompute == "full" else 6) * model.params * tokens
    compute = flops / (cfg.gpus * cluster.peak_tflops * 1e12 * cluster.mfu)
    comm = comm_bytes_per_step(model, cfg)
    bw = axis_bandwidth(cluster, cfg)
    parts = {"compute": compute, "bubble": compute * (cfg.pp - 1) / cfg.microbatches}
    parts.update({axis: comm[axis] / bw[axis] for axis in ("tp", "pp", "dp")})
    parts["total"] = sum(parts.values())
    return parts


# ---------------------------------------------------------------------------------------------
# The choice of degrees
# ---------------------------------------------------------------------------------------------

def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def why_invalid(model: Model, cluster: Cluster, cfg: ParallelConfig, memory=memory_per_gpu) -> str:
    """The first rule ``cfg`` breaks, or "" if it is a valid layout for this cluster."""
    job = cfg.job
    if cfg.gpus != cluster.gpus:
        return f"t*p*d = {cfg.gpus}, the cluster has {cluster.gpus} GPUs"
    if cfg.tp > cluster.gpus_per_node or cluster.gpus_per_node % cfg.tp:
        return f"TP={cfg.tp} does not fit within a node of {cluster.gpus_per_node} GPUs (NVLink)"
    if model.heads % cfg.tp:
        return f"TP={cfg.tp} does not divide the {model.heads} attention heads"
    if cfg.pp > model.layers:
        return f"PP={cfg.pp} is more stages than the {model.layers} layers"
    if job.global_batch % (job.micro_batch * cfg.dp):
        return (f"global batch {job.global_batch} is not a multiple of DP x micro-batch = "
                f"{cfg.dp * job.micro_batch}")
    total = memory(model, cfg)["total"]
    if total > cluster.gpu_mem_gb * GB:
        return f"needs {total / GB:.1f} GB per GPU, the GPU has {cluster.gpu_mem_gb:g} GB"
    return ""


def candidates(cluster: Cluster, job: Job) -> list[ParallelConfig]:
    """Every (t, p, d) with t * p * d = n and t a divisor of the GPUs per node."""
    n = cluster.gpus
    return [ParallelConfig(t, p, n // (t * p), job)
            for t in divisors(cluster.gpus_per_node) if n % t == 0
            for p in divisors(n // t)]


def reference_choose_degrees(model: Model, cluster: Cluster, job: Job = Job(),
                             verbose: bool = False) -> ParallelConfig:
    """The valid layout with the least step_time()["total"]; ties go to the smaller t * p (less
    model parallelism), then the smaller p. Raises ValueError if nothing fits."""
    valid, rejected = [], []
    for cfg in candidates(cluster, job):
        reason = why_invalid(model, cluster, cfg)
        (rejected.append((cfg, reason)) if reason else valid.append(cfg))
    if not valid:
        least = min(candidates(cluster, job), key=lambda c: memory_per_gpu(model, c)["total"])
        raise ValueError(
            f"No (TP, PP, DP) layout of {model.name} fits {cluster.name}: the least memory is "
            f"{memory_per_gpu(model, least)['total'] / GB:.1f} GB at {least}. Use ZeRO-3, full "
            f"recompute, a smaller micro-batch or more GPUs.")
    best = min(valid, key=lambda c: (step_time(model, cluster, c)["total"], c.tp * c.pp, c.pp))
    if verbose:
        print(plan_report(model, cluster, best, valid, rejected))
    return best


def plan_report(model, cluster, best, valid, rejected, shown: int = 5) -> str:
    """A few lines saying what was ruled out, why, and how the fastest layouts compare."""
    lines = [f"{model.name} ({model.params / 1e9:.1f}B params) on {cluster.name} "
             f"({cluster.gpus} GPUs, {cluster.gpu_mem_gb:g} GB each): "
             f"{len(valid)} valid layouts, {len(rejected)} ruled out."]
    for cfg, reason in rejected[:shown]:
        lines.append(f"  ruled out {cfg}: {reason}")
    if len(rejected) > shown:
        lines.append(f"  ... and {len(rejected) - shown} more")
    lines.append("  fastest valid layouts (seconds per step):")
    ranked = sorted(valid, key=lambda c: step_time(model, cluster, c)["total"])
    for cfg in ranked[:shown]:
        st, mem = step_time(model, cluster, cfg), memory_per_gpu(model, cfg)["total"]
        lines.append(f"    {str(cfg):20s} {st['total']:7.2f} s  (bubble {st['bubble']:.2f}, "
                     f"TP {st['tp']:.2f}, PP {st['pp']:.2f}, DP {st['dp']:.2f})  {mem / GB:5.1f} GB")
    lines.append(f"  chosen: {best}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Published models and clusters
# ---------------------------------------------------------------------------------------------

# Architectures from "The Llama 3 Herd of Models" (Llama Team, AI @ Meta, arXiv:2407.21783,
# Table 3) and the released configs (vocabulary 128,256).
LLAMA3_8B = Model("Llama 3 8B", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
                  vocab=128256)
LLAMA3_70B = Model("Llama 3 70B", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
                   vocab=128256)
LLAMA3_405B = Model("Llama 3 405B", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
                    vocab=128256)

H100_16x8 = Cluster("16 nodes x 8 H100 80GB", nodes=16, gpus_per_node=8, gpu_mem_gb=80)

# Llama 3 405B pre-training, first stage (Llama 3 paper, Table 4 and Section 3.3): 8,192 H100
# 80GB, 8 per server on NVLink; TP 8, CP 1, PP 16, hence DP 64 (FSDP); sequence 8,192 tokens,
# 16M tokens per batch (2,048 sequences, 32 per DP rank); 430 TFLOP/s per GPU (43% BF16 MFU).
LLAMA3_405B_CLUSTER = Cluster("1,024 nodes x 8 H100 80GB", nodes=1024, gpus_per_node=8,
                              gpu_mem_gb=80, mfu=0.43)
LLAMA3_405B_JOB = Job(seq_len=8192, global_batch=2048, micro_batch=1, zero_stage=3)
LLAMA3_405B_PUBLISHED = ParallelConfig(tp=8, pp=16, dp=64, job=LLAMA3_405B_JOB)


def with_job(cfg: ParallelConfig, **changes) -> ParallelConfig:
    """The same degrees with some Job fields changed (e.g. zero_stage=3)."""
    return replace(cfg, job=replace(cfg.job, **changes))


def model_of_size(params_b: float) -> Model:
    """A Llama-3-shaped model of about ``params_b`` billion parameters, for the planner: head
    dimension 128, 8 KV heads, SwiGLU width 3.5 h, about h/120 layers (Llama 3: 4096/32,
    8192/80, 16384/126), so N ~ 0.1 h^3 fixes the hidden size."""
    hidden = max(1024, 1024 * round((params_b * 1e9 / 0.106) ** (1 / 3) / 1024))
    shape = Model("", 1, hidden, hidden // 128, 8, 256 * round(3.5 * hidden / 256), 128256)
    layers = max(2, round((params_b * 1e9 - 2 * shape.vocab * hidden) / shape.layer_params))
    return replace(shape, name=f"~{params_b:g}B model", layers=layers)


# ---------------------------------------------------------------------------------------------
# Reports and figures for the lab
# ---------------------------------------------------------------------------------------------

def memory_table(model: Model, configs: list[ParallelConfig], memory=memory_per_gpu) -> str:
    """GB per GPU by term, one column per layout."""
    cols = [memory(model, c) for c in configs]
    head = f"{'GB per GPU':16s}" + "".join(f"{str(c):>22s}" for c in configs)
    rows = [f"{term:16s}" + "".join(f"{col[term] / GB:22.1f}" for col in cols)
            for term in (*TERMS, "total")]
    return "\n".join([head, *rows])


def plot_memory(model: Model, configs: list[ParallelConfig], gpu_mem_gb: float,
                memory=memory_per_gpu):
    """Stacked bars of the memory terms per layout, with the GPU's capacity as a line."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{c}\nZeRO-{c.job.zero_stage}" for c in configs]
    bottom = [0.0] * len(configs)
    for term in TERMS:
        values = [memory(model, c)[term] / GB for c in configs]
        ax.bar(labels, values, bottom=bottom, label=term)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(gpu_mem_gb, color="k", linestyle="--", linewidth=1)
    ax.text(len(configs) - 0.5, gpu_mem_gb, f" {gpu_mem_gb:g} GB GPU", va="bottom", ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("GB per GPU (log)")
    ax.set_title(f"{model.name}: memory per GPU by term")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    return fig


def layout_summary(model: Model, cluster: Cluster, cfg: ParallelConfig) -> str:
    """Memory, bubble and per-axis communication of one layout, as text."""
    mem, st = memory_per_gpu(model, cfg), step_time(model, cluster, cfg)
    comm, bw = comm_bytes_per_step(model, cfg), axis_bandwidth(cluster, cfg)
    lines = [f"{model.name} on {cluster.name}, {cfg}, ZeRO-{cfg.job.zero_stage}, "
             f"m = {cfg.microbatches} micro-batches of {cfg.job.micro_batch} x {cfg.job.seq_len} tokens",
             "  memory per GPU: " + ", ".join(f"{k} {mem[k] / GB:.1f}" for k in TERMS)
             + f" = {mem['total'] / GB:.1f} GB of {cluster.gpu_mem_gb:g}",
             f"  bubble: (p-1)/(m+p-1) = {bubble_fraction(cfg.pp, cfg.microbatches):.3f} of the "
             f"pipeline's time",
             "  per step and GPU    GB sent   link GB/s   seconds"]
    for axis in ("tp", "pp", "dp"):
        lines.append(f"    {axis.upper():4s}             {comm[axis] / GB:9.2f}   {bw[axis] / GB:9.0f}"
                     f"   {st[axis]:7.2f}")
    lines.append(f"  compute {st['compute']:.2f} s + bubble {st['bubble']:.2f} s + communication "
                 f"{st['tp'] + st['pp'] + st['dp']:.2f} s = {st['total']:.2f} s per step")
    return "\n".join(lines)


def published_comparison(choose=reference_choose_degrees) -> str:
    """Llama 3 405B: the layout ``choose`` picks for its published cluster and batch, beside the
    published layout (TP 8, PP 16, DP 64 on 8,192 GPUs)."""
    ours = choose(LLAMA3_405B, LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB)
    ours = ParallelConfig(ours.tp, ours.pp, ours.dp, LLAMA3_405B_JOB)
    lines = ["                    " + f"{'published (Llama 3, Table 4)':>30s}{'this model picks':>22s}"]
    for label, fn in [("layout", str),
                      ("memory GB/GPU", lambda c: f"{memory_per_gpu(LLAMA3_405B, c)['total'] / GB:.1f}"),
                      ("bubble (p-1)/(m+p-1)", lambda c: f"{bubble_fraction(c.pp, c.microbatches):.3f}"),
                      ("step time s (model)", lambda c: f"{step_time(LLAMA3_405B, LLAMA3_405B_CLUSTER, c)['total']:.1f}")]:
        lines.append(f"{label:20s}{fn(LLAMA3_405B_PUBLISHED):>30s}{fn(ours):>22s}")
    tokens = LLAMA3_405B_JOB.global_batch * LLAMA3_405B_JOB.seq_len
    lines.append(f"measured (paper): 430 TFLOP/s per GPU -> "
                 f"{6 * LLAMA3_405B.params * tokens / (8192 * 430e12):.1f} s per 16M-token step "
                 f"(6 N tokens, attention FLOPs left out)")
    return "\n".join(lines)


def planner(choose=reference_choose_degrees):
    """Sliders for model size, sequence length, GPUs per node, nodes and GPU memory; shows the
    chosen degrees, memory per GPU by term, the bubble and the communication per axis."""
    import ipywidgets as w

    def show(params_b, seq_len, gpus_per_node, nodes, gpu_mem_gb, batch_m_tokens, zero_stage,
             recompute):
        model = model_of_size(params_b)
        cluster = Cluster(f"{nodes} x {gpus_per_node} GPUs", nodes, gpus_per_node, gpu_mem_gb)
        # The batch in sequences: the token budget rounded to a multiple of the GPU count.
        seqs = max(cluster.gpus, cluster.gpus * round(batch_m_tokens * 1e6 / seq_len / cluster.gpus))
        job = Job(seq_len=seq_len, global_batch=seqs, zero_stage=zero_stage, recompute=recompute)
        print(f"{model.name}: {model.layers} layers, hidden {model.hidden}, {model.heads} heads "
              f"({model.params / 1e9:.1f}B params); batch {seqs} x {seq_len} tokens")
        print(f"rule of thumb: {rule_of_thumb_gpus(model.params, gpu_mem_gb):.1f} GPUs to hold it")
        try:
            cfg = choose(model, cluster, job)
        except ValueError as err:
            print(err)
            return
        print(layout_summary(model, cluster, ParallelConfig(cfg.tp, cfg.pp, cfg.dp, job)))

    style = {"description_width": "150px"}
    layout = w.Layout(width="480px")
    return w.interactive(
        show,
        params_b=w.FloatLogSlider(value=70, base=10, min=0, max=3, description="model (B params)",
                                  style=style, layout=layout),
        seq_len=w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768], value=4096,
                                  description="sequence length", style=style, layout=layout),
        gpus_per_node=w.SelectionSlider(options=[1, 2, 4, 8], value=8, description="GPUs per node",
                                        style=style, layout=layout),
        nodes=w.SelectionSlider(options=[2 ** k for k in range(12)], value=16, description="nodes",
                                style=style, layout=layout),
        gpu_mem_gb=w.SelectionSlider(options=[16, 24, 40, 48, 80, 96, 141, 192], value=80,
                                     description="GPU memory (GB)", style=style, layout=layout),
        batch_m_tokens=w.SelectionSlider(options=[0.5, 1, 2, 4, 8, 16], value=4,
                                         description="batch (M tokens)", style=style, layout=layout),
        zero_stage=w.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage", style=style),
        recompute=w.Dropdown(options=["none", "selective", "full"], value="selective",
                             description="recompute", style=style),
    )
