"""Lab 11's open design, on paper: how low the bubble of a schedule can go when each rank may
hold at most ``k`` microbatches' activations (one stage per rank, ``p`` ranks, ``m``
microbatches, unit times t_F = t_B = t_W = 1, messages free: ``replay``'s convention, where a
microbatch's activations are held from the start of its F to the end of its W, or of its B when
the backward is whole).

Both figures are idle time over compute time, summed over the ranks (``Replay.bubble``, PTD-P's
convention, Narayanan et al. 2021, sec. 2.2); a span of ``T`` units gives ``T / 3m - 1``, since
every rank computes ``3m`` units of it.
"""
from __future__ import annotations

from distlab.labs.pipeline_bubble import budget_bound


def cap_bound(num_ranks: int, num_microbatches: int, max_held: int) -> float:
    """The least bubble any table can have (split backwards or not) under the cap.

    Two floors on the span ``T``. The fill: rank ``p-1`` starts its first forward after the
    ``p-1`` forwards before it and then computes its ``3m`` units, so ``T >= p - 1 + 3m``. Rank
    0's slots: it holds microbatch ``i`` from the start of its F to the end of its W, and in
    between the microbatch goes forward through every rank and its input's gradient comes all
    the way back: ``p`` forwards, ``p`` B's and rank 0's W, in a chain, at least ``2p + 1``
    units. With at most ``k`` held at once, the ``m`` holding intervals split into ``k`` chains
    that never overlap (intervals at most ``k`` deep colour with ``k`` colours), one of them
    ``ceil(m/k)`` intervals long: ``T >= ceil(m/k) (2p + 1)``."""
    p, m, k = num_ranks, num_microbatches, max_held
    span = max(p - 1 + 3 * m, -(-m // k) * (2 * p + 1))
    return span / (3 * m) - 1


def whole_backward_bound(num_ranks: int, num_microbatches: int, max_held: int) -> float:
    """The least bubble of any table whose backwards stay whole (no W: each B costs
    t_B + t_W = 2), under the same cap: Lab 5's bound (``pipeline_bubble.budget_bound``, t_f = 1,
    t_b = 2), turned from a share of the step ``b`` into idle over compute, ``b / (1 - b)``. A
    budget below it needs the split."""
    share = budget_bound(num_ranks, num_microbatches, max_held)
    return share / (1 - share)
