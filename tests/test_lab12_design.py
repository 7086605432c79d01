"""Lab 12's open design (Section 6): a checkpoint plan, graded on a scale by the expected
fraction of time it loses.

The model of an asynchronous save is checked against a simulation of its failures; the search
for the best plan against a finer search; the scale's figures on every graded problem; the
solution passes both tests; the planted mistake (Young's interval, unrefined: the hinted design)
loses the bar and nothing else."""
import math

import pytest

from distlab.checks import lab12, lab12_interval
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.labs.checkpoint.interval import lost_fraction
from distlab.labs.checkpoint.plans import (MODES, Problem, best_plan, hinted_plan,
                                           plan_lost_fraction, simulate_plan)

LAB = lab12_interval.LAB
CELL = "plan_checkpoints"
# (name, cell, old, new, the test it loses): Young's interval for the mode that stalls less
# Lab 12's import cells: every solution cell's definitions need them (Section 4's default spec)
SETUP = ("state_imports", "reshard_imports", "async_imports", "restart_imports",
         "interval_imports", "plan_imports")
MISTAKES = [
    ("plan_young_unrefined", CELL, "    return plans[mode][1], mode",
     "    mode = 'async' if async_stall < blocking_stall else 'blocking'\n"
     "    return math.sqrt(2 * min(async_stall, blocking_stall) * M), mode",
     "test_checkpoint_plan_bar"),
    # Young's interval without its factor 2 (the first-order optimum of delta/tau + tau/(2M)
    # misread): about 6% more lost than the hinted design, so both tests
    ("plan_young_without_factor_two", CELL, "    return plans[mode][1], mode",
     "    mode = 'async' if async_stall < blocking_stall else 'blocking'\n"
     "    return math.sqrt(min(async_stall, blocking_stall) * M), mode",
     "test_checkpoint_plan test_checkpoint_plan_bar"),
]
PROBLEMS = [Problem(7200.0, 600.0, 120.0, 10.0, 300.0), Problem(1800.0, 300.0, 60.0, 5.0, 120.0),
            Problem(8 * 3600.0, 900.0, 240.0, 4.0, 900.0),
            Problem(3600.0, 120.0, 60.0, 20.0, 900.0)]


def _edited(name: str):
    (cell, old, new), = [(c, o, n) for m, c, o, n, _ in MISTAKES if m == name]
    return solutions.solution_namespace(LAB, [(cell, old, new)], SETUP)[CELL]


@pytest.fixture(scope="module")
def solved():
    return solutions.solution_functions(LAB, (CELL,), SETUP)[CELL]


def test_a_blocking_plan_loses_what_dalys_model_says():
    for p in PROBLEMS:
        for tau in (100.0, 900.0, 5000.0):
            assert plan_lost_fraction(tau, "blocking", p) == pytest.approx(
                lost_fraction(tau, p.blocking_stall, p.restart, p.mtbf), rel=1e-12)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_the_simulation_agrees_with_the_model_within_its_sampling_error(problem):
    for mode in MODES:
        for tau in (0.5 * problem.async_write, 2 * problem.async_write):
            want = plan_lost_fraction(tau, mode, problem)
            got, error = simulate_plan(tau, mode, problem, checkpoints=4000, seed=3)
            # 4 standard errors: a correct simulation strays past them once in ~16,000 draws
            assert abs(got - want) < 4 * error, (mode, tau, got, want, error)


def test_the_simulation_sees_a_model_without_the_write():
    # a model that forgets what a failure during the write costs is off by far more
    p = PROBLEMS[3]
    tau = 2 * p.async_write
    without = Problem(p.mtbf, p.restart, p.blocking_stall, p.async_stall, 0.0)
    got, error = simulate_plan(tau, "async", p, checkpoints=4000, seed=3)
    assert abs(got - plan_lost_fraction(tau, "async", without)) > 4 * error


@pytest.mark.parametrize("problem", PROBLEMS + lab12_interval.design_problems(None))
def test_the_best_plan_beats_a_finer_search(problem):
    tau, mode, lost = best_plan(problem)
    assert lost == plan_lost_fraction(tau, mode, problem)
    for m in MODES:
        grid = [problem.mtbf * 1e-4 * 1.001 ** k for k in range(12000)]   # 1e-4 M .. ~16 M
        assert min(plan_lost_fraction(t, m, problem) for t in grid) >= lost - 1e-9


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4, 5, 6, 7])
def test_the_scale_on_every_graded_problem(seed):
    for problem in lab12_interval.design_problems(seed):
        fig = lab12_interval.plan_scale(problem)
        assert fig["best"] <= fig["bar"] - lab12_interval.MIN_GAP / 2 < fig["hinted"]
        assert fig["hinted"] == plan_lost_fraction(*hinted_plan(problem), problem)
    kinds = [lab12_interval.plan_scale(p)["best_mode"]
             for p in lab12_interval.design_problems(seed)]
    assert kinds[0] == MODES.index("async") and kinds[1] == MODES.index("blocking")


