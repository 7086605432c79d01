"""Graded checks of Lab 1, "Collectives and their cost".

Exercises (each checked on real ranks or, for the pure formulas, in the kernel):
1. ``all_reduce_rs_ag(tensor)``: all-reduce (sum) as one reduce-scatter and one all-gather.
2. ``ring_all_reduce(tensor)``: ring all-reduce from point-to-point messages only: the tensor is cut
   into n chunks (uneven when n does not divide its length), n-1 reduce-scatter steps and n-1
   all-gather steps, each rank sending one chunk to its ring neighbour per step, so every rank
   sends 2(n-1) messages carrying 2(n-1)/n of the tensor.
3. ``bus_factor(comms, nbytes)``: the bytes one rank sent (its ``send``/``isend`` records) over
   the buffer's size, derived from what it sent, not looked up: checked on a ring's records
   (visible: a correct ring's, stored; hidden: the student's own ring's) and on two other
   algorithms' (direct exchange, reduce-then-broadcast), where a table's 2(n-1)/n is wrong.
   ``bandwidths(nbytes, seconds, factor) -> (algbw, busbw)`` in GB/s (1e9 bytes/s) as nccl-tests
   defines them: algbw = S / t, busbw = algbw * factor.
4. ``fit_alpha_beta(sizes, times) -> (alpha, bandwidth)``: the Hockney model t(S) = alpha + S / B,
   fitted by minimising the *relative* squared error sum_i ((alpha + S_i/B - t_i) / t_i)^2, linear
   in (alpha, 1/B); and ``predict_time(alpha, bandwidth, nbytes)``.
5. ``fit_ring_model(world_sizes, sizes, times) -> (alpha, bandwidth)``: the ring all-reduce model
   t(n, S) = 2(n-1) alpha + 2(n-1)/n S/B fitted on several world sizes at once (same relative
   least squares), so that the latency term, growing with n, appears.

The references are the plain single-process computations: ``inputs.sum(0)`` for both all-reduces,
the formulas above for 3, ``torch.linalg.lstsq`` in float64 for 4. Both all-reduces and the ring
run for 3 are graded on their record only once it accounts for what crossed (``checks.crossed``).
"""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab01_lines import (all_reduce_line, bandwidths_line, bus_factor_line, fit_line,
                                       prediction_line, size, span)
from distlab.checks.lab01_records import bus_factor_cases
from distlab.checks.ranks import call_each, run_each_backend
from distlab.labs.collectives import reference_fit, reference_ring_fit
from distlab.runtime.devices import device as rank_device
from distlab.runtime.per_rank import PerRank, reference

LAB = "01_collectives"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
RANK_IMPORTS = ()
SEED = 1234
BUS_FACTOR_WORLD_SIZES, BUS_FACTOR_NUMEL = (2, 4), 1030   # the visible test's records
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
# How close an answer must be (relative): the same arithmetic, or a least-squares solve in float64
BANDWIDTH_TOL, BUS_FACTOR_TOL, FIT_TOL, PREDICT_TOL = 1e-6, 1e-9, 1e-4, 1e-6


# ---------------------------------------------------------------------------------------------
# Inputs and references (the single-process computations)

def all_reduce_inputs(world_size: int, numel: int, seed: int) -> torch.Tensor:
    """One row per rank: (world_size, numel) float32 from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(world_size, numel, generator=g)


def reference_bandwidths(nbytes: float, seconds: float, factor: float) -> tuple[float, float]:
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * factor


def reference_bus_factor(comms, nbytes: float) -> float:
    """Bytes this rank sent point-to-point over the buffer's size: what busbw counts."""
    return sum(c.bytes for c in comms if c.op in ("send", "isend")) / nbytes


