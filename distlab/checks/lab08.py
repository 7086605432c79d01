"""Graded checks of Lab 8, sharded data parallelism.

Exercises 1-3 run the student's ZeRO-2 optimizer and ZeRO-3 wrappers on real ranks
(``distlab.labs.sharded.harness``), train the lab's stack of MLP blocks for 3 AdamW steps, and
compare with AdamW on the full batch in one process (``reference_sharded_training``): stored
references for the visible tests (seed 0), computed afresh for hidden ones (any seed, width,
depth and world size). The checks then read *how* it was done: the collective record
(``out.comms``: ops, counts, bytes, start and end times) and bytes measured on the ranks (the
gradients a rank holds after backward; the storages behind the blocks' parameters while they
compute). Exercise 4, the graded prediction, compares the student's bytes per step with the ZeRO
paper's count (``lab08_prediction``). Exercise 5 calls the student's choice of checkpointed
blocks and measures the stack's saved activations with that choice against the budget, and its
recompute against every other choice's (their bytes summed from each block's, measured). Exercise 6, the open design, trains the student's ``fully_shard`` and
checkpointing design on real ranks and measures each rank's peak live bytes against a measured
budget and the losses against one process (``lab08_design``).

Tolerances: float64 throughout, as in Lab 2 (the ranks' sums run in another order than the full
batch's: 1e-12 apart after 3 steps; a missing 1/W shows at 1e-7 in the parameters and at once in
the gradients), so 1e-9 never fails a right answer and catches every factor.
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab08_patterns import (check_zero2_pattern, check_zero3_pattern,
                                           prefetch_timing, step_comms)
from distlab.checks.lab08_ranks import run_ranks as _run
from distlab.labs.sharded import (CheckpointProblem, ShardSetup, best_checkpoint_choice,
                                  block_profile, budget_of, recompute_flops,
                                  reference_sharded_training, saved_bytes, shard_numel,
                                  wrap_blocks, wrap_model, zero2_training, zero3_training)

from distlab.runtime.per_rank import PerRank, reference

LAB = "08_sharded_data_parallel"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# torch._dynamo (with DTensor and FSDP): an optimizer's constructor imports it, 0.4-0.8 s a rank.
RANK_IMPORTS = ("torch._dynamo",)
# The lab's own grading budget (CONTRIBUTING.md, "The grading budget"; bench/grading_budget.py):
# wall seconds for a full answer at --jobs 1 on an idle 2-core machine, above the course's 6 s.
# What needs it: 14 runs on real ranks, 42 rank processes. ZeRO-2, ZeRO-3 and prefetching are
# each graded on 4 runs (visible on 2 and 4 ranks; hidden with fresh seeds on 4 ranks, blocks
# that 4 does not divide, which only padding passes, and on 2): a rank trains in a tenth of a
# CPU-second, the rest of a run is starting and reporting its ranks. The design trains FSDP2 with
# checkpointing for 4 steps on 2 ranks and, hidden, on 4 (the scale where sharding divides the
# states by 4; its peaks are stored, not measured per student), every operation's storage and
# every module's boundary measured (LiveBytes): half the lab. Its steady peak is the least of the
# 3 steps after the first: under load, one or two of them count a gloo buffer (measured: up to
# 17 KB), more than the 4 KB between the course's design and the bar on 4 ranks. What made it
# cheaper: the reference's checkpoint choice summed from block profiles, LiveBytes' lighter
# bookkeeping, the design's ranks stepping AdamW on each parameter's local shard
# (distlab.labs.shard_adamw: the same update, bit for bit), the guard's entry calls. Measured idle,
# the whole course side by side with main 00c1be4 (bench/grading_budget.py, 28
# November 2026, 2-core AMD EPYC, load 1.3-2.1): 11.2 s and 16.3 CPU-s before, 8.9 s and 12.7 CPU-s
# after (design 44%); 14.3 s and 21.8 CPU-s earlier (a23a509).
GRADING_BUDGET_S = 11.0
STEPS = 3
GRAD_TOL = dict(atol=1e-12, rtol=1e-9)
PARAM_TOL = dict(atol=1e-9, rtol=1e-9)
VISIBLE_FRACTIONS = (0.5, 0.3)   # the visible tests' budgets, stored with their least recompute


# ---------------------------------------------------------------------------------------------
# References

def _setup(seed, hidden: int, blocks: int) -> ShardSetup:
    return ShardSetup(seed=0 if seed is None else seed, hidden=hidden, blocks=blocks)


def _checkpoint_problem(seed, fraction: float, blocks: int) -> CheckpointProblem:
    """Seed None: the lab's stack; else widths drawn from the seed (multiples of 8, 8 to 96)."""
    if seed is None:
        return CheckpointProblem(fraction=fraction)
    g = torch.Generator().manual_seed(seed)
    widths = tuple(8 * int(w) for w in torch.randint(1, 13, (blocks,), generator=g))
    return CheckpointProblem(seed=seed, widths=widths, fraction=fraction)


