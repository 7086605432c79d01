"""Graded checks of Lab 11, "Pipelines without bubbles".

Exercises, in the lab's order (each section's grading in its own module):
1. the split backward, ``backward_input`` / ``backward_weight`` (B, W), and the
   prediction ``predict_held_bytes``: ``lab11_split``.
2. schedules as tables and the prediction, ``lab11_tables``: ``interleaved_1f1b(p, m,
   v)``, ``zb_h1(p, m)``, ``zb_v(p, m)`` (tables replayed: valid, bubble and peak no worse than
   expected) and ``predict_interleaved(p, m, v)``.
3. ``run_table(row, stages, placement, num_microbatches)``: one rank's row of any
   schedule table run with isend/irecv, equal to one process within 1e-6, the table's messages
   (``lab11_executor``).
4. the open design on a scale, ``lab11_design``: ``check_capped_schedule``,
   ``check_capped_schedule_bar``.
"""
from __future__ import annotations

from distlab.checks import lab11_split  # noqa: E402
from distlab.checks.lab11_split import COURSE_CODE  # noqa: E402,F401  (each section adds its own below)


def check_split_backward(backward_input, backward_weight, seed: int | None = None, layers=2,
                         hidden=6, batch=8) -> str:
    """backward_input / backward_weight (B, W) of the first, a middle and the last stage, two
    microbatches each: equal to the full backward; B computes no weight gradient, W no input
    gradient (``lab11_split``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_split.grade_split_backward(backward_input, backward_weight, seed, layers,
                                            hidden, batch)


def check_held_prediction(predict_held_bytes, seed: int | None = None) -> str:
    """predict_held_bytes(num_layers, batch, hidden, itemsize): the bytes held between B and W,
    recompute and keep (``lab11_split``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_split.grade_held_prediction(predict_held_bytes, seed)


# Section 2: schedules as tables, graded on paper (``lab11_tables``)
from distlab.checks import lab11_tables  # noqa: E402
COURSE_CODE = {**globals().get("COURSE_CODE", {}), **lab11_tables.COURSE_CODE}   # each section adds its own


def check_interleaved_1f1b(interleaved_1f1b, seed: int | None = None) -> str:
    """interleaved_1f1b(p, m, v): a valid table (F and whole B of every microbatch on every
    stage, stage s on rank s mod p, completes) whose bubble and peak activations are no worse
    than PTD-P's interleaved schedule's (torch's ScheduleInterleaved1F1B) on every case."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_tables.grade_table(interleaved_1f1b, "interleaved", seed)


def check_zb_h1(zb_h1, seed: int | None = None) -> str:
    """zb_h1(p, m): a valid table (F, B and W of every microbatch, stage r on rank r,
    completes) whose bubble and peak are no worse than ZB-H1's (Qi et al. 2023, sec. 2.1)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_tables.grade_table(zb_h1, "zb_h1", seed)


def check_zb_v(zb_v, seed: int | None = None) -> str:
    """zb_v(p, m), m >= 2p: a valid table (F, B and W of every microbatch, stages s and
    2p-1-s on rank s, completes) whose bubble and peak are no worse than the course's V
    (torch's ScheduleZBVZeroBubble)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_tables.grade_table(zb_v, "zb_v", seed)


def check_interleaved_prediction(predict_interleaved, seed: int | None = None) -> str:
    """predict_interleaved(p, m, v) -> (bubble, peak): interleaved 1F1B's bubble (idle over
    compute) and peak activations (stage-microbatches, busiest rank), unit times."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_tables.grade_prediction(predict_interleaved, seed)


# Section 3: the executor on real ranks (``lab11_executor``)
from distlab.checks import lab11_executor  # noqa: E402


def check_executor(run_table, seed: int | None = None, world_size: int = 4,
                   num_microbatches: int = 8) -> str:
    """``run_table(row, stages, placement, num_microbatches)`` on every rank, for the course's
    interleaved 1F1B (v = 2), ZB-H1 and zero-bubble V tables: the loss and every gradient equal
    one process's within 1e-6 (float64); only isend/irecv, exactly the table's messages per
    peer; a deadlock reported after 10 s of no progress (``lab11_executor``)."""
    __tracebackhide__ = True  # noqa: F841
    return lab11_executor.grade_executor(run_table, seed, world_size, num_microbatches)


# Section 4, the open design. The judge serves only ``distlab.checks.lab11:check_*``, so
# the section's checks are defined here, each one line into its module.
from distlab.checks import lab11_design  # noqa: E402
from distlab.checks.lab11_design import VISIBLE as DESIGN_CASE, grade_capped  # noqa: E402


def check_capped_schedule(capped_schedule, world_size: int = DESIGN_CASE[0],
                          num_microbatches: int = DESIGN_CASE[1], max_held: int = DESIGN_CASE[2],
                          seed: int | None = None) -> str:
    """``capped_schedule(p, m, k)``: a complete table, its dependencies kept, at most ``k``
    held per rank, equal to one process on real ranks, its bubble at most the hinted design's."""
    return grade_capped(capped_schedule, world_size, num_microbatches, max_held, seed, "hinted")


def check_capped_schedule_bar(capped_schedule, world_size: int = DESIGN_CASE[0],
                              num_microbatches: int = DESIGN_CASE[1],
                              max_held: int = DESIGN_CASE[2], seed: int | None = None) -> str:
    """The same properties, the bubble at most the bar (halfway to the course's design)."""
    return grade_capped(capped_schedule, world_size, num_microbatches, max_held, seed, "bar")


# What the checks' ranks import of PyTorch beyond torch.distributed (distlab/checks/__init__.py),
# each section's: the design's ranks (the course's executor, one Submitted call) need nothing.
RANK_IMPORTS: tuple[str, ...] = ()   # Sections 3 and 4: their ranks need nothing more


from distlab.checks.course_code import CourseCode  # noqa: E402

# Each section's checks module keeps its own COURSE_CODE (the judge reads the
# check's own module); this one merges them (the handout withholds what they name).
COURSE_CODE = {**COURSE_CODE, **lab11_design.COURSE_CODE}
COURSE_CODE["check_executor"] = CourseCode(forbidden=lab11_executor.EXECUTOR_SHIPPED)


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 11, each section's."""
    return {**lab11_split.make_references(), **lab11_design.design_sets(),
            "executor": lab11_executor.executor_set(), "torch": lab11_executor.torch_set()}


from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
