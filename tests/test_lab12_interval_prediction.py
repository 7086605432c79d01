"""Lab 12's graded prediction (Section 5): the expected fraction of time lost, within first
order's own error of the exact model. The tolerance admits a first-order model and the exact one
on every case the check can draw, and refuses each planted mistake (``MISTAKES``: textual edits
of the solution's cell), which loses its test and no other."""
import math

import pytest

from distlab.checks import lab12, lab12_interval
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.labs.checkpoint.interval import lost_fraction, lost_fraction_first_order

LAB = lab12_interval.LAB
CELL = "predict_lost_fraction"
# (name, cell, old, new, the test it loses)
# Lab 12's import cells: every solution cell's definitions need them (Section 4's default spec)
SETUP = ("state_imports", "reshard_imports", "async_imports", "restart_imports",
         "interval_imports", "plan_imports")
MISTAKES = [
    ("prediction_no_restart", CELL, "(restart + period / 2) / mtbf", "(period / 2) / mtbf",
     "test_predict_lost_fraction"),
    ("prediction_whole_period", CELL, "(restart + period / 2) / mtbf", "(restart + period) / mtbf",
     "test_predict_lost_fraction"),
]
SEEDS = range(60)


def _edited(name: str):
    (cell, old, new), = [(c, o, n) for m, c, o, n, _ in MISTAKES if m == name]
    return solutions.solution_namespace(LAB, [(cell, old, new)], SETUP)[CELL]


def _wrong(case, name):
    tau, delta, restart, mtbf = case
    first = lost_fraction_first_order(*case)
    return {"prediction_no_restart": first - restart / mtbf,
            "prediction_whole_period": first + (tau + delta) / (2 * mtbf)}[name]


@pytest.mark.parametrize("seed", [None, *SEEDS])
def test_the_tolerance_admits_both_models_and_refuses_each_mistake(seed):
    for case in lab12_interval.lost_prediction_cases(seed):
        tol = lab12_interval.prediction_tolerance(*case)
        exact = lost_fraction(*case)
        tau, delta, restart, mtbf = case
        # first order, and its variants (per interval of compute instead of per period)
        for model in (lost_fraction_first_order(*case), delta / tau + (tau / 2 + restart) / mtbf):
            assert abs(model - exact) <= tol, (case, model, exact, tol)
        for name, *_ in MISTAKES:
            assert abs(_wrong(case, name) - exact) > 2 * tol, (case, name)


@pytest.mark.stored_data
def test_the_visible_cases_are_stored_as_the_model_computes_them():
    from distlab.checks.stored import load
    stored = load(LAB, lab12_interval.PREDICTION_SET)
    assert stored["cases"].tolist() == [list(c) for c in lab12_interval.PREDICTION_VISIBLE]
    assert stored["lost"].tolist() == pytest.approx(
        [lost_fraction(*c) for c in lab12_interval.PREDICTION_VISIBLE], rel=1e-12)


def test_the_solution_passes_and_shows_its_figures():
    predict = solutions.solution_functions(LAB, (CELL,), SETUP)[CELL]
    line = lab12.check_lost_prediction(predict)
    case = lab12_interval.PREDICTION_VISIBLE[0]
    assert (f"{predict(*case):.4f} (model {lost_fraction(*case):.4f} ± "
            f"{lab12_interval.prediction_tolerance(*case):.4f})") in line
    assert "on 3 cases" in lab12.check_lost_prediction(predict, seed=3)


def test_the_exact_model_passes_too():
    def exact(tau, delta, restart, mtbf):
        import math
        return 1 - tau / (mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf))
    lab12.check_lost_prediction(exact, seed=11)


@pytest.mark.parametrize("name,hint", [("prediction_no_restart", "what the restarts cost"),
                                       ("prediction_whole_period", "Too much rework")])
def test_each_mistake_loses_the_prediction_with_its_hint(name, hint):
    with pytest.raises(CheckFailed, match=rf"predict_lost_fraction\(3000\.0, 60\.0, 1200\.0, "
                                          rf"345600\.0\): .*expected 0\.02732 .*{hint}"):
        lab12.check_lost_prediction(_edited(name))


def test_a_wrong_return_is_named():
    with pytest.raises(CheckFailed, match="return one number"):
        lab12.check_lost_prediction(lambda tau, delta, restart, mtbf: (tau, delta))
