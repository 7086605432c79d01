"""Graded checks of Lab 12, "When a rank dies".

Exercises, in the lab's order (each section's grading in its own module):
1. ``whole_state(trainer)`` / ``restore(trainer, state)``: the whole training state, graded by
   resuming from it, bit for bit against the uninterrupted run (``lab12_state``).
2. ``save(model, optimizer, folder)`` / ``load(model, optimizer, folder)`` with
   ``torch.distributed.checkpoint``, each rank its own shards, loaded on another world size
   (2 -> 4 and 4 -> 2): every rank's rows exact (``lab12_reshard``).
3. (Section 3, asynchronous saves: taught and measured, not graded here.)
4. ``train_resumable(rank, world_size, root, steps, save_every, save, load, spec)``: the loop
   that resumes from the newest complete checkpoint, graded with a rank killed from outside by
   SIGKILL at a (hidden: random) step and a relaunch (``lab12_restart``).
5. ``predict_lost_fraction(tau, delta, restart, mtbf)``: the graded prediction of the time lost
   (``lab12_interval``).
6. ``plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write)``: the open design
   on a scale, the hinted design's level and the bar (``lab12_interval``).
"""
from __future__ import annotations

from distlab.checks.course_code import CourseCode  # noqa: F401

COURSE_CODE: dict = {}

# Sections 1 and 2: the whole state, and DCP with resharding (``lab12_state``, ``lab12_reshard``)
from distlab.checks import lab12_reshard, lab12_state  # noqa: E402
from distlab.checks.course_code import names  # noqa: E402

# The course's answers to Sections 1 and 2 (the handout withholds them); the uninterrupted run
# the checks compare with is not one (any Trainer trains it), so a student's own kernel can
# make it where the stored one was made on another CPU.
STATE_SHIPPED = (names("distlab.labs.checkpoint.run_state", "training_state", "restore_state")
                 + names("distlab.labs.checkpoint.saving", "save_checkpoint", "load_checkpoint",
                         "load_shards"))
COURSE_CODE = {**COURSE_CODE, "check_whole_state": CourseCode(forbidden=STATE_SHIPPED),
               "check_resharding": CourseCode(forbidden=STATE_SHIPPED)}


def check_whole_state(whole_state, restore, seed: int | None = None, world_size: int = 2,
                      steps: int = 6, save_at: int = 3) -> str:
    """``whole_state(trainer)`` and ``restore(trainer, state)``: ranks train ``save_at`` steps,
    take the state, serialize it (torch.save to bytes and back), restore it into a fresh
    Trainer and train to ``steps``; the losses after the resume and every parameter at the end
    equal the uninterrupted run's to the last bit (float64), and the step is restored
    (``lab12_state``). Hidden: the run stopped after another step and trained on for
    another number of steps, drawn from the seed."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_state.grade_whole_state(whole_state, restore, seed, world_size, steps, save_at)


def check_resharding(save, load, seed: int | None = None) -> str:
    """``save(model, optimizer, folder)`` and ``load(model, optimizer, folder)``: 2 ranks save a
    drawn state (each into a folder of its own, merged by the checker), 4 load it and save
    another, 2 load that; each save a DCP checkpoint every writer wrote its shards of, and after
    each load every rank holds exactly its rows of every parameter and of AdamW's state
    (``lab12_reshard``). ``seed``: other states and widths (no hidden case: nothing in it can
    be known ahead)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_reshard.grade_resharding(save, load, seed)


# Section 4: the resumable loop, a rank killed from outside (``lab12_restart``)
from distlab.checks import lab12_restart  # noqa: E402
from distlab.checks.lab12_restart import VISIBLE as RESTART_CASE  # noqa: E402
COURSE_CODE = {**COURSE_CODE, **lab12_restart.COURSE_CODE}


