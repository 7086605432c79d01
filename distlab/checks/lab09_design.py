"""Lab 9's open design exercise (served by ``distlab.checks.lab09``): ``padded_moe_forward(x,
router, experts, num_experts, k, capacity_factor, group) -> (y, keep)``, the expert-parallel
layer with a capacity and **no count exchange**: as GShard (§2.2) and Switch Transformer (§2.2)
do, every expert takes exactly C = ⌈c·T·k/E⌉ rows from every rank, kept assignments first come
first served, the overflow dropped, the rest padding. Graded by its properties, on real ranks:

- the collective record: exactly two all-to-alls of floating point (dispatch, combine), each of
  the fixed size Exercise 5's budget states (C rows for every expert, kept or padding) on every
  rank, and no other collective at all: no integer (count or size) exchange, no gather;
- ``keep`` (T, k): the capacity reference's drops (``reference_keep`` on the rank's own tokens);
- ``y`` (T, h): the plain layer restricted to those kept assignments (``combine_reference``).

The grade reads only the forward (the combine's backward would be the same fixed all-to-all).
Visible: the stored problem (2 ranks, default sizes, capacity factor 1.0), references stored in
``data/09_expert_parallel/padded.pt``; hidden: fresh problems, references computed in the judge."""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import Collectives, expect_collectives, rank_device
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab09_problems import (LAB, experts_by_rank, layer_of, mine, moe_case, moe_shape,
                                           own_rows)
from distlab.checks.lab09_ranks import SIZE_MISMATCH, _close, _run
from distlab.labs.experts.moe import MoE, combine_reference, reference_keep
from distlab.runtime.per_rank import reference

STORED_FACTOR = 1.0          # the visible test's capacity factor
FLOAT32 = 4
PADDED_HINT = ("Without a count exchange no rank knows how many rows another will send, so every "
               "send must have a size fixed by (T, k, E, c, h) alone: one slot per (expert, "
               "place in its queue), C slots per expert, zeros where no token came.")


def _layer(ref: dict, experts: int, k: int) -> MoE:
    return layer_of(ref, experts, k)


def padded_reference(ref: dict, world_size: int, experts: int, k: int, factor: float) -> dict:
    """Every rank's capacity drops and kept output, concatenated ((p T, k) and (p T, h))."""
    moe = _layer(ref, experts, k)
    keeps, ys = [], []
    with torch.no_grad():
        for rank in range(world_size):
            x = mine(ref["x"], rank, world_size)
            _, gates, idx = moe.route(x)
            keep = reference_keep(idx, experts, factor)
            keeps.append(keep)
            ys.append(combine_reference(x, gates, idx, keep, moe.experts))
    return {"keep": torch.cat(keeps), "y": torch.cat(ys)}


def padded_set(ref: dict, world_size: int, experts: int, k: int) -> dict:
    """The visible test's references, for ``data/<lab>/padded.pt``."""
    return {"seed": ref["seed"], **padded_reference(ref, world_size, experts, k, STORED_FACTOR)}


def _padded_on_rank(rank, world_size, fn, x, router, local, experts, k, factor):
    """Rank body: the rank's own tokens ``x``, the router (replicated) and its own experts;
    returns the student's (y, keep), compared in the judge."""
    dev = rank_device()
    with torch.no_grad():
        got = fn(x.to(dev), router.to(dev), local.to(dev), experts, k, factor, None)
    try:
        y, keep = got
    except (TypeError, ValueError):
        raise TypeError(f"padded_moe_forward must return (y, keep), got {type(got).__name__}") \
            from None
    return {"y": torch.as_tensor(y).detach().cpu(), "keep": torch.as_tensor(keep).cpu()}


def _failure_hint(text: str) -> str:
    """For ranks whose all-to-all sizes disagreed: the fixed size is the whole point."""
    return PADDED_HINT if "all_to_all" in text and any(m in text for m in SIZE_MISMATCH) else ""


def _is_float(c) -> bool:
    return c.dtype.startswith(("float", "bfloat"))


def padded_collectives(message: int) -> list[Collectives]:
    """What one rank's forward may issue: no integers, no gather, two all-to-alls of ``message``
    bytes."""
    return [
        Collectives("integer collectives (a count or size exchange)", lambda c: not _is_float(c),
                    0, "Padding to the capacity exists to make the count exchange unnecessary: "
                       "drop it. " + PADDED_HINT),
        Collectives("gather, broadcast or all-reduce of tokens",
                    lambda c: c.op not in ("all_to_all", "all_to_all_single"), 0,
                    "Tokens travel by all-to-all only, to the rank of their expert."),
        Collectives("all-to-all of tokens", lambda c: True, 2,
                    "One fixed-size all-to-all dispatches, one brings the results back.",
                    lambda b: b == message,
                    f"expected {message} (E·C·h·4: C slots for each of the E experts). "
                    + PADDED_HINT)]


def grade_padded(fn, world_size: int = 2, seed: int | None = None, tokens=12, hidden=8, ffn=16,
                 experts=4, k=2, capacity_factor=STORED_FACTOR) -> None:
    ref, case = moe_case(seed, world_size, moe_shape(tokens, hidden, ffn, experts, k))
    if seed is not None:
        expected = reference(padded_reference(ref, world_size, experts, k, capacity_factor))
    elif capacity_factor != STORED_FACTOR:
        raise CheckFailed(f"the stored references are for capacity factor {STORED_FACTOR}; pass "
                          f"a seed to check another factor")
    else:
        from distlab.checks.stored import load
        expected = reference(load(LAB, "padded"))
    capacity = math.ceil(capacity_factor * tokens * k / experts)
    message = experts * capacity * hidden * FLOAT32
    moe = _layer(ref, experts, k)
    for backend, out in _run(_padded_on_rank, world_size, f"padded_moe_forward on {case}", fn,
                             own_rows(ref["x"], world_size), moe.router,
                             experts_by_rank(moe, world_size), experts, k, capacity_factor,
                             hint_of=_failure_hint):
        where = f"{case}, capacity factor {capacity_factor} (C = {capacity}), {out.backend}"
        assert_crossed_as_recorded(out, f"padded_moe_forward on {where}")   # the record is the traffic
        for rank, res in enumerate(out):
            expect_collectives(out.comms[rank], f"padded_moe_forward on {where}, rank {rank}",
                               padded_collectives(message),
                               only="dispatch and combine are the only collectives")
            keep = mine(expected["keep"], rank, world_size)
            _close(res["keep"].to(torch.bool), keep, f"padded_moe_forward: keep on {where}", rank,
                   "Each expert keeps at most C of this rank's assignments, first come first "
                   "served: every token's first choice in token order, then the second choices "
                   "(GShard's Algorithm 1); True for a kept assignment.")
            _close(res["y"], mine(expected["y"], rank, world_size),
                   f"padded_moe_forward output on {where}", rank,
                   "y_t = Σ_j gate_tj · expert_{i_tj}(x_t) over the kept assignments only (a "
                   "token with none kept gets zeros): bring each kept row back from its slot.")
