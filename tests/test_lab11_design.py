"""Lab 11's open design (Section 4): a schedule table under a memory cap, graded on a scale.

The bound is checked against the least bubble an exhaustive search finds on small cases; the
scale's figures against each other on every graded case; the solution passes both tests; the
planted mistakes (``MISTAKES``: textual edits of the solution's cell) each lose their test."""
import itertools

import pytest

from distlab.checks import lab11, lab11_design
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.labs.pipeline.capped import cap_bound, whole_backward_bound
from distlab.labs.pipeline.schedules import replay

LAB = lab11_design.LAB
CELL = "capped_schedule"
# (p, m, k) of the lab's test cells: the visible case, then the hidden ones
GRADED = [(4, 8, 3), (2, 6, 2), (4, 4, 3)]
BAR_GRADED = [(4, 8, 3), (4, 4, 3)]

# (name, cell, old, new, the test it loses): the hinted design (Hint 3: a forward first) passes
# the first test and loses the bar; one more than the cap held; a W started before its B.
MISTAKES = [
    ("capped_hinted_design", CELL, 'for op in "BFW":', 'for op in "FBW":',
     "test_capped_schedule_bar"),
    ("capped_over_the_cap", CELL, "held >= k", "held >= k + 1",
     "test_capped_schedule test_capped_schedule_bar"),
    ("capped_w_before_b", CELL, '        return ("B", i, r)\n', "        return None\n",
     "test_capped_schedule test_capped_schedule_bar"),
]


def _edited(name: str):
    (cell, old, new), = [(c, o, n) for m, c, o, n, _ in MISTAKES if m == name]
    return solutions.solution_namespace(LAB, [(cell, old, new)])["capped_schedule"]


@pytest.fixture(scope="module")
def solved():
    return solutions.solution_functions(LAB, ("capped_schedule",))["capped_schedule"]


def _least_span(p: int, m: int, k: int) -> int:
    """The shortest span of any table (unit times, every backward split, each rank taking its
    microbatches in order), by breadth-first search over what every rank has done: all actions
    last one unit, so a state at an integer time is the counts of F, B and W done per rank."""
    frontier, goal, t = {((0, 0, 0),) * p}, ((m, m, m),) * p, 0
    while goal not in frontier:
        nxt = set()
        for state in frontier:
            options = []
            for r, (f, b, w) in enumerate(state):
                mine = [(f, b, w)]                                           # idle
                if f < m and f - w < k and (r == 0 or state[r - 1][0] > f):
                    mine.append((f + 1, b, w))
                if b < m and (state[r + 1][1] > b if r < p - 1 else f > b):
                    mine.append((f, b + 1, w))
                if w < b:
                    mine.append((f, b, w + 1))
                options.append(mine)
            nxt.update(itertools.product(*options))
        frontier, t = nxt, t + 1
    return t


@pytest.mark.parametrize("p,m,k", [(2, 4, 1), (2, 4, 2), (3, 4, 2), (3, 6, 2), (4, 4, 2),
                                   (4, 6, 2)])
def test_the_bound_is_below_the_best_table_a_search_finds(p, m, k):
    best = _least_span(p, m, k) / (3 * m) - 1
    assert cap_bound(p, m, k) <= best + 1e-12
    course = replay(lab11_design._course_table(p, m, k), t_fwd=1, t_bwd=1, t_wgt=1).bubble
    assert best <= course + 1e-12
    if (p, m, k) in ((2, 4, 1), (2, 4, 2)):      # where the bound is reached
        assert best == pytest.approx(cap_bound(p, m, k))


@pytest.mark.parametrize("p,m,k", GRADED)
def test_the_scale_on_every_graded_case(p, m, k):
    fig = lab11_design.scale_of(p, m, k)
    # the bar is strictly better than the hinted design, the course's design reaches it, no
    # table beats the bound, and the first test's limit needs the split backward
    eps = 1e-12      # the bound is T/3m - 1, a bubble idle/busy: the same number, rounded apart
    assert fig["bound"] <= fig["course"] + eps and fig["course"] <= fig["bar"] + eps
    assert fig["bar"] < fig["hinted"] < fig["whole"]
    for table in (lab11_design._hinted_table(p, m, k), lab11_design._course_table(p, m, k)):
        lab11_design._check_complete(table, p, m, "course")
        assert max(replay(table, t_fwd=1, t_bwd=1, t_wgt=1).peak.values()) <= k


def test_the_whole_backward_bound_is_lab_5s():
    from distlab.labs.pipeline_bubble import budget_bound
    from distlab.labs.pipeline.tables import one_f_one_b
    # with no cap to speak of (k >= p), Lab 5's floor is 1F1B's (p - 1)/m, and 1F1B reaches it
    assert whole_backward_bound(4, 8, 4) == pytest.approx(3 / 8)
    assert replay(one_f_one_b(4, 8), t_fwd=1, t_bwd=1, t_wgt=1).bubble == pytest.approx(3 / 8)
    b = budget_bound(4, 8, 2)
    assert whole_backward_bound(4, 8, 2) == pytest.approx(b / (1 - b))


