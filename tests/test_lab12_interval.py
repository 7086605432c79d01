"""Lab 12's checkpoint interval: the exact model, Young's first order, Daly's estimate, and a
Monte Carlo of the failures agreeing with the model within its sampling error."""
import math

import pytest

from distlab.labs.checkpoint.interval import (best_interval, daly_interval, lost_fraction,
                                              lost_fraction_first_order, simulate_lost_fraction,
                                              young_period)

# (delta, R, M) in seconds: a save of a minute with an 8-hour MTBF; a slow save and restart with
# a 2-hour one; failures so frequent that first order is far off
CASES = [(60.0, 120.0, 8 * 3600.0), (300.0, 600.0, 2 * 3600.0), (60.0, 120.0, 1200.0)]


@pytest.mark.parametrize("delta,restart,mtbf", CASES)
def test_simulation_agrees_with_the_model_within_its_sampling_error(delta, restart, mtbf):
    for tau in (0.5 * young_period(delta, mtbf), young_period(delta, mtbf) - delta,
                2 * young_period(delta, mtbf)):
        expected = lost_fraction(tau, delta, restart, mtbf)
        got, error = simulate_lost_fraction(tau, delta, restart, mtbf, segments=4000, seed=1)
        # 4 standard errors: a correct simulation strays past them once in ~16,000 draws
        assert abs(got - expected) < 4 * error, (tau, got, expected, error)


def test_the_simulation_sees_a_wrong_model():
    # the first-order formula is off by much more than the sampling error where M is short
    delta, restart, mtbf = CASES[2]
    tau = young_period(delta, mtbf) - delta
    got, error = simulate_lost_fraction(tau, delta, restart, mtbf, segments=4000, seed=1)
    assert abs(got - lost_fraction_first_order(tau, delta, restart, mtbf)) > 4 * error


@pytest.mark.parametrize("mtbf", [1e4, 1e5, 1e6])
def test_first_order_is_the_model_to_first_order(mtbf):
    # Expanding the model in 1/M: lost = delta/L + (tau/L) a/M - (tau/L)(a^2 - b)/M^2 + ...,
    # a = R + L/2, b = R^2/2 + RL/2 + L^2/6, and a^2 - b <= (R + L)^2 / 2. What first order drops
    # is the product (delta/L)(a/M) and the square term: the gap stays within their sum.
    delta, restart, tau = 60.0, 120.0, 1000.0
    period, a = tau + delta, restart + (tau + delta) / 2
    gap = abs(lost_fraction(tau, delta, restart, mtbf)
              - lost_fraction_first_order(tau, delta, restart, mtbf))
    bound = delta / period * a / mtbf + ((restart + period) / mtbf) ** 2
    assert gap <= bound, (gap, bound)


@pytest.mark.parametrize("delta,restart,mtbf", CASES)
def test_youngs_period_minimises_the_first_order_loss(delta, restart, mtbf):
    period = young_period(delta, mtbf)
    assert period == math.sqrt(2 * delta * mtbf)
    best = lost_fraction_first_order(period - delta, delta, restart, mtbf)
    for factor in (0.9, 0.99, 1.01, 1.1):
        assert best < lost_fraction_first_order(factor * period - delta, delta, restart, mtbf)


@pytest.mark.parametrize("delta,restart,mtbf", CASES)
def test_dalys_estimate_is_closer_to_the_optimum_than_first_order(delta, restart, mtbf):
    best = best_interval(delta, restart, mtbf)
    assert abs(daly_interval(delta, mtbf) - best) < abs(young_period(delta, mtbf) - delta - best)
    # the optimum is a minimum of the model
    for factor in (0.95, 1.05):
        assert lost_fraction(best, delta, restart, mtbf) < lost_fraction(factor * best, delta,
                                                                         restart, mtbf)


def test_the_restart_cost_does_not_move_the_optimum():
    # R multiplies every interval's expected time by e^(R/M): the useful share scales by e^(-R/M)
    delta, mtbf = 60.0, 7200.0
    for tau in (100.0, 900.0, 5000.0):
        useful = 1 - lost_fraction(tau, delta, 1800.0, mtbf)
        assert math.isclose(useful, math.exp(-1800.0 / mtbf) * (1 - lost_fraction(
            tau, delta, 0.0, mtbf)), rel_tol=1e-12)


def test_bad_input_is_refused_with_the_values():
    with pytest.raises(ValueError, match="M > 0"):
        lost_fraction(100.0, 10.0, 10.0, 0.0)
    with pytest.raises(ValueError, match="tau=-1"):
        simulate_lost_fraction(-1.0, 10.0, 10.0, 100.0)
