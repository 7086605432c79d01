"""The check of Lab 4's scaling exercise (called from ``distlab.checks.lab04``, which the judge
serves): ``predict_step_time`` and ``strong_scaling_efficiency`` against the plain formulas of
``distlab.labs.tp_scaling``, on fixed cases (seed 404, whose expected values are stored: a
student's handout has no formulas) and fresh ones (computed in the judge)."""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed, verified
from distlab.checks.lab04_problems import LAB
from distlab.checks.ranks import call_each
from distlab.labs.tp_scaling import (cases, reference_predicted_step,
                                     reference_strong_scaling_efficiency, ring_all_reduce_time)

SEED = 404


def _args(case: dict) -> tuple:
    return (case["t1"], case["n"], case["alpha"], case["bandwidth"], case["batch"],
            case["seq"], case["hidden"])


def _computed(case: dict) -> tuple[float, float, float]:
    """(T_N, its efficiency, one all-reduce's time) of ``case``, from the formulas."""
    tn = reference_predicted_step(*_args(case))
    nbytes = case["batch"] * case["seq"] * case["hidden"] * 4
    return (tn, reference_strong_scaling_efficiency(case["t1"], tn, case["n"]),
            ring_all_reduce_time(case["n"], nbytes, case["alpha"], case["bandwidth"]))


def reference_set() -> dict:
    """The visible cases' expected values, for ``data/<lab>/scaling.pt``."""
    values = torch.tensor([_computed(case) for case in cases(SEED)], dtype=torch.float64)
    return {"seed": SEED, "predicted": values[:, 0].clone(), "efficiency": values[:, 1].clone(),
            "all_reduce": values[:, 2].clone()}


def _expected(seed: int | None) -> list[tuple[float, float, float]]:
    """Per case: stored for the visible test (seed None), else computed (in the judge)."""
    if seed is not None:
        return [_computed(case) for case in cases(seed)]
    from distlab.checks.stored import load
    stored = load(LAB, "scaling")
    return list(zip(stored["predicted"].tolist(), stored["efficiency"].tolist(),
                    stored["all_reduce"].tolist()))


def check(predict, efficiency, seed: int | None = None) -> None:
    done, todo = [], list(zip(cases(SEED if seed is None else seed), _expected(seed)))
    calls = [(f"predict_step_time(t1={case['t1']:.4g}, n={case['n']}, alpha={case['alpha']:.3g}, "
              f"bandwidth={case['bandwidth']:.3g}, batch={case['batch']}, seq={case['seq']}, "
              f"hidden={case['hidden']})") for case, _ in todo]
    # Each function's cases in one launch; the efficiency's T_N is the model's, as before.
    predicted = call_each(predict, [_args(case) for case, _ in todo], names=calls)
    efficiencies = call_each(efficiency, [(case["t1"], ref[0], case["n"]) for case, ref in todo],
                             names=[f"strong_scaling_efficiency(t1={case['t1']:.4g}, tn={ref[0]:.4g}, "
                                    f"n={case['n']})" for case, ref in todo])
    for (case, (expected, exp_eff, one)), call, answer, eff in zip(todo, calls, predicted,
                                                                   efficiencies):
        try:
            got = float(answer)
        except (TypeError, ValueError) as err:
            raise CheckFailed(f"{call} did not return a number: {err}")
        if not math.isclose(got, expected, rel_tol=1e-9):
            nbytes = case["batch"] * case["seq"] * case["hidden"] * 4
            raise CheckFailed(
                f"{call}: expected {expected:.6g} s, got {got:.6g}. T_N = T1/N + 4 all-reduces of "
                f"b*s*h*4 = {nbytes} bytes, each 2(N-1)*alpha + 2(N-1)/N * S/B = {one:.4g} s in "
                f"Lab 1's ring model (none on one rank).")
        tn = expected
        got_eff = float(eff)
        if not math.isclose(got_eff, exp_eff, rel_tol=1e-9):
            raise CheckFailed(
                f"strong_scaling_efficiency(t1={case['t1']:.4g}, tn={tn:.4g}, n={case['n']}): "
                f"expected {exp_eff:.6g}, got {got_eff:.6g}. Strong-scaling efficiency is "
                f"T1 / (N * T_N) (the speedup T1/T_N divided by N).")
        done.append(f"{case['n']} ranks: T_N {got:.4g} s, efficiency {got_eff:.3g}")
    verified(f"predict_step_time and strong_scaling_efficiency match the ring model on "
             f"{len(done)} cases ({'; '.join(done[:3])})")
