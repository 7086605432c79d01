"""Graded checks of Lab 1, "Collectives and their cost".

Exercises (each checked on real ranks or, for the pure formulas, in the kernel):
1. ``all_reduce_rs_ag(tensor)``: all-reduce (sum) as one reduce-scatter and one all-gather.
2. ``ring_all_reduce(tensor)``: ring all-reduce from point-to-point messages only: the tensor is cut
   into n chunks (uneven when n does not divide its length), n-1 reduce-scatter steps and n-1
   all-gather steps, each rank sending one chunk to its ring neighbour per step, so every rank
   sends 2(n-1) messages carrying 2(n-1)/n of the tensor.
3. ``bandwidths(op, nbytes, seconds, world_size) -> (algbw, busbw)`` in GB/s (1e9 bytes/s), as
   nccl-tests defines them: algbw = S / t with S the size nccl-tests reports (the whole gathered
   buffer for all_gather and reduce_scatter), busbw = algbw * factor with factor 2(n-1)/n for
   all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for broadcast.
4. ``fit_alpha_beta(sizes, times) -> (alpha, bandwidth)``: the Hockney model t(S) = alpha + S / B,
   fitted by minimising the *relative* squared error sum_i ((alpha + S_i/B - t_i) / t_i)^2, linear
   in (alpha, 1/B); and ``predict_time(alpha, bandwidth, nbytes)``.

The references are the plain single-process computations: ``inputs.sum(0)`` for both all-reduces,
the formulas above for 3, ``torch.linalg.lstsq`` in float64 for 4.
"""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.ranks import run_each_backend
from distlab.labs.collectives import reference_fit
from distlab.runtime.devices import device as rank_device

