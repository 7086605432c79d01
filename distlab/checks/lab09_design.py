"""Lab 9's open design exercise (served by ``distlab.checks.lab09``): ``padded_moe_forward(x,
router, experts, num_experts, k, capacity_factor, group) -> (y, keep)``, the expert-parallel
layer with a capacity and **no count exchange**: as GShard (§2.2) and Switch Transformer (§2.2)
do, each rank sends every rank a buffer of a size fixed by (T, k, E, c, h) alone, S = (E/p)·C
rows for each destination (C = ⌈c·T·k/E⌉), zeros where no token came. Graded by its properties,
on real ranks:

- the collective record: exactly two all-to-alls of floating point (dispatch, combine), each of
  the fixed size the exercise's budget states on every rank, and no other collective at all: no
  integer (count or size) exchange, no gather;
- ``keep`` (T, k): every assignment Exercise 3's rule keeps (``reference_keep`` on the rank's
  own tokens) is kept; and on every destination rank (the rank itself included) at most S of
  the rank's tokens have a kept assignment: a row of the fixed buffer carries one token;
- ``y`` (T, h): the plain layer restricted to the student's kept assignments (each assignment's
  gated expert output, summed over the kept ones);
- the figure, on a scale (``checks.common.design_scale``): the assignments dropped, over all
  ranks. The first test's limit is Exercise 3's rule's drops (Hint 3's design: every expert's C
  slots its own, which the first property already implies); the second's, the bar halfway from
  there to the bound: the fewest drops any layer within the properties above can reach
  (``fewest_drops``). The course's solution reaches the bound (tests/test_lab09.py).

Why not the bytes: without a count exchange the buffer's size must hold the worst routing, and
sharing a rank's slots among its experts, one row per token, needs min(T, S) rows for that; at the
graded sizes that is S, the hinted design's. The bytes are the exchange's fixed price; what a
design changes at that price is how many assignments it drops.

The grade reads only the forward (the combine's backward would be the same fixed all-to-all).
Both tests grade one run: the first test's run and figures serve the second (``_RUNS``, a
``common.DesignRuns``).
Visible: the stored problem (2 ranks, default sizes, capacity factor 1.0), references stored in
``data/09_expert_parallel/padded.pt``; hidden: fresh problems, references computed in the judge."""
from __future__ import annotations

import math

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import (Collectives, DesignRuns, design_scale, expect_collectives,
                                   rank_device)
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab09_problems import (LAB, experts_by_rank, layer_of, mine, moe_case, moe_shape,
                                           own_rows)
from distlab.checks.lab09_ranks import SIZE_MISMATCH, _close, _run
from distlab.labs.experts.moe import MoE, reference_keep
from distlab.runtime.per_rank import reference

STORED_FACTOR = 1.0          # the visible test's capacity factor
FLOAT32 = 4
PADDED_HINT = ("Without a count exchange no rank knows how many rows another will send, so every "
               "send must have a size fixed by (T, k, E, c, h) alone: (E/p)·C rows for each "
               "destination rank, zeros where no token came.")


def _layer(ref: dict, experts: int, k: int) -> MoE:
    return layer_of(ref, experts, k)


