"""Lab 11's foundation: Lab 5's replay extended to F, B and W on virtual stages, and the course's
schedule tables (interleaved 1F1B, ZB-H1, a zero-bubble V) against the formulas their papers
state. On paper, single process: no ranks run."""
import pytest

from distlab.labs.pipeline import measured_bubble, peak_in_flight, replay, schedule_order
from distlab.labs.pipeline import tables
from distlab.labs.pipeline_bubble import bubble_of_compute, bubble_of_step

UNIT = dict(t_fwd=1.0, t_bwd=1.0, t_wgt=1.0)   # t_F = t_B = t_W, the unit times Qi et al. use


def _each_once(table, placement, m):
    """Every stage runs F and B of every microbatch once, W at most once, on its own rank."""
    for rank, row in enumerate(table):
        assert len(row) == len(set(row))
        for op, i, s in row:
            assert placement[s] == rank and 0 <= i < m
    ran = {a for row in table for a in row}
    for s, i in ((s, i) for s in range(len(placement)) for i in range(m)):
        assert ("F", i, s) in ran and ("B", i, s) in ran


# ----------------------------------------------------------------------------- the replay

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 3)])
def test_lab5_tables_replay_as_before(p, m):
    """Lab 5's ``(op, i)`` form and the ``(op, i, stage)`` form time the same; the new figures
    agree with Lab 5's readings of the events."""
    old = replay(schedule_order("1f1b", p, m))
    new = replay(tables.one_f_one_b(p, m))
    assert [(e.rank, e.mb, e.kind, e.start, e.end) for e in old] == \
           [(e.rank, e.mb, e.kind, e.start, e.end) for e in new]
    assert old.peak == new.peak == peak_in_flight(old)
    assert old.step_share == pytest.approx(measured_bubble(old, p))
    assert old.step_share == pytest.approx(bubble_of_step(p, m))
    assert old.bubble == pytest.approx(bubble_of_compute(p, m))


def test_a_lab5_stage_with_no_actions_deadlocks_as_before():
    with pytest.raises(RuntimeError, match=r"deadlocks: stage 0 at \('B', 0\)"):
        replay([[("F", 0), ("B", 0)], []])


def test_a_split_backward_sends_its_gradient_sooner():
    """B then W right after it computes what the whole backward did, but the gradient leaves
    after B: the step is shorter although no rank computes less."""
    p, m = 3, 4
    whole = replay(tables.one_f_one_b(p, m), **UNIT)
    split = [[a for op, i, s in row for a in ([(op, i, s), ("W", i, s)] if op == "B" else
                                              [(op, i, s)])] for row in tables.one_f_one_b(p, m)]
    assert whole.span == (m + p - 1) * 3   # 1F1B, Lab 5: (m + p - 1)(t_F + t_B + t_W)
    assert replay(split, **UNIT).busy == whole.busy
    assert replay(split, **UNIT).span < whole.span