def make_references() -> dict:
    """The visible tests' references: 3 AdamW steps of the lab's stack (seed 0) on the full
    batch (and 1 step, for the lab's 2-D mesh figure), and the lab's checkpointing problem's
    budget and least recompute (every choice tried). A handout holds these, not the reference
    implementations: visible tests and the lab's figures read them."""
    setup = ShardSetup()
    ref = reference_sharded_training(setup, STEPS)
    sets = {"adamw_3_steps": {"seed": setup.seed, "losses": ref["losses"],
                              "params": torch.cat(ref["params"]), "grads": torch.cat(ref["grads"])}}
    # One step: what the lab's 2-D mesh run (tp_within_fsdp) is compared with (reference_params).
    sets["adamw_1_step"] = {"seed": setup.seed,
                            "params": torch.cat(reference_sharded_training(setup, 1)["params"])}
    for fraction in VISIBLE_FRACTIONS:
        problem = CheckpointProblem(fraction=fraction)
        budget = budget_of(problem)
        _, flops = best_checkpoint_choice(problem, budget)
        sets[_budget_set(fraction)] = {"seed": problem.seed, "budget": torch.tensor(budget),
                                       "least_recompute_flops": torch.tensor(flops)}
    from distlab.checks.lab08_design import design_budget_set, peaks_sets
    from distlab.checks.lab08_prediction import prediction_set
    sets["prediction"] = prediction_set()
    sets["design_budget"] = design_budget_set()
    sets.update(peaks_sets())
    return sets


def _budget_set(fraction: float) -> str:
    return f"checkpoint_budget_{round(100 * fraction)}"


def _expected(seed, hidden: int, blocks: int) -> dict:
    """Stored for the visible tests (seed None, the lab's sizes: a handout has no reference),
    else computed here and now (in the grader's judge, which has it)."""
    if seed is not None or (hidden, blocks) != (ShardSetup.hidden, ShardSetup.blocks):
        return reference(_reference(seed, hidden, blocks))
    return reference(_stored_reference())


def _shares(setup: ShardSetup, world_size: int, sharded: bool = False) -> PerRank:
    """Each rank's inputs: the initial model (replicated, as data parallelism needs; for ZeRO-3,
    ``sharded``, NaN outside the rank's shard) and its own rows of the batch, made here; the seed
    and the other ranks' rows stay in the judge."""
    return PerRank(setup.shares(world_size, sharded))


def _reference(seed, hidden: int, blocks: int) -> dict:
    """AdamW on the full batch in one process, computed here and now."""
    return {**reference_sharded_training(_setup(seed, hidden, blocks), STEPS),
            "tol": {"params": PARAM_TOL, "grads": GRAD_TOL, "losses": PARAM_TOL}}


def _stored_reference() -> dict:
    """The visible tests' reference: the stored set, split into the lab's blocks."""
    setup = _setup(None, ShardSetup.hidden, ShardSetup.blocks)
    from distlab.checks.stored import load, tolerance
    stored = load(LAB, "adamw_3_steps")
    sizes = [sum(p.numel() for p in block.parameters()) for block in setup.model()]
    # Made on the course's CPU; another one draws the float32 initial weights a last bit apart,
    # which AdamW carries through the steps (as in Lab 2: distlab.checks.stored.tolerance).
    return {"losses": stored["losses"], "params": list(stored["params"].split(sizes)),
            "grads": list(stored["grads"].split(sizes)),
            "tol": {key: tolerance(stored[key], steps=STEPS)
                    for key in ("params", "grads", "losses")}}


def _check_losses(out, ref: dict, world_size: int) -> None:
    mean = torch.tensor([out[r]["losses"] for r in range(world_size)], dtype=torch.float64).mean(0)
    assert_close(mean, ref["losses"].to(mean.dtype), what="mean over the ranks of their losses per step",
                 hint="Each rank computes the loss of its own rows; their mean is the full "
                      "batch's loss when the forward used the right parameters.",
                 **ref["tol"]["losses"])


