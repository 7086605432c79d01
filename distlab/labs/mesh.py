"""A small transformer trained on a 3D device mesh (PP x DP x TP), compared step by step with
the same model trained in one process. Lab 7.

The mesh is ``init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``'s: TP
is the innermost dimension, so a TP group is ``tp`` consecutive ranks (on a real cluster: GPUs of
one node, on NVLink), then DP, then PP outermost. Rank r sits at
``(r // (dp*tp), (r // tp) % dp, r % tp)``. ``train_on_mesh(..., layout=...)`` places the
coordinates on the ranks any other way (Lab 7's design exercise).

Each axis is PyTorch's own tool:
  tp: ``parallelize_module(block, mesh["tp"], plan)`` with a plan dict of ColwiseParallel /
      RowwiseParallel (Megatron: q, k, v and the MLP's up projection split by output features, the
      attention output and MLP down projection by input features; one all-reduce after each in
      forward, one before each in backward);
  dp: ``fully_shard(stage, mesh=mesh["dp"])`` (FSDP2: parameters sharded over DP, all-gathered for
      forward and backward, gradients reduce-scattered and averaged);
  pp: ``torch.distributed.pipelining`` (PipelineStage + Schedule1F1B): stage 0 holds the embedding
      and the first half of the blocks, the last stage the rest, the final norm and the head;
      activations go forward and their gradients back by send/recv between stages.

Why the losses agree with one process: every DP replica sees B/dp sequences, the schedule splits
them into micro-batches, each micro-batch's loss (so its gradient) is scaled by 1/m, FSDP averages
over DP, so the update is the gradient of the mean loss over the whole batch B, which is what the
single process computes. Only the order of floating-point additions differs.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from distlab.labs.mesh_steps import pipeline_step, replica_step, token_cross_entropy
from distlab.labs.shard_adamw import ShardAdamW, local as _local
from distlab.labs.tables import largest_residue
from distlab.labs.threads import one_thread
from distlab.runtime.devices import device as rank_device

# Loss agreement with single-process training: float32, different summation order only.
LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5

# The linear layers of one TinyBlock, by their name inside the block.
BLOCK_LINEARS = ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.up", "mlp.down")


@dataclass(frozen=True)
class TinyConfig:
    """Small enough that 8 ranks on 2 CPU cores train it in seconds."""
    vocab: int = 32
    dim: int = 32
    heads: int = 4
    ffn: int = 64
    layers: int = 2
    seq: int = 8
    batch: int = 8          # sequences per step, over all DP replicas
    steps: int = 3
    lr: float = 1e-2


@dataclass(frozen=True)
class MeshShape:
    pp: int
    dp: int
    tp: int

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of a rank: TP innermost, PP outermost."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def __str__(self) -> str:
        return f"PP={self.pp} x DP={self.dp} x TP={self.tp}"


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

class TinyAttention(nn.Module):
    """Causal self-attention. Under tensor parallelism q, k, v hold heads/t heads each, so the
    head count is read from the local weight (the -1 in view), never from the config."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (f(x).view(B, T, -1, self.head_dim).transpose(1, 2)     # (B, nh, T, hd)
                   for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)      # (B, nh, T, hd)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))               # (B, T, nh*hd) -> (B, T, C)


class TinyMLP(nn.Module):
    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, ffn), nn.Linear(ffn, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class TinyBlock(nn.Module):
    """Pre-norm transformer block. The norms stay replicated: their input is the full activation
    every TP rank holds after the row-parallel all-reduce."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn, self.mlp = TinyAttention(cfg.dim, cfg.heads), TinyMLP(cfg.dim, cfg.ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """A contiguous piece of the model: the embedding if first, some blocks, the norm and head if
    last. With one stage it is the whole model: tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, blocks, embed=None, norm=None, head=None):
        super().__init__()
        self.embed, self.blocks, self.norm, self.head = embed, nn.ModuleList(blocks), norm, head

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)                                            # (B, T) -> (B, T, C)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))                                  # (B, T, C) -> (B, T, V)
        return x


def build_model(cfg: TinyConfig, seed: int) -> Stage:
    """The whole model, initialised from ``seed``: every rank builds the same one and keeps its
    part, so all layouts start from the single-process model's weights."""
    torch.manual_seed(seed)
    blocks = [TinyBlock(cfg) for _ in range(cfg.layers)]
    return Stage(blocks, embed=nn.Embedding(cfg.vocab, cfg.dim), norm=nn.LayerNorm(cfg.dim),
                 head=nn.Linear(cfg.dim, cfg.vocab, bias=False))


def split_stage(model: Stage, pp: int, index: int) -> Stage:
    """Stage ``index`` of ``pp``: blocks split as evenly as possible, embedding first, head last."""
    n = len(model.blocks)
    lo, hi = index * n // pp, (index + 1) * n // pp
    first, last = index == 0, index == pp - 1
    return Stage(list(model.blocks)[lo:hi], embed=model.embed if first else None,
                 norm=model.norm if last else None, head=model.head if last else None)


