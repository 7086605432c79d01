"""Graded checks of Lab 9, "Expert parallelism".

Exercises, each run on real ranks (2 visible, 4 hidden); rank r holds tokens [r T, (r+1) T) and
experts [r E/p, (r+1) E/p) of one MoE layer (``distlab.labs.experts.moe``):
1. ``dispatch(x, expert_idx, num_experts, group)`` -> ``(recv, plan)``: the tokens this rank's
   experts must process, by one count exchange and one ``all_to_all_single`` with uneven splits.
2. ``moe_forward(x, router, experts, num_experts, k, group)``: dispatch, local experts, combine
   (the reverse all-to-all), gates; its backward, through the ``AllToAll`` autograd function,
   reverses both all-to-alls.
3. ``expert_capacity(tokens, k, num_experts, capacity_factor)`` and ``capacity_mask(expert_idx,
   num_experts, capacity_factor)`` -> ``(keep, dropped_fraction)`` (Switch Transformer §2.2, eq. 3).
4. ``predict_all_to_all_bytes(...)``: the graded prediction (``lab09_prediction``).
5. ``padded_moe_forward(...)``: the open design exercise, a capacity-padded fixed-size
   all-to-all with no count exchange, its dropped assignments graded on a scale in two tests
   (``lab09_design``).
6. ``load_balancing_loss(probs, expert_idx, num_experts)``: Switch Transformer §2.2, eq. (4).

The reference is the plain single-process layer on all p T tokens. Tolerance: atol = rtol = 1e-4
in float32: the ranks compute the same products on the same rows, in other batch groupings (about
1e-6 apart here); a token sent to the wrong expert, or a missing gate, moves values by O(0.1).
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import Collectives, expect_collectives, rank_device, split_phases
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab09_problems import (LAB, SEED, SHAPE, expected_dispatch,  # noqa: F401
                                           experts_by_rank, layer_of, mine, moe_case, moe_problem,
                                           moe_shape, own_rows)
from distlab.checks.lab09_ranks import (ATOL, MISSING_HINT, RTOL, SIZE_MISMATCH,  # noqa: F401
                                        SPLITS_HINT, _close, _run, failure_hint)
from distlab.labs.experts.moe import reference_aux_loss, reference_capacity, reference_keep
from distlab.runtime.per_rank import PerRank, reference

# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
RANK_IMPORTS = ()
GATHERS = {"all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
           "gather", "broadcast", "all_reduce"}
TOKEN_OPS = {"all_to_all_single", "all_to_all"}


def make_references() -> dict[str, dict]:
    """The stored reference sets of Lab 9 (see ``distlab.course.references``): the problem
    (default sizes, 2 ranks), its capacity masks and aux losses (a handout has no reference_*:
    visible tests read these), the plain layer's outputs the lab's figures show, the
    prediction's bytes and the padded layer's references (``lab09_prediction``, ``lab09_design``)."""
    from distlab.checks.lab09_design import padded_set
    from distlab.checks.lab09_prediction import a2a_bytes_set
    moe = moe_problem(SEED, 2, **SHAPE)
    return {"moe": moe,
            "capacity": {"seed": SEED, **_capacity_reference(moe, 2, SHAPE["experts"],
                                                             STORED_FACTOR)},
            "aux_loss": {"seed": SEED, **_aux_reference(moe, 2, SHAPE["experts"], SHAPE["k"])},
            "demos": {"seed": 0, **demo_references()},
            "prediction": a2a_bytes_set(),
            "padded": padded_set(moe, 2, SHAPE["experts"], SHAPE["k"])}


def demo_references() -> dict:
    """What the plain layer computes for the lab's demonstrations (show_routing, measure_traffic,
    ep_dp_step), which the lab's cells show beside the student's layer: a handout has no plain
    layer (``distlab.labs.experts.stored``)."""
    from distlab.labs.experts.demos import ROUTING, routing_output
    from distlab.labs.experts.ep_dp import EP_DP, plain_step
    from distlab.labs.experts.traffic import TRAFFIC, plain_output
    step = plain_step(**EP_DP)
    return {"routing_y": routing_output(**ROUTING), "traffic_y": plain_output(**TRAFFIC),
            **{f"ep_dp_{key}": value for key, value in step.items()}}


def _is_float(c) -> bool:
    return c.dtype.startswith(("float", "bfloat"))


NO_TOKEN_GATHER = Collectives(
    "gather or broadcast of tokens", lambda c: c.op in GATHERS and _is_float(c), 0,
    "Gathering the tokens gives every rank all p·T tokens, p/k times the bytes of the all-to-all "
    "of T·k assignments, and memory that grows with the world size; expert parallelism sends each "
    "token only to the "
    "rank that holds its expert: one all_to_all_single with uneven splits.")


def _count_exchange(experts: int, world_size: int) -> Collectives:
    """One collective of integers (the per-expert counts) before the tokens: at most p·E of them."""
    why = (f"Exchange the per-expert counts once, before the tokens: one all_to_all_single of "
           f"E={experts} integers.")
    return Collectives("integers (the count exchange)", lambda c: not _is_float(c), 1, why,
                       lambda b: b <= world_size * experts * 8,
                       f"more than p·E = {world_size * experts} integers. {why}")


def _token_all_to_alls(count: int, why: str, sent: int | None = None) -> Collectives:
    """``count`` all-to-alls of tokens (floating point), of ``sent`` bytes each where given."""
    return Collectives("all-to-all of tokens", lambda c: _is_float(c) and c.op in TOKEN_OPS,
                       count, why, None if sent is None else (lambda b: b == sent),
                       f"expected {sent}. {why}")


# ---------------------------------------------------------------------------------------------
# Exercise 1: dispatch

def _dispatch_on_rank(rank, world_size, dispatch, x, idx, experts):
    """Rank body: the rank's own tokens ``x`` (T, h) and their experts ``idx`` (T, k); returns
    what the student's dispatch received and planned, compared in the judge."""
    dev = rank_device()
    recv, plan = dispatch(x.to(dev), idx.to(dev), experts, None)
    return {"recv": recv.detach(), "recv_expert": plan.recv_expert,
            "send_splits": [int(n) for n in plan.send_splits],
            "recv_splits": [int(n) for n in plan.recv_splits]}


