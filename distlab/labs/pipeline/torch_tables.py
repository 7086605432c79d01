"""torch's own schedule tables, read without running them, in the course's form.

``torch.distributed.pipelining`` builds a multi-stage schedule's per-rank table when the schedule
object is made (``schedule.pipeline_order``: rank -> list of ``_Action(stage, type, microbatch)``
or None for an idle slot). Making one needs only what the constructor reads from its stages
(``group_size``, ``group_rank``, ``num_stages``, ``submod``), so ``torch_table`` hands it
placeholders: no process group, no model, nothing runs.

``from_torch`` maps its actions onto the course's ``(op, microbatch, stage)``: torch's ``F`` is
``F``; its ``I`` (input gradient) is the course's ``B`` with a ``W`` of its own; its ``B`` (whole
backward) is a ``B`` with none; its ``W`` is ``W``; an ``OVERLAP_F_B`` (DualPipeV runs a forward
and a backward of two stages together) becomes its two actions in order; idle slots (None) go,
since ``replay`` times each action by its inputs, not by a slot.
"""
from __future__ import annotations

import types

TORCH_SCHEDULES = ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble",
                   "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
_OPS = {"F": "F", "I": "B", "B": "B", "W": "W"}


def _placeholder_stages(num_ranks: int, v: int) -> list:
    """What a schedule's constructor reads from its local stages, for rank 0's ``v`` stages."""
    return [types.SimpleNamespace(group_size=num_ranks, group_rank=0, num_stages=num_ranks * v,
                                  submod=None, stage_index_to_group_rank=None)
            for _ in range(v)]


def torch_schedule(name: str, num_ranks: int, num_microbatches: int, v: int = 2):
    """torch's schedule object ``name`` for ``p`` ranks, ``v`` stages each and ``m`` microbatches,
    made for its table only (its ``step`` would need real stages)."""
    from torch.distributed.pipelining import schedules
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"unknown torch schedule {name!r}: choose one of {TORCH_SCHEDULES}")
    return getattr(schedules, name)(_placeholder_stages(num_ranks, v), num_microbatches,
                                    loss_fn=lambda output, target: output)


def from_torch(pipeline_order: dict) -> list[list[tuple[str, int, int]]]:
    """torch's ``pipeline_order`` (rank -> actions) as the course's table (one list per rank)."""
    table = []
    for rank in sorted(pipeline_order):
        row = []
        for action in pipeline_order[rank]:
            for one in _compute_actions(action, rank):
                row.append(one)
        table.append(row)
    return table


def _compute_actions(action, rank: int) -> list[tuple[str, int, int]]:
    if action is None:
        return []
    if action.sub_actions:
        return [one for sub in action.sub_actions for one in _compute_actions(sub, rank)]
    kind = action.computation_type.value
    if kind not in _OPS:
        raise ValueError(f"rank {rank}'s action {action} is not a computation (F, I, B, W, "
                         "OVERLAP_F_B): read the compute-only table, schedule.pipeline_order")
    return [(_OPS[kind], action.microbatch_index, action.stage_index)]


def torch_table(name: str, num_ranks: int, num_microbatches: int, v: int = 2):
    """torch's table for schedule ``name`` in the course's form, and its placement (the rank of
    each stage, ``schedule.stage_index_to_group_rank``)."""
    schedule = torch_schedule(name, num_ranks, num_microbatches, v)
    mapping = schedule.stage_index_to_group_rank
    return from_torch(schedule.pipeline_order), [mapping[s] for s in range(num_ranks * v)]