def test_stored_figures_are_the_codes():
    from distlab.checks.stored import load
    stored = load(LAB, lab11_design.SET)
    assert tuple(stored["case"].tolist()) == lab11_design.VISIBLE
    fig = lab11_design.scale_of(*lab11_design.VISIBLE)
    assert stored["figures"].tolist() == pytest.approx([fig[f] for f in lab11_design.FIGURES],
                                                      rel=1e-12)


def test_the_solution_passes_both_tests_and_shows_its_figures(solved):
    line = lab11.check_capped_schedule(solved)
    fig = lab11_design.scale_of(*lab11_design.VISIBLE)
    assert (f"bubble on paper {fig['course']:.3f}; the hinted design {fig['hinted']:.3f}, the bar "
            f"{fig['bar']:.3f} (halfway to the course's {fig['course']:.3f}), the bound "
            f"{fig['bound']:.3f}: within the hinted design's bubble") in line
    assert "peak held per rank 3/3/3/3 (cap 3)" in line and "equal one process's" in line
    assert "within the bar" in lab11.check_capped_schedule_bar(solved)
    for p, m, k in GRADED[1:]:
        lab11.check_capped_schedule(solved, world_size=p, num_microbatches=m, max_held=k, seed=5)
    for p, m, k in BAR_GRADED[1:]:
        lab11.check_capped_schedule_bar(solved, world_size=p, num_microbatches=m, max_held=k,
                                        seed=6)


def test_the_hinted_design_loses_only_the_bar():
    hinted = _edited("capped_hinted_design")
    for p, m, k in GRADED:
        assert hinted(p, m, k) == lab11_design._hinted_table(p, m, k)
    assert "within the hinted design's bubble" in lab11.check_capped_schedule(hinted)
    with pytest.raises(CheckFailed, match=r"bubble on paper 0\.417; the hinted design 0\.417, "
                                          r"the bar 0\.396 .*This test's limit is the bar, "
                                          r"0\.396\. "
                                          r"When rank 0 cannot start a forward"):
        lab11.check_capped_schedule_bar(hinted)


def test_a_table_over_the_cap_loses_its_tests():
    over = _edited("capped_over_the_cap")
    for check in (lab11.check_capped_schedule, lab11.check_capped_schedule_bar):
        with pytest.raises(CheckFailed, match=r"rank 0 holds 4 microbatches' activations "
                                              r"at once .*max_held = 3"):
            check(over)


def test_a_w_before_its_b_loses_its_tests():
    early = _edited("capped_w_before_b")
    for check in (lab11.check_capped_schedule, lab11.check_capped_schedule_bar):
        with pytest.raises(CheckFailed, match=r"on paper, your table deadlocks: rank \d at "
                                              r"\('W', 0, \d\), waiting for \('B', 0, \d\)"):
            check(early)


def test_a_table_missing_a_backward_is_named():
    def no_last_b(p, m, k):
        table = lab11_design._course_table(p, m, k)
        return [row if r else [a for a in row if a[:2] != ("B", m - 1)]
                for r, row in enumerate(table)]
    with pytest.raises(CheckFailed, match=r"rank 0 never runs \('B', 7, 0\)"):
        lab11.check_capped_schedule(no_last_b)


def test_visible_checks_need_no_answer_of_the_course(monkeypatch, solved):
    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    monkeypatch.setattr(lab11_design, "_greedy", withheld)
    lab11.check_capped_schedule(solved)
    with pytest.raises(CheckFailed, match="No stored figures for world_size=4, "
                                          "num_microbatches=4, max_held=3"):
        lab11.check_capped_schedule(solved, world_size=4, num_microbatches=4, max_held=3, seed=1)


def test_one_run_serves_both_tests(monkeypatch, solved):
    calls = []
    real = lab11_design._run_on_ranks
    monkeypatch.setattr(lab11_design, "_run_on_ranks", lambda *a: calls.append(a) or real(*a))
    lab11.check_capped_schedule(solved)
    lab11.check_capped_schedule_bar(solved)
    assert len(calls) == 1


def test_a_handout_without_the_executor_leaves_the_run_to_the_grader(monkeypatch, solved):
    from distlab.labs.pipeline import executor
    from distlab.runtime.outcome import RankError

    def stubbed(*args, **kwargs):
        raise RankError("rank 0 raised", 0, "NotImplementedError", "NotImplementedError: ...")
    monkeypatch.setattr(executor, "run_tables", stubbed)
    assert "the run on real ranks: the grader's" in lab11.check_capped_schedule(solved)