def check_dispatch(dispatch, world_size: int = 2, seed: int | None = None, tokens=12, hidden=8,
                   ffn=16, experts=4, k=2) -> None:
    """Rank r receives the rows of every token (of every rank) routed to its experts, ordered by
    source rank, local expert, then the source's flat index t·k+j; its plan gives the splits
    and the local expert of each row. Collectives: one count exchange (integers), then exactly
    one all_to_all_single of the T·k sent rows, and no gather of tokens."""
    __tracebackhide__ = True  # noqa: F841
    ref, case = moe_case(seed, world_size, moe_shape(tokens, hidden, ffn, experts, k))
    for backend, out in _run(_dispatch_on_rank, world_size, f"dispatch on {case}", dispatch,
                             own_rows(ref["x"], world_size), own_rows(ref["idx"], world_size),
                             experts):
        where = f"{case}, {out.backend}"
        assert_crossed_as_recorded(out, f"dispatch on {where}")   # the record below is the traffic
        for rank, res in enumerate(out):
            want = expected_dispatch(ref["idx"], ref["x"], experts, world_size, rank)
            sent = k * tokens * hidden * 4
            expect_collectives(out.comms[rank], f"dispatch on {where}, rank {rank}", [
                NO_TOKEN_GATHER, _count_exchange(experts, world_size),
                _token_all_to_alls(1, f"Send this rank's T·k = {k * tokens} rows in exactly one "
                                      f"all_to_all_single ({sent} bytes).", sent)])
            for key in ("send_splits", "recv_splits"):
                _close(res[key], want[key], f"dispatch: plan.{key} on {where}", rank,
                       "send_splits[d]: rows this rank sends to rank d; recv_splits[s]: rows "
                       "it receives from rank s (from the count exchange).")
            _close(res["recv"], want["recv"], f"dispatch: received tokens on {where}", rank,
                   "Rows arrive ordered by source rank, then local expert, then the source's "
                   "t·k+j: sort each rank's assignments by expert (stable) before sending.")
            _close(res["recv_expert"], want["recv_expert"], f"dispatch: plan.recv_expert on {where}",
                   rank, "The local expert (0..E/p-1) of each received row, from the counts.")


# ---------------------------------------------------------------------------------------------
# Exercise 2: the expert-parallel layer, forward and backward

def _layer_on_rank(rank, world_size, moe_forward, x, dy, router, local, experts, k):
    """Rank body: the rank's own tokens ``x`` and upstream gradient ``dy`` (T, h), the router
    (replicated: every rank routes its own tokens) and its own experts ``local``; returns the
    student's output, dL/dx and the gradients by name, compared in the judge."""
    import torch.distributed as dist
    dev = rank_device()
    router, local = router.to(dev), local.to(dev)
    x = x.to(dev).clone().requires_grad_(True)
    y = moe_forward(x, router, local, experts, k, None)
    dist.barrier()
    (y * dy.to(dev)).sum().backward()
    grads = {n: (torch.zeros_like(p) if p.grad is None else p.grad.detach())
             for n, p in local.named_parameters()}
    router = router.weight.grad
    return {"y": y.detach(), "dx": x.grad, "grads": grads,
            "router": None if router is None else router.detach()}


