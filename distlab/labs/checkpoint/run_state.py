"""Lab 12's training run and the whole of its state: what a bit-identical resume needs.

The run: a tiny stack of MLP blocks with dropout, sharded with FSDP2 (``fully_shard``, as in
Lab 8) over all ranks, trained with AdamW on batches drawn from a small dataset. Every source of
randomness a real run has is here, so that forgetting one shows:
  - the global torch CPU generator draws the dropout masks (per rank: same seed, other data);
  - a per-rank ``torch.Generator`` draws the noise each rank adds to its inputs (augmentation);
  - Python's ``random`` shuffles the dataset at the start of every epoch;
  - the data position (epoch, offset into the epoch's order, and that order) says which rows
    come next.
The whole state is the model's and optimizer's shards (``get_state_dict``: DTensor shards keyed
by parameter name, so that another world size can read them), the step, the three generators
and the data position. RNG states differ by rank, so they go under per-rank keys: a plain
tensor under one key is taken by ``torch.distributed.checkpoint`` as replicated and written by
one rank only.
"""
from __future__ import annotations

import dataclasses
import random

import torch
import torch.distributed as dist
from torch import nn

from distlab.labs.losses import loss_fn


class DropBlock(nn.Module):
    """Linear(d, h) -> tanh -> dropout -> Linear(h, d), with a residual connection."""

    def __init__(self, d: int, h: int, p: float):
        super().__init__()
        self.lin1, self.drop, self.lin2 = nn.Linear(d, h), nn.Dropout(p), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.lin2(self.drop(torch.tanh(self.lin1(x))))  # (B, d) -> (B, h) -> (B, d)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The lab's run: ``blocks`` blocks of width ``d`` (hidden ``hidden``), a dataset of
    ``samples`` rows (an epoch: 2 steps on 2 ranks, 1 on 4, so that a short run reshuffles),
    ``batch`` rows per rank and step, AdamW; float64 so that a resume that is not bit-identical
    cannot hide in rounding."""
    seed: int = 0
    d: int = 8
    hidden: int = 16
    blocks: int = 2
    samples: int = 16
    batch: int = 4
    dropout: float = 0.2
    noise: float = 0.05
    lr: float = 1e-2
    dtype: torch.dtype = torch.float64
    device: str = "cpu"   # "cuda": each rank on its current GPU, NCCL (tests/test_gpu.py)
    # the dataset's own seed (None: seed + 1), so that a run can restart on a trainer of another
    # seed (other weights and generators) that reads the same data (Section 1's check)
    data_seed: int | None = None

    def restarted(self, offset: int = 7919) -> "RunSpec":
        """The same run's data, another seed for everything else: a fresh trainer whose weights,
        generators and data position are not the run's until a state makes them so."""
        return dataclasses.replace(self, seed=self.seed + offset,
                                   data_seed=self.seed + 1 if self.data_seed is None
                                   else self.data_seed)

    def model(self) -> nn.Sequential:
        """The same initial weights in every process (the global RNG left untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return nn.Sequential(*[DropBlock(self.d, self.hidden, self.dropout)
                                   for _ in range(self.blocks)]).to(self.dtype)

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x (samples, d) and y = a fixed smooth function of x plus noise (samples, d)."""
        g = torch.Generator().manual_seed(self.seed + 1 if self.data_seed is None
                                          else self.data_seed)
        x = torch.randn(self.samples, self.d, generator=g, dtype=self.dtype)
        return x, torch.sin(x) + 0.1 * torch.randn(x.shape, generator=g, dtype=self.dtype)


class DataPosition:
    """Which rows come next: the epoch, the offset into the epoch's order, and the order (a
    permutation drawn with Python's ``random`` when the epoch starts). Every rank holds the same
    position; each step takes ``batch * world_size`` rows and rank r reads its ``batch`` of them."""

    def __init__(self, samples: int):
        self.samples, self.epoch, self.offset = samples, 0, 0
        self.order = self._shuffle()

    def _shuffle(self) -> list[int]:
        order = list(range(self.samples))
        random.shuffle(order)
        return order

    def next_rows(self, rows: int, rank: int, per_rank: int) -> list[int]:
        if self.offset + rows > self.samples:   # the epoch's tail is dropped (drop_last)
            self.epoch, self.offset = self.epoch + 1, 0
            self.order = self._shuffle()
        mine = self.order[self.offset + rank * per_rank:self.offset + (rank + 1) * per_rank]
        self.offset += rows
        return mine

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset,
                "order": torch.tensor(self.order, dtype=torch.int64)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.order = [int(i) for i in state["order"]]


