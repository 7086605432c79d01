"""What Lab 12's Sections 5 and 6 show: a prediction beside the simulated run that measures it,
the Llama 3 figures worked through, and a plan checked on save costs measured on real ranks.
Each takes the student's own functions (a handout has no model to show instead)."""
from __future__ import annotations

from typing import Callable

from distlab.labs.checkpoint import llama3
from distlab.labs.checkpoint.interval import simulate_lost_fraction
from distlab.labs.checkpoint.plans import Problem, simulate_plan
from distlab.labs.tables import format_table

SIM_SEED = 12

# (tau, delta, R, M) in seconds: the prediction's three visible cases, then two where failures
# come every few intervals
MEASURED_CASES = [(3000.0, 60.0, 1200.0, 4 * 86400.0), (1800.0, 30.0, 900.0, 2 * 86400.0),
                  (4800.0, 120.0, 2400.0, 6 * 86400.0), (1800.0, 30.0, 900.0, 12 * 3600.0),
                  (600.0, 60.0, 300.0, 3600.0)]


def _time(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def prediction_beside_simulation(predict: Callable, cases=MEASURED_CASES,
                                 segments: int = 20000) -> str:
    """A table: each case, the prediction, the simulated run's lost fraction and its standard
    error, and how many standard errors apart they are."""
    rows = []
    for tau, delta, restart, mtbf in cases:
        mine = float(predict(tau, delta, restart, mtbf))
        got, error = simulate_lost_fraction(tau, delta, restart, mtbf, segments=segments,
                                            seed=SIM_SEED)
        rows.append({"tau": _time(tau), "delta": _time(delta), "R": _time(restart),
                     "M": _time(mtbf), "predicted": f"{mine:.4f}",
                     "simulated": f"{got:.4f} ± {error:.4f}",
                     "apart (std errors)": f"{(mine - got) / error:+.1f}"})
    return format_table(rows)


def llama3_figures(predict: Callable) -> str:
    """The job's MTBF, then the loss at Young's interval for a few saves and restarts, by
    ``predict``, with the write speed each save needs."""
    head = (f"Llama 3 405B (§3.3.4, Table 5): {llama3.INTERRUPTIONS} interruptions in "
            f"{llama3.DAYS} days on {llama3.GPUS:,} GPUs: the job's MTBF is "
            f"{llama3.job_mtbf() / 3600:.2f} h ({llama3.job_mtbf():.0f} s), one GPU's "
            f"{llama3.gpu_mtbf_years():.1f} years. Checkpoint ~{llama3.CHECKPOINT_BYTES / 1e12:.2f}"
            f" TB (12 bytes per parameter, an estimate).")
    rows = [{"save": _time(r["save_s"]), "restart": _time(r["restart_s"]),
             "Young's interval": _time(60 * r["interval_min"]), "lost": f"{r['lost']:.3f}",
             "write (GB/s)": f"{r['write_GBps']:.0f}",
             "per GPU (MB/s)": f"{r['per_gpu_MBps']:.1f}"} for r in llama3.llama3_table(predict)]
    limits = [f"restart {_time(r)}: at most {llama3.largest_save(predict, t, r):.1f} s of save "
              f"for {t:.0%} lost" for r in (60.0, 300.0) for t in (0.03, 0.05)]
    return "\n".join([head, format_table(rows), *limits])


def measured_problem(costs: dict[str, float], mtbf: float) -> Problem:
    """A design problem from save costs measured on ranks (``save_costs``), failures every
    ``mtbf`` seconds, a restart that is the measured load (the relaunch left out: it is the
    launcher's, not the checkpoint's)."""
    return Problem(mtbf=mtbf, restart=costs["load"], blocking_stall=costs["blocking"],
                   async_stall=costs["async_stall"], async_write=costs["async_write"])


def plan_on_measured(plan: Callable, problem: Problem, checkpoints: int = 20000) -> str:
    """The student's plan for ``problem`` and the simulated run's lost fraction, beside the
    same run at a few other intervals and both modes."""
    tau, mode = plan(*problem.args())
    rows = []
    for m in ("blocking", "async"):
        for factor in (0.5, 1.0, 2.0):
            t = factor * float(tau)
            lost, error = simulate_plan(t, m, problem, checkpoints=checkpoints, seed=SIM_SEED)
            rows.append({"mode": m, "interval": _time(t) + (" (yours)" if factor == 1 and
                                                            m == mode else ""),
                         "simulated lost": f"{lost:.4f} ± {error:.4f}"})
    return f"{problem.shown()}\n" + format_table(rows)