def check_moe_layer(moe_forward, world_size: int = 2, seed: int | None = None, tokens=12,
                    hidden=8, ffn=16, experts=4, k=2, starve: bool = False) -> None:
    """moe_forward(x, router, local_experts, E, k, group): each rank's output and dL/dx equal the
    plain layer's rows of its tokens; each local expert's gradient equals the plain one; the
    router's gradients summed over ranks equal the plain one. Forward: a count exchange and two
    token all-to-alls (dispatch, combine); backward: exactly two token all-to-alls. ``starve``:
    a routing where some rank's experts get no token (that rank must still join the backward)."""
    __tracebackhide__ = True  # noqa: F841
    ref, case = moe_case(seed, world_size, moe_shape(tokens, hidden, ffn, experts, k), starve)
    per = experts // world_size
    moe = layer_of(ref, experts, k)
    for backend, out in _run(_layer_on_rank, world_size, f"moe_forward on {case}", moe_forward,
                             own_rows(ref["x"], world_size), own_rows(ref["dy"], world_size),
                             moe.router, experts_by_rank(moe, world_size), experts, k):
        where = f"{case}, {out.backend}"
        assert_crossed_as_recorded(out, f"moe_forward on {where}")
        for rank, res in enumerate(out):
            _close(res["y"], mine(ref["y"], rank, world_size), f"moe_forward output on {where}",
                   rank, "y_t = Σ_j gate_tj · expert_{i_tj}(x_t): put each combined row back at "
                         "its (t, j) slot and weight it by the gate that chose it.")
        for rank, res in enumerate(out):
            fwd, bwd = split_phases(out.comms[rank], 2, "moe_forward", rank)
            for phase, comms, counts in (("forward", fwd, [_count_exchange(experts, world_size)]),
                                         ("backward", bwd, [])):
                expect_collectives(comms, f"moe_forward on {where}, rank {rank}'s {phase}", [
                    NO_TOKEN_GATHER, *counts, _token_all_to_alls(2, (
                        f"The {phase} issues exactly two token all-to-alls (dispatch and combine"
                        f"{', reversed' if phase == 'backward' else ''}). The backward of an "
                        f"all-to-all is the all-to-all with the splits swapped: write it in "
                        f"AllToAll.backward."))])
            _close(res["dx"], mine(ref["dx"], rank, world_size), f"moe_forward input gradient on {where}",
                   rank, "A token's gradient comes back from its experts' ranks by the reverse "
                         "all-to-all, plus the router's part.")
            for name, got in res["grads"].items():
                i, rest = name.split(".", 1)
                full = f"experts.{rank * per + int(i)}.{rest}"
                want = ref.get(f"grad.{full}")
                _close(got, torch.zeros_like(got) if want is None else want,
                       f"moe_forward: gradient of expert {full} on {where}", rank,
                       "An expert's gradient collects every token routed to it, from all ranks.")
        routers = [res["router"] for res in out]
        if any(r is None for r in routers):
            raise CheckFailed(f"moe_forward on {where}: the router got no gradient on some rank; "
                              f"the gates (router probabilities) must weight the expert outputs.")
        _close(sum(routers), ref["grad.router.weight"],
               f"moe_forward: router gradients summed over ranks on {where}", None,
               "Each rank's router sees its own tokens: the gradients add up over ranks (a DP "
               "all-reduce does that in training); a missing gate weight loses them.")


# ---------------------------------------------------------------------------------------------
# Exercise 3: capacity

CAPACITY_CASES = [(12, 2, 4, 1.0), (10, 2, 8, 1.25), (16, 1, 4, 1.0), (7, 2, 4, 1.5), (64, 2, 8, 2.0)]
STORED_FACTOR = 1.0      # the capacity factor of the stored set (visible tests)


def _capacity_reference(ref: dict, world_size: int, experts: int, factor: float) -> dict:
    """The reference capacities of CAPACITY_CASES and every rank's keep mask (concatenated,
    (p T, k)), from the reference implementations (the judge's, or make_references')."""
    keep = [reference_keep(mine(ref["idx"], r, world_size), experts, factor)
            for r in range(world_size)]
    return {"capacities": torch.tensor([reference_capacity(*c) for c in CAPACITY_CASES]),
            "keep": torch.cat(keep)}