def _contributions(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """(T, k, h): each assignment's gated expert output, gate_tj · expert_{i_tj}(x_t)."""
    _, gates, idx = moe.route(x)
    out = torch.zeros(*idx.shape, x.shape[1])
    for e, expert in enumerate(moe.experts):
        t, j = (idx == e).nonzero(as_tuple=True)
        if len(t):
            out[t, j] = gates[t, j, None] * expert(x[t])
    return out


def padded_reference(ref: dict, world_size: int, experts: int, k: int, factor: float) -> dict:
    """Every rank's Exercise 3 keep (p T, k), each assignment's gated output (p T, k, h) and the
    scale of drops (hinted, bar, bound)."""
    moe = _layer(ref, experts, k)
    keeps, contribs = [], []
    with torch.no_grad():
        for rank in range(world_size):
            x = mine(ref["x"], rank, world_size)
            keeps.append(reference_keep(moe.route(x)[2], experts, factor))
            contribs.append(_contributions(moe, x))
    keep = torch.cat(keeps)
    scale = drop_scale(ref["idx"], keep, world_size, experts, factor)
    return {"keep": keep, "contrib": torch.cat(contribs),
            "scale": torch.tensor([scale["hinted"], scale["bar"], scale["bound"]],
                                  dtype=torch.float64)}


def padded_set(ref: dict, world_size: int, experts: int, k: int) -> dict:
    """The visible test's references, for ``data/<lab>/padded.pt``."""
    return {"seed": ref["seed"], **padded_reference(ref, world_size, experts, k, STORED_FACTOR)}


def slots(tokens: int, k: int, experts: int, world_size: int, factor: float) -> tuple[int, int]:
    """(C, S): an expert's capacity and the rows a rank sends each destination rank."""
    capacity = math.ceil(factor * tokens * k / experts)
    return capacity, experts // world_size * capacity


def fewest_drops(idx: torch.Tensor, must: torch.Tensor, experts: int, world_size: int,
                 rows: int) -> int:
    """The bound: the fewest of one rank's assignments (``idx`` (T, k)) any layer within the
    contract drops. Destinations are independent (a rank's S rows to d carry only assignments on
    d) and a row carries one token, which serves all that token's assignments on d. The tokens
    with an assignment ``must`` keep (Exercise 3's) take their rows first; the rows left go to the
    tokens with the most assignments on d: no choice of them covers more."""
    dest = idx // (experts // world_size)
    dropped = 0
    for d in range(world_size):
        on_d = (dest == d).sum(1)
        forced = ((dest == d) & must).any(1)
        rest = sorted(on_d[~forced].tolist(), reverse=True)
        dropped += sum(rest[max(0, rows - int(forced.sum())):])
    return dropped


def drop_scale(idx: torch.Tensor, keep: torch.Tensor, world_size: int, experts: int,
               factor: float) -> dict[str, float]:
    """The scale over all ranks (``idx``, ``keep``: (p T, k)): Exercise 3's drops, the bar and the
    bound."""
    tokens, k = idx.shape[0] // world_size, idx.shape[1]
    rows = slots(tokens, k, experts, world_size, factor)[1]
    bound = sum(fewest_drops(mine(idx, r, world_size), mine(keep, r, world_size), experts,
                             world_size, rows) for r in range(world_size))
    return design_scale(float((~keep).sum()), float(bound))


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
                    f"expected {message} (E·C·h·4: (E/p)·C rows of h floats for each of the p "
                    f"ranks). " + PADDED_HINT)]


def _expected(ref: dict, seed, world_size: int, experts: int, k: int, factor: float) -> dict:
    if seed is not None:
        return reference(padded_reference(ref, world_size, experts, k, factor))
    if factor != STORED_FACTOR:
        raise CheckFailed(f"the stored references are for capacity factor {STORED_FACTOR}; pass "
                          f"a seed to check another factor")
    from distlab.checks.stored import load
    return reference(load(LAB, "padded"))


def _check_keep(keep: torch.Tensor, must: torch.Tensor, idx: torch.Tensor, where: str, rank: int,
                experts: int, world_size: int, rows: int) -> None:
    """Exercise 3's kept assignments stay kept; at most ``rows`` tokens kept on each rank."""
    if tuple(keep.shape) != tuple(must.shape):
        raise CheckFailed(f"padded_moe_forward: keep on {where}, rank {rank}, has shape "
                          f"{list(keep.shape)}; expected {list(must.shape)} (T, k) booleans.")
    lost = (must & ~keep).nonzero().tolist()
    if lost:
        t, j = lost[0]
        raise CheckFailed(
            f"padded_moe_forward: keep on {where}, rank {rank}: assignment (t={t}, j={j}) to "
            f"expert {int(idx[t, j])} is dropped ({len(lost)} such), yet Exercise 3's rule keeps "
            f"it: each expert keeps the first C of the rank's assignments, first come first "
            f"served (every token's first choice in token order, then the second choices; "
            f"GShard's Algorithm 1). Every assignment that rule keeps must stay kept.")
    dest = idx // (experts // world_size)
    for d in range(world_size):
        held = int(((dest == d) & keep).any(1).sum())
        if held > rows:
            raise CheckFailed(
                f"padded_moe_forward: keep on {where}, rank {rank}: {held} of its tokens have a "
                f"kept assignment on rank {d}, whose (E/p)·C = {rows} rows from this rank carry "
                f"one token each. A token kept on rank {d} travels there in one of those rows "
                f"(rank {rank}'s own experts included: capacity bounds what each rank's "
                f"experts compute).")


