"""The training steps lab 6 profiles: data parallel (naive and overlapped), tensor parallel, pipeline.

Each ``*_step(rank, world_size, spec)`` builds its model on the rank and returns ``step()``, one
training step with the ranges "forward", "backward" and "optimizer" marked by
``record_function`` (and nothing else named, so the traces do not give away the strategy).
``distlab.labs.timelines.profiling.profile_ranks`` runs them; ``RUNS`` names them.

- DP naive: backward, then one blocking all-reduce per gradient (Lab 2's first version).
- DP overlapped: each gradient's all-reduce starts asynchronously from a hook as soon as
  autograd has accumulated it, so it runs during the rest of backward (Lab 2's overlap).
- TP: a stack of Megatron MLPs (``distlab.labs.tensor_parallel.TensorParallelMLP``): one all-reduce of
  (b, s, h) per MLP in forward and one in backward.
- PP: GPipe over ``distlab.labs.pipeline``'s stages: m microbatch forwards, then m backwards, with a
  send/recv of a (b/m, h) tensor at every stage edge.

Under torchrun (for nsys on a GPU node) run one of them directly::

    torchrun --nproc-per-node 2 -m distlab.labs.timelines.runs tp --steps 5
"""
from __future__ import annotations

import argparse
import contextlib
import os
import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.runtime.devices import device as rank_device, pick_backend
from torch import nn
from torch.profiler import record_function


@dataclasses.dataclass(frozen=True)
class Spec:
    """Sizes of the profiled models: small enough for a few steps in about a second on a 2-core
    CPU, large enough that communication and compute both show. ``batch`` rows (``dp_batch`` for
    data parallel, which splits them over the ranks), width ``hidden``, ``layers`` blocks,
    ``seq`` tokens per row (tensor parallel), ``microbatches`` (pipeline)."""
    batch: int = 32
    dp_batch: int = 512
    hidden: int = 256
    layers: int = 4
    seq: int = 16
    microbatches: int = 4
    seed: int = 0