def _capacity_case(ref: dict, seed, world_size: int, experts: int, factor: float) -> dict:
    """The stored capacity references for a visible test (a handout has no reference_keep), or
    fresh ones for a hidden test."""
    if seed is not None:
        return reference(_capacity_reference(ref, world_size, experts, factor))
    if factor != STORED_FACTOR:
        raise CheckFailed(f"the stored references are for capacity factor {STORED_FACTOR}; pass "
                          f"a seed to check another factor")
    from distlab.checks.stored import load
    return reference(load(LAB, "capacity"))


def _capacity_on_rank(rank, world_size, expert_capacity, capacity_mask, idx, experts, factor):
    """Rank body: the rank's own routing ``idx`` (T, k); returns the student's mask, dropped
    fraction and capacities, compared in the judge."""
    keep, dropped = capacity_mask(idx.to(rank_device()), experts, factor)
    return {"keep": keep, "dropped": float(dropped),
            "capacities": [int(expert_capacity(*case)) for case in CAPACITY_CASES]}


def check_capacity(expert_capacity, capacity_mask, world_size: int = 2, seed: int | None = None,
                   tokens=12, hidden=8, ffn=16, experts=4, k=2, capacity_factor=1.0) -> None:
    """expert_capacity = ceil(c·T·k/E) (Switch Transformer §2.2, eq. 3); capacity_mask keeps, per expert, the first
    that many of a rank's assignments (every first choice in token order, then every second) and
    reports the fraction of the T·k assignments dropped."""
    __tracebackhide__ = True  # noqa: F841
    ref, case = moe_case(seed, world_size, moe_shape(tokens, hidden, ffn, experts, k))
    expected = _capacity_case(ref, seed, world_size, experts, capacity_factor)
    for backend, out in _run(_capacity_on_rank, world_size, f"capacity on {case}", expert_capacity,
                             capacity_mask, own_rows(ref["idx"], world_size), experts,
                             capacity_factor):
        where = f"{case}, capacity factor {capacity_factor}, {out.backend}"
        for rank, res in enumerate(out):
            want = [int(c) for c in expected["capacities"]]
            if res["capacities"] != want:
                bad = next(i for i, (a, b) in enumerate(zip(res["capacities"], want)) if a != b)
                t, kk, e, c = CAPACITY_CASES[bad]
                raise CheckFailed(
                    f"expert_capacity(tokens={t}, k={kk}, num_experts={e}, capacity_factor={c}) "
                    f"on rank {rank}: expected {want[bad]}, got {res['capacities'][bad]}. An "
                    f"expert's buffer holds ceil(c·T·k/E) assignments: T tokens make T·k "
                    f"assignments, spread over E experts.")
            keep = mine(expected["keep"], rank, world_size)
            _close(res["keep"].to(torch.bool), keep, f"capacity_mask on {where}", rank,
                   "Fill each expert up to capacity with every token's first choice, in token "
                   "order, then the second choices; drop the rest.")
            _close(torch.tensor(res["dropped"]), 1 - keep.float().mean(),
                   f"capacity_mask dropped fraction on {where}", rank,
                   "The fraction of the T·k assignments that did not fit.")


# ---------------------------------------------------------------------------------------------
# Exercise 4: the load-balancing loss

def _aux_on_rank(rank, world_size, loss_fn, logits, experts, k):
    """Rank body: the router's logits of the rank's own tokens (T, E); returns the student's
    loss and its gradient with respect to the logits, compared in the judge."""
    logits = logits.to(rank_device()).requires_grad_(True)
    probs = torch.softmax(logits, dim=-1)                         # (T, E)
    idx = probs.topk(k, dim=-1).indices                           # (T, k)
    loss = loss_fn(probs, idx, experts)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(f"load_balancing_loss must return a one-element tensor, got {loss!r}")
    loss.reshape(()).backward()
    return {"loss": loss.detach().reshape(()), "grad": logits.grad}


