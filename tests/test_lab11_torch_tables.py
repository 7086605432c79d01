"""torch's own schedule tables (read from the schedule objects, nothing run) in the course's form,
replayed beside the course's tables: the same bubble and peak for p = 4, m = 8 (the issue's case:
two stages per rank, m >= 2p)."""
import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from distlab.labs.pipeline import replay, tables
from distlab.labs.pipeline.compare import compare_tables, messages
from distlab.labs.pipeline.torch_tables import TORCH_SCHEDULES, from_torch, torch_table

UNIT = dict(t_fwd=1.0, t_bwd=1.0, t_wgt=1.0)
A = torch_schedules._Action
T = torch_schedules._ComputationType


def test_actions_map_onto_f_b_w():
    order = {0: [A(0, T.FORWARD, 0), None, A(0, T.BACKWARD_INPUT, 0), A(0, T.BACKWARD_WEIGHT, 0),
                 A(-1, T.OVERLAP_F_B, None, (A(1, T.FORWARD, 1), A(0, T.FULL_BACKWARD, 1)))]}
    assert from_torch(order) == [[("F", 0, 0), ("B", 0, 0), ("W", 0, 0), ("F", 1, 1),
                                  ("B", 1, 0)]]
    with pytest.raises(ValueError, match="rank 0's action 0SEND_F0 is not a computation"):
        from_torch({0: [A(0, T.SEND_F, 0)]})


@pytest.mark.parametrize("p,m", [(4, 8), (2, 4), (4, 12)])
def test_torch_interleaved_1f1b_replays_as_the_course_table(p, m):
    """``ScheduleInterleaved1F1B`` writes the course's table action for action (m a multiple of
    p); on paper both give PTD-P's bubble and the same peak."""
    theirs, placement = torch_table("ScheduleInterleaved1F1B", p, m, v=2)
    assert placement == tables.round_robin(p, 2)
    ours = tables.interleaved_1f1b(p, m, 2)
    for times in (dict(t_fwd=1.0, t_bwd=1.0), dict(t_fwd=1.0, t_bwd=2.0)):
        a, b = replay(theirs, placement=placement, **times), replay(ours, **times)
        assert (a.span, a.bubble, a.peak) == (b.span, b.bubble, b.peak)
    assert theirs == ours


@pytest.mark.parametrize("p,m", [(4, 8), (3, 6), (4, 9), (5, 10)])
def test_torch_zbv_replays_as_the_course_v(p, m):
    """``ScheduleZBVZeroBubble`` and the course's V (a different order: greedy, not torch's
    hand-written phases) both reach the bound p (p-1) t_F at 2p half-stages held."""
    theirs, placement = torch_table("ScheduleZBVZeroBubble", p, m, v=2)
    assert placement == tables.v_shape(p)
    a, b = replay(theirs, placement=placement, **UNIT), replay(tables.zb_v(p, m), **UNIT)
    assert (a.span, a.idle, a.peak) == (b.span, b.idle, b.peak)
    assert a.idle == p * (p - 1)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (3, 6)])
def test_zb_h1_is_torch_zero_bubble_with_one_stage_per_rank(p, m):
    """``ScheduleInterleavedZeroBubble`` (ZB1P) with v = 1 writes ZB-H1: the same table."""
    theirs, placement = torch_table("ScheduleInterleavedZeroBubble", p, m, v=1)
    assert placement == list(range(p))
    assert theirs == tables.zb_h1(p, m)


def test_every_torch_schedule_replays_without_deadlock():
    """All four of torch's multi-stage schedules, p = 4, m = 8, v = 2: each action once, every
    dependency met (the replay would name a wait that never ends)."""
    for name in TORCH_SCHEDULES:
        table, placement = torch_table(name, 4, 8, v=2)
        assert sum(map(len, table)) == len({a for row in table for a in row})
        r = replay(table, placement=placement, **UNIT)
        assert r.busy == 8 * 8 * 3     # every stage's F, B and W of every microbatch, once


@pytest.mark.parametrize("p,m", [(4, 8), (2, 4)])
def test_messages_per_step_count_only_what_crosses_ranks(p, m):
    """Every stage boundary crossed once each way per microbatch: 2 (S - 1) m messages for S
    stages, less the V's turn (stages p-1 and p share rank p-1)."""
    assert messages(tables.one_f_one_b(p, m), list(range(p))) == 2 * (p - 1) * m
    assert messages(tables.interleaved_1f1b(p, m, 2), tables.round_robin(p, 2)) == 2 * (2 * p - 1) * m
    assert messages(tables.zb_v(p, m), tables.v_shape(p)) == 2 * (2 * p - 2) * m


def test_the_comparison_shows_each_replay():
    p, m = 4, 8
    text = compare_tables({"ZB-V": (tables.zb_v(p, m), tables.v_shape(p)),
                           "torch": torch_table("ScheduleInterleaved1F1B", p, m, v=2)})
    zbv = replay(tables.zb_v(p, m), t_fwd=0.5, t_bwd=0.5, t_wgt=0.5)   # a half-stage's times
    row = next(line for line in text.splitlines() if line.startswith("ZB-V")).split()
    assert row[1:] == ["2", f"{zbv.bubble:.4f}", f"{zbv.span:g}", "8/8/8/8", "4", "96"]
