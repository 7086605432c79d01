"""Schedule tables side by side on paper: each one's bubble, peak activations and messages per
step from ``replay``, as Lab 11's table shows them (the course's tables or a student's beside
torch's own)."""
from __future__ import annotations

from distlab.labs.pipeline.schedules import replay


def messages(table, placement) -> int:
    """Messages one step sends between ranks: an activation for every F whose next stage is on
    another rank, a gradient for every B whose previous stage is (hand-offs between two stages of
    one rank cost none)."""
    last = len(placement) - 1
    count = 0
    for row in table:
        for op, i, s in row:
            nxt = s + 1 if op == "F" and s < last else s - 1 if op == "B" and s > 0 else None
            count += nxt is not None and placement[nxt] != placement[s]
    return count


def compare_tables(schedules: dict, *, t_fwd: float = 1.0, t_bwd: float = 1.0,
                   t_wgt: float = 1.0) -> str:
    """One row per schedule (name -> ``(table, placement)``): stages per rank, the bubble (idle
    over compute, PTD-P's convention), the step's length, the peak activations per rank (in
    stage-microbatches, and in whole microbatches: a stage of a rank with ``v`` stages holds
    ``1/v`` of its layers) and the messages per step. ``t_fwd``, ``t_bwd``, ``t_wgt`` are the
    times of a rank's whole share of the layers (a stage of ``v`` per rank takes ``1/v`` of
    them, so spans compare); a whole backward, where a table does not split it, costs
    ``t_bwd + t_wgt``."""
    head = (f"{'schedule':<32}{'v':>3}{'bubble':>9}{'span':>7}{'peak (stage-mb)':>18}"
            f"{'peak (mb)':>11}{'messages':>10}")
    rows = [head, "-" * len(head)]
    for name, (table, placement) in schedules.items():
        v = len(placement) // len(table)
        r = replay(table, t_fwd=t_fwd / v, t_bwd=t_bwd / v, t_wgt=t_wgt / v, placement=placement)
        peaks = "/".join(str(r.peak[k]) for k in sorted(r.peak))
        rows.append(f"{name:<32}{v:>3}{r.bubble:>9.4f}{r.span:>7g}{peaks:>18}"
                    f"{max(r.peak.values()) / v:>11g}{messages(table, placement):>10}")
    return "\n".join(rows)
