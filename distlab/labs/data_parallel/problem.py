"""Lab 2's problem and its single-process baseline: the model, the batch and how a rank takes its
rows, the baseline training every data-parallel variant must reproduce, the rank-side trainer,
and ZeRO's partition of the flattened parameters."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch
from torch import nn

from distlab.labs.baseline import full_batch_training
from distlab.labs.losses import loss_fn
from distlab.labs.tables import residue
from distlab.runtime.devices import device

@dataclasses.dataclass(frozen=True)
class Setup:
    """A regression problem small enough for a 2-core laptop: an MLP with tanh activations
    (smooth, so no gradient sits at exactly zero and rounding cannot flip a ReLU), trained with
    AdamW on the mean squared error. ``batch`` must divide by every world size used (2 and 4)."""
    seed: int = 0
    batch: int = 32
    d_in: int = 32
    d_hidden: int = 64
    d_out: int = 8
    depth: int = 3          # number of Linear layers
    lr: float = 1e-2
    weight_decay: float = 0.01
    # float64 for the checks: a wrong factor (2x) and a rounding difference (1e-16) are then
    # fourteen orders of magnitude apart, so a tight tolerance never fails a right answer.
    dtype: torch.dtype = torch.float64

    def model(self) -> nn.Module:
        """The same initial weights in every process: drawn from ``seed`` with the global RNG
        forked, so building a model changes no other random stream."""
        dims = [self.d_in] + [self.d_hidden] * (self.depth - 1) + [self.d_out]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            layers: list[nn.Module] = []
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
                layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(dims) - 2 else [])
            return nn.Sequential(*layers).to(self.dtype)

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch (x: (batch, d_in), y: (batch, d_out)), identical on every rank."""
        g = torch.Generator().manual_seed(self.seed + 1)
        x = torch.randn(self.batch, self.d_in, generator=g, dtype=self.dtype)
        y = torch.randn(self.batch, self.d_out, generator=g, dtype=self.dtype)
        return x, y

    def optimizer(self, params) -> torch.optim.Optimizer:
        # foreach=False: one code path on every device, so CPU references match GPU runs closely.
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, foreach=False)