# ---------------------------------------------------------------------------------------------
# Exercise 1: ZeRO-2

def check_zero2_step(cls, *, world_size: int = 2, seed: int | None = None,
                     hidden: int = 24, blocks: int = 4) -> None:
    """``cls(buckets, lr=, weight_decay=)`` (one bucket per block) with ``step()``,
    ``zero_grad()`` and ``local_optimizer``: after 3 steps every rank's parameters equal
    single-process AdamW's; per step one reduce-scatter and one all-gather per bucket, no
    all-reduce; after each backward the rank holds the gradient of its shards only (1/W of the
    gradient bytes plus each bucket's padding, fewer than W elements), and every tensor its
    class made that is still alive then, beyond its shards, their gradients and AdamW's state,
    adds up to at most one more shard per bucket (measured on the rank: ``TensorsMade``)."""
    __tracebackhide__ = True  # noqa: F841
    setup = _setup(seed, hidden, blocks)
    out = _run(zero2_training, world_size, f"Zero2AdamW ({_case(seed, hidden, blocks)})", cls,
               _shares(setup, world_size), STEPS)
    assert_crossed_as_recorded(out, "Zero2AdamW")   # the pattern below reads the record
    ref = _expected(seed, hidden, blocks)
    sizes = [p.numel() for p in ref["params"]]
    allowed = sum(shard_numel(n, world_size) for n in sizes) * 8
    for rank in range(world_size):
        check_zero2_pattern(out.comms[rank], rank, sizes, STEPS)
        for step, held in enumerate(out[rank]["grad_bytes"]):
            if held > allowed:
                raise CheckFailed(
                    f"rank {rank} held {held} bytes of gradients after the backward of step "
                    f"{step}; ZeRO-2 keeps only its shards' gradients, {allowed} bytes (1/"
                    f"{world_size} of {sum(sizes) * 8}, plus padding). Once a bucket's gradient "
                    f"is reduce-scattered, set its parameters' .grad to None, inside backward.")
        _check_kept(out[rank]["kept"], rank, allowed, world_size)
        for i, (got, exp) in enumerate(zip(out[rank]["params"], ref["params"])):
            assert_close(got, out[0]["params"][i], atol=0, rtol=0, rank=rank,
                         what=f"block {i}'s parameters compared with rank 0's",
                         hint="Every rank must all-gather the same updated shards.")
            assert_close(got, exp, rank=rank, what=f"block {i}'s parameters after {STEPS} steps",
                         hint="Compare with AdamW on the full batch in one process; check the "
                              "division of the reduce-scattered sum by the world size.",
                         **ref["tol"]["params"])
    _check_losses(out, ref, world_size)


def _case(seed, hidden: int, blocks: int) -> str:
    sizes = "" if (hidden, blocks) == (ShardSetup.hidden, ShardSetup.blocks) else \
        f", hidden={hidden}, blocks={blocks}"
    return ("the stored inputs" if seed is None else f"fresh inputs, seed {seed}") + sizes


SLACK = 1024   # bytes: the loss and other scalars a step leaves alive


def _check_kept(kept: list[dict], rank: int, allowed: int, world_size: int) -> None:
    """Every byte the rank's tensors keep alive after backward, beyond the model's parameters and
    its local optimizer's shards, their gradients and AdamW's state: at most one more shard's
    worth per bucket (a receive buffer, say), never a full-size gradient."""
    for step, k in enumerate(kept):
        if k["other_bytes"] > allowed + SLACK:
            largest = ", ".join(f"{shape} ({n} bytes)" for n, shape in k["largest"])
            raise CheckFailed(
                f"rank {rank} kept {k['other_bytes']} bytes of tensors alive after the backward of "
                f"step {step}, besides the model's parameters and its shards, their gradients and "
                f"AdamW's state (measured: every tensor your class made that is still alive; the "
                f"largest: {largest}). ZeRO-2 may keep at most one more shard-sized buffer per "
                f"bucket, {allowed} bytes: a gradient buffer of the whole bucket (W = {world_size} "
                f"times a shard) kept in an attribute is the full gradient ZeRO-2 exists to drop. "
                f"Build the padded gradient in a temporary, reduce-scatter it, and keep only the "
                f"shard's gradient.")