def make_batches(cfg: TinyConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and targets of every step, (steps, B, T) each. The target is the next token of a
    fixed random permutation of the vocabulary, something the model can learn in a few steps."""
    g = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(cfg.vocab, generator=g)
    tokens = torch.randint(cfg.vocab, (cfg.steps, cfg.batch, cfg.seq), generator=g)
    return tokens, perm[tokens]


def reference_losses(cfg: TinyConfig, seed: int) -> torch.Tensor:
    """Loss of each step of plain single-process training on the whole batch, (steps,)."""
    with one_thread():   # tiny tensors: 2 threads on a busy machine were 10x slower (0.43 s vs 0.04 s)
        return _single_process_losses(cfg, seed)


def _single_process_losses(cfg: TinyConfig, seed: int) -> torch.Tensor:
    model = build_model(cfg, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    tokens, targets = make_batches(cfg, seed)
    losses = []
    for step in range(cfg.steps):
        opt.zero_grad()
        loss = token_cross_entropy(model(tokens[step]), targets[step])
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def megatron_plan() -> dict:
    """The tensor-parallel plan of one TinyBlock (the lab's exercise asks for this dict)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}


# ---------------------------------------------------------------------------------------------
# One rank of the 3D run
# ---------------------------------------------------------------------------------------------

def _placements(stage: Stage) -> dict[str, str]:
    """How each block linear's weight is laid out over the TP ranks ("replicated" if the plan
    left it a plain tensor)."""
    out = {}
    for i, block in enumerate(stage.blocks):
        for name in BLOCK_LINEARS:
            w = block.get_submodule(name).weight
            out[f"{name} (block {i})"] = str(tuple(w.placements)) if hasattr(w, "placements") \
                else "replicated"
    return out


def _local_elements(stage: Stage) -> int:
    return sum(_local(p).numel() for p in stage.parameters())


@dataclass
class MeshShare:
    """One rank's inputs of a mesh run (``mesh_shares``): its pipeline stage's initial weights,
    whole (tensor parallelism and FSDP shard them on the rank), and its DP replica's rows of
    every step's tokens and targets, (steps, B/dp, T) each; not the seed that makes the rest."""
    stage: Stage
    tokens: torch.Tensor
    targets: torch.Tensor


def _grid(shape: MeshShape, layout) -> torch.Tensor:
    return torch.arange(shape.world_size).reshape(shape.pp, shape.dp, shape.tp) if layout is None \
        else torch.tensor(layout, dtype=torch.int64)                     # (pp, dp, tp) -> rank


def _share(model: Stage, batches, shape: MeshShape, cfg: TinyConfig, grid, rank: int) -> MeshShare:
    pp_i, dp_i, _ = (int(i) for i in (grid == rank).nonzero()[0])
    per_dp = cfg.batch // shape.dp
    rows = slice(dp_i * per_dp, (dp_i + 1) * per_dp)      # this DP replica's share of the batch
    tokens, targets = (t[:, rows].clone() for t in batches)
    return MeshShare(split_stage(model, shape.pp, pp_i), tokens, targets)


def mesh_shares(shape: MeshShape, cfg: TinyConfig, seed: int, layout=None) -> list[MeshShare]:
    """Every rank's ``MeshShare``, made in the calling process (a check's judge): pass them as
    ``PerRank(...)`` in place of the seed, so that no rank holds another's stage or rows."""
    model, batches, grid = build_model(cfg, seed), make_batches(cfg, seed), _grid(shape, layout)
    return [_share(model, batches, shape, cfg, grid, r) for r in range(shape.world_size)]


def train_on_mesh(rank: int, world_size: int, shape: MeshShape, plan_fn, cfg: TinyConfig,
                  seed: "int | MeshShare", layout=None, last_step=None) -> dict:
    """Train ``cfg.steps`` steps on this rank's part of the PP x DP x TP mesh.

    ``layout``: the global rank at each (pp, dp, tp) coordinate, nested lists of shape
    (pp, dp, tp); None lays ranks out row-major (``init_device_mesh``: TP innermost).
    Returns {"coords", "placements" (block linears after TP, before FSDP), "elements" (parameter
    elements this rank stores), "losses" ((steps,) global-batch mean loss on the last stage, else
    None), "step_seconds" (wall time of each step on this rank; the first includes set-up),
    "step_windows" ((start, end) ``time.perf_counter()`` of each step, the clock of the
    collective record)}.
    ``seed``: the seed of the model and batches (the lab's runs), or this rank's ``MeshShare``
    (a check's runs: the rank gets its stage and rows, not the seed).
    ``last_step``: a context manager the last step runs in (what a check measures of that step).
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if world_size != shape.world_size:
        raise ValueError(f"{shape} needs {shape.world_size} ranks, got {world_size}")
    device = rank_device()
    grid = _grid(shape, layout)
    mesh = DeviceMesh(device.type, grid, mesh_dim_names=("pp", "dp", "tp"))
    pp_i, dp_i, tp_i = (int(i) for i in (grid == rank).nonzero()[0])
    share = seed if isinstance(seed, MeshShare) else \
        _share(build_model(cfg, seed), make_batches(cfg, seed), shape, cfg, grid, rank)

    stage = share.stage.to(device)
    plan = plan_fn()
    for block in stage.blocks:
        parallelize_module(block, mesh["tp"], plan)
    placements = _placements(stage)
    fully_shard(stage, mesh=mesh["dp"])
    opt = ShardAdamW(stage.parameters(), cfg.lr)

    run_step = pipeline_step(stage, shape, pp_i, mesh, device, cfg) if shape.pp > 1 \
        else replica_step(stage)

    losses, windows = [], []
    for step in range(cfg.steps):
        watched = last_step if last_step is not None and step == cfg.steps - 1 else nullcontext()
        with watched:
            start = time.perf_counter()
            opt.zero_grad()
            loss = run_step(share.tokens[step].to(device), share.targets[step].to(device))
            opt.step()
            windows.append((start, time.perf_counter()))
        if loss is not None:                                 # the mean over DP replicas
            loss = loss.detach().clone()
            dist.all_reduce(loss, group=mesh["dp"].get_group())
            losses.append(loss / shape.dp)
    return {"coords": (pp_i, dp_i, tp_i), "placements": placements,
            "elements": _local_elements(stage), "step_windows": windows,
            "step_seconds": [end - start for start, end in windows],
            "losses": torch.stack(losses).cpu() if losses else None}


# ---------------------------------------------------------------------------------------------
# From the notebook
# ---------------------------------------------------------------------------------------------

@dataclass
class MeshRun:
    shape: MeshShape
    losses: torch.Tensor           # (steps,) from the last pipeline stage
    reference: torch.Tensor        # (steps,) single process
    results: list                  # every rank's dict from train_on_mesh
    seconds: float                 # wall time of the whole run (spawn included)
    traced: object = None          # a traced run's distlab.run results, with .comms (mesh_traffic)

    @property
    def max_error(self) -> float:
        return (self.losses - self.reference).abs().max().item()

    def table(self) -> str:
        # float32 losses: a residue shows as its bound, its digits would differ by CPU
        shown = largest_residue([(self.losses, self.reference)])[1]
        lines = [f"{self.shape} on {self.shape.world_size} ranks: {self.seconds:.1f} s wall "
                 f"(max |loss - single process|: {shown}; tolerance "
                 f"{LOSS_ATOL:g} + {LOSS_RTOL:g}*|loss|)",
                 "  step   single process   mesh"]
        for i, (r, m) in enumerate(zip(self.reference.tolist(), self.losses.tolist())):
            lines.append(f"  {i:4d}   {r:14.6f}   {m:.6f}")
        return "\n".join(lines)


def run_mesh(shape: MeshShape, plan_fn=megatron_plan, cfg: TinyConfig = TinyConfig(),
             seed: int = 0, timeout: float = 300) -> MeshRun:
    """Train on ``shape.world_size`` ranks with ``distlab.run`` and beside it in this process."""
    import distlab
    check_batch_fits(cfg, shape)
    start = time.perf_counter()
    out = distlab.run(train_on_mesh, shape.world_size, shape, plan_fn, cfg, seed, timeout=timeout)
    seconds = time.perf_counter() - start
    last = next(r for r in out if r["losses"] is not None)
    return MeshRun(shape, last["losses"], reference_losses(cfg, seed), list(out), seconds)


def check_batch_fits(cfg: TinyConfig, shape: MeshShape) -> None:
    """The batch must split into DP shares and (with PP) two micro-batches each."""
    need = shape.dp * (2 if shape.pp > 1 else 1)
    if cfg.batch % need or cfg.heads % shape.tp or cfg.layers < shape.pp:
        raise ValueError(f"{cfg} does not fit {shape}: batch must be a multiple of {need}, heads "
                         f"of TP={shape.tp}, layers at least PP={shape.pp}")


def dense_elements(cfg: TinyConfig) -> int:
    return sum(p.numel() for p in build_model(cfg, 0).parameters())


__all__ = ["TinyConfig", "MeshShape", "build_model", "split_stage", "make_batches",
           "reference_losses", "megatron_plan", "train_on_mesh", "MeshShare", "mesh_shares", "run_mesh", "MeshRun",
           "BLOCK_LINEARS", "LOSS_RTOL", "LOSS_ATOL", "check_batch_fits", "dense_elements"]
