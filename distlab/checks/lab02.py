"""Graded checks of lab 2, data parallelism.

Every check runs the student's code on real ranks (``distlab.run``), trains the lab's MLP for a
few AdamW steps, and compares each rank with single-process training on the full batch
(``distlab.labs.data_parallel.reference_training``): stored references for the visible tests (seed 0),
computed afresh for the hidden ones (any seed, width and world size). Where the exercise is about
communication, the rank's collective record (``out.comms``) is checked too.

Tolerances. The ranks compute the mean loss of their own rows and the gradients are averaged
afterwards, so the sums happen in another order than in the full-batch reference: equal up to
rounding, not bitwise. In float32, AdamW's m / (sqrt(v) + eps) amplifies that rounding on elements
whose gradient is near zero (measured: parameters 1.2e-4 apart after 3 steps, worst of 1200
runs), which is as large as some real bugs. The checks therefore train in float64, where the
same measurement gives 1e-12 (parameters) and 1e-18 (gradients beyond rtol 1e-9): tolerances of
1e-9 leave a margin of 1000 and still catch a factor of 2 by twelve orders of magnitude. The
visible tests compare with a stored run made on the course's CPU, whose float32 weight init
another CPU rounds a last bit apart: there the tolerance is what that carries through 3 steps
(``distlab.checks.stored.tolerance``, ~1e-5 of the largest value). The
ranks must agree with each other exactly: an all-reduce gives every rank the same bits.

Why gradients are checked and not only parameters: Adam's update m / (sqrt(v) + eps) is nearly
invariant to the scale of the gradient, so a missing division by the world size changes the
parameters by ~1e-7 only. The gradients (and AdamW's first moment) show it at once.
"""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.common import (GATHER_OPS, REDUCE_SCATTER_OPS, Collectives,
                                   expect_collectives, op_in)
from distlab.labs.data_parallel import (Setup, device, final_state, flat, gradient_average,
                                        optimizer_state_bytes, param_bytes,
                                        reference_training, shard_bounds, train_steps)
from distlab.labs.data_parallel.problem import GRADIENT_AVERAGE_CASE
from distlab.labs.data_parallel.step_times import a100_overlap_set
from distlab.checks.lab02_ranks import Optimizer as _Optimizer, rank_inputs as _rank_inputs
from distlab.runtime.per_rank import reference