class Trainer:
    """One rank's side of the run: the FSDP2 model, its optimizer, the generators, the data
    position and the step. ``step()`` trains one step and returns its loss (the mean over all
    ranks' rows, the same number on every rank)."""

    def __init__(self, rank: int, world_size: int, spec: RunSpec = RunSpec()):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        self.rank, self.world_size, self.spec = rank, world_size, spec
        torch.set_num_threads(1)   # the same kernels whichever launcher started the rank
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if spec.device == "cuda" else torch.device("cpu"))
        self.model = spec.model().to(self.device)
        mesh = init_device_mesh(self.device.type, (world_size,))
        for block in self.model:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        # On the CPU, AdamW's fused kernel: one operation per step on the DTensor shards, so
        # one sharding decision (DTensor's, made and cached at the first step) instead of one
        # per parameter shape and operation; every rank of every launch pays that first step,
        # which costs half as much (0.05 CPU-s instead of 0.10-0.15 on a 2-core EPYC, 28
        # November 2026), and later steps 0.01 instead of 0.016. The same algorithm; its last
        # bits differ from the per-tensor loop's, and every reference is made by this Trainer.
        # On a GPU the per-tensor loop, as measured there (bench/reports).
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.lr, foreach=False,
                                           fused=self.device.type == "cpu")
        torch.manual_seed(spec.seed)                        # dropout: same seed on every rank
        random.seed(spec.seed)                              # the shuffle: same on every rank
        self.noise = torch.Generator().manual_seed(spec.seed + 100 + rank)   # per rank
        self.data = DataPosition(spec.samples)
        self.x, self.y = (t.to(self.device) for t in spec.dataset())
        self.steps_done = 0

    def step(self) -> float:
        rows = self.data.next_rows(self.spec.batch * self.world_size, self.rank, self.spec.batch)
        noise = torch.randn(len(rows), self.spec.d, generator=self.noise,   # on the CPU: the
                            dtype=self.spec.dtype).to(self.device)          # same on any device
        x = self.x[rows] + self.spec.noise * noise                          # (batch, d)
        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(self.model(x), self.y[rows])
        loss.backward()          # FSDP2 averages the gradients over the ranks
        self.optimizer.step()
        self.steps_done += 1
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() / self.world_size

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered whole (a collective: every rank calls it)."""
        return {name: p.full_tensor().detach().clone()
                for name, p in self.model.named_parameters()}


def rank_key(rank: int) -> str:
    return f"rank{rank}"


def training_state(trainer: Trainer) -> dict:
    """Everything a bit-identical resume needs, as a state dict ``torch.distributed.checkpoint``
    saves: the shards (keyed by parameter name), the step and data position (the same on every
    rank), and this rank's generators, kept apart from every other rank's."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    return {"model": model_sd, "optim": optim_sd,
            "progress": {"step": trainer.steps_done, "data": trainer.data.state_dict()},
            "rng": {rank_key(trainer.rank): {"torch": torch.get_rng_state(),
                                              "noise": trainer.noise.get_state(),
                                              "python": random.getstate(),
                                              **_gpu_rng(trainer)}}}


def _gpu_rng(trainer: Trainer) -> dict:
    """On a GPU the dropout masks come from the device's own generator: it is state too."""
    return {"cuda": torch.cuda.get_rng_state(trainer.device)} if trainer.device.type == "cuda" \
        else {}


def restore_state(trainer: Trainer, state: dict) -> None:
    """Put a loaded ``training_state`` back into the trainer: shards, step, data, generators."""
    from torch.distributed.checkpoint.state_dict import set_state_dict
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer.steps_done = int(state["progress"]["step"])
    trainer.data.load_state_dict(state["progress"]["data"])
    mine = state["rng"][rank_key(trainer.rank)]
    torch.set_rng_state(mine["torch"])
    trainer.noise.set_state(mine["noise"])
    random.setstate(mine["python"])
    if "cuda" in mine:
        torch.cuda.set_rng_state(mine["cuda"], trainer.device)
