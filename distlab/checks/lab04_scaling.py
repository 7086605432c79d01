"""The check of Lab 4's scaling exercise (called from ``distlab.checks.lab04``, which the judge
serves): ``predict_step_time`` and ``strong_scaling_efficiency`` against the plain formulas of
``distlab.labs.tp_scaling``, on fixed cases (seed 404) and fresh ones."""
from __future__ import annotations

import math

from distlab.checks.assertions import CheckFailed
from distlab.labs.tp_scaling import (cases, reference_predicted_step,
                                     reference_strong_scaling_efficiency, ring_all_reduce_time)

SEED = 404


def check(predict, efficiency, seed: int | None = None) -> None:
    for case in cases(SEED if seed is None else seed):
        args = (case["t1"], case["n"], case["alpha"], case["bandwidth"], case["batch"],
                case["seq"], case["hidden"])
        call = (f"predict_step_time(t1={case['t1']:.4g}, n={case['n']}, alpha={case['alpha']:.3g}, "
                f"bandwidth={case['bandwidth']:.3g}, batch={case['batch']}, seq={case['seq']}, "
                f"hidden={case['hidden']})")
        expected = reference_predicted_step(*args)
        try:
            got = float(predict(*args))
        except (TypeError, ValueError) as err:
            raise CheckFailed(f"{call} did not return a number: {err}")
        if not math.isclose(got, expected, rel_tol=1e-9):
            nbytes = case["batch"] * case["seq"] * case["hidden"] * 4
            one = ring_all_reduce_time(case["n"], nbytes, case["alpha"], case["bandwidth"])
            raise CheckFailed(
                f"{call}: expected {expected:.6g} s, got {got:.6g}. T_N = T1/N + 4 all-reduces of "
                f"b*s*h*4 = {nbytes} bytes, each 2(N-1)*alpha + 2(N-1)/N * S/B = {one:.4g} s in "
                f"Lab 1's ring model (none on one rank).")
        tn = expected
        exp_eff = reference_strong_scaling_efficiency(case["t1"], tn, case["n"])
        got_eff = float(efficiency(case["t1"], tn, case["n"]))
        if not math.isclose(got_eff, exp_eff, rel_tol=1e-9):
            raise CheckFailed(
                f"strong_scaling_efficiency(t1={case['t1']:.4g}, tn={tn:.4g}, n={case['n']}): "
                f"expected {exp_eff:.6g}, got {got_eff:.6g}. Strong-scaling efficiency is "
                f"T1 / (N * T_N) (the speedup T1/T_N divided by N).")