# ---------------------------------------------------------------------------------------------
# Exercises 2 and 3: ZeRO-3

def _check_zero3_values(out, ref: dict, world_size: int) -> None:
    for i, (exp_p, exp_g) in enumerate(zip(ref["params"], ref["grads"])):
        s = shard_numel(exp_p.numel(), world_size)
        for rank in range(world_size):
            got = out[rank]["shards"][i]
            if got.numel() != s:
                raise CheckFailed(f"rank {rank}'s shard of block {i} has {got.numel()} elements; "
                                  f"it must hold s = ceil({exp_p.numel()} / {world_size}) = {s} "
                                  f"(the flat parameters padded to W * s).")
            if out[rank]["grads"][i] is None:
                raise CheckFailed(f"rank {rank}'s shard of block {i} has no gradient after "
                                  f"backward: reduce-scatter the block's gradients into shard.grad.")
        gathered = torch.cat([out[r]["shards"][i] for r in range(world_size)])[:exp_p.numel()]
        grads = torch.cat([out[r]["grads"][i] for r in range(world_size)])[:exp_p.numel()]
        assert_close(grads, exp_g, what=f"block {i}'s gradient (the ranks' shards joined) at step "
                     f"{STEPS}", hint="The gradient shard is the reduce-scattered sum divided by "
                     "the world size.", **ref["tol"]["grads"])
        assert_close(gathered, exp_p, what=f"block {i}'s parameters (the ranks' shards joined) "
                     f"after {STEPS} steps", **ref["tol"]["params"])
    _check_losses(out, ref, world_size)


def _check_gathered_memory(out, world_size: int) -> None:
    for rank in range(world_size):
        layer = max(out[rank]["block_bytes"])
        peak = max(out[rank]["gathered"])
        if peak > 2 * layer:
            raise CheckFailed(
                f"rank {rank} held {peak} bytes of gathered parameters at once, "
                f"{peak / layer:.1f} blocks of {layer} bytes; ZeRO-3 holds at most two (the one "
                f"computing and the next). Free a block's gathered parameters (free_storage) "
                f"right after its forward and after its gradients are reduce-scattered.")


def check_zero3_block(cls, *, world_size: int = 2, seed: int | None = None,
                      hidden: int = 24, blocks: int = 4) -> None:
    """``cls(block)`` shards one block (attribute ``shard``: its s = ceil(P / W) elements) and
    registers hooks that gather it for forward and backward. After 3 AdamW steps on the shards,
    loss, gradients and parameters equal single-process training; per step and block one
    all-gather in forward, one in backward and one reduce-scatter; at most two blocks' parameters
    gathered at any probe (measured: bytes of the storages behind the parameters)."""
    __tracebackhide__ = True  # noqa: F841
    setup = _setup(seed, hidden, blocks)
    out = _run(zero3_training, world_size, f"Zero3Block ({_case(seed, hidden, blocks)})",
               wrap_blocks(cls), _shares(setup, world_size, sharded=True), STEPS)
    assert_crossed_as_recorded(out, "Zero3Block")
    for rank in range(world_size):
        for step in range(STEPS):
            check_zero3_pattern(step_comms(out, rank, step), out[rank]["steps"][step], rank, step,
                                out[rank]["block_bytes"])
    _check_gathered_memory(out, world_size)
    _check_zero3_values(out, _expected(seed, hidden, blocks), world_size)


def check_prefetch(cls, *, world_size: int = 2, seed: int | None = None,
                   hidden: int = 24, blocks: int = 4) -> None:
    """``cls(blocks)`` (attribute ``shards``, one per block) is ZeRO-3 with prefetch: the values
    and the per-block pattern of ``check_zero3_block``, and every gather but the first of each
    pass asynchronous, issued before the previous block's compute ended and still in flight
    when that compute started."""
    __tracebackhide__ = True  # noqa: F841
    setup = _setup(seed, hidden, blocks)
    out = _run(zero3_training, world_size, f"PrefetchingZero3 ({_case(seed, hidden, blocks)})",
               wrap_model(cls), _shares(setup, world_size, sharded=True), STEPS)
    assert_crossed_as_recorded(out, "PrefetchingZero3")
    for rank in range(world_size):
        for step in range(STEPS):
            comms = step_comms(out, rank, step)
            probes = out[rank]["steps"][step]
            check_zero3_pattern(comms, probes, rank, step, out[rank]["block_bytes"])
            prefetch_timing(comms, probes, rank, step)
    _check_gathered_memory(out, world_size)
    _check_zero3_values(out, _expected(seed, hidden, blocks), world_size)


