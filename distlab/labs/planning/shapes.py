"""What a plan is made of: the model, the cluster, the job one optimizer step trains, the degrees
of the three axes, and the published Llama 3 models, cluster and run. Lab 7.

Notation (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", the PTD-P paper): ``t, p, d`` tensor-, pipeline- and data-parallel degrees with
``t * p * d = n`` GPUs; ``B`` global batch (sequences per step), ``b`` micro-batch, ``m = B / (b d)``
micro-batches per pipeline per step; ``s`` sequence length, ``h`` hidden size, ``a`` attention
heads, ``L`` layers.

GPU memory and bandwidths use decimal units (GB = 1e9 bytes): a "80 GB" H100 holds 80 GiB, so
comparing with 80e9 bytes leaves about 7% for the CUDA context, allocator fragmentation and
communication buffers.
"""
from __future__ import annotations

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
    """GPUs, their memory, and what they achieve. ``kernel_efficiency`` is the fraction of peak
    bf16 FLOP/s the matrix multiplications reach *inside their kernels*: the cost model adds the
    bubble and the communication on top, so it is not MFU (which is measured end to end, bubble
    and communication included; ``step_time.model_mfu`` derives the model's MFU). Bandwidths are
    per-GPU bus bandwidths (nccl-tests' busbw) inside a node (NVLink) and between nodes (one NIC per
    GPU)."""
    name: str
    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    peak_tflops: float = 989.0       # H100 SXM dense bf16
    kernel_efficiency: float = 0.40  # the course's assumption, not a measurement
    intra_node_gbs: float = 450.0    # NVLink 4: 900 GB/s both directions, 450 each way
    inter_node_gbs: float = 50.0     # one 400 Gb/s NIC per GPU

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


# How ZeRO-2/3 live with m > 1 micro-batches (pipeline or gradient accumulation) per step:
#   "regather": shard after every micro-batch (FSDP's default): memory keeps the 1/d, and the
#               sharded terms' traffic is paid m times (weights gathered, gradients
#               reduce-scattered per micro-batch);
#   "resident": keep full weights (ZeRO-3) and gradients (ZeRO-2/3) across the micro-batches:
#               traffic once per step, as ZeRO-1, but memory loses the 1/d on those terms.
ZERO_ACCUMULATION = ("regather", "resident")


@dataclass(frozen=True)
class Job:
    """What one optimizer step trains, independent of how it is split.

    recompute: "none" keeps every activation; "selective" recomputes the attention core
    (softmax and dropout over a x s x s scores) in backward; "full" keeps only each layer's input
    and recomputes the layer. sequence_parallel shards the norm/dropout activations over TP ranks.
    zero_accumulation: see ZERO_ACCUMULATION (matters only for ZeRO-2/3 with m > 1).
    """
    seq_len: int = 4096
    global_batch: int = 1024          # sequences per step
    micro_batch: int = 1
    zero_stage: int = 1
    recompute: str = "selective"
    sequence_parallel: bool = True
    grad_bytes: int = 4               # fp32 gradients (2 for bf16)
    weight_bytes: int = 2             # bf16 weights and activations
    zero_accumulation: str = "regather"


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of the three axes and the job they run. ``tp * pp * dp * cp`` is the GPU count.
    ``cp``: the context-parallel degree (Lab 10), each sequence cut over ``cp`` GPUs; 1 (every
    Lab 7 layout) leaves the three axes as they were; ``distlab.labs.planning.context`` plans
    with it."""
    tp: int
    pp: int
    dp: int
    job: Job = field(default_factory=Job)
    cp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def microbatches(self) -> int:
        """m = B / (b d): micro-batches each pipeline runs per step."""
        return self.job.global_batch // (self.job.micro_batch * self.dp)

    def __str__(self) -> str:
        return f"TP={self.tp} PP={self.pp} DP={self.dp}" + (f" CP={self.cp}" if self.cp > 1 else "")


def with_job(cfg: ParallelConfig, **changes) -> ParallelConfig:
    """The same degrees with some Job fields changed (e.g. zero_stage=3)."""
    return replace(cfg, job=replace(cfg.job, **changes))


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
# 16M tokens per batch (2,048 sequences, 32 per DP rank); 430 TFLOP/s per GPU (43% BF16 MFU),
# measured end to end. The cluster gets the course's kernel efficiency, not the MFU: the cost
# model adds bubble and communication itself, and its total is compared with the measured step.
# The job is ZeRO-1, as pipelines pair with it: the optimizer state sharded over DP, full bf16
# weights and fp32 gradients kept across the 32 micro-batches, one reduce-scatter and one
# all-gather per step (Llama 3 keeps its FSDP weights unsharded after forward, Section 3.3.2, to
# avoid gathering them again). By the course's count the first stage then holds about L layers of
# activations at 8,192 tokens, 73 GB with selective recompute, too many for 80 GB in any layout;
# Meta fit them with what the course does not model (one layer fewer on the first and the last
# stage, 126 = 16 x 8 - 2; buffers freed early), so the course's job recomputes every layer
# instead: 8/6 of the compute and 4 more TP collectives per layer in every layout alike.
LLAMA3_405B_CLUSTER = Cluster("1,024 nodes x 8 H100 80GB", nodes=1024, gpus_per_node=8,
                              gpu_mem_gb=80)
LLAMA3_405B_JOB = Job(seq_len=8192, global_batch=2048, micro_batch=1, zero_stage=1,
                      recompute="full")
LLAMA3_405B_PUBLISHED = ParallelConfig(tp=8, pp=16, dp=64, job=LLAMA3_405B_JOB)
LLAMA3_405B_TFLOPS = 430.0            # per GPU, measured (Table 4)
LLAMA3_405B_MFU = 0.43                # BF16 MFU, measured (Table 4)


def model_of_size(params_b: float) -> Model:
    """A Llama-3-shaped model of about ``params_b`` billion parameters, for the planner: head
    dimension 128, 8 KV heads, SwiGLU width 3.5 h, about h/120 layers (Llama 3: 4096/32,
    8192/80, 16384/126), so N ~ 0.1 h^3 fixes the hidden size."""
    hidden = max(1024, 1024 * round((params_b * 1e9 / 0.106) ** (1 / 3) / 1024))
    shape = Model("", 1, hidden, hidden // 128, 8, 256 * round(3.5 * hidden / 256), 128256)
    layers = max(2, round((params_b * 1e9 - 2 * shape.vocab * hidden) / shape.layer_params))
    return replace(shape, name=f"~{params_b:g}B model", layers=layers)