LAB = "01_collectives"
SEED = 1234
P2P = {"send", "recv", "isend", "irecv"}
# torch 2.13 renamed the tensor-in/tensor-out collectives (``*_single``); the old names still work.
REDUCE_SCATTER = {"reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"}
ALL_GATHER = {"all_gather", "all_gather_into_tensor", "all_gather_single"}
BUS_FACTOR = {  # busbw / algbw, from nccl-tests' doc/PERFORMANCE.md
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


# ---------------------------------------------------------------------------------------------
# Inputs and references (the single-process computations)

def all_reduce_inputs(world_size: int, numel: int, seed: int) -> torch.Tensor:
    """One row per rank: (world_size, numel) float32 from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(world_size, numel, generator=g)


def reference_bandwidths(op: str, nbytes: float, seconds: float, world_size: int) -> tuple[float, float]:
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[op](world_size)


def bandwidth_cases(seed: int, count: int = 12) -> dict[str, torch.Tensor]:
    """Random (op, size, time, world size) cases and their (algbw, busbw)."""
    g = torch.Generator().manual_seed(seed)
    ops = list(BUS_FACTOR)
    op_index = torch.randint(len(ops), (count,), generator=g)
    world = torch.randint(2, 17, (count,), generator=g)
    nbytes = (2.0 ** torch.randint(10, 31, (count,), generator=g)).double()
    seconds = torch.exp(torch.empty(count, dtype=torch.float64).uniform_(-11, 0, generator=g))
    expected = torch.tensor([reference_bandwidths(ops[o], float(s), float(t), int(n))
                             for o, s, t, n in zip(op_index, nbytes, seconds, world)], dtype=torch.float64)
    return {"op_index": op_index, "world_size": world, "nbytes": nbytes, "seconds": seconds,
            "expected": expected}


def sweep_sample(seed: int) -> dict[str, torch.Tensor]:
    """A synthetic sweep t = (alpha + S/B) * noise over 1 KiB..64 MiB, plus an unseen size."""
    g = torch.Generator().manual_seed(seed)
    alpha = float(torch.empty(1, dtype=torch.float64).uniform_(5e-6, 2e-4, generator=g))
    bandwidth = float(torch.empty(1, dtype=torch.float64).uniform_(0.3e9, 50e9, generator=g))
    sizes = 2.0 ** torch.arange(10, 27, dtype=torch.float64)
    noise = torch.exp(0.05 * torch.randn(len(sizes), generator=g, dtype=torch.float64))
    times = (alpha + sizes / bandwidth) * noise
    unseen = float(3 * 2 ** int(torch.randint(12, 24, (1,), generator=g)))
    fit = torch.tensor(reference_fit(sizes, times), dtype=torch.float64)
    predicted = fit[0] + unseen / fit[1]
    return {"sizes": sizes, "times": times, "unseen": torch.tensor(unseen, dtype=torch.float64),
            "fit": fit, "predicted": predicted}


def make_references() -> dict[str, dict]:
    """The stored reference sets of Lab 1 (see ``distlab.course.references``)."""
    refs = {}
    for name, (world_size, numel) in {"all_reduce_ws2": (2, 10), "all_reduce_ws4": (4, 13)}.items():
        seed = SEED + world_size
        inputs = all_reduce_inputs(world_size, numel, seed)
        refs[name] = {"seed": seed, "inputs": inputs, "expected": inputs.sum(0)}
    refs["bandwidths"] = {"seed": SEED, **bandwidth_cases(SEED)}
    refs["alpha_beta"] = {"seed": SEED, **sweep_sample(SEED)}
    return refs


def _stored(name: str) -> dict[str, torch.Tensor]:
    from distlab.checks.stored import load
    return load(LAB, name)


# ---------------------------------------------------------------------------------------------
# Exercises 1 and 2: all-reduces on ranks

def _apply_on_rank(rank: int, world_size: int, inputs: torch.Tensor, fn):
    """Rank body: call the student's in-rank ``fn`` on this rank's row (on its GPU under NCCL)."""
    import torch.distributed as dist
    mine = inputs[rank].clone().to(rank_device())
    result = fn(mine)
    return result if result is not None else mine  # an in-place implementation may return None


def _case(world_size: int, numel: int | None, seed: int | None) -> tuple[torch.Tensor, torch.Tensor, str]:
    if seed is None:
        ref = _stored(f"all_reduce_ws{world_size}")
        return ref["inputs"], ref["expected"], f"the stored inputs ({world_size} ranks)"
    numel = numel if numel is not None else int(torch.randint(world_size, 64, (1,),
                                                generator=torch.Generator().manual_seed(seed)))
    inputs = all_reduce_inputs(world_size, numel, seed)
    return inputs, inputs.sum(0), f"fresh inputs (seed {seed}, {world_size} ranks, {numel} elements)"


def _check_values(out, expected: torch.Tensor, name: str, case: str) -> None:
    for rank, got in enumerate(out):
        if isinstance(got, torch.Tensor) and got.shape != expected.shape and got.numel() == expected.numel():
            raise CheckFailed(f"{name} on {case}: rank {rank} returned shape {list(got.shape)}; "
                              f"return the result in the input's shape {list(expected.shape)}.")
        assert_close(got, expected, what=f"{name} on {case} ({out.backend})", rank=rank,
                     atol=1e-4, rtol=1e-5,
                     hint="Every rank must end with the elementwise sum of all ranks' tensors.")


def check_all_reduce_rs_ag(fn, world_size: int = 2, numel: int | None = None,
                           seed: int | None = None) -> None:
    """``fn(tensor)`` on every rank must return the sum over ranks, using exactly one
    reduce-scatter and one all-gather (no all_reduce)."""
    inputs, expected, case = _case(world_size, numel, seed)
    for backend, out in run_each_backend(_apply_on_rank, world_size, inputs, fn):
        _check_values(out, expected, "all_reduce_rs_ag", case)
        for rank, comms in enumerate(out.comms):
            ops = [c.op for c in comms]
            rs = [c for c in comms if c.op in REDUCE_SCATTER]
            ag = [c for c in comms if c.op in ALL_GATHER]
            others = [op for op in ops if op not in REDUCE_SCATTER | ALL_GATHER]
            if len(rs) != 1 or len(ag) != 1 or others:
                raise CheckFailed(
                    f"all_reduce_rs_ag on {case}: rank {rank} called {ops or 'no collective'}; "
                    f"expected exactly one reduce-scatter followed by one all-gather.")
            if rs[0].seq > ag[0].seq:
                raise CheckFailed(f"all_reduce_rs_ag on {case}: rank {rank} gathered before it "
                                  f"reduce-scattered; reduce first, then gather the reduced shards.")
            needed = expected.numel() * expected.element_size()
            if rs[0].bytes < needed:
                raise CheckFailed(
                    f"all_reduce_rs_ag on {case}: rank {rank}'s reduce-scatter moved {rs[0].bytes} "
                    f"bytes, less than the whole tensor ({needed} bytes): every element must be reduced.")


def check_ring_all_reduce(fn, world_size: int = 4, numel: int | None = None,
                          seed: int | None = None) -> None:
    """``fn(tensor)`` must return the sum over ranks using point-to-point messages only: each rank
    sends 2(n-1) messages to one ring neighbour, 2(n-1)/n of the tensor in all."""
    inputs, expected, case = _case(world_size, numel, seed)
    n, numel_ = world_size, expected.numel()
    item = expected.element_size()
    for backend, out in run_each_backend(_apply_on_rank, world_size, inputs, fn):
        _check_values(out, expected, "ring_all_reduce", case)
        sent_total = 0
        for rank, comms in enumerate(out.comms):
            collective = sorted({c.op for c in comms if c.op not in P2P})
            if collective:
                raise CheckFailed(f"ring_all_reduce on {case}: rank {rank} called {collective}; "
                                  f"build the ring from send/recv (or isend/irecv) only.")
            sends = [c for c in comms if c.op in ("send", "isend")]
            if len(sends) != 2 * (n - 1):
                raise CheckFailed(
                    f"ring_all_reduce on {case}: rank {rank} sent {len(sends)} messages; a ring "
                    f"all-reduce on {n} ranks sends 2(n-1) = {2 * (n - 1)}: one chunk per step, "
                    f"n-1 reduce-scatter steps and n-1 all-gather steps.")
            peers = {c.peer for c in sends}
            neighbours = {(rank + 1) % n, (rank - 1) % n}
            if len(peers) != 1 or not peers <= neighbours:
                raise CheckFailed(f"ring_all_reduce on {case}: rank {rank} sent to ranks "
                                  f"{sorted(peers)}; in a ring each rank sends only to one neighbour "
                                  f"(rank {(rank + 1) % n}, or rank {(rank - 1) % n} for the other direction).")
            sent = sum(c.bytes for c in sends)
            low, high = 2 * (n - 1) * (numel_ // n) * item, 2 * (n - 1) * math.ceil(numel_ / n) * item
            if not low <= sent <= high:
                raise CheckFailed(
                    f"ring_all_reduce on {case}: rank {rank} sent {sent} bytes; each rank should "
                    f"send 2(n-1)/n of the tensor, {2 * (n - 1) / n * numel_ * item:.0f} bytes "
                    f"(between {low} and {high} with uneven chunks): send chunks, not the whole tensor.")
            sent_total += sent
        if sent_total != 2 * (n - 1) * numel_ * item:
            raise CheckFailed(f"ring_all_reduce on {case}: the ranks sent {sent_total} bytes in all; "
                              f"a ring sends every chunk n-1 times in each phase, "
                              f"2(n-1) x {numel_ * item} = {2 * (n - 1) * numel_ * item} bytes.")


# ---------------------------------------------------------------------------------------------
# Exercises 3 and 4: formulas, checked in the kernel

def _as_pair(value, name: str) -> tuple[float, float]:
    try:
        a, b = value
        return float(a), float(b)
    except (TypeError, ValueError):
        raise CheckFailed(f"{name} must return a pair of numbers, got {value!r}.")


def check_bandwidths(fn, seed: int | None = None) -> None:
    """``fn(op, nbytes, seconds, world_size)`` must return nccl-tests' (algbw, busbw) in GB/s."""
    cases = _stored("bandwidths") if seed is None else bandwidth_cases(seed)
    ops = list(BUS_FACTOR)
    for i in range(len(cases["nbytes"])):
        op, n = ops[int(cases["op_index"][i])], int(cases["world_size"][i])
        nbytes, seconds = float(cases["nbytes"][i]), float(cases["seconds"][i])
        got = _as_pair(fn(op, nbytes, seconds, n), "bandwidths")
        exp = [float(v) for v in cases["expected"][i]]
        for label, g, e, hint in (("algbw", got[0], exp[0], "algbw = size / time, in GB/s (1e9 bytes/s)."),
                                  ("busbw", got[1], exp[1],
                                   f"busbw = algbw x {BUS_FACTOR[op](n):.4g} for {op} on {n} ranks.")):
            if not math.isclose(g, e, rel_tol=1e-6):
                raise CheckFailed(f"bandwidths({op!r}, nbytes={nbytes:.0f}, seconds={seconds:.3g}, "
                                  f"world_size={n}): {label} expected {e:.6g} GB/s, got {g:.6g}. {hint}")


def check_alpha_beta(fit_fn, predict_fn, seed: int | None = None) -> None:
    """``fit_fn(sizes, times)`` must return (alpha, bandwidth) of the relative least-squares fit;
    ``predict_fn(alpha, bandwidth, nbytes)`` the model's time for an unseen size."""
    sample = _stored("alpha_beta") if seed is None else sweep_sample(seed)
    where = "the stored sweep" if seed is None else f"a fresh sweep (seed {seed})"
    sizes, times = sample["sizes"].clone(), sample["times"].clone()
    alpha, bandwidth = _as_pair(fit_fn(sizes, times), "fit_alpha_beta")
    exp_alpha, exp_bw = (float(v) for v in sample["fit"])
    for label, got, exp, unit in (("alpha (latency)", alpha, exp_alpha, "s"),
                                  ("bandwidth", bandwidth, exp_bw, "bytes/s")):
        if not math.isclose(got, exp, rel_tol=1e-4):
            raise CheckFailed(
                f"fit_alpha_beta on {where}: {label} expected {exp:.6g} {unit}, got {got:.6g}. "
                f"Minimise the relative error sum(((alpha + S/B - t)/t)^2): divide each row of the "
                f"least-squares system [1, S] @ [alpha, 1/B] = t by t.")
    unseen = float(sample["unseen"])
    predicted = float(predict_fn(exp_alpha, exp_bw, unseen))
    if not math.isclose(predicted, float(sample["predicted"]), rel_tol=1e-6):
        raise CheckFailed(f"predict_time(alpha={exp_alpha:.4g}, bandwidth={exp_bw:.4g}, "
                          f"nbytes={unseen:.0f}): expected {float(sample['predicted']):.6g} s, "
                          f"got {predicted:.6g}.")


__all__ = ["check_all_reduce_rs_ag", "check_ring_all_reduce", "check_bandwidths",
           "check_alpha_beta", "make_references"]


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB1_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_all_reduce_rs_ag", "check_ring_all_reduce", "check_bandwidths", "check_alpha_beta"],
    CourseCode(forbidden=LAB1_SHIPPED))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