def rank_rows(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of the batch dimension (the plumbing's own sharding)."""
    if t.shape[0] % world_size:
        raise ValueError(f"a batch of {t.shape[0]} rows does not split evenly over {world_size} "
                         f"ranks; choose a batch size divisible by the world size")
    return t.chunk(world_size)[rank]  # (batch / world_size, ...)


def param_bytes(params) -> int:
    """Bytes of the parameters, which is also the bytes of their gradients."""
    return sum(p.numel() * p.element_size() for p in params)


def flat(tensors) -> torch.Tensor:
    """All tensors flattened and concatenated, in order (a copy): (sum of numel,)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` (AdamW: exp_avg, exp_avg_sq, step).
    For AdamW on P float32 parameters that is 2 * 4 * P bytes plus one scalar per tensor."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))


# ---------------------------------------------------------------------------------------------
# The single-process baseline: what every data-parallel variant must reproduce.

def reference_training(setup: Setup, steps: int) -> dict:
    """Train ``setup.model()`` for ``steps`` AdamW steps on the full batch in this process.

    Returns ``params`` (the final parameters), ``grads`` (the gradients of the last step, before
    its update), ``losses`` (full-batch loss per step), ``exp_avg`` (AdamW's first moment of every
    parameter, flattened in parameter order: (P,)) and ``state_bytes`` (optimizer-state bytes).
    """
    model = setup.model()
    optimizer = setup.optimizer(model.parameters())
    losses = full_batch_training(model, optimizer, *setup.data(), steps)
    params = list(model.parameters())
    return {"params": [p.detach().clone() for p in params],
            "grads": [p.grad.clone() for p in params],
            "losses": losses,
            "exp_avg": flat(optimizer.state[p]["exp_avg"] for p in params),
            "state_bytes": optimizer_state_bytes(optimizer)}


# ---------------------------------------------------------------------------------------------
# The rank-side trainer that the checks and the comparison share.

def train_steps(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, steps: int,
                after_backward: Callable[[], None] | None = None) -> dict:
    """``steps`` training steps on this rank's rows ``x``, ``y``; ``after_backward()`` runs between
    ``loss.backward()`` and ``optimizer.step()`` (where a gradient synchronisation goes).

    Returns ``losses`` (this rank's loss per step), ``backward_end`` (perf_counter time at which
    each backward returned) and ``step_start`` / ``step_end`` (perf_counter times of each step).
    """
    record = {"losses": [], "backward_end": [], "step_start": [], "step_end": []}
    for _ in range(steps):
        record["step_start"].append(time.perf_counter())
        optimizer.zero_grad()  # torch's default sets the gradients to None
        loss = loss_fn(model(x), y)
        loss.backward()
        record["backward_end"].append(time.perf_counter())
        if after_backward is not None:
            after_backward()
        optimizer.step()
        if x.is_cuda:  # GPU work is asynchronous: the step ends when the device is done
            torch.cuda.synchronize()
        record["step_end"].append(time.perf_counter())
        record["losses"].append(loss.item())
    return record


def rank_problem(setup: Setup, rank: int, world_size: int):
    """(model, x_local, y_local) on this rank's device: the same model everywhere, own rows."""
    dev = device()
    x, y = setup.data()
    return (setup.model().to(dev), rank_rows(x, rank, world_size).to(dev),
            rank_rows(y, rank, world_size).to(dev))


def final_state(model: nn.Module) -> dict:
    """What a rank sends back for comparison: its parameters and its last gradients."""
    params = list(model.parameters())
    return {"params": [p.detach().clone() for p in params],
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in params]}



def shard_bounds(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """ZeRO's partition of P flattened elements: shards of ceil(P / W), the last one padded.
    Rank r owns elements [r*s, min((r+1)*s, P)) with s = ceil(P / W)."""
    s = math.ceil(numel / world_size)
    return min(rank * s, numel), min((rank + 1) * s, numel)




def gradient_average(world_size: int = 4, setup: Setup = Setup()) -> dict[str, torch.Tensor]:
    """In one process: split the batch into ``world_size`` shards, compute each shard's loss and
    gradient, and compare the mean and the sum of the shard gradients with the full-batch
    gradient. Returns the numbers of ``gradient_average_demo``'s table: ``shard_loss``,
    ``shard_norm``, ``shard_diff`` (W,) and the scalars ``full_loss``, ``full_norm``,
    ``mean_norm``, ``mean_diff``, ``sum_norm``, ``sum_diff`` (diff: max |g - full-batch g|)."""
    model = setup.model()
    x, y = setup.data()

    def grad(xs, ys) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        return loss.item(), flat(p.grad for p in model.parameters())  # (P,)

    full_loss, full = grad(x, y)
    shards = [grad(xs, ys) for xs, ys in zip(x.chunk(world_size), y.chunk(world_size))]
    mean = sum(g for _, g in shards) / world_size
    total = sum(g for _, g in shards)
    numbers = {"shard_loss": [loss for loss, _ in shards],
               "shard_norm": [g.norm().item() for _, g in shards],
               "shard_diff": [(g - full).abs().max().item() for _, g in shards],
               "full_loss": full_loss, "full_norm": full.norm().item(),
               "mean_norm": mean.norm().item(), "mean_diff": (mean - full).abs().max().item(),
               "sum_norm": total.norm().item(), "sum_diff": (total - full).abs().max().item()}
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in numbers.items()}


def format_gradient_average(n: dict[str, torch.Tensor]) -> str:
    """``gradient_average``'s numbers as the lab's table."""
    lines = [f"{'':<16} {'loss':>8} {'|grad|':>8} {'max |g - full-batch g|':>23}"]
    for r, (loss, norm, diff) in enumerate(zip(n["shard_loss"], n["shard_norm"], n["shard_diff"])):
        label = f"rank {r}'s rows"
        lines.append(f"{label:<16} {loss:>8.4f} {norm:>8.4f} {diff:>23.2e}")
    lines.append(f"{'full batch':<16} {n['full_loss']:>8.4f} {n['full_norm']:>8.4f} {0:>23.2e}")
    # The mean equals the full-batch gradient up to float64 rounding, whose digits depend on the
    # CPU: the table shows the bound they are under, the same on every machine.
    mean_diff = residue(float(n["mean_diff"]), scale=float(n["full_norm"]))
    lines.append(f"{'mean of ranks':<16} {'':>8} {n['mean_norm']:>8.4f} {mean_diff:>23}")
    lines.append(f"{'sum of ranks':<16} {'':>8} {n['sum_norm']:>8.4f} {n['sum_diff']:>23.2e}")
    return "\n".join(lines)


# The lab's cases, stored with the course (data/02_data_parallel/, made by `distlab references`
# from the course's implementations, which a student's handout of Lab 2 leaves out).
GRADIENT_AVERAGE_CASE = {"world_size": 4, "setup": Setup()}


def stored(name: str) -> dict[str, torch.Tensor]:
    """Reference set ``name`` of Lab 2 (``data/02_data_parallel/<name>.pt``)."""
    from distlab import paths
    path = paths.data() / "02_data_parallel" / f"{name}.pt"
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: rebuild it with "
                                f"`distlab references 02_data_parallel`") from None


def gradient_average_demo(world_size: int = 4, setup: Setup = Setup()) -> str:
    """The table of ``gradient_average`` (it shows the losses differ and that the *mean* is the
    full gradient): for the lab's case (4 shards of ``Setup()``) the course's stored numbers,
    otherwise computed now."""
    case = {"world_size": world_size, "setup": setup}
    numbers = stored("gradient_average") if case == GRADIENT_AVERAGE_CASE else \
        gradient_average(world_size, setup)
    return format_gradient_average(numbers)