def test_peak_counts_from_the_forward_to_the_weights_gradient():
    one = lambda row: replay([row], **UNIT).peak[0]
    assert one([("F", 0, 0), ("B", 0, 0), ("W", 0, 0), ("F", 1, 0), ("B", 1, 0), ("W", 1, 0)]) == 1
    assert one([("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("W", 0, 0), ("B", 1, 0), ("W", 1, 0)]) == 2
    assert one([("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)]) == 1   # whole backwards


def test_dependencies_cross_virtual_stages_on_one_rank():
    """Stages 0 and 2 on rank 0, stage 1 on rank 1: microbatch 0 goes 0 -> 1 -> 2 and back."""
    table = [[("F", 0, 0), ("F", 0, 2), ("B", 0, 2), ("B", 0, 0)], [("F", 0, 1), ("B", 0, 1)]]
    events = {(e.kind, e.stage): (e.start, e.end) for e in replay(table, t_fwd=1, t_bwd=2)}
    assert events == {("F", 0): (0, 1), ("F", 1): (1, 2), ("F", 2): (2, 3), ("B", 2): (3, 5),
                      ("B", 1): (5, 7), ("B", 0): (7, 9)}


def test_a_weights_gradient_before_its_backward_deadlocks_and_says_where():
    table = [[("F", 0, 0), ("W", 0, 0), ("B", 0, 0)]]
    with pytest.raises(RuntimeError, match=r"deadlocks: rank 0 at \('W', 0, 0\), waiting for "
                                           r"\('B', 0, 0\)"):
        replay(table)


def test_malformed_tables_are_refused_with_what_to_do():
    with pytest.raises(RuntimeError, match=r"runs \('F', 0, 0\) twice \(rank 0\)"):
        replay([[("F", 0, 0), ("F", 0, 0), ("B", 0, 0)]])
    with pytest.raises(ValueError, match="stage 0 has actions on rank 0 and on rank 1"):
        replay([[("F", 0, 0)], [("B", 0, 0)]])
    with pytest.raises(ValueError, match="stage 1's actions are on rank 1, but the placement "
                                         "puts it on 0"):
        replay([[("F", 0, 0), ("B", 0, 0)], [("F", 0, 1), ("B", 0, 1)]], placement=[0, 0])
    with pytest.raises(ValueError, match="an op is 'F', 'B' or 'W'"):
        replay([[("X", 0, 0)]])


# ----------------------------------------------------------------------------- the tables

@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 4, 2), (2, 4, 3), (4, 12, 3), (8, 16, 2)])
@pytest.mark.parametrize("t_bwd", [1.0, 2.0])
def test_interleaved_1f1b_bubble_is_ptdp_formula(p, m, v, t_bwd):
    """PTD-P (Narayanan et al. 2021, sec. 2.2): with v stages per rank, each a v-th of its
    layers, the idle time is (p-1)/(v m) of the compute. On paper, with t_F, t_B the times of
    one stage, the step lasts exactly (v m + p - 1)(t_F + t_B): every rank computes
    v m (t_F + t_B) of it and idles (p - 1)(t_F + t_B)."""
    placement = tables.round_robin(p, v)
    table = tables.interleaved_1f1b(p, m, v)
    _each_once(table, placement, m)
    r = replay(table, t_fwd=1.0, t_bwd=t_bwd, placement=placement)
    assert r.span == (v * m + p - 1) * (1.0 + t_bwd)
    assert r.idle * v * m == (p - 1) * r.busy                 # exact: every time is an integer
    assert r.bubble == pytest.approx((p - 1) / (v * m))
    # the warm-up's forwards plus the first steady one are held at once: (v-1)p + 2(p-1-r) + 1
    assert r.peak == {rank: min((v - 1) * p + 2 * (p - 1 - rank) + 1, v * m) for rank in range(p)}


def test_interleaved_1f1b_needs_whole_groups_of_microbatches():
    with pytest.raises(ValueError, match="num_microbatches = 6 must be a multiple of 4"):
        tables.interleaved_1f1b(4, 6, 2)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 4), (3, 7), (8, 16)])
@pytest.mark.parametrize("times", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0),
                                   (1.0, 1.5, 0.5)])
def test_zb_h1_bubble_is_a_third_of_1f1b_at_its_memory(p, m, times):
    """Qi et al. 2023, sec. 2.1: 1F1B idles (p-1)(T_F + T_B + T_W) per rank, ZB-H1
    (p-1)(T_F + T_B - T_W) (times where T_W is at most T_F and T_B, as these), a third with the
    paper's T_F = T_B = T_W; its peak activations equal 1F1B's (p, on rank 0)."""
    t_f, t_b, t_w = times
    times = dict(t_fwd=t_f, t_bwd=t_b, t_wgt=t_w)
    table = tables.zb_h1(p, m)
    _each_once(table, list(range(p)), m)
    base, zb = replay(tables.one_f_one_b(p, m), **times), replay(table, **times)
    assert base.idle == pytest.approx(p * (p - 1) * (t_f + t_b + t_w))
    assert zb.idle == pytest.approx(p * (p - 1) * (t_f + t_b - t_w))
    assert max(zb.peak.values()) == max(base.peak.values()) == min(p, m)
    if t_f == t_b == t_w:
        assert zb.idle * 3 == base.idle


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (4, 9), (5, 10), (6, 13), (8, 17)])
def test_zb_v_reaches_the_bound_at_1f1b_memory(p, m):
    """With stages s and 2p-1-s on rank s and t_F = t_B = t_W, rank p-1 cannot start before
    (p-1) t_F and has 2m (t_F + t_B + t_W) to compute, so no step is shorter than their sum and
    the ranks idle at least p (p-1) t_F together. The V reaches it holding 2p half-stages at most,
    1F1B's p whole microbatches."""
    placement = tables.v_shape(p)
    table = tables.zb_v(p, m)
    _each_once(table, placement, m)
    assert all(("W", i, s) in set(table[placement[s]]) for s in range(2 * p) for i in range(m))
    r = replay(table, placement=placement, **UNIT)
    assert r.span == (p - 1) + 2 * m * 3
    assert r.idle == p * (p - 1)
    assert r.peak == {rank: 2 * p for rank in range(p)}


def test_the_greedy_tables_respect_their_cap():
    p = 3
    for cap in (2 * p, 2 * p + 1, 3 * p):
        r = replay(tables.greedy_table(tables.v_shape(p), 6, cap), **UNIT)
        assert max(r.peak.values()) <= cap
    # greedy fills a V's cap with first-stage forwards: below 2p it stops, and says so
    with pytest.raises(RuntimeError, match="raise the cap"):
        tables.greedy_table(tables.v_shape(p), 6, 2 * p - 1)