def bandwidth_cases(seed: int, count: int = 12) -> dict[str, torch.Tensor]:
    """Random (size, time, factor) cases and their (algbw, busbw); factors of n in 2..16."""
    g = torch.Generator().manual_seed(seed)
    ops = list(BUS_FACTOR)
    op_index = torch.randint(len(ops), (count,), generator=g)
    world = torch.randint(2, 17, (count,), generator=g)
    factor = torch.tensor([BUS_FACTOR[ops[o]](int(n)) for o, n in zip(op_index, world)],
                          dtype=torch.float64)
    nbytes = (2.0 ** torch.randint(10, 31, (count,), generator=g)).double()
    seconds = torch.exp(torch.empty(count, dtype=torch.float64).uniform_(-11, 0, generator=g))
    expected = torch.tensor([reference_bandwidths(float(s), float(t), float(f))
                             for s, t, f in zip(nbytes, seconds, factor)], dtype=torch.float64)
    return {"factor": factor, "nbytes": nbytes, "seconds": seconds, "expected": expected}


def ring_model_sample(seed: int) -> dict[str, torch.Tensor]:
    """A synthetic ring sweep on 2 and 4 ranks: t = (2(n-1) alpha + 2(n-1)/n S/B) * noise."""
    g = torch.Generator().manual_seed(seed)
    alpha = float(torch.empty(1, dtype=torch.float64).uniform_(5e-6, 2e-4, generator=g))
    bandwidth = float(torch.empty(1, dtype=torch.float64).uniform_(0.3e9, 50e9, generator=g))
    sizes = (2.0 ** torch.arange(10, 25, 2, dtype=torch.float64)).repeat(2)
    world = torch.tensor([2.0] * (len(sizes) // 2) + [4.0] * (len(sizes) // 2), dtype=torch.float64)
    noise = torch.exp(0.05 * torch.randn(len(sizes), generator=g, dtype=torch.float64))
    times = (2 * (world - 1) * alpha + 2 * (world - 1) / world * sizes / bandwidth) * noise
    fit = torch.tensor(reference_ring_fit(world, sizes, times), dtype=torch.float64)
    return {"world_sizes": world, "sizes": sizes, "times": times, "fit": fit}


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
    refs["ring_model"] = {"seed": SEED, **ring_model_sample(SEED)}
    cases = bus_factor_cases(BUS_FACTOR_WORLD_SIZES, BUS_FACTOR_NUMEL)
    refs["bus_factor"] = {
        "seed": SEED, "world_sizes": torch.tensor(BUS_FACTOR_WORLD_SIZES),
        "numel": torch.tensor(BUS_FACTOR_NUMEL),
        "expected": torch.tensor([reference_bus_factor(comms, 4 * BUS_FACTOR_NUMEL)
                                  for _, _, comms in cases], dtype=torch.float64)}
    return refs


EXPECTED_KEYS = {"all_reduce_ws2": ("expected",), "all_reduce_ws4": ("expected",),
                 "bandwidths": ("expected",), "alpha_beta": ("fit", "predicted"),
                 "ring_model": ("fit",), "bus_factor": ("expected",)}


def _marked(name: str, values: dict) -> dict:   # expected results (not inputs): kept off ranks
    return {k: reference(v) if k in EXPECTED_KEYS[name] else v for k, v in values.items()}


def _stored(name: str) -> dict[str, torch.Tensor]:
    from distlab.checks.stored import load
    return _marked(name, load(LAB, name))


# ---------------------------------------------------------------------------------------------
# Exercises 1 and 2: all-reduces on ranks

def _apply_on_rank(rank: int, world_size: int, mine: torch.Tensor, fn):
    """Rank body: call the student's in-rank ``fn`` on this rank's row (on its GPU under NCCL).
    It gets its own row only: the other rows are what it must communicate for."""
    mine = mine.clone().to(rank_device())
    result = fn(mine)
    return result if result is not None else mine  # an in-place implementation may return None


def _case(world_size: int, numel: int | None, seed: int | None) -> tuple[PerRank, torch.Tensor, str]:
    if seed is None:
        ref = _stored(f"all_reduce_ws{world_size}")
        inputs, expected, case = ref["inputs"], ref["expected"], f"the stored inputs ({world_size} ranks)"
    else:
        # KiBs a rank: an all-reduce outside the record crosses more than its header allowance.
        g = torch.Generator().manual_seed(seed)
        numel = numel if numel is not None else int(torch.randint(1024, 2048, (1,), generator=g))
        inputs = all_reduce_inputs(world_size, numel, seed)
        expected = reference(inputs.sum(0))
        case = f"fresh inputs (seed {seed}, {world_size} ranks, {numel} elements)"
    return PerRank([row.clone() for row in inputs]), expected, case   # copies: a view holds all rows


def _check_run(out, expected: torch.Tensor, name: str, case: str) -> tuple[float, float]:
    """What crossed is what the record says (so that the record can be graded), and the values:
    (the largest error of any rank, the absolute part of its allowance) for the passing line."""
    assert_crossed_as_recorded(out, f"{name} on {case}")
    for rank, got in enumerate(out):
        if isinstance(got, torch.Tensor) and got.shape != expected.shape and got.numel() == expected.numel():
            raise CheckFailed(f"{name} on {case}: rank {rank} returned shape {list(got.shape)}; "
                              f"return the result in the input's shape {list(expected.shape)}.")
        assert_close(got, expected, what=f"{name} on {case} ({out.backend})", rank=rank, atol=1e-4, rtol=1e-5,
                     hint="Every rank must end with the elementwise sum of all ranks' tensors.")
    worst = max(float((got.cpu().double() - expected.double()).abs().max()) for got in out)
    return worst, 1e-4 * max(1.0, float(expected.abs().max()))   # assert_close's scaled atol


def check_all_reduce_rs_ag(fn, world_size: int = 2, numel: int | None = None,
                           seed: int | None = None) -> str:
    """``fn(tensor)`` on every rank must return the sum over ranks, using exactly one
    reduce-scatter and one all-gather (no all_reduce)."""
    rows, expected, case = _case(world_size, numel, seed)
    errors, moved = {}, []
    for backend, out in run_each_backend(_apply_on_rank, world_size, rows, fn):
        errors[out.backend] = _check_run(out, expected, "all_reduce_rs_ag", case)
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
            moved.append(rs[0].bytes)
    return all_reduce_line("all_reduce_rs_ag", world_size, expected.numel(), errors,
                           f"one reduce-scatter ({span(moved, lambda b: f'{b:,}')} bytes, the whole "
                           f"tensor's {needed:,} or more) then one all-gather on every rank")


def check_ring_all_reduce(fn, world_size: int = 4, numel: int | None = None,
                          seed: int | None = None) -> str:
    """``fn(tensor)`` must return the sum over ranks using point-to-point messages only: each rank
    sends 2(n-1) messages to one ring neighbour, 2(n-1)/n of the tensor in all."""
    rows, expected, case = _case(world_size, numel, seed)
    n, numel_, item = world_size, expected.numel(), expected.element_size()
    errors, sent_each = {}, []
    for backend, out in run_each_backend(_apply_on_rank, world_size, rows, fn):
        errors[out.backend] = _check_run(out, expected, "ring_all_reduce", case)
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
            sent_each.append(sent)
        if sent_total != 2 * (n - 1) * numel_ * item:
            raise CheckFailed(f"ring_all_reduce on {case}: the ranks sent {sent_total} bytes in all; "
                              f"a ring sends every chunk n-1 times in each phase, "
                              f"2(n-1) x {numel_ * item} = {2 * (n - 1) * numel_ * item} bytes.")
    sent = span(sent_each, lambda b: f"{b:,}")
    return all_reduce_line("ring_all_reduce", n, numel_, errors,
                           f"every rank sent 2(n-1) = {2 * (n - 1)} messages to one neighbour, {sent} "
                           f"bytes (2(n-1)/n of {numel_ * item:,}: {2 * (n - 1) / n * numel_ * item:,.0f})")


# ---------------------------------------------------------------------------------------------
# Exercises 3 and 4: formulas, checked in the kernel

def _as_pair(value, name: str) -> tuple[float, float]:
    try:
        a, b = value
        return float(a), float(b)
    except (TypeError, ValueError):
        raise CheckFailed(f"{name} must return a pair of numbers, got {value!r}.")


def check_bandwidths(fn, seed: int | None = None) -> str:
    """``fn(nbytes, seconds, factor)`` must return nccl-tests' (algbw, busbw) in GB/s."""
    cases = _stored("bandwidths") if seed is None else _marked("bandwidths", bandwidth_cases(seed))
    calls = list(zip(*(cases[k].double().tolist() for k in ("nbytes", "seconds", "factor"))))
    answers, expected = [], cases["expected"].tolist()
    for (nbytes, seconds, factor), answer, exp in zip(calls, call_each(fn, calls), expected):
        answers.append(got := _as_pair(answer, "bandwidths"))
        for label, g, e, hint in (("algbw", got[0], exp[0], "algbw = size / time, in GB/s (1e9 bytes/s)."),
                                  ("busbw", got[1], exp[1], f"busbw = algbw x factor ({factor:.4g}).")):
            if not math.isclose(g, e, rel_tol=BANDWIDTH_TOL):
                raise CheckFailed(f"bandwidths(nbytes={nbytes:.0f}, seconds={seconds:.3g}, "
                                  f"factor={factor:.4g}): {label} expected {e:.6g} GB/s, got "
                                  f"{g:.6g}. {hint}")
    return bandwidths_line(calls, answers, expected, BANDWIDTH_TOL)


def check_bus_factor(fn, ring, world_sizes=BUS_FACTOR_WORLD_SIZES, numel: int | None = None,
                     seed: int | None = None) -> str:
    """``fn(comms, nbytes)`` must return the bytes the record's sends carried over ``nbytes``: on
    a ring all-reduce's records (2(n-1)/n) and on two other algorithms' records, where the ring's
    2(n-1)/n is wrong. Visible (no ``seed``): a correct ring's records on 2 and 4 ranks, against
    the stored factors. Hidden: the records of the student's own ``ring`` on ``world_sizes``, on a
    buffer of ``numel`` elements (drawn from ``seed`` when not given)."""
    if seed is None:
        stored = _stored("bus_factor")
        world_sizes, numel = tuple(stored["world_sizes"].tolist()), int(stored["numel"])
        cases, expected_factors = bus_factor_cases(world_sizes, numel), stored["expected"].tolist()
    else:
        numel = numel if numel is not None else 1024 + seed % 1024   # KiBs: see _case
        cases = bus_factor_cases(world_sizes, numel, ring)
        expected_factors = [reference(reference_bus_factor(comms, numel * 4)) for *_, comms in cases]
    nbytes = numel * 4
    answers = call_each(fn, [(comms, nbytes) for *_, comms in cases])   # one launch for all
    for i, ((what, _, comms), expected, got) in enumerate(zip(cases, expected_factors, answers, strict=True)):
        try:
            got = answers[i] = float(got)
        except (TypeError, ValueError) as err:
            raise CheckFailed(f"bus_factor on {what}: expected a number, got an error: {err}")
        if not math.isclose(got, expected, rel_tol=BUS_FACTOR_TOL):
            raise CheckFailed(
                f"bus_factor(comms, nbytes={nbytes}) on {what}: expected {expected:.6g}, got {got:.6g}. "
                f"Derive it from the record: the sends in it carried {round(expected * nbytes)} bytes, "
                f"and busbw / algbw = bytes one rank sent / buffer bytes (a table's 2(n-1)/n "
                f"holds for a ring only).")
    return bus_factor_line([short for _, short, _ in cases], answers, expected_factors, nbytes,
                           BUS_FACTOR_TOL)


def check_alpha_beta(fit_fn, predict_fn, seed: int | None = None) -> str:
    """``fit_fn(sizes, times)`` must return (alpha, bandwidth) of the relative least-squares fit;
    ``predict_fn(alpha, bandwidth, nbytes)`` the model's time for an unseen size."""
    sample = _stored("alpha_beta") if seed is None else _marked("alpha_beta", sweep_sample(seed))
    where = "the stored sweep" if seed is None else f"a fresh sweep (seed {seed})"
    sizes, times = sample["sizes"].clone(), sample["times"].clone()
    alpha, bandwidth = _as_pair(fit_fn(sizes, times), "fit_alpha_beta")
    exp_alpha, exp_bw = (float(v) for v in sample["fit"])
    for label, got, exp, unit in (("alpha (latency)", alpha, exp_alpha, "s"),
                                  ("bandwidth", bandwidth, exp_bw, "bytes/s")):
        if not math.isclose(got, exp, rel_tol=FIT_TOL):
            raise CheckFailed(
                f"fit_alpha_beta on {where}: {label} expected {exp:.6g} {unit}, got {got:.6g}. "
                f"Minimise the relative error sum(((alpha + S/B - t)/t)^2): divide each row of the "
                f"least-squares system [1, S] @ [alpha, 1/B] = t by t.")
    unseen = float(sample["unseen"])
    # The fit is predict_time's input (fit_fn's answer was judged above): a plain float.
    predicted = float(predict_fn(exp_alpha, exp_bw, unseen))
    if not math.isclose(predicted, float(sample["predicted"]), rel_tol=PREDICT_TOL):
        raise CheckFailed(f"predict_time(alpha={exp_alpha:.4g}, bandwidth={exp_bw:.4g}, "
                          f"nbytes={unseen:.0f}): expected {float(sample['predicted']):.6g} s, "
                          f"got {predicted:.6g}.")
    sizes = sample["sizes"]   # not the copy fit_fn had: it may have changed it
    swept = f"{len(sizes)} sizes ({size(float(sizes.min()))} to {size(float(sizes.max()))})"
    return (fit_line("fit_alpha_beta", swept, (alpha, bandwidth), (exp_alpha, exp_bw), FIT_TOL,
                     "alpha + S/B") + "; " +
            prediction_line(unseen, predicted, float(sample["predicted"]), PREDICT_TOL))


def check_ring_model(fn, seed: int | None = None) -> str:
    """``fn(world_sizes, sizes, times)`` must return (alpha, bandwidth) of the relative
    least-squares fit of t = 2(n-1) alpha + 2(n-1)/n S/B over all rows at once."""
    sample = _stored("ring_model") if seed is None else _marked("ring_model", ring_model_sample(seed))
    where = "the stored ring sweep (2 and 4 ranks)" if seed is None else f"a fresh ring sweep (seed {seed})"
    args = (sample["world_sizes"].clone(), sample["sizes"].clone(), sample["times"].clone())
    alpha, bandwidth = _as_pair(fn(*args), "fit_ring_model")
    exp_alpha, exp_bw = (float(v) for v in sample["fit"])
    for label, got, exp, unit in (("alpha (latency per step)", alpha, exp_alpha, "s"),
                                  ("bandwidth", bandwidth, exp_bw, "bytes/s")):
        if not math.isclose(got, exp, rel_tol=FIT_TOL):
            raise CheckFailed(
                f"fit_ring_model on {where}: {label} expected {exp:.6g} {unit}, got {got:.6g}. "
                f"The ring's time on n ranks is t = 2(n-1) alpha + 2(n-1)/n S/B: fit both world "
                f"sizes at once with the rows [2(n-1), 2(n-1)/n S] / t (relative error).")
    world, sizes = sample["world_sizes"].tolist(), sample["sizes"]   # as given, not as fn left them
    rows = (f"{len(world)} runs ({' and '.join(str(int(n)) for n in sorted(set(world)))} ranks, "
            f"{size(float(sizes.min()))} to {size(float(sizes.max()))})")
    return fit_line("fit_ring_model", rows, (alpha, bandwidth), (exp_alpha, exp_bw), FIT_TOL,
                    "2(n-1)·alpha + 2(n-1)/n·S/B")


__all__ = ["check_all_reduce_rs_ag", "check_ring_all_reduce", "check_bandwidths",
           "check_bus_factor", "check_alpha_beta", "check_ring_model", "make_references"]


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB1_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([name for name in __all__ if name.startswith("check_")],
                             CourseCode(forbidden=LAB1_SHIPPED))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
