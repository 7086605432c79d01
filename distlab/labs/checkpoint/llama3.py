"""The checkpoint interval at Llama 3's scale: the failure rate the paper reports, and which save
and restart costs keep the time lost under a few percent.

Sources: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv 2407.21783), §3.3.4 and
Table 5: 466 job interruptions (419 unexpected) in a 54-day snapshot of Llama 3 405B's
pre-training on up to 16,384 H100 GPUs. The checkpoint's size is an estimate, said as such:
405e9 parameters, each with mixed-precision Adam's fp32 master weight and two fp32 moments
(Rajbhandari et al. 2020, "ZeRO", §3.1, K = 12); a bf16 copy of the weights is made again from
the master weights. The restart costs are assumptions the lab varies.

Every loss here comes from a ``lost`` function of (tau, delta, restart, mtbf) handed in: the lab
passes the student's own prediction, the tests the course's model.
"""
from __future__ import annotations

import math
from typing import Callable

from distlab.labs.checkpoint.interval import young_period

GPUS = 16_384
DAYS = 54
INTERRUPTIONS = 466
UNEXPECTED = 419
PARAMETERS = 405e9
BYTES_PER_PARAMETER = 12
CHECKPOINT_BYTES = PARAMETERS * BYTES_PER_PARAMETER

Lost = Callable[[float, float, float, float], float]


def job_mtbf(interruptions: int = INTERRUPTIONS) -> float:
    """The job's mean time between interruptions, in seconds."""
    return DAYS * 86400 / interruptions


def gpu_mtbf_years() -> float:
    """What that makes of one GPU's (with its host's share): every GPU fails alike and any one
    failure stops the job, so the job's rate is the sum of the GPUs'."""
    return job_mtbf() * GPUS / (365.25 * 86400)


def plan_row(lost: Lost, save: float, restart: float, mtbf: float | None = None) -> dict:
    """A save of ``save`` seconds at Young's interval, with a restart of ``restart``: the
    interval, the loss (``lost``), and the write speed the save needs, whole and per GPU."""
    mtbf = job_mtbf() if mtbf is None else mtbf
    tau = young_period(save, mtbf)
    return {"save_s": save, "restart_s": restart, "interval_min": tau / 60,
            "lost": lost(tau, save, restart, mtbf),
            "write_GBps": CHECKPOINT_BYTES / save / 1e9,
            "per_gpu_MBps": CHECKPOINT_BYTES / save / GPUS / 1e6}


def largest_save(lost: Lost, target: float, restart: float, mtbf: float | None = None) -> float:
    """The longest save (seconds) that keeps the loss at Young's interval at ``target``; 0 when
    the restarts alone lose more."""
    mtbf = job_mtbf() if mtbf is None else mtbf

    def over(save):
        return lost(young_period(save, mtbf), save, restart, mtbf) > target

    lo, hi = 1e-6, mtbf / 2
    if over(lo):
        return 0.0
    if not over(hi):
        return hi
    for _ in range(200):         # bisection: the loss grows with the save
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
        if hi / lo < 1 + 1e-9:
            break
    return lo


def llama3_table(lost: Lost, saves=(5.0, 30.0, 120.0), restarts=(60.0, 600.0)) -> list[dict]:
    """``plan_row`` for every save and restart."""
    return [plan_row(lost, s, r) for r in restarts for s in saves]
