"""Lab 4's scaling exercise: predict a tensor-parallel block's step time on N ranks from Lab 1's
ring model, and compare it with the measurement (strong scaling: the same problem on more ranks).

Model. A transformer block split over N ranks computes 1/N of the dense block's work, plus the
block's collectives (Megatron-LM, Shoeybi et al. 2019, sec. 3), each costed by Lab 1's ring model,
with no overlap of communication and compute. The model's formula is the student's to build in
Exercise 7 (the reference, ``reference_predicted_step``, is withheld from the handout); the
strong-scaling efficiency is 1 when every added rank pays for itself.
"""
from __future__ import annotations

import math

import torch

ALL_REDUCES_PER_STEP = 4


def ring_all_reduce_time(n: int, nbytes: float, alpha: float, bandwidth: float) -> float:
    """Lab 1's ring model: 2(n-1) alpha + 2(n-1)/n S/B (0 on one rank)."""
    return 0.0 if n == 1 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bandwidth


def reference_predicted_step(t1: float, n: int, alpha: float, bandwidth: float, batch: int,
                             seq: int, hidden: int, bytes_per_element: int = 4) -> float:
    nbytes = batch * seq * hidden * bytes_per_element
    return t1 / n + ALL_REDUCES_PER_STEP * ring_all_reduce_time(n, nbytes, alpha, bandwidth)


def reference_strong_scaling_efficiency(t1: float, tn: float, n: int) -> float:
    return t1 / (n * tn)


def cases(seed: int, count: int = 10) -> list[dict]:
    """Random (T1, N, alpha, B, b, s, h) cases, as a lab might measure them."""
    g = torch.Generator().manual_seed(seed)

    def uniform(lo, hi):
        return float(torch.empty(1, dtype=torch.float64).uniform_(lo, hi, generator=g))
    out = []
    for _ in range(count):
        out.append({"t1": math.exp(uniform(math.log(1e-4), math.log(1.0))),
                    "n": int(torch.randint(1, 9, (1,), generator=g)),
                    "alpha": math.exp(uniform(math.log(1e-6), math.log(1e-3))),
                    "bandwidth": math.exp(uniform(math.log(1e8), math.log(3e11))),
                    "batch": int(torch.randint(1, 9, (1,), generator=g)),
                    "seq": int(2 ** int(torch.randint(5, 12, (1,), generator=g))),
                    "hidden": int(2 ** int(torch.randint(6, 14, (1,), generator=g)))})
    return out


def link_fit(world_sizes=(2, 4), max_bytes: int = 1 << 19) -> tuple[float, float]:
    """Lab 1's ring model fitted on this machine's all-reduce (gloo or NCCL) on 2 and 4 ranks:
    (alpha per ring step, bandwidth), nccl-tests' 5 warm-up and 20 timed calls per size."""
    from distlab.labs.collectives import reference_ring_fit, sweep
    rows = []
    for n in world_sizes:
        rows += sweep(world_size=n, ops=("all_reduce",), max_bytes=max_bytes, step=8)
    alpha, bandwidth = reference_ring_fit([r["world_size"] for r in rows],
                                          [r["nbytes"] for r in rows], [r["seconds"] for r in rows])
    print(f"ring model of this machine's all_reduce ({', '.join(map(str, world_sizes))} ranks): "
          f"alpha = {alpha * 1e6:.1f} us per step, B = {bandwidth / 1e9:.3f} GB/s")
    return alpha, bandwidth


def prediction_table(rows: list[dict], predict, efficiency, alpha: float, bandwidth: float,
                     batch: int, seq: int, hidden: int) -> list[dict]:
    """Predicted against measured T_N and strong-scaling efficiency, for the rows of
    ``distlab.labs.attention.scaling_table`` (the first row is the dense block, N = 1)."""
    t1 = float(rows[0]["ms per step"]) / 1e3
    out = []
    print(f"{'N':>3}{'T_N measured ms':>18}{'T_N predicted ms':>18}{'efficiency measured':>21}"
          f"{'predicted':>11}")
    for row in rows:
        n, measured = int(row["ranks"]), float(row["ms per step"]) / 1e3
        predicted = float(predict(t1, n, alpha, bandwidth, batch, seq, hidden))
        r = {"n": n, "measured_s": measured, "predicted_s": predicted,
             "efficiency_measured": float(efficiency(t1, measured, n)),
             "efficiency_predicted": float(efficiency(t1, predicted, n))}
        out.append(r)
        print(f"{n:>3}{measured * 1e3:>18.2f}{predicted * 1e3:>18.2f}"
              f"{r['efficiency_measured']:>21.2f}{r['efficiency_predicted']:>11.2f}")
    return out