LAB = "02_data_parallel"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# torch._dynamo (with DTensor and FSDP): an optimizer's constructor imports it, 0.4-0.8 s a rank.
RANK_IMPORTS = ("torch._dynamo",)
# Within the course's grading budget (CONTRIBUTING.md; bench/grading_budget.py): each exercise is
# graded by one run on 4 ranks (visible: the stored reference; 4 tells a divide-by-W from a
# divide-by-2, or rows of rank 1 - r) and one on 2 with a fresh seed and another width (hidden).
# Idle, the whole course side by side with main 00c1be4 (16 runs: 2 and 4 ranks visible, 4 and 2
# hidden; bench/grading_budget.py, 28 November 2026, 2-core AMD EPYC, load 1.3-2.1): 7.0 s and
# 9.4 CPU-s before, 3.7 s and 4.2 CPU-s after, the guard's entry calls included.
STEPS = 3
GRAD_TOL = dict(atol=1e-12, rtol=1e-9)
PARAM_TOL = dict(atol=1e-9, rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# References

def _setup(seed: int | None, d_hidden: int) -> Setup:
    return Setup(seed=0 if seed is None else seed, d_hidden=d_hidden)


def make_references() -> dict:
    """The visible tests' reference: 3 AdamW steps of the lab's MLP (seed 0) on the full batch,
    and AdamW's state bytes; and the numbers of the lab's gradient-average table (a handout has
    neither ``reference_training`` nor ``gradient_average``)."""
    from distlab.checks.lab02_prediction import state_bytes_set
    setup = Setup(seed=0)
    ref = reference_training(setup, STEPS)
    case = GRADIENT_AVERAGE_CASE
    return {"adamw_3_steps": {"seed": setup.seed, "params": flat(ref["params"]),
                              "grads": flat(ref["grads"]), "exp_avg": ref["exp_avg"],
                              "losses": torch.tensor(ref["losses"])},
            "adamw_state": {"seed": setup.seed,
                            "state_bytes": torch.tensor(reference_training(setup, 1)["state_bytes"])},
            "gradient_average": {"seed": case["setup"].seed,
                                 **gradient_average(case["world_size"], case["setup"])},
            "a100_overlap": {"seed": 0, **a100_overlap_set()},
            "prediction": state_bytes_set()}


def _unflatten(vector: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    pieces = vector.split([t.numel() for t in like])
    return [piece.view_as(t) for piece, t in zip(pieces, like)]


def _reference(seed: int, d_hidden: int) -> dict:
    """The hidden tests' reference, computed here and now (in the judge while grading)."""
    return {**reference_training(_setup(seed, d_hidden), STEPS),
            "tol": {"params": PARAM_TOL, "grads": GRAD_TOL, "exp_avg": GRAD_TOL}}


def _stored_reference(d_hidden: int) -> dict:
    """The visible tests' reference (seed 0), as ``reference_training`` returns it, from data/."""
    from distlab.checks.stored import load, tolerance
    setup = _setup(None, d_hidden)
    if setup != Setup(seed=0):
        raise ValueError(f"the stored reference is the lab's MLP with d_hidden={Setup().d_hidden}; "
                         f"pass a seed to check d_hidden={d_hidden}")
    stored = load(LAB, "adamw_3_steps")
    shapes = [p.detach() for p in setup.model().parameters()]
    # Made on the course's CPU: on another, torch draws the float32 initial weights a last bit
    # apart, which AdamW carries through the steps (7e-7 on parameters of 0.2, against 1e-15 on
    # one CPU). The tolerance allows that (distlab.checks.stored.tolerance) and stays five
    # orders of magnitude below a missing average (2x the gradients and the first moment).
    return {"params": _unflatten(stored["params"], shapes),
            "grads": _unflatten(stored["grads"], shapes), "exp_avg": stored["exp_avg"],
            "losses": stored["losses"].tolist(),
            "state_bytes": int(load(LAB, "adamw_state")["state_bytes"]),
            "tol": {key: tolerance(stored[key], steps=STEPS)
                    for key in ("params", "grads", "exp_avg")}}


def _reference_for(seed: int | None, d_hidden: int) -> dict:
    """Stored reference for the visible test (seed None), else computed here and now; marked as
    expected results, which no rank may receive."""
    return reference(_stored_reference(d_hidden) if seed is None else _reference(seed, d_hidden))


# ---------------------------------------------------------------------------------------------
# Comparisons shared by the checks

def _names(setup: Setup) -> list[str]:
    return [name for name, _ in setup.model().named_parameters()]


def _compare(out, ref: dict, setup: Setup, world_size: int, *, grads: bool = True) -> None:
    """Ranks identical to each other, gradients and parameters equal to the reference."""
    names = _names(setup)
    for rank in range(world_size):
        if grads:
            for name, got, exp in zip(names, out[rank]["grads"], ref["grads"]):
                if got is None:
                    raise CheckFailed(f"gradient of {name} on rank {rank} is None after the step: "
                                      f"leave the averaged gradients in p.grad (zero them at the "
                                      f"start of a step, not at the end).")
                assert_close(got, exp, what=f"averaged gradient of {name} after step {STEPS}",
                             rank=rank, hint=_grad_hint(got, exp, world_size),
                             **ref["tol"]["grads"])
        for name, got, exp in zip(names, out[rank]["params"], ref["params"]):
            assert_close(got, out[0]["params"][names.index(name)], atol=0, rtol=0,
                         what=f"parameter {name} compared with rank 0's", rank=rank,
                         hint="Data-parallel ranks must stay identical: every rank has to apply "
                              "the same averaged gradient.")
            assert_close(got, exp, what=f"parameter {name} after {STEPS} AdamW steps", rank=rank,
                         hint="Compare with single-process training on the full batch.",
                         **ref["tol"]["params"])


def _grad_hint(got: torch.Tensor, exp: torch.Tensor, world_size: int) -> str:
    # A gradient that points the same way but is W times longer: the division was forgotten.
    ratio = (got.norm() / exp.norm()).item() if exp.norm() > 0 else 0.0
    aligned = torch.nn.functional.cosine_similarity(got.reshape(-1), exp.reshape(-1), dim=0) > 0.99
    if abs(ratio - world_size) < 0.05 * world_size and bool(aligned):
        return (f"Your gradient is {world_size} times the expected one: all_reduce sums over the "
                f"ranks. Divide by the world size to get the average.")
    return ("Each rank's gradient must be the average over all ranks of the gradients of their "
            "own rows (that is the gradient of the full-batch loss).")


def _comms(out, rank: int, ops=None) -> list:
    return [c for c in out.comms[rank] if c.op != "barrier" and (ops is None or c.op in ops)]


def _run(what: str, fn, world_size: int, *args):
    """The ranks' results, once what crossed is within what their records say (which the checks
    then grade: ``distlab.checks.crossed``)."""
    from distlab import run
    out = run(fn, world_size, *args, timeout=120)
    assert_crossed_as_recorded(out, what)
    return out


# ---------------------------------------------------------------------------------------------
# Exercise 1: a data-parallel training step

def _dp_step_rank(rank: int, world_size: int, step_fn, model, opt: _Optimizer, data,
                  steps: int) -> dict:
    dev = device()
    model = model.to(dev)
    optimizer = opt.optimizer(model.parameters())
    x, y = (t.to(dev) for t in data)   # the full batch's shape, NaN outside this rank's rows
    for _ in range(steps):
        step_fn(model, optimizer, x, y)
    return final_state(model)


def check_data_parallel_step(step_fn, *, world_size: int = 2, seed: int | None = None,
                             d_hidden: int = 64) -> None:
    """``step_fn(model, optimizer, x, y)`` (x, y: the full batch, on every rank) run for 3 steps
    must give the parameters of single-process AdamW on the full batch, with one all-reduce per
    parameter per step."""
    setup = _setup(seed, d_hidden)
    out = _run("data_parallel_step", _dp_step_rank, world_size, step_fn, *_rank_inputs(setup, world_size, True), STEPS)
    n_params = len(list(setup.model().parameters()))
    for rank in range(world_size):
        reduces = _comms(out, rank, {"all_reduce"})
        if len(reduces) != n_params * STEPS:
            raise CheckFailed(
                f"rank {rank} issued {len(reduces)} all_reduce calls in {STEPS} steps; expected "
                f"{n_params * STEPS}: one per parameter ({n_params} parameters) per step.")
    _compare(out, _reference_for(seed, d_hidden), setup, world_size)


# ---------------------------------------------------------------------------------------------
# Exercise 2: bucketed all-reduce

def _sync_rank(rank: int, world_size: int, make_sync, model, opt: _Optimizer, data,
               steps: int) -> dict:
    """Train with ``after_backward = make_sync(params)``: the checks' harness for exercises 2, 3."""
    dev = device()
    model, (x, y) = model.to(dev), (t.to(dev) for t in data)
    after_backward = make_sync(list(model.parameters()))
    record = train_steps(model, opt.optimizer(model.parameters()), x, y, steps, after_backward)
    return {**final_state(model), **record}


def _bucketed(fn, bucket_bytes: int):
    """make_sync for exercise 2 (a closure cloudpickle carries to the ranks)."""
    return lambda params: (lambda: fn(params, bucket_bytes))


def check_bucketed_all_reduce(fn, *, bucket_bytes: int = 8192, world_size: int = 2,
                              seed: int | None = None, d_hidden: int = 64) -> None:
    """``fn(params, bucket_bytes)`` must average the gradients with all-reduces of flat buckets:
    at most ceil(P / bucket_bytes) all-reduces per step for P gradient bytes, none larger than
    bucket_bytes, every gradient byte reduced exactly once, and the values of the reference."""
    setup = _setup(seed, d_hidden)
    out = _run("bucketed_all_reduce", _sync_rank, world_size, _bucketed(fn, bucket_bytes), *_rank_inputs(setup, world_size),
               STEPS)
    total = param_bytes(setup.model().parameters())
    most = math.ceil(total / bucket_bytes)
    for rank in range(world_size):
        comms = _comms(out, rank)
        wrong = [c for c in comms if c.op != "all_reduce"]
        if wrong:
            raise CheckFailed(f"rank {rank} called {wrong[0].describe()}; a bucketed gradient "
                              f"sync uses only all_reduce.")
        big = [c for c in comms if c.bytes > bucket_bytes]
        if big:
            raise CheckFailed(
                f"rank {rank}: {big[0].describe()} moves {big[0].bytes} bytes, more than the "
                f"bucket of {bucket_bytes} bytes. A bucket holds bucket_bytes // element_size "
                f"elements ({bucket_bytes // 4} float32 values), not bucket_bytes.")
        if len(comms) > most * STEPS:
            raise CheckFailed(
                f"rank {rank} issued {len(comms) / STEPS:g} all-reduces per step; {total} bytes "
                f"of gradients in buckets of {bucket_bytes} bytes need at most "
                f"ceil({total}/{bucket_bytes}) = {most}. Fill every bucket before sending it "
                f"(flatten the gradients into one buffer and cut it into bucket-sized pieces).")
        sent = sum(c.bytes for c in comms)
        if sent != total * STEPS:
            raise CheckFailed(
                f"rank {rank} all-reduced {sent / STEPS:g} bytes per step; the gradients are "
                f"{total} bytes and each must be reduced exactly once.")
    _compare(out, _reference_for(seed, d_hidden), setup, world_size)


# ---------------------------------------------------------------------------------------------
# Exercise 3: overlap the all-reduce with backward

def _overlapped(cls):
    return lambda params: cls(params).wait


def check_overlapped_all_reduce(cls, *, world_size: int = 2, seed: int | None = None,
                                d_hidden: int = 64) -> None:
    """``cls(params)`` registers gradient hooks that start async all-reduces during backward;
    ``.wait()`` finishes them before the optimizer step. Checks the values, that the collectives
    are asynchronous, waited on, and that all but the last of each step were issued before
    backward returned."""
    setup = _setup(seed, d_hidden)
    out = _run("OverlappedAllReduce", _sync_rank, world_size, _overlapped(cls), *_rank_inputs(setup, world_size), STEPS)
    total = param_bytes(setup.model().parameters())
    for rank in range(world_size):
        record = out[rank]
        for step in range(STEPS):
            lo, hi = record["step_start"][step], record["step_end"][step]
            comms = [c for c in _comms(out, rank) if lo <= c.start <= hi]
            _check_overlap_step(comms, rank, step, record["backward_end"][step], hi, total)
    _compare(out, _reference_for(seed, d_hidden), setup, world_size)


def _check_overlap_step(comms: list, rank: int, step: int, backward_end: float,
                        step_end: float, total: int) -> None:
    where = f"rank {rank}, step {step}"
    if not comms:
        raise CheckFailed(f"{where}: no collective was issued; the hooks must all-reduce the "
                          f"gradients.")
    sync = [c for c in comms if not c.async_op]
    if sync:
        raise CheckFailed(f"{where}: {sync[0].describe()} is blocking; call it with "
                          f"async_op=True so backward continues while it runs.")
    late = [c for c in comms[:-1] if c.start > backward_end]
    if late:
        raise CheckFailed(
            f"{where}: {len(late)} of {len(comms)} all-reduces started after backward had "
            f"returned, so nothing overlapped. Start each one from a gradient hook "
            f"(Tensor.register_post_accumulate_grad_hook), as soon as its gradient is ready.")
    unwaited = [c for c in comms if c.end is None or c.end > step_end]
    if unwaited:
        raise CheckFailed(f"{where}: {unwaited[0].describe()} was not waited on before the "
                          f"optimizer step; wait() on every Work that all_reduce returned.")
    sent = sum(c.bytes for c in comms)
    if sent != total:
        raise CheckFailed(f"{where}: all-reduced {sent} bytes; the gradients are {total} bytes "
                          f"and each must be reduced exactly once per step (register each hook "
                          f"once, in __init__).")


# ---------------------------------------------------------------------------------------------
# Exercise 4: ZeRO-1

def _zero_rank(rank: int, world_size: int, cls, model, opt: _Optimizer, data, steps: int) -> dict:
    dev = device()
    model, (x, y) = model.to(dev), (t.to(dev) for t in data)
    optimizer = cls(model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)
    train_steps(model, optimizer, x, y, steps)
    local = getattr(optimizer, "local_optimizer", None)
    if not isinstance(local, torch.optim.Optimizer):
        raise TypeError("the ZeRO-1 optimizer must keep its rank's torch.optim.AdamW in the "
                        "attribute local_optimizer")
    shards = [p for group in local.param_groups for p in group["params"]]
    exp_avg = [local.state[p]["exp_avg"] for p in shards if "exp_avg" in local.state[p]]
    return {**final_state(model), "state_bytes": optimizer_state_bytes(local),
            "exp_avg": flat(exp_avg) if exp_avg else torch.zeros(0)}


def _check_zero1_pattern(comms: list, rank: int, numel: int) -> None:
    """ZeRO-1's communication per step: one reduce-scatter of the whole (padded) gradient, one
    all-gather of the parameters, no all-reduce (Rajbhandari et al. 2020, sec. 5.1 and 7.1)."""
    whole = numel * 8  # float64 parameters, the whole flattened (padded) vector
    kinds = [Collectives("all_reduce", op_in({"all_reduce"}), 0,
                         "ZeRO-1 uses a reduce-scatter instead: each rank needs the summed "
                         "gradient of its own shard only. An all-reduce followed by slicing gives "
                         "the right values but delivers every rank the whole sum, W times the "
                         "gradient bytes that rank needs, and the all-gather then adds a second "
                         "full volume: use dist.reduce_scatter_single.")]
    kinds += [Collectives(name, op_in(ops), STEPS,
                          f"ZeRO-1 makes exactly one {name} {what} per step (flatten everything "
                          f"into one buffer first).", lambda b: b >= whole,
                          f"less than the {whole} bytes of all the parameters: reduce-scatter (and "
                          f"all-gather) the whole flattened vector, padded to W x ceil(P / W) "
                          f"elements.")
              for name, ops, what in (("reduce-scatter", REDUCE_SCATTER_OPS, "of the gradients"),
                                      ("all-gather", GATHER_OPS, "of the updated parameter shards"))]
    expect_collectives(comms, f"rank {rank}, in {STEPS} steps", kinds,
                       only="a ZeRO-1 step needs only one reduce-scatter and one all-gather.")


def check_sharded_adamw(cls, *, world_size: int = 2, seed: int | None = None,
                        d_hidden: int = 64) -> None:
    """``cls(params, lr=, weight_decay=)`` with ``step()``/``zero_grad()``: ZeRO-1 AdamW. After 3
    steps the parameters equal single-process AdamW's on every rank; rank r's AdamW first moment
    is elements shard_bounds(P, r, W) of the reference's; its state takes ~1/W of the bytes; each
    step makes one reduce-scatter and one all-gather of the whole flattened vector, no all-reduce."""
    setup = _setup(seed, d_hidden)
    out = _run("ShardedAdamW", _zero_rank, world_size, cls, *_rank_inputs(setup, world_size), STEPS)
    ref = _reference_for(seed, d_hidden)
    numel = ref["exp_avg"].numel()
    for rank in range(world_size):
        lo, hi = shard_bounds(numel, rank, world_size)
        got = out[rank]["exp_avg"]
        if got.numel() not in (hi - lo, math.ceil(numel / world_size)):
            raise CheckFailed(
                f"rank {rank} keeps AdamW state for {got.numel()} elements; its shard is "
                f"elements [{lo}, {hi}) of the {numel} flattened parameters "
                f"(shards of ceil(P / world_size), the last one padded).")
        assert_close(got[:hi - lo], ref["exp_avg"][lo:hi], rank=rank,
                     what=f"AdamW's exp_avg of the shard [{lo}, {hi})",
                     hint=_grad_hint(got[:hi - lo], ref["exp_avg"][lo:hi], world_size),
                     **ref["tol"]["exp_avg"])
        allowed = ref["state_bytes"] / world_size + 8 * world_size + 256
        if out[rank]["state_bytes"] > allowed:
            raise CheckFailed(
                f"rank {rank} holds {out[rank]['state_bytes']} bytes of optimizer state; ZeRO-1 "
                f"keeps about 1/{world_size} of AdamW's {ref['state_bytes']} bytes "
                f"(at most {allowed:.0f}).")
        _check_zero1_pattern(_comms(out, rank), rank, ref["exp_avg"].numel())
    _compare(out, ref, setup, world_size, grads=False)


def check_predicted_state_bytes(predict_state_bytes, seed: int | None = None) -> None:
    """``predict_state_bytes(numel, num_tensors, world_size, sharded)``: AdamW's and ZeRO-1's
    optimizer state per rank, against the formula (``lab02_prediction``)."""
    from distlab.checks.lab02_prediction import grade_state_bytes
    grade_state_bytes(predict_state_bytes, seed)


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB2_SHIPPED, CourseCode, names  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_data_parallel_step", "check_bucketed_all_reduce", "check_overlapped_all_reduce",
    "check_sharded_adamw", "check_predicted_state_bytes"],
    CourseCode(forbidden=LAB2_SHIPPED + names("distlab.checks.lab02_prediction", "_state_bytes")))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