# One run grades both tests: the first test's figures, by submitted function and problem, taken
# by the second (``common.DesignRuns``; a hidden problem's first seed serves the second test's).
_RUNS = DesignRuns()


def _measure(fn, world_size: int, seed, sizes: dict, factor: float) -> dict:
    """Run the student's layer, check every property; return the figures for the verdict."""
    tokens, hidden, experts, k = (sizes[n] for n in ("tokens", "hidden", "experts", "k"))
    ref, case = moe_case(seed, world_size, moe_shape(**sizes))
    expected = _expected(ref, seed, world_size, experts, k, factor)
    capacity, rows = slots(tokens, k, experts, world_size, factor)
    message = experts * capacity * hidden * FLOAT32
    moe = _layer(ref, experts, k)
    dropped = 0
    for backend, out in _run(_padded_on_rank, world_size, f"padded_moe_forward on {case}", fn,
                             own_rows(ref["x"], world_size), moe.router,
                             experts_by_rank(moe, world_size), experts, k, factor,
                             hint_of=_failure_hint):
        where = f"{case}, capacity factor {factor} (C = {capacity}), {out.backend}"
        assert_crossed_as_recorded(out, f"padded_moe_forward on {where}")   # the record is the traffic
        dropped = 0
        for rank, res in enumerate(out):
            expect_collectives(out.comms[rank], f"padded_moe_forward on {where}, rank {rank}",
                               padded_collectives(message),
                               only="dispatch and combine are the only collectives")
            keep = res["keep"].to(torch.bool)
            _check_keep(keep, mine(expected["keep"], rank, world_size),
                        mine(ref["idx"], rank, world_size), where, rank, experts, world_size, rows)
            want = (mine(expected["contrib"], rank, world_size) * keep.unsqueeze(-1)).sum(1)
            _close(res["y"], want, f"padded_moe_forward output on {where}", rank,
                   "y_t = Σ_j gate_tj · expert_{i_tj}(x_t) over the assignments your keep marks "
                   "kept (a token with none kept gets zeros): bring each kept result back.")
            dropped += int((~keep).sum())
    scale = dict(zip(("hinted", "bar", "bound"), expected["scale"].tolist()))
    return {"where": f"{case}, capacity factor {factor} (C = {capacity}, S = {rows} rows per "
                     f"rank)", "dropped": dropped, "total": world_size * tokens * k,
            "scale": scale, "message": message}


def _comparison(fig: dict) -> str:
    s = fig["scale"]
    return (f"{fig['dropped']} of {fig['total']} assignments dropped; Exercise 3's rule (Hint 3's "
            f"design) drops {s['hinted']:g}, the bar {s['bar']:g}, the bound {s['bound']:g}")


def grade_padded(fn, world_size: int = 2, seed: int | None = None, tokens=12, hidden=8, ffn=16,
                 experts=4, k=2, capacity_factor=STORED_FACTOR, level: str = "hinted") -> str:
    """Both tests of the design: the properties, and the drops within ``level`` ("hinted" or
    "bar"); returns the verdict line."""
    sizes = moe_shape(tokens, hidden, ffn, experts, k)
    case = (world_size, seed is None, tuple(sizes.items()), capacity_factor)
    fig = _RUNS.run(fn, case, lambda: _measure(fn, world_size, seed, sizes, capacity_factor),
                    first=level == "hinted")
    limit, name = fig["scale"][level], "budget" if level == "hinted" else "bar"
    if fig["dropped"] > limit:
        why = ("halfway from Exercise 3's rule to the bound; the course's layer reaches it"
               if name == "bar" else "what Exercise 3's rule drops")
        raise CheckFailed(
            f"padded_moe_forward on {fig['where']}: {_comparison(fig)}. This test's limit is the "
            f"{name}, {limit:g} dropped ({why}). On each destination rank, how many of the rows "
            f"you sent it were zeros, while assignments bound for that same rank were dropped?")
    return (f"padded_moe_forward on {fig['where']}: {_comparison(fig)}: within the {name}; two "
            f"all-to-alls of {fig['message']} bytes each, no count exchange, the outputs of your "
            f"kept assignments")
