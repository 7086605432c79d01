"""Plumbing for lab 2, data parallelism: the problem, the single-process baseline, the rank-side
trainer, optimizer-state memory, DDP, and the step-time comparison.

Data parallelism in one paragraph. Every rank holds the whole model and its own slice of the batch:
with a global batch of B rows and W ranks, rank r takes rows [r*B/W, (r+1)*B/W). Each rank's loss
is the mean over its own rows, so the losses differ. Because the slices are equal in size,

    grad of the full-batch mean loss = (1/W) * sum_r grad of rank r's mean loss,

so one all-reduce (sum) per gradient followed by a division by W gives every rank the gradient of
single-process training on the full batch; the ranks then take identical optimizer steps and their
parameters stay identical. Communication per step: an all-reduce of every gradient, i.e. the
parameter bytes P; a ring moves 2*(W-1)/W * P bytes in and out of each rank for it.

Nothing here is an exercise's answer: the students write the gradient synchronisation themselves
(lab 2), and these helpers run it, time it and compare it with PyTorch's DDP.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from distlab.labs.losses import loss_fn  # noqa: F401 (Lab 2 imports it from here)
from distlab.runtime.devices import device  # noqa: F401 (the labs import it from here)


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
    x, y = setup.data()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
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


# ---------------------------------------------------------------------------------------------
# DistributedDataParallel, with its collectives counted by a comm hook.

def ddp_model(model: nn.Module, bucket_bytes: int, record: list | None = None) -> nn.Module:
    """``model`` wrapped in DDP with buckets of ``bucket_bytes``. DDP's reducer issues its
    all-reduces from C++, where distlab's record cannot see them; with ``record`` given, a comm
    hook appends (bytes, perf_counter start) per bucket and then does what DDP does by default
    (divide by the world size, all-reduce with SUM)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    dev = device()
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index] if dev.type == "cuda" else None,
        bucket_cap_mb=bucket_bytes / 2**20)
    if record is not None:
        def hook(state, bucket):
            buffer = bucket.buffer()
            record.append((buffer.numel() * buffer.element_size(), time.perf_counter()))
            return default_hooks.allreduce_hook(state, bucket)
        ddp.register_comm_hook(None, hook)
    return ddp


def ddp_training(rank: int, world_size: int, setup: Setup, steps: int, bucket_bytes: int) -> dict:
    """Train with DDP for ``steps`` steps; returns the final state, the train_steps record and
    the comm-hook record of every bucket all-reduce."""
    model, x, y = rank_problem(setup, rank, world_size)
    hooked: list = []
    ddp = ddp_model(model, bucket_bytes, record=hooked)
    record = train_steps(ddp, setup.optimizer(ddp.parameters()), x, y, steps)
    return {**final_state(model), **record, "buckets": hooked}


# ---------------------------------------------------------------------------------------------
# Backend features: what gloo and NCCL accept.