def check_train_resumable(train_resumable, save, load, seed: int | None = None,
                          world_size: int = RESTART_CASE["world_size"],
                          steps: int | None = None,
                          save_every: int = RESTART_CASE["save_every"]) -> str:
    """``train_resumable(rank, world_size, root, steps, save_every, save, load, spec)`` with
    your ``save`` (asynchronous) and ``load``: a rank killed by SIGKILL from outside at a step
    (hidden: drawn from ``seed``, in a run of 10 steps), the run relaunched on the merged checkpoints plus an
    unfinished newer one; it resumes from the newest complete one, trains exactly the steps
    left (the launcher's record) and lands bit for bit on your own clean restart from that
    checkpoint; every save waited for (``lab12_restart``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_restart.grade_train_resumable(train_resumable, save, load, seed, world_size,
                                               steps, save_every)

# Sections 5 and 6, how often to save (``lab12_interval``): the prediction and the open design
from distlab.checks import lab12_interval  # noqa: E402
COURSE_CODE = {**COURSE_CODE, **lab12_interval.COURSE_CODE}


def check_lost_prediction(predict_lost_fraction, seed: int | None = None) -> str:
    """``predict_lost_fraction(tau, delta, restart, mtbf)``: the expected fraction of time lost,
    within first order's own error of the model, on three cases."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_lost_prediction(predict_lost_fraction, seed)


def check_checkpoint_plan(plan_checkpoints, seed: int | None = None) -> str:
    """``plan_checkpoints(mtbf, restart, blocking_stall, async_stall, async_write) -> (interval,
    mode)``: on three problems, the expected loss at most the hinted design's."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_plan(plan_checkpoints, seed, "hinted")


def check_checkpoint_plan_bar(plan_checkpoints, seed: int | None = None) -> str:
    """The same problems, the expected loss at most the bar (halfway to the best plan's)."""
    __tracebackhide__ = True  # noqa: F841
    return lab12_interval.grade_plan(plan_checkpoints, seed, "bar")

# The lab's own grading budget (CONTRIBUTING.md, "The grading budget"; bench/grading_budget.py):
# wall seconds for a full answer at --jobs 1 on an idle 2-core machine, above the course's 6 s.
# What needs it: the launches in ``LAUNCHES``, one after the other, none shareable. Resharding
# loads on two world sizes (2 ranks save, 4 load and save, 2 load); the whole state's hidden case
# is the student's resume beside the course's uninterrupted run of the hidden seed, on ranks of
# its own; each restart case (visible, hidden) is a run killed by the launcher, the student's
# clean restart and the relaunch, the clean restart on ranks of its own (a loop's ranks that held
# it could copy it: tests/test_lab12_attacks.py). The steps are few already (the kill two steps
# after the second save and two before the end: 8 steps, 10 in the hidden case, a save every 2):
# a rank's cost is its start, its FSDP2 trainer's first step (halved by the fused AdamW,
# ``run_state.Trainer``) and its first save.
# Measured 10.1 s wall and 15.9 CPU-s at load 0.5 before the fused AdamW (main a23a509, 28 November
# 2026, 2-core AMD EPYC). Idle, the whole course side by side with main 00c1be4
# (bench/grading_budget.py, 28 November 2026, load 1.3-2.1): 7.8 s and 11.9 CPU-s before, 6.3 s and
# 8.9 CPU-s after (the restart 44%, resharding 23%, the whole state 14%), the course-code guard's
# entry calls the change.
GRADING_BUDGET_S = 8.0
# {test: (launches, rank processes)} of one graded run of the test cell, its visible and hidden
# calls together, where the stored run is this machine's (elsewhere the whole state's visible
# case makes the course's run again: one launch of 2 ranks more). Counted where each section's
# tests run the solution (tests/test_lab12_state.py, _state_reshard.py, _restart_check.py).
LAUNCHES = {"test_whole_state": (3, 6), "test_resharding": (3, 8), "test_train_resumable": (6, 12)}

# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py).
RANK_IMPORTS: tuple[str, ...] = (
    # Sections 1, 2 and 4 (measured for Section 4: a rank with nothing preloaded, after the
    # solution's loop): FSDP2 and DTensor, the optimizer (AdamW imports torch._dynamo, which
    # imports part of _inductor), DCP
    "torch._dynamo", "torch._inductor", "torch.distributed.tensor", "torch.distributed.fsdp",
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict")


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 12, each section's."""
    return {"resume": lab12_state.visible_set(), **lab12_interval.lost_prediction_sets(),
            **lab12_interval.plan_sets()}


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
