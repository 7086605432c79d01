"""Graded checks of Lab 10, "Context parallelism".

Exercises (rank r holds the tokens at ``positions[r]`` of every sequence; 2 ranks visible, 4
hidden; float64 against plain attention on one process, ``distlab.labs.context.dense``):
1. ``merge_partials(out_a, lse_a, out_b, lse_b)`` -> ``(out, lse)``: the online softmax.
2. ``ring_attention(q, k, v, positions, group)`` -> ``(out, lse)``: Ring Attention's forward; K/V
   go to the right neighbour with isend/irecv.
3. ``ring_attention_backward(dout, q, k, v, out, lse, positions, group)`` -> ``(dq, dk, dv)``.
4. ``causal_layout(seq_len, world_size)`` -> positions (p, s/p): a short ring critical path,
   graded on a scale (``lab10_layout``, with the prediction before it).
5. ``ulysses_attention(q, k, v, group, causal)`` -> out: all-to-all to head shards and back.
The measurements' graded prediction and planner question are ``lab10_plan``'s, served from here
(``check_ring_bytes_prediction``, ``check_cp_degree``).

Tolerance: atol = rtol = 1e-9 in float64 (correct answers agree to about 1e-14).
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.common import describe_comms, rank_device, split_phases
from distlab.checks.crossed import assert_crossed_as_recorded
from distlab.checks.lab10_watch import RingWatch, refusal
from distlab.checks.lab10_problems import (BACKWARD_EXPECTED, FORWARD_EXPECTED,  # noqa: F401
                                           LAB, MERGE_CASES, SEED, SHAPE, at, context_problem,
                                           layouts, with_expected, merge_problem, problem_case,
                                           rank_tokens, shape_of)
from distlab.checks.rank_failures import ranks_failed
from distlab.checks.ranks import run_each_backend
from distlab.runtime.outcome import DistributedError
from distlab.runtime.per_rank import PerRank, reference

RANK_IMPORTS = ()
ATOL = RTOL = 1e-9
P2P = {"isend", "irecv"}
ALL_TO_ALL = {"all_to_all", "all_to_all_single"}


def make_references() -> dict[str, dict]:
    """The stored sets of Lab 10: the problem at the default sizes with plain attention's results
    (visible ring and Ulysses tests), the merge cases built from it, the demonstrations' plain
    results (causal output; a projection's weight gradient), and ``lab10_plan``'s sets (the
    measurements, the prediction, the planner)."""
    from distlab.labs.context.demos import (DEMO, GRAD_DEMO, demo_problem, grad_problem,
                                            plain_weight_grad)
    from distlab.labs.context.dense import dense_attention
    problem = context_problem(SEED, **SHAPE)
    demo, grad = demo_problem(0, **DEMO), grad_problem(1, **GRAD_DEMO)
    demo["causal.out"] = dense_attention(demo["q"], demo["k"], demo["v"], True)[0]
    demo.update({f"grad.{key}": t for key, t in grad.items()})
    demo["grad.dw"] = plain_weight_grad(dense_attention, grad, GRAD_DEMO["heads"])
    from distlab.checks.lab10_layout import penalty_prediction_set
    return {**lab10_plan.make_references(), "penalty_prediction": penalty_prediction_set(),
            "attention": problem,
            "merge": {"seed": SEED, **merge_problem(problem)}, "demos": {"seed": 0, **demo}}


def _close(got, expected, what: str, rank, hint: str = "") -> None:
    assert_close(got, expected, what=what, rank=rank, atol=ATOL, rtol=RTOL, hint=hint)


def _run(fn, world_size: int, what: str, *args):
    __tracebackhide__ = True  # noqa: F841
    try:
        runs = run_each_backend(fn, world_size, *args)
    except DistributedError as err:
        raise ranks_failed(what, err, "") from None
    for backend, out in runs:   # every check run here grades the record: it must be the traffic
        assert_crossed_as_recorded(out, f"{what}, {out.backend}")
    return runs


# ---------------------------------------------------------------------------------------------
# Exercise 1: merging partial attention

def check_merge(merge_partials, seed: int | None = None, batch=2, heads=4, seq=16, dim=4) -> None:
    """merge_partials(out_a, lse_a, out_b, lse_b) equals attention over both blocks, out and
    lse, for the cases of ``MERGE_CASES`` (fully masked rows: lse = -inf, out = 0; scores near
    1000, where exp overflows float64)."""
    __tracebackhide__ = True  # noqa: F841
    if seed is None:
        if shape_of(batch, heads, seq, dim) != SHAPE:
            raise CheckFailed("the stored references are for the default sizes; pass a seed")
        from distlab.checks.stored import load
        cases, where = load(LAB, "merge"), "the stored inputs"
    else:
        cases = merge_problem(context_problem(seed, batch, heads, seq, dim))
        where = f"fresh inputs (seed {seed})"
    for i, name in enumerate(MERGE_CASES):
        c = {key.split(".", 1)[1]: t for key, t in cases.items() if key.startswith(f"{i}.")}
        c.update(reference({key: c[key] for key in ("out_want", "lse_want")}))
        got = merge_partials(c["out_a"], c["lse_a"], c["out_b"], c["lse_b"])
        if not (isinstance(got, tuple) and len(got) == 2):
            raise CheckFailed(f"merge_partials must return (out, lse), got {type(got).__name__}")
        hint = {"causal halves": "A query whose keys in one block are all masked has lse = -inf "
                                 "and out = 0 there: its weight exp(lse - lse_new) must be 0.",
                "both blocks masked": "Both blocks masked: return out = 0 and lse = -inf (not "
                                      "nan): -inf - (-inf) is nan, so pick a finite reference "
                                      "where both are -inf.",
                "large logits": "exp(1000) is inf in float64: never exponentiate an lse itself. "
                                "Subtract the larger lse first (exp(lse_a - m), m = max(lse_a, "
                                "lse_b)), as the online softmax does."}[name]
        _close(got[1], c["lse_want"], f"merge_partials: lse, case {name!r} on {where}", None, hint)
        _close(got[0], c["out_want"], f"merge_partials: out, case {name!r} on {where}", None, hint)


# ---------------------------------------------------------------------------------------------
# Exercises 2 and 3: ring attention, forward and backward

def _ring_forward_on_rank(rank, world_size, ring_attention, inputs, cases):
    """Rank body: the rank's own q, k, v per case in ``inputs``; returns what the student's
    ring_attention made (and what the ring watch saw), compared in the judge."""
    import torch.distributed as dist
    dev = rank_device()
    results = []
    for (q, k, v), (positions, causal) in zip(inputs, cases):
        q, k, v = q.to(dev), k.to(dev), v.to(dev)
        with torch.no_grad(), RingWatch() as watch:
            out, lse = ring_attention(q, k, v, positions if causal else None, None)
        dist.barrier()
        results.append({"out": out, "lse": lse, "largest": (watch.numel, watch.shape),
                        "received": watch.most_received})
    return results


def _ring_backward_on_rank(rank, world_size, backward, inputs, cases):
    """Rank body: per case the rank's own dout, q, k, v and its shard of the forward's out and
    lse (inputs of the exercise's interface); returns the student's (dq, dk, dv)."""
    import torch.distributed as dist
    dev = rank_device()
    results = []
    for tensors, (positions, causal) in zip(inputs, cases):
        q, k, v, dout, out, lse = (t.to(dev) for t in tensors)
        with torch.no_grad():
            grads = backward(dout, q, k, v, out, lse, positions if causal else None, None)
        dist.barrier()
        results.append(grads)
    return results


def _cases(problem, world_size: int) -> list[tuple[str, torch.Tensor, bool]]:
    """(description, positions, causal): not causal on the contiguous split; causal on it and
    on a random permutation of the positions."""
    split = layouts(problem, world_size)
    contiguous = split["contiguous split"]
    return [("not causal, contiguous split", contiguous, False),
            *((f"causal, {name}", positions, True) for name, positions in split.items())]


def _expect_ring(comms, rank: int, p: int, sent, what: str, wanted: str) -> None:
    """Only isend/irecv, every send to rank+1 mod p and every receive from rank-1 mod p, and the
    bytes sent within ``sent`` (a (low, high) pair)."""
    right, left = (rank + 1) % p, (rank - 1) % p
    calls = [c for c in comms if c.op != "barrier"]
    other = [c for c in calls if c.op not in P2P]
    if other:
        raise CheckFailed(f"{what}: rank {rank} called {describe_comms(other)}. A ring moves "
                          f"blocks only between neighbours, with dist.isend / dist.irecv (or "
                          f"dist.batch_isend_irecv): asynchronous, so that the next block is in "
                          f"flight while the current one computes, and no rank ever holds every "
                          f"block.")
    for c in calls:
        want = right if c.op == "isend" else left
        if c.peer != want:
            raise CheckFailed(f"{what}: rank {rank}'s {c.describe()}; in a ring rank r sends to "
                              f"its right neighbour (r+1) mod p = {right} and receives from its "
                              f"left one (r-1) mod p = {left}.")
    for op in ("isend", "irecv"):
        moved = sum(c.bytes for c in calls if c.op == op)
        if not sent[0] <= moved <= sent[1]:
            raise CheckFailed(f"{what}: rank {rank}'s {op} calls moved {moved} bytes in all; "
                              f"expected {wanted}. It issued: {describe_comms(calls)}.")


def check_ring_forward(ring_attention, world_size: int = 2, seed: int | None = None, batch=2,
                       heads=4, seq=16, dim=4) -> None:
    """ring_attention(q, k, v, positions, group) -> (out, lse) of this rank's queries over the
    whole sequence: equal to plain attention (not causal; causal on a contiguous split and on a
    random permutation). Record: only isend/irecv, to rank+1 and from rank-1 mod p, the bytes
    of Exercise 2's contract (the lab's prediction before it). Memory: no tensor larger than
    a score block (b·h·(s/p)²) or a stacked K/V block (2·b·h·(s/p)·d), and at most two received
    K/V blocks (2·2·B bytes) alive whenever a receive starts (the current one and the next)."""
    __tracebackhide__ = True  # noqa: F841
    problem, case = problem_case(seed, world_size, shape_of(batch, heads, seq, dim))
    problem = with_expected(problem, FORWARD_EXPECTED)
    cases = _cases(problem, world_size)
    run_cases = [(pos, causal) for _, pos, causal in cases]
    n = seq // world_size
    block = batch * heads * n * dim * 8
    limit = batch * heads * n * max(n, 2 * dim)
    for backend, out in _run(_ring_forward_on_rank, world_size, f"ring_attention on {case}",
                             ring_attention, rank_tokens(problem, run_cases, world_size, "qkv"),
                             run_cases):
        where = f"{case}, {out.backend}"
        for rank, results in enumerate(out):
            phases = split_phases(out.comms[rank], len(cases) + 1, "ring_attention", rank)
            for (name, positions, causal), res, comms in zip(cases, results, phases):
                what = f"ring_attention ({name}) on {where}"
                tag = "causal" if causal else "full"
                _expect_ring(comms, rank, world_size, ((world_size - 1) * 2 * block,) * 2, what,
                             f"(p-1)·2·B = {world_size - 1}·2·{block}: K and V, p-1 times")
                numel, shape = res["largest"]
                if numel > limit:
                    raise CheckFailed(f"{what}: rank {rank} made a tensor of shape {list(shape)} "
                                      f"({numel} elements); the largest allowed is {limit} (a "
                                      f"score block b·h·(s/p)² or a stacked K/V block). Compute "
                                      f"one block of scores at a time, against the K/V block "
                                      f"the rank holds, and merge.")
                if res["received"] > 2 * 2 * block:
                    raise CheckFailed(f"{what}: rank {rank} held {res['received']} bytes of "
                                      f"received K/V at once; at most two blocks' worth (2·2·B = "
                                      f"{4 * block}) are allowed: the one being computed and the "
                                      f"one in flight. Drop a block once it is computed and "
                                      f"passed on, and the requests once waited for (a "
                                      f"finished request still holds the tensors it moved).")
                mine = positions[rank]
                hint = ("Each step attends the rank's queries to the block it holds, masked by "
                        "that block's positions (positions[source rank]), and merges with "
                        "merge_partials.")
                _close(res["lse"], at(problem[f"{tag}.lse"], mine), f"{what}: lse", rank, hint)
                _close(res["out"], at(problem[f"{tag}.out"], mine), f"{what}: out", rank, hint)


def check_ring_backward(ring_attention_backward, world_size: int = 2, seed: int | None = None,
                        batch=2, heads=4, seq=16, dim=4) -> None:
    """ring_attention_backward(dout, q, k, v, out, lse, positions, group) -> (dq, dk, dv) of this
    rank's tokens, equal to plain attention's gradients (same cases as the forward). Record:
    only isend/irecv, to rank+1 and from rank-1 mod p: K/V p-1 times and dK/dV p-1 or p times,
    between 4(p-1)·B and (4p-2)·B bytes sent per rank."""
    __tracebackhide__ = True  # noqa: F841
    problem, case = problem_case(seed, world_size, shape_of(batch, heads, seq, dim))
    problem = with_expected(problem, BACKWARD_EXPECTED)
    cases = _cases(problem, world_size)
    run_cases = [(pos, causal) for _, pos, causal in cases]
    block = batch * heads * (seq // world_size) * dim * 8
    low, high = 4 * (world_size - 1) * block, (4 * world_size - 2) * block
    for backend, out in _run(_ring_backward_on_rank, world_size,
                             f"ring_attention_backward on {case}", ring_attention_backward,
                             rank_tokens(problem, run_cases, world_size,
                                       ("q", "k", "v", "dout", "{tag}.out", "{tag}.lse")), run_cases):
        where = f"{case}, {out.backend}"
        for rank, results in enumerate(out):
            phases = split_phases(out.comms[rank], len(cases) + 1, "ring_attention_backward", rank)
            for (name, positions, causal), grads, comms in zip(cases, results, phases):
                what = f"ring_attention_backward ({name}) on {where}"
                _expect_ring(comms, rank, world_size, (low, high), what,
                             f"between 4(p-1)·B = {low} and (4p-2)·B = {high}: K/V p-1 times, "
                             f"dK/dV p-1 or p times (B = {block})")
                if not (isinstance(grads, (tuple, list)) and len(grads) == 3):
                    raise CheckFailed(f"{what}: return (dq, dk, dv), got {type(grads).__name__}")
                tag = "causal" if causal else "full"
                for name_, got in zip(("dq", "dk", "dv"), grads):
                    _close(got, at(problem[f"{tag}.{name_}"], positions[rank]), f"{what}: {name_}",
                           rank, "dK and dV of a block collect a part from every rank's queries: "
                                 "they travel around the ring with K and V, and after the last "
                                 "step one more hop brings them to the rank that owns the block."
                           if name_ != "dq" else
                           "dq = Σ over blocks of dS·K/√d, dS = P∘(dP - rowsum(dout∘out)), "
                           "P = exp(S - lse) with the whole row's lse.")


# ---------------------------------------------------------------------------------------------
# Exercise 4: the causal layout (the open design exercise, on a scale) and its prediction
# (``lab10_layout``: the judge serves only this module's check_* functions)

def check_causal_layout(causal_layout, sizes=((2, 64),)) -> str:
    """causal_layout(seq_len, world_size) -> positions (p, s/p) for each (world_size, seq_len):
    every position once, a ring critical path at most the hinted design's; returns the figures."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab10_layout import grade_causal_layout
    return grade_causal_layout(causal_layout, sizes, "hinted")


def check_causal_layout_better(causal_layout, sizes=((4, 64),)) -> str:
    """The same, the critical path at most halfway from the hinted design's to the bound."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab10_layout import grade_causal_layout
    return grade_causal_layout(causal_layout, sizes, "bar")


def check_penalty_prediction(predict_contiguous_penalty, seed: int | None = None) -> str:
    """predict_contiguous_penalty(world_size): the contiguous split's penalty (lab10_layout)."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab10_layout import grade_penalty_prediction
    return grade_penalty_prediction(predict_contiguous_penalty, seed)


# ---------------------------------------------------------------------------------------------
# Exercise 5: Ulysses

def _ulysses_on_rank(rank, world_size, ulysses_attention, qkv):
    """Rank body: the rank's own q, k, v (the contiguous split); returns the student's outputs
    (not causal, causal) and what a call with p+1 heads raised, compared in the judge."""
    import torch.distributed as dist
    dev = rank_device()
    q, k, v = (t.to(dev) for t in qkv)
    results = {}
    for causal in (False, True):
        with torch.no_grad():
            results[causal] = ulysses_attention(q, k, v, None, causal)
        dist.barrier()
    bad = [t[:, :1].expand(-1, world_size + 1, -1, -1).contiguous() for t in (q, k, v)]
    results["refused"] = refusal(ulysses_attention, bad)
    return results


def check_ulysses(ulysses_attention, world_size: int = 2, seed: int | None = None, batch=2,
                  heads=4, seq=16, dim=4) -> None:
    """ulysses_attention(q, k, v, group, causal) -> out (b, h, s/p, d) on the contiguous split,
    equal to plain attention (not causal, causal). Record per call: only all-to-alls, 4·B bytes
    in all (q, k and v into head shards, separately or fused, and out back; B = b·h·(s/p)·d·8),
    the last one B bytes (the return). With p+1 heads it raises ValueError naming the heads."""
    __tracebackhide__ = True  # noqa: F841
    problem, case = problem_case(seed, world_size, shape_of(batch, heads, seq, dim))
    problem = with_expected(problem, ("full.out", "causal.out"))
    if heads % world_size:
        raise CheckFailed(f"{heads} heads over {world_size} ranks: choose divisible sizes")
    n = seq // world_size
    block = batch * heads * n * dim * 8
    contiguous = [(layouts(problem, world_size)["contiguous split"], False)]
    qkv = PerRank(rank_inputs[0] for rank_inputs in rank_tokens(problem, contiguous, world_size,
                                                              "qkv").values)
    for backend, out in _run(_ulysses_on_rank, world_size, f"ulysses_attention on {case}",
                             ulysses_attention, qkv):
        where = f"{case}, {out.backend}"
        for rank, res in enumerate(out):
            phases = split_phases(out.comms[rank], 3, "ulysses_attention", rank)
            for causal, comms in zip((False, True), phases):
                what = f"ulysses_attention ({'causal' if causal else 'not causal'}) on {where}"
                _expect_ulysses(comms, rank, block, what)
                _close(res[causal], problem[f"{'causal' if causal else 'full'}.out"][:, :, rank * n:(rank + 1) * n],
                       f"{what}: out", rank,
                       "After the first all-to-all a rank holds h/p heads of the whole sequence, "
                       "in position order: plain attention on them, then the reverse all-to-all.")
            kind, message = res["refused"]
            if kind != "ValueError" or str(world_size + 1) not in message \
                    or "head" not in message.lower():
                got = {"ValueError": f"a ValueError that does not name them: {message!r}",
                       "collective": "a collective called first (it would hang or fail the "
                                     "ranks)", "no error": "no error"}.get(
                    kind, f"{kind}: {message!r:.200}")
                raise CheckFailed(
                    f"{world_size + 1} heads over {world_size} ranks: raise ValueError, saying how "
                    f"many heads there are ({world_size + 1}), on which rank and what to do, before "
                    f"any collective. Rank {rank} gave {got}.")


def _expect_ulysses(comms, rank: int, block: int, what: str) -> None:
    calls = [c for c in comms if c.op != "barrier"]
    other = [c for c in calls if c.op not in ALL_TO_ALL]
    why = (f"Ulysses sends q, k and v to head shards (3·B = {3 * block} bytes, in one all-to-all "
           f"or three) and the output back to sequence shards (B = {block} bytes, one "
           f"all-to-all, the last).")
    if other:
        raise CheckFailed(f"{what}: rank {rank} called {describe_comms(other)}; only all-to-alls "
                          f"are allowed. {why}")
    moved = sum(c.bytes for c in calls)
    if moved != 4 * block or not calls or calls[-1].bytes != block:
        raise CheckFailed(f"{what}: rank {rank} issued {describe_comms(calls)}: {moved} bytes; "
                          f"expected 4·B = {4 * block}, the last all-to-all B. {why}")


# ---------------------------------------------------------------------------------------------
# The measurements' graded prediction and planner question (``lab10_plan``: the judge serves only
# this module's check_* functions)

def check_ring_bytes_prediction(predict_ring_bytes, seed: int | None = None) -> str:
    """predict_ring_bytes(seq_len, world_size, q_heads, kv_heads, head_dim, batch, itemsize): the
    bytes one rank sends per ring forward (``lab10_plan``)."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab10_plan import grade_ring_prediction
    return grade_ring_prediction(predict_ring_bytes, seed)


def check_cp_degree(smallest_cp, seed: int | None = None) -> str:
    """smallest_cp(model, job, tp, pp, dp, gpu_mem_gb): the planner's smallest fitting CP degree
    (``lab10_plan``)."""
    __tracebackhide__ = True  # noqa: F841
    from distlab.checks.lab10_plan import grade_cp_degree
    return grade_cp_degree(smallest_cp, seed)


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import CourseCode, names  # noqa: E402
ANSWERS = "distlab.labs.context.answers"
LAB10_SHIPPED = (names(ANSWERS, "merge_partials", "ring_attention", "ring_attention_backward",
                       "block_grads", "exchange", "causal_layout", "ulysses_attention",
                       "_all_to_all", "_neighbours", "_wait")
                 + names("distlab.labs.context.dense", "dense_attention"))
COURSE_CODE = dict.fromkeys(["check_merge", "check_ring_forward", "check_ring_backward",
                             "check_causal_layout", "check_causal_layout_better", "check_ulysses"],
                            CourseCode(forbidden=LAB10_SHIPPED))
from distlab.checks import lab10_plan  # noqa: E402
COURSE_CODE.update(dict.fromkeys(["check_ring_bytes_prediction", "check_cp_degree"],
                                 CourseCode(forbidden=lab10_plan.PLAN_SHIPPED)))
from distlab.checks import lab10_layout  # noqa: E402
COURSE_CODE["check_penalty_prediction"] = CourseCode(forbidden=lab10_layout.LAYOUT_SHIPPED)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