# ---------------------------------------------------------------------------------------------
# Exercise 5: checkpointing under a budget

def check_choose_checkpoints(fn, *, seed: int | None = None, fraction: float = 0.5,
                             blocks: int = 6) -> str:
    """``fn(profile, budget)`` -> one bool per block (checkpoint it or not). With that choice the
    stack's saved activations, measured, stay within ``budget`` bytes, and its recompute equals
    the least of every choice within the budget (all 2^n tried, each the sum of its blocks'
    measured bytes: ``best_checkpoint_choice``)."""
    __tracebackhide__ = True  # noqa: F841
    problem = _checkpoint_problem(seed, fraction, blocks)
    if seed is None and fraction in VISIBLE_FRACTIONS:
        from distlab.checks.stored import load
        stored = load(LAB, _budget_set(fraction))
        budget, least = int(stored["budget"]), int(stored["least_recompute_flops"])
    else:
        budget = budget_of(problem)
        least = None
    profile = block_profile(problem)
    choice = fn([dict(row) for row in profile], budget)   # a copy: the reference reads the profile
    n = len(problem.widths)
    if not isinstance(choice, (list, tuple)) or len(choice) != n \
            or not all(isinstance(c, bool) for c in choice):
        raise CheckFailed(f"choose_checkpoints returned {choice!r}; expected a list of {n} bools "
                          f"(True: wrap that block in checkpoint).")
    kept = saved_bytes(problem, choice)
    if kept > budget:
        raise CheckFailed(
            f"with your choice {choice} the stack keeps {kept} bytes of activations for backward "
            f"(measured), over the budget of {budget}. A checkpointed block still keeps its "
            f"input: count its checkpointed_bytes, not zero.")
    if least is None:
        least = best_checkpoint_choice(problem, budget, profile)[1]
    cost = recompute_flops(problem, choice)
    if cost > least:
        raise CheckFailed(
            f"your choice {choice} fits the budget ({kept} of {budget} bytes) but recomputes "
            f"{cost} FLOPs; another choice within the budget recomputes only {least}. Try every "
            f"choice (there are 2^{n}) or solve the knapsack exactly.")
    ticked = [i for i, c in enumerate(choice) if c]
    return (f"choose_checkpoints: your choice checkpoints blocks {ticked} of {n}: {kept:,} bytes "
            f"kept (measured) within the budget of {budget:,}; recompute {cost:,} FLOPs, the "
            f"least of every choice within the budget ({least:,})")


# ---------------------------------------------------------------------------------------------
# The prediction and the open design exercise (lab08_prediction, lab08_design)

def check_step_bytes(predict, *, seed: int | None = None) -> str:
    """``predict(scheme, block_numels, world_size, itemsize)``: one rank's bytes per step against
    the ZeRO paper's count (sec. 7) with the flat layout's padding (``lab08_prediction``)."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab08_prediction import grade_step_bytes
    return grade_step_bytes(predict, seed=seed)


from distlab.checks.lab08_design import design_budget, grade_design  # noqa: E402,F401


def check_design(design, *, world_size: int = 2, seed: int | None = None) -> str:
    """``design(model, mesh) -> model``, the design exercise's first test: trained on real ranks,
    the losses equal to one process's and every rank's peak live bytes within Hint 3's design's
    (``lab08_design``). Returns the line the cell prints: the peak beside the scale."""
    __tracebackhide__ = True  # noqa: F841
    return grade_design(design, _run, world_size=world_size, seed=seed, level="hinted")


def check_design_bar(design, *, world_size: int = 2, seed: int | None = None) -> str:
    """The second test: as ``check_design`` (its run, made once), the peak within the bar, halfway
    to the bound no design beats (``distlab.labs.sharded.budget.design_bound``)."""
    __tracebackhide__ = True  # noqa: F841
    return grade_design(design, _run, world_size=world_size, seed=seed, level="bar")


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB8_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys(["check_zero2_step", "check_zero3_block", "check_prefetch",
                             "check_choose_checkpoints", "check_step_bytes", "check_design",
                             "check_design_bar"],
                            CourseCode(forbidden=LAB8_SHIPPED))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