def check_aux_loss(load_balancing_loss, world_size: int = 2, seed: int | None = None,
                   tokens=12, hidden=8, ffn=16, experts=4, k=2) -> None:
    """On each rank's tokens: E · Σ_i f_i P_i (Switch Transformer §2.2, eq. 4), f_i the fraction of
    the T·k assignments to expert i, P_i the mean probability of i; value and gradient with
    respect to the router logits equal the reference's (which is 1 for a uniform router)."""
    __tracebackhide__ = True  # noqa: F841
    ref, case = moe_case(seed, world_size, moe_shape(tokens, hidden, ffn, experts, k))
    if seed is None:                     # visible: stored (a handout has no reference_aux_loss)
        from distlab.checks.stored import load
        expected = reference(load(LAB, "aux_loss"))
    else:
        expected = reference(_aux_reference(ref, world_size, experts, k))
    logits = PerRank([(mine(ref["x"], r, world_size) @ ref["param.router.weight"].T).detach()
                      for r in range(world_size)])
    for backend, out in _run(_aux_on_rank, world_size, f"load_balancing_loss on {case}",
                             load_balancing_loss, logits, experts, k):
        where = f"{case}, {out.backend}"
        for rank, res in enumerate(out):
            hint = ("E · Σ_i f_i · P_i: the factor E makes a uniform router score exactly 1 "
                    "whatever E is (Switch Transformer §2.2); f_i is a count (no gradient).")
            _close(res["loss"], expected["loss"][rank], f"load_balancing_loss value on {where}",
                   rank, hint)
            _close(res["grad"], mine(expected["grad"], rank, world_size),
                   f"load_balancing_loss gradient on {where}", rank, hint)


def _aux_reference(ref: dict, world_size: int, experts: int, k: int) -> dict:
    """Each rank's reference loss (p,) and its gradient with respect to the router logits
    (p T, E), from reference_aux_loss (the judge's, or make_references')."""
    losses, grads = [], []
    for rank in range(world_size):
        logits = (mine(ref["x"], rank, world_size) @ ref["param.router.weight"].T).requires_grad_(True)
        probs = torch.softmax(logits, dim=-1)
        loss = reference_aux_loss(probs, probs.topk(k, dim=-1).indices, experts)
        loss.backward()
        losses.append(loss.detach())
        grads.append(logits.grad)
    return {"loss": torch.stack(losses), "grad": torch.cat(grads)}


# ---------------------------------------------------------------------------------------------
# Exercise 5 (prediction) and Exercise 6 (open design): the capacity-padded all-to-all

def check_predicted_bytes(predict_all_to_all_bytes, seed: int | None = None) -> str:
    """``predict_all_to_all_bytes(tokens, hidden, experts, k, world_size, capacity_factor)``: the
    bytes of one padded dispatch all-to-all, its least padding and its part off the rank, by the
    formulas (``lab09_prediction``)."""
    from distlab.checks.lab09_prediction import grade_a2a_bytes
    return grade_a2a_bytes(predict_all_to_all_bytes, seed)


def check_padded_moe(padded_moe_forward, world_size: int = 2, seed: int | None = None, tokens=12,
                     hidden=8, ffn=16, experts=4, k=2, capacity_factor=1.0) -> str:
    """The open design exercise, its first test: dispatch and combine by one fixed-size all-to-all
    each, no count exchange; every assignment Exercise 3's rule keeps kept, the outputs of the
    kept assignments; drops within Exercise 3's (``lab09_design``). Returns the verdict line:
    the drops beside Exercise 3's, the bar and the bound."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab09_design import grade_padded
    return grade_padded(padded_moe_forward, world_size, seed, tokens, hidden, ffn, experts, k,
                        capacity_factor)


def check_padded_moe_bar(padded_moe_forward, world_size: int = 2, seed: int | None = None,
                         tokens=12, hidden=8, ffn=16, experts=4, k=2,
                         capacity_factor=1.0) -> str:
    """The open design exercise, its second test: as ``check_padded_moe`` (whose run it reuses),
    with the drops within the bar, halfway from Exercise 3's rule to the bound."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab09_design import grade_padded
    return grade_padded(padded_moe_forward, world_size, seed, tokens, hidden, ffn, experts, k,
                        capacity_factor, level="bar")


def padded_scale() -> str:
    """The design's scale for the visible case, as stored (the lab prints it before the tests)."""
    from distlab.checks.stored import load
    hinted, bar, bound = load(LAB, "padded")["scale"].tolist()
    return (f"2 ranks, T = {SHAPE['tokens']}, E = {SHAPE['experts']}, k = {SHAPE['k']}, c = "
            f"{STORED_FACTOR}: {2 * SHAPE['tokens'] * SHAPE['k']} assignments; Exercise 3's rule "
            f"drops {hinted:g} (the first test's limit), the bar {bar:g} (the second's), the "
            f"bound {bound:g}")


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB9_SHIPPED, CourseCode, names  # noqa: E402
COURSE_CODE = dict.fromkeys(["check_dispatch", "check_moe_layer", "check_capacity",
                             "check_aux_loss", "check_predicted_bytes", "check_padded_moe",
                             "check_padded_moe_bar"],
                            CourseCode(forbidden=LAB9_SHIPPED
                                       + names("distlab.checks.lab09_prediction", "_a2a_bytes")
                                       + names("distlab.checks.lab09_design", "padded_reference",
                                             "fewest_drops")))
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