def backend_features(rank: int, world_size: int) -> list[tuple[str, str]]:
    """Try, on this rank's backend, the reduce features the lab talks about; each row is
    (feature, what happened). Run it on ranks: ``run(backend_features, 2)[0]``."""
    dev = device()
    rows = []

    def attempt(name: str, fn: Callable[[], torch.Tensor]) -> None:
        try:
            rows.append((name, f"ok: {fn().tolist()}"))
        except Exception as exc:  # noqa: BLE001 - the failure is the answer here
            rows.append((name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"))

    def reduce(t: torch.Tensor, op) -> torch.Tensor:
        dist.all_reduce(t, op=op)
        return t

    base = float(rank + 1)  # rank r contributes r + 1: the average is (W + 1) / 2
    attempt("all_reduce AVG, float32", lambda: reduce(torch.full((2,), base, device=dev),
                                                        dist.ReduceOp.AVG))
    attempt("all_reduce AVG, int64", lambda: reduce(torch.full((2,), rank + 1, device=dev),
                                                      dist.ReduceOp.AVG))
    attempt("all_reduce PREMUL_SUM(1/W), float32",
            lambda: reduce(torch.full((2,), base, device=dev),
                           dist._make_nccl_premul_sum(1.0 / world_size)))
    attempt("all_reduce SUM then / W, float32",
            lambda: reduce(torch.full((2,), base, device=dev), dist.ReduceOp.SUM) / world_size)
    return rows


# ---------------------------------------------------------------------------------------------
# Step-time comparison: naive / bucketed / overlapped / DDP on the same model.

# Timing runs in float32, the dtype training uses, on a model large enough for communication to show.
BENCH_SETUP = Setup(batch=64, d_in=256, d_hidden=256, d_out=256, depth=6, dtype=torch.float32)


def _sync_for(kind: str, impl, params: list, bucket_bytes: int):
    """The ``after_backward`` callable for one strategy, built from the student's function."""
    if kind == "naive":
        return lambda: impl(params)
    if kind == "bucketed":
        return lambda: impl(params, bucket_bytes)
    if kind == "overlapped":
        return impl(params).wait  # registers its gradient hooks now, waits after backward
    raise ValueError(f"unknown strategy {kind!r}")


def _time_strategy(kind: str, impl, rank: int, world_size: int, setup: Setup, steps: int,
                   warmup: int, bucket_bytes: int) -> dict:
    model, x, y = rank_problem(setup, rank, world_size)
    hooked: list = []
    if kind == "DDP":
        model = ddp_model(model, bucket_bytes, record=hooked)
        after = None
    else:
        after = _sync_for(kind, impl, list(model.parameters()), bucket_bytes)
    optimizer = setup.optimizer(model.parameters())
    train_steps(model, optimizer, x, y, warmup, after)
    dist.barrier()  # every rank starts the timed steps together
    hooked.clear()
    record = train_steps(model, optimizer, x, y, steps, after)
    return {"kind": kind, "window": (record["step_start"][0], record["step_end"][-1]),
            "step_s": [e - s for s, e in zip(record["step_start"], record["step_end"])],
            "ddp_buckets": [b for b, _ in hooked]}


def step_time_ranks(rank: int, world_size: int, impls: dict, setup: Setup, steps: int,
                    warmup: int, bucket_bytes: int) -> list[dict]:
    """Rank function: time every strategy in ``impls`` (kind -> student implementation; DDP
    needs none) one after the other, in the same processes."""
    return [_time_strategy(kind, impl, rank, world_size, setup, steps, warmup, bucket_bytes)
            for kind, impl in impls.items()]


def compare_step_times(naive=None, bucketed=None, overlapped=None, *, world_size: int = 2,
                       setup: Setup = BENCH_SETUP, steps: int = 10, warmup: int = 3,
                       bucket_bytes: int = 256 * 1024, ddp: bool = True, timeout: float = 120,
                       backend: str = "auto") -> list[dict]:
    """Time one training step of each strategy on ``world_size`` ranks and count its collectives.

    ``naive(params)``, ``bucketed(params, bucket_bytes)`` and ``overlapped(params)`` (an object
    with ``wait()``) are the lab's exercises; DDP uses ``bucket_cap_mb = bucket_bytes / 2**20``.
    Returns one row per strategy: ``strategy``, ``ms_per_step`` (median over steps of the slowest
    rank), ``collectives`` and ``bytes`` per step (from ``out.comms`` for the lab's strategies,
    from a recording comm hook for DDP), and ``param_bytes``.
    """
    from distlab import run
    impls = {k: v for k, v in (("naive", naive), ("bucketed", bucketed),
                               ("overlapped", overlapped)) if v is not None}
    if ddp:
        impls["DDP"] = None
    out = run(step_time_ranks, world_size, impls, setup, steps, warmup, bucket_bytes,
              timeout=timeout, backend=backend)
    nbytes = param_bytes(setup.model().parameters())
    rows = []
    for i, kind in enumerate(impls):
        per_rank = [out[r][i] for r in range(world_size)]
        slowest = [max(s) for s in zip(*(p["step_s"] for p in per_rank))]
        if kind == "DDP":
            sizes = per_rank[0]["ddp_buckets"]
            source = "DDP comm hook"
        else:
            lo, hi = per_rank[0]["window"]
            sizes = [c.bytes for c in out.comms[0]
                     if lo <= c.start <= hi and c.op != "barrier"]
            source = "out.comms"
        rows.append({"strategy": kind, "ms_per_step": 1e3 * statistics.median(slowest),
                     "collectives": len(sizes) / steps, "bytes": sum(sizes) / steps,
                     "param_bytes": nbytes, "counted_by": source})
    return rows


def format_table(rows: list[dict]) -> str:
    """The comparison as a fixed-width text table."""
    lines = [f"{'strategy':<11} {'ms/step':>8} {'collectives/step':>17} {'bytes/step':>11} "
             f"{'counted by':>14}"]
    for r in rows:
        lines.append(f"{r['strategy']:<11} {r['ms_per_step']:>8.2f} {r['collectives']:>17.1f} "
                     f"{r['bytes']:>11,.0f} {r['counted_by']:>14}")
    return "\n".join(lines)


def plot_step_times(rows: list[dict], ax=None):
    """Bar chart of milliseconds per step, annotated with collectives per step."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3))
    names = [r["strategy"] for r in rows]
    bars = ax.bar(names, [r["ms_per_step"] for r in rows], color="#4c72b0")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['collectives']:.0f} coll.", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per step (slowest rank, median)")
    ax.set_title("one data-parallel training step")
    return ax


# ---------------------------------------------------------------------------------------------
# ZeRO-1: optimizer-state memory per rank.

def _state_bytes_rank(rank: int, world_size: int, cls, setup: Setup) -> int:
    model, x, y = rank_problem(setup, rank, world_size)
    optimizer = cls(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
    train_steps(model, optimizer, x, y, 1)  # AdamW allocates its state at the first step
    return optimizer_state_bytes(getattr(optimizer, "local_optimizer", optimizer))


def optimizer_memory(cls, world_sizes=(2, 4), setup: Setup = BENCH_SETUP) -> list[dict]:
    """Optimizer-state bytes per rank of ZeRO-1 (``cls``, whose ``local_optimizer`` holds the
    rank's AdamW) against replicated AdamW, one row per world size; the row for 1 is plain AdamW.
    Replicated AdamW keeps 8 bytes per float32 parameter on every rank; ZeRO-1 keeps 8 per
    element of the rank's shard, ceil(P / W) elements."""
    from distlab import run
    full = reference_training(setup, 1)["state_bytes"]
    rows = [{"world_size": 1, "adamw": full, "zero1": full}]
    for world_size in world_sizes:
        out = run(_state_bytes_rank, world_size, cls, setup, timeout=120)
        rows.append({"world_size": world_size, "adamw": full, "zero1": max(out)})
    for row in rows:
        row["ratio"] = row["zero1"] / full
    return rows


def format_memory(rows: list[dict]) -> str:
    lines = [f"{'ranks':>5} {'AdamW state/rank':>17} {'ZeRO-1 state/rank':>18} {'ratio':>6}"]
    lines += [f"{r['world_size']:>5} {r['adamw']:>17,} {r['zero1']:>18,} {r['ratio']:>6.3f}"
              for r in rows]
    return "\n".join(lines)


def plot_memory(rows: list[dict], ax=None):
    """Optimizer-state bytes per rank against the world size, with the 1/W line."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3))
    ws = [r["world_size"] for r in rows]
    ax.plot(ws, [r["adamw"] / 2**10 for r in rows], "o-", label="AdamW, replicated")
    ax.plot(ws, [r["zero1"] / 2**10 for r in rows], "s-", label="ZeRO-1 (measured)")
    ax.plot(ws, [rows[0]["adamw"] / w / 2**10 for w in ws], "k:", label="1 / world size")
    ax.set_xticks(ws)
    ax.set_xlabel("ranks")
    ax.set_ylabel("optimizer state per rank (KiB)")
    ax.legend(fontsize=8)
    return ax


def shard_bounds(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """ZeRO's partition of P flattened elements: shards of ceil(P / W), the last one padded.
    Rank r owns elements [r*s, min((r+1)*s, P)) with s = ceil(P / W)."""
    s = math.ceil(numel / world_size)
    return min(rank * s, numel), min((rank + 1) * s, numel)


# ---------------------------------------------------------------------------------------------
# Demonstrations the lab's cells call.

def gradient_average_demo(world_size: int = 4, setup: Setup = Setup()) -> str:
    """In one process: split the batch into ``world_size`` shards, compute each shard's loss and
    gradient, and compare the mean and the sum of the shard gradients with the full-batch gradient.
    Returns the table as text (it shows the losses differ and that the *mean* is the full gradient)."""
    model = setup.model()
    x, y = setup.data()

    def grad(xs, ys) -> tuple[float, torch.Tensor]:
        model.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        return loss.item(), flat(p.grad for p in model.parameters())  # (P,)

    full_loss, full = grad(x, y)
    shards = [grad(xs, ys) for xs, ys in zip(x.chunk(world_size), y.chunk(world_size))]
    lines = [f"{'':<16} {'loss':>8} {'|grad|':>8} {'max |g - full-batch g|':>23}"]
    for r, (loss, g) in enumerate(shards):
        lines.append(f"rank {r}'s rows   {loss:>8.4f} {g.norm():>8.4f} {(g - full).abs().max():>23.2e}")
    mean = sum(g for _, g in shards) / world_size
    total = sum(g for _, g in shards)
    lines.append(f"{'full batch':<16} {full_loss:>8.4f} {full.norm():>8.4f} {0:>23.2e}")
    lines.append(f"{'mean of ranks':<16} {'':>8} {mean.norm():>8.4f} {(mean - full).abs().max():>23.2e}")
    lines.append(f"{'sum of ranks':<16} {'':>8} {total.norm():>8.4f} {(total - full).abs().max():>23.2e}")
    return "\n".join(lines)


def show_backend_features(world_size: int = 2, backend: str = "auto") -> str:
    """Run ``backend_features`` on ranks and return rank 0's answers as a table."""
    from distlab import run
    out = run(backend_features, world_size, backend=backend)
    width = max(len(name) for name, _ in out[0])
    return f"backend: {out.backend}\n" + "\n".join(f"{name:<{width}}  {result}"
                                                  for name, result in out[0])


def compare_with_ddp(world_size: int = 2, steps: int = 3, bucket_bytes: int = 8192,
                     setup: Setup = Setup()) -> str:
    """Train the lab's model with DDP on ranks and with plain AdamW in this process; report the
    largest parameter difference per rank and the buckets DDP all-reduced in each step."""
    from distlab import run
    out = run(ddp_training, world_size, setup, steps, bucket_bytes, timeout=120)
    ref = reference_training(setup, steps)
    lines = []
    for rank in range(world_size):
        diff = max((a - b).abs().max().item() for a, b in zip(out[rank]["params"], ref["params"]))
        lines.append(f"rank {rank}: max |DDP - single process| after {steps} steps = {diff:.2e}")
    hooked, ends = out[0]["buckets"], out[0]["step_end"]
    for step, end in enumerate(ends):
        start = out[0]["step_start"][step]
        sizes = [b for b, t in hooked if start <= t <= end]
        lines.append(f"step {step}: {len(sizes)} bucket all-reduce(s) of {sizes} bytes")
    return "\n".join(lines)