@pytest.mark.stored_data
def test_stored_figures_are_the_codes():
    from distlab.checks.stored import load
    stored = load(LAB, lab12_interval.DESIGN_SET)
    problems = lab12_interval.design_problems(None)
    assert stored["problems"].tolist() == [list(p.args()) for p in problems]
    for row, problem in zip(stored["figures"].tolist(), problems):
        fig = lab12_interval.plan_scale(problem)
        assert row == pytest.approx([fig[f] for f in lab12_interval.FIGURES], rel=1e-12)


def test_the_solution_passes_both_tests_and_shows_its_figures(solved):
    line = lab12.check_checkpoint_plan(solved)
    problem = lab12_interval.design_problems(None)[0]
    fig = lab12_interval.plan_scale(problem)
    assert (f"long write: async every {fig['best_tau']:.0f} s loses {fig['best']:.4f} (hinted "
            f"{fig['hinted']:.4f}, bar {fig['bar']:.4f}, best {fig['best']:.4f})") in line
    assert "within the bar" in lab12.check_checkpoint_plan_bar(solved)
    lab12.check_checkpoint_plan(solved, seed=5)
    lab12.check_checkpoint_plan_bar(solved, seed=5)


def test_youngs_interval_unrefined_loses_only_the_bar():
    young = _edited("plan_young_unrefined")
    for problem in lab12_interval.design_problems(None):
        (tau, mode), (want_tau, want_mode) = young(*problem.args()), hinted_plan(problem)
        assert mode == want_mode and tau == pytest.approx(want_tau, rel=1e-12)
    assert "within the hinted design's loss" in lab12.check_checkpoint_plan(young)
    with pytest.raises(CheckFailed, match=r"long write: async every \d+ s loses .*This test's "
                                          r"limit is the bar, .*Where is first order off\?"):
        lab12.check_checkpoint_plan_bar(young)


def test_a_worse_plan_loses_the_first_test_too():
    with pytest.raises(CheckFailed, match=r"This test's limit is the hinted design's loss"):
        lab12.check_checkpoint_plan(lambda m, r, b, s, w: (m / 100, "async"))


def test_a_wrong_return_is_named():
    with pytest.raises(CheckFailed, match="'blocking' or 'async'"):
        lab12.check_checkpoint_plan(lambda m, r, b, s, w: (600.0, "sync"))


def test_one_run_serves_both_tests(monkeypatch, solved):
    calls = []
    real = lab12_interval._measure
    monkeypatch.setattr(lab12_interval, "_measure", lambda *a: calls.append(a) or real(*a))
    lab12.check_checkpoint_plan(solved)
    lab12.check_checkpoint_plan_bar(solved)
    assert len(calls) == 1


def test_visible_checks_need_no_answer_of_the_course(monkeypatch, solved):
    """A student's kernel has no model: the visible tests simulate the plans instead, and the
    hidden ones say they are the grader's."""
    from distlab.labs.checkpoint import plans

    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    for name in ("plan_lost_fraction", "best_plan", "hinted_plan"):
        monkeypatch.setattr(plans, name, withheld)
    assert "simulated here ±" in lab12.check_checkpoint_plan(solved)
    with pytest.raises(CheckFailed, match="Hidden problems need the grader's code"):
        lab12.check_checkpoint_plan(solved, seed=1)


def test_what_the_design_shows():
    """The lab's closing text, on the visible problems: the hinted async interval is shorter than
    the write where the write is long, and the best waits for it; where failures are frequent
    beside the write the blocking save wins though it stalls more; where they come every few
    saves, even the best blocking interval is not Young's, and first order is off there."""
    from distlab.labs.checkpoint.interval import lost_fraction_first_order, young_period
    long_write, frequent, short = lab12_interval.design_problems(None)
    tau, mode = hinted_plan(long_write)
    best_tau, best_mode, _ = best_plan(long_write)
    assert mode == best_mode == "async" and tau < long_write.async_write <= best_tau
    assert frequent.async_stall < frequent.blocking_stall and best_plan(frequent)[1] == "blocking"
    assert min(plan_lost_fraction(t, "async", frequent)
               for t in (frequent.async_write * f for f in (1, 1.5, 2, 3))) > best_plan(frequent)[2]
    tau, mode, best = best_plan(short)
    young = young_period(short.blocking_stall, short.mtbf)
    assert mode == "blocking" and plan_lost_fraction(young, "blocking", short) > best + 1e-3
    assert abs(lost_fraction_first_order(tau, short.blocking_stall, short.restart, short.mtbf)
               - best) > 0.05