def _mlp_stack(spec: Spec) -> nn.Sequential:
    """``layers`` Linear+tanh blocks of width ``hidden``, the same on every rank (from the seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        blocks = [nn.Sequential(nn.Linear(spec.hidden, spec.hidden), nn.Tanh())
                  for _ in range(spec.layers)]
    return nn.Sequential(*blocks)


def _data(spec: Spec, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(spec.seed + 1)
    return torch.randn(*shape, generator=g)


# ---------------------------------------------------------------------------------------------
# Data parallel

def dp_step(rank: int, world_size: int, spec: Spec = Spec(), overlap: bool = False):
    """A data-parallel step on this rank's ``batch / world_size`` rows; gradients averaged by
    all-reduce, after backward (``overlap=False``) or during it (``overlap=True``)."""
    dev = rank_device()
    model = _mlp_stack(spec).to(dev)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=1e-3)
    x = _data(spec, spec.dp_batch, spec.hidden).chunk(world_size)[rank].to(dev)  # (b/n, h)
    pending: list = []
    if overlap:
        def launch(p):  # fires once p.grad is complete, while backward goes on with earlier layers
            pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        for p in params:
            p.register_post_accumulate_grad_hook(launch)

    def step():
        optimizer.zero_grad()
        with record_function("forward"):
            loss = model(x).square().mean()
        with record_function("backward"):
            loss.backward()
        if overlap:
            for p, work in pending:
                work.wait()
            pending.clear()
        else:
            for p in params:
                dist.all_reduce(p.grad)
        for p in params:
            p.grad /= world_size
        with record_function("optimizer"):
            optimizer.step()
    return step


def dp_overlapped_step(rank: int, world_size: int, spec: Spec = Spec()):
    """``dp_step`` with the all-reduces started from gradient hooks."""
    return dp_step(rank, world_size, spec, overlap=True)


# ---------------------------------------------------------------------------------------------
# Tensor parallel

def tp_step(rank: int, world_size: int, spec: Spec = Spec()):
    """A step of ``layers`` Megatron MLPs (h -> 4h -> h), each column- then row-parallel: every
    rank holds 1/n of each weight and sees the whole (batch/4, seq, h) input."""
    from distlab.labs.tensor_parallel import MLP, TensorParallelMLP
    dev = rank_device()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        dense = [MLP(spec.hidden, 4 * spec.hidden) for _ in range(spec.layers)]
    model = nn.Sequential(*[TensorParallelMLP(m) for m in dense]).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # A quarter of the batch keeps TP's step as long as DP's on the same width.
    x = _data(spec, max(1, spec.batch // 4), spec.seq, spec.hidden).to(dev)  # (b, s, h)

    def step():
        optimizer.zero_grad()
        with record_function("forward"):
            loss = model(x).square().mean()
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
    return step


# ---------------------------------------------------------------------------------------------
# Pipeline parallel

def pp_step(rank: int, world_size: int, spec: Spec = Spec()):
    """A GPipe step: stage ``rank`` of ``world_size`` holds its share of ``2 * layers`` blocks;
    ``microbatches`` forwards (receive from rank-1, send to rank+1), then as many backwards."""
    from distlab.labs.pipeline import make_model, stage_layers
    dev = rank_device()
    stage = stage_layers(make_model(2 * spec.layers, spec.hidden, spec.seed), rank, world_size).to(dev)
    optimizer = torch.optim.SGD(stage.parameters(), lr=1e-3)
    first, last = rank == 0, rank == world_size - 1
    micro = spec.batch // spec.microbatches
    xs = _data(spec, spec.batch, spec.hidden).to(dev).split(micro)  # m x (b/m, h)

    def step():
        optimizer.zero_grad()
        inputs, outputs = [], []
        with record_function("forward"):
            for i in range(len(xs)):
                if first:
                    x = xs[i]
                else:
                    x = torch.empty(micro, spec.hidden, device=dev)
                    dist.recv(x, rank - 1)
                    x.requires_grad_()
                y = stage(x)
                if not last:
                    dist.send(y.detach(), rank + 1)
                inputs.append(x)
                outputs.append(y)
        with record_function("backward"):
            for x, y in zip(inputs, outputs):
                if last:
                    (F.mse_loss(y, torch.zeros_like(y)) / len(xs)).backward()
                else:
                    grad = torch.empty_like(y)
                    dist.recv(grad, rank + 1)
                    y.backward(grad)
                if not first:
                    dist.send(x.grad, rank - 1)
        with record_function("optimizer"):
            optimizer.step()
    return step


RUNS = {"DP naive": dp_step, "DP overlapped": dp_overlapped_step, "TP": tp_step, "PP": pp_step}
KIND = {"DP naive": "DP", "DP overlapped": "DP", "TP": "TP", "PP": "PP"}


def profile_all(world_size: int = 2, spec: Spec = Spec(), steps: int = 3, warmup: int = 1,
                runs=tuple(RUNS), backend: str = "auto") -> dict:
    """Profile each named run, all on the same ranks (one launch);
    {name: distlab.labs.timelines.profiling.Profile}."""
    from distlab.labs.timelines.profiling import profile_many
    return profile_many({name: (RUNS[name], (spec,)) for name in runs}, world_size, steps=steps,
                        warmup=warmup, backend=backend)


# ---------------------------------------------------------------------------------------------
# What the formulas of labs 1-5 predict for these runs

def formula_messages(run: str, spec: Spec, world_size: int, rank: int) -> list[tuple[str, int]]:
    """The messages rank ``rank`` sends in one step of ``run`` (a profiled run, section 1 of
    Lab 6) by the formulas of Labs 2, 3 and 5: a list of (op, bytes), op "all_reduce" or
    "send", bytes the tensor's size as nccl-tests counts it."""
    item = 4  # float32
    if run.startswith("DP"):
        return [("all_reduce", p.numel() * item) for p in _mlp_stack(spec).parameters()]
    if run == "TP":
        b = max(1, spec.batch // 4)
        return [("all_reduce", b * spec.seq * spec.hidden * item)] * (2 * spec.layers - 1)
    if run == "PP":
        m, size = spec.microbatches, spec.batch // spec.microbatches * spec.hidden * item
        return ([("send", size)] * m if rank < world_size - 1 else []) + \
               ([("send", size)] * m if rank > 0 else [])
    raise ValueError(f"unknown run {run!r}")


def link_model(world_size: int = 2) -> tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s) of this machine's all-reduce, fitted as in lab 1 on a
    short sweep (1 KiB to 1 MiB)."""
    from distlab.labs.collectives import reference_fit
    from distlab.labs.collectives import sweep, timings
    rows = sweep(world_size, ops=("all_reduce",), min_bytes=1 << 10, max_bytes=1 << 20, iters=3)
    return reference_fit(*timings(rows, "all_reduce"))


def predicted_vs_measured(profiles: dict, comm_share, alpha: float,
                          bandwidth: float, spec: Spec = Spec(), merge_intervals=None,
                          messages=None) -> list[dict]:
    """Per run, rank 0, medians over steps: bytes per step by formula and in the trace,
    communication time predicted by alpha + S/B per message (PP: plus the bubble, an idle
    (p-1)/m of compute), and the predicted and measured communication shares. Printed.
    ``comm_share`` and ``merge_intervals`` (the union, for the compute time) are the lab's
    measures: in Lab 6 yours (by default the course's union, which a Lab 6 handout leaves out).
    ``messages(run, spec, world_size, rank)``: the predicted messages, in Lab 6 your
    ``predict_messages`` (by default ``formula_messages``, which a Lab 6 handout leaves out)."""
    import statistics
    if merge_intervals is None:
        from distlab.labs.timelines.intervals import union as merge_intervals

    def length(spans, window) -> float:
        lo, hi = window
        return sum(b - a for a, b in merge_intervals([(max(s.start, lo), min(s.end, hi))
                                                      for s in spans if min(s.end, hi) > max(s.start, lo)]))

    rows = []
    print(f"{'run':<14} {'formula B':>10} {'traced B':>10} {'compute ms':>11} {'predicted ms':>13} "
          f"{'measured ms':>12} {'pred. share':>12} {'meas. share':>12}")
    for run, prof in profiles.items():
        tl, n = prof.timeline, prof.timeline.world_size
        windows = tl.steps(0)
        predicted_messages = (messages or formula_messages)(run, spec, n, 0)
        traced = [sum(s.bytes for s in tl.of(0, "comm") if a <= s.start < b and s.op != "barrier"
                      and s.op != "recv") for a, b in windows]
        compute = statistics.median(length(tl.of(0, "compute"), w) for w in windows)
        measured = [comm_share(tl, 0, w) for w in windows]
        predicted = sum(alpha + nbytes / bandwidth for _, nbytes in predicted_messages)
        if run == "PP":
            predicted += compute * (n - 1) / spec.microbatches
        row = {"run": run, "formula_bytes": sum(b for _, b in predicted_messages),
               "traced_bytes": statistics.median(traced), "compute_ms": compute * 1e3,
               "predicted_ms": predicted * 1e3,
               "measured_ms": statistics.median(m * (w[1] - w[0]) for m, w in zip(measured, windows)) * 1e3,
               "predicted_share": predicted / (predicted + compute),
               "measured_share": statistics.median(measured)}
        rows.append(row)
        print(f"{run:<14} {row['formula_bytes']:>10} {row['traced_bytes']:>10.0f} "
              f"{row['compute_ms']:>11.1f} {row['predicted_ms']:>13.1f} {row['measured_ms']:>12.1f} "
              f"{row['predicted_share']:>12.1%} {row['measured_share']:>12.1%}")
    return rows


def main(argv=None) -> int:
    """Under torchrun: build the step, warm up, run ``--steps`` steps inside NVTX ranges
    ("step", and PyTorch's per-op ranges via emit_nvtx) for nsys to record."""
    parser = argparse.ArgumentParser(prog="python -m distlab.labs.timelines.runs")
    parser.add_argument("run", choices=["dp", "dp_overlapped", "tp", "pp"])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    fn = {"dp": dp_step, "dp_overlapped": dp_overlapped_step, "tp": tp_step, "pp": pp_step}[args.run]
    # Under torchrun: the backend as distlab.run picks it, the GPU of this process's LOCAL_RANK.
    backend = pick_backend("auto", int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    step = fn(dist.get_rank(), dist.get_world_size())
    step()  # warm-up, outside the capture range
    on_gpu = rank_device().type == "cuda"
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi starts here
    # emit_nvtx turns every autograd op into an NVTX range (NVTX needs CUDA, so GPU runs only).
    with torch.autograd.profiler.emit_nvtx() if on_gpu else contextlib.nullcontext():
        for _ in range(args.steps):
            with torch.cuda.nvtx.range("step") if on_gpu else contextlib.nullcontext():
                step()
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def closing_note(rows: list[dict], overlaps: dict | None = None) -> str:
    """The measured communication shares in a sentence per run (from ``predicted_vs_measured``)."""
    lines = [f"Measured here ({os.cpu_count()} CPU cores, gloo, 2 ranks), rank 0, median step:"]
    for row in rows:
        lines.append(f"- {row['run']}: communication {row['measured_share']:.0%} of the step "
                     f"({row['measured_ms']:.1f} ms of it), the formulas predicted "
                     f"{row['predicted_share']:.0%} ({row['predicted_ms']:.1f} ms).")
    if overlaps:
        for name, values in overlaps.items():
            lines.append(f"- {name}: {', '.join(f'{v:.0%}' for v in values)} of the communication "
                         f"hidden under compute (ranks 0..{len(values) - 1}).")
    text = "\n".join(lines)
    print(text)
    return text
