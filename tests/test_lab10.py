"""Lab 10, context parallelism: the checks pass the solution on 2 and 4 ranks, each planted mistake
loses exactly its own test (directly, and through the grader), and the numbers the lab states
come from code checked here.

Wrong submissions are made from the solution's own cells by a textual edit (never a hand-copied
notebook), so they stay in step with the lab.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distlab.checks import lab10
from distlab.checks.assertions import VERDICT_CHARS, CheckFailed
from distlab.course import solutions
from distlab.labs import context
from distlab.labs.context import answers
from distlab.runtime import wire
from submissions import unrecorded
from check_verdicts import verdicts  # tests/check_verdicts.py

LAB = "10_context_parallel"
SOURCE = Path(__file__).resolve().parents[1] / f"solutions/{LAB}/{LAB}.py"
HIDDEN = dict(batch=1, heads=4, seq=32, dim=16)

# (name, grade_id of the solution cell, old text, new text, the test it must lose: one, or a
# tuple where one mistake fails a scale's every step)
MISTAKES = [
    ("merge_without_max_subtraction", "merge",
     "    m = torch.maximum(lse_a, lse_b)\n",
     "    m = torch.zeros_like(lse_a)   # no max subtracted: exp(lse) itself\n",
     "test_merge"),
    ("ring_sends_to_the_wrong_neighbour", "ring_forward",
     "            incoming, requests = exchange(kv, right, left, group)     # the next block in flight",
     "            incoming, requests = exchange(kv, left, right, group)     # the next block in flight",
     "test_ring_forward"),
    ("backward_leaves_dk_on_the_wrong_rank", "ring_backward",
     "        dkv, grad_requests = exchange(dkv + torch.stack([dk_part, dv_part]), right, left, group)\n",
     "        dkv, grad_requests = dkv + torch.stack([dk_part, dv_part]), []\n"
     "        if step < p - 1:   # no last hop: each rank keeps its left neighbour's dK/dV\n"
     "            dkv, grad_requests = exchange(dkv, right, left, group)\n",
     "test_ring_backward"),
    ("contiguous_causal_split", "causal_layout",
     "    chunks = torch.arange(seq_len).view(2 * world_size, -1)           # (2p, s/2p)\n"
     "    return torch.stack([torch.cat([chunks[r], chunks[2 * world_size - 1 - r]])\n"
     "                        for r in range(world_size)])                  # (p, s/p)",
     "    return torch.arange(seq_len).view(world_size, -1)",
     ("test_causal_layout", "test_causal_layout_better")),
    # the hinted design (Hint 2) meets the first step of the scale, not the bar beyond it
    ("striped_causal_split", "causal_layout",
     "    chunks = torch.arange(seq_len).view(2 * world_size, -1)           # (2p, s/2p)\n"
     "    return torch.stack([torch.cat([chunks[r], chunks[2 * world_size - 1 - r]])\n"
     "                        for r in range(world_size)])                  # (p, s/p)",
     "    return torch.arange(seq_len).view(-1, world_size).t().contiguous()   # dealt like cards",
     "test_causal_layout_better"),
    ("penalty_of_the_busiest_rank", "predict_contiguous_penalty",
     "    return (0.5 + (world_size - 1)) / (world_size / 2)",
     "    return 2 * world_size - 1   # the last rank's total work over rank 0's",
     "test_predict_contiguous_penalty"),
    ("ulysses_without_the_return_all_to_all", "ulysses",
     "    return swap(out, 2, 1)                                            # (b, h, s/p, d)",
     "    mine = out.chunk(p, dim=2)[me]                                  # no all-to-all back:\n"
     "    return torch.cat([mine] * p, dim=1)                               # its own heads, p times",
     "test_ulysses"),
]
# A mistake whose wrong neighbour is the right one on 2 ranks (left = right): only 4 ranks see it.
FOUR_RANKS_ONLY = {"ring_sends_to_the_wrong_neighbour"}
GRADED_TESTS = ["test_merge", "test_ring_forward", "test_ring_backward",
                "test_predict_contiguous_penalty", "test_causal_layout", "test_causal_layout_better",
                "test_ulysses"]


SETUP = ("imports", "plan_imports")   # the locked cells the solution cells need


def solution_namespace(edit: tuple[str, str, str] | None = None) -> dict:
    """The solution cells and the imports, run, with one planted edit (grade_id, old, new)."""
    return solutions.solution_namespace(LAB, [edit] if edit else [], SETUP)


def _lost(loses) -> set[str]:
    from submissions.packing import tests
    return tests(loses)


def run_checks(ns: dict, world_size: int = 2, seed: int | None = None, **sizes) -> dict[str, str]:
    """{test id: "pass" or the failure message} for the graded checks of the exercises and of
    the layout's prediction."""
    seq = 4 * world_size * 8 if seed is not None else 64
    calls = {
        "test_merge": lambda: lab10.check_merge(ns["merge_partials"], seed, **sizes),
        "test_ring_forward": lambda: lab10.check_ring_forward(ns["ring_attention"], world_size,
                                                              seed, **sizes),
        "test_ring_backward": lambda: lab10.check_ring_backward(ns["ring_attention_backward"],
                                                                world_size, seed, **sizes),
        "test_predict_contiguous_penalty": lambda: lab10.check_penalty_prediction(
            ns["predict_contiguous_penalty"], seed),
        "test_causal_layout": lambda: lab10.check_causal_layout(ns["causal_layout"],
                                                                ((world_size, seq),)),
        "test_causal_layout_better": lambda: lab10.check_causal_layout_better(
            ns["causal_layout"], ((world_size, seq),)),
        "test_ulysses": lambda: lab10.check_ulysses(ns["ulysses_attention"], world_size, seed,
                                                    **sizes),
    }
    return verdicts(calls)


# ---------------------------------------------------------------------------------------------
# The solution passes; each mistake loses exactly its own test

def test_solution_passes_on_stored_and_fresh_inputs():
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}
    assert set(run_checks(ns, 4, seed=5, **HIDDEN).values()) == {"pass"}
    assert set(run_checks(ns, 2, seed=6, batch=1, heads=6, seq=20, dim=4).values()) == {"pass"}


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="NCCL needs a GPU per rank (2); this machine has "
                           f"{torch.cuda.device_count()}")
def test_solution_passes_on_nccl_too(monkeypatch):
    """The same checks with DISTLAB_BACKEND=both: gloo, then NCCL against the same references."""
    monkeypatch.setenv("DISTLAB_BACKEND", "both")
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}


# What each planted mistake's message says (on the hidden case, 4 ranks, seed 7).
TOLD_WHY = {"merge_without_max_subtraction": "exp\\(1000\\) is inf",
            "ring_sends_to_the_wrong_neighbour": "right neighbour \\(r\\+1\\) mod p = 1",
            "backward_leaves_dk_on_the_wrong_rank": "one more hop brings them to the rank",
            "contiguous_causal_split": r"critical path 3,600 \(1\.744× ideal\); dealt like "
                                       r"cards \(the hinted design\) 2,112 \(1\.023× ideal\)",
            "striped_causal_split": r"critical path 2,112 \(1\.023× ideal\).*bar halfway to "
                                    r"the bound 2,088 \(1\.012× ideal\), bound \(ideal\) 2,064 "
                                    r"\(1\.000× ideal\)\. Needed: at most the bar",
            "penalty_of_the_busiest_rank": "2p−1 is how much more rank p−1 does",
            "ulysses_without_the_return_all_to_all": "the last all-to-all B"}


@pytest.mark.parametrize("name,cell,old,new,loses", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_exactly_its_own_test(name, cell, old, new, loses):
    """... and its message on the hidden case (4 ranks, seed 7) names what went wrong."""
    ns = solution_namespace((cell, old, new))
    for world_size, seed, sizes in ((2, None, {}), (4, 7, HIDDEN)):
        results = run_checks(ns, world_size, seed, **sizes)
        failed = {t for t, r in results.items() if r != "pass"}
        expected = set() if world_size == 2 and name in FOUR_RANKS_ONLY else _lost(loses)
        assert failed == expected, (name, world_size, results)
    message = results[sorted(_lost(loses))[0]]
    assert re.search(TOLD_WHY[name], message), (name, message)


def test_the_mistakes_are_told_why():
    """Each planted mistake's message names what went wrong: every mistake has its words in
    TOLD_WHY, which the test above finds in the message of its hidden run (the same run with the
    same seed, not run a second time here)."""
    assert set(TOLD_WHY) == {m[0] for m in MISTAKES}


def test_a_full_score_row_or_blocking_sends_fail_the_ring():
    """The memory bound sees a rank that gathers every block before computing; the record sees
    blocking send/recv (no block in flight)."""
    gather = solution_namespace(("ring_forward", "        block = (block_attention(q, kv[0], kv[1])",
                                 "        _ = q @ torch.cat([k, k], 2).transpose(-2, -1)   # a whole row of scores\n"
                                 "        block = (block_attention(q, kv[0], kv[1])"))
    with pytest.raises(CheckFailed, match=r"made a tensor of shape .* \(1024 elements\)"):
        lab10.check_ring_forward(gather["ring_attention"])
    blocking = solution_namespace(("ring_forward",
                                   "    requests = dist.batch_isend_irecv(",
                                   "    first, then = (dist.send, tensor, right), (dist.recv, buffer, left)\n"
                                   "    for op, t, peer in (first, then) if dist.get_rank() % 2 == 0 else (then, first):\n"
                                   "        op(t, peer, group)\n"
                                   "    return buffer, []\n"
                                   "    requests = dist.batch_isend_irecv("))
    with pytest.raises(CheckFailed, match=r"rank 0 called send of .*, recv of .*dist.isend / dist.irecv"):
        lab10.check_ring_forward(blocking["ring_attention"])


def test_a_ring_that_keeps_its_finished_requests_holds_one_block_too_many():
    """A finished request holds the block it sent: kept until the next exchange starts, three
    received blocks are alive at once on 4 ranks (the visible test runs 4 ranks too)."""
    keeps = solution_namespace(("ring_forward", "kv, requests = incoming, None", "kv = incoming"))
    lab10.check_ring_forward(keeps["ring_attention"])                  # 2 ranks: one receive
    with pytest.raises(CheckFailed, match=r"held 6144 bytes of received K/V at once; at most "
                                          r"two blocks' worth \(2·2·B = 4096\)"):
        lab10.check_ring_forward(keeps["ring_attention"], world_size=4)


def test_the_ring_watch_imports_no_dynamo_on_a_rank():
    """The forward's memory watch is a dispatch mode; PyTorch wraps a mode's __torch_dispatch__
    in a Dynamo guard whose first call imports torch._dynamo (some 800 modules), which every rank
    of every run would pay (the judge's zygote preloads no torch._dynamo for this lab). In a fresh interpreter, as a
    rank forked from the judge's zygote: the watch still sees every operation, and imports nothing."""
    import subprocess
    import sys
    code = ("import sys, torch\n"
            "from distlab.checks.lab10_watch import RingWatch\n"
            "before = set(sys.modules)\n"
            "with RingWatch() as watch:\n"
            "    kv = torch.stack([torch.ones(2, 3), torch.ones(2, 3)])\n"
            "print(watch.numel, watch.shape, sorted(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[0] == f"{2 * 2 * 3} (2, 2, 3) []", done.stdout + done.stderr


def test_ulysses_refuses_heads_that_do_not_divide():
    """Said as the failing case: its heads and ranks, what to raise and what came instead (a
    collective is stopped before it can hang or fail the ranks)."""
    ns = solution_namespace(("ulysses", "    if q.shape[1] % p:", "    if False:"))
    with pytest.raises(CheckFailed, match=r"^3 heads over 2 ranks: raise ValueError.*Rank 0 gave "
                                          r"a collective called first"):
        lab10.check_ulysses(ns["ulysses_attention"])
    vague = solution_namespace(("ulysses", "    if q.shape[1] % p:\n        raise ValueError(",
                                "    if q.shape[1] % p:\n        raise ValueError('no') or ValueError("))
    with pytest.raises(CheckFailed, match=r"gave a ValueError that does not name them: 'no'"):
        lab10.check_ulysses(vague["ulysses_attention"])


# ---------------------------------------------------------------------------------------------
# The references and the numbers the lab states

def test_references_are_plain_attention():
    ref = lab10.make_references()
    problem = ref["attention"]
    for tag, causal in (("full", False), ("causal", True)):
        scores = problem["q"] @ problem["k"].transpose(-2, -1) / 2          # d = 4
        if causal:
            scores = scores.masked_fill(torch.ones(16, 16).triu(1).bool(), float("-inf"))
        torch.testing.assert_close(problem[f"{tag}.out"], scores.softmax(-1) @ problem["v"])
        torch.testing.assert_close(problem[f"{tag}.lse"], scores.logsumexp(-1))
    merge = ref["merge"]
    assert torch.isinf(merge["1.lse_want"][..., :8]).all()              # both blocks masked
    assert merge["2.lse_a"].max() > 710                                  # exp overflows float64


def _prose() -> str:
    """The lab source's prose (comment lines), joined so that a phrase may cross a line break."""
    return " ".join(line[2:] for line in SOURCE.read_text().splitlines() if line.startswith("# "))


def test_passing_lines_show_the_students_figures(capsys):
    """A pass returns the student's figures beside the reference's (computed here): the ring's
    bytes, the CP degree with its memory, each layout's critical path; no seed shown."""
    from distlab.checks import lab10_layout, lab10_plan
    ns = solution_namespace()
    line = lab10.check_ring_bytes_prediction(ns["predict_ring_bytes"], seed=3)
    for s, p, hq, hkv, d, b, item in lab10_plan.ring_bytes_cases(3):
        want = lab10_plan.ring_bytes_formula(s, p, hq, hkv, d, b, item)
        assert f"s={s:,}, p={p}, {hkv} KV heads: {want:,.0f} (formula {want:,})" in line
    line = lab10.check_cp_degree(ns["smallest_cp"], seed=3)
    for model, job, tp, pp, dp, mem in lab10_plan.cp_cases(3):
        cp = lab10_plan.reference_smallest_cp(model, job, tp, pp, dp, mem)
        gb = cp and lab10_plan._gb(model, job, tp, pp, dp, cp)
        assert (f"DP={dp}: CP {cp}, {gb:.1f} of {mem:g} GB" if cp else f"DP={dp}: None (CP") in line
    sizes = ((4, 64), (2, 32))
    line = lab10.check_causal_layout_better(ns["causal_layout"], sizes)
    for p, s in sizes:
        path = context.layout.critical_path(answers.causal_layout(s, p))
        bars = lab10_layout.layout_bars(s, p)
        assert f"s={s}, p={p}: {path:,.0f} ({path / bars['bound']:.3f}× ideal) (hinted " \
               f"{bars['hinted'] / bars['bound']:.3f}×, bar {bars['bar'] / bars['bound']:.3f}×)" in line
    for line in (lab10.check_ring_bytes_prediction(ns["predict_ring_bytes"], seed=3), line):
        assert "seed" not in line and len(line) <= VERDICT_CHARS


def test_balance_is_counted_on_the_critical_path():
    """The lab's text: the contiguous split's busiest rank does about 2p-1 times rank 0's work,
    but the ring's critical path is about 2 - 1/p times the ideal (1.75 at p = 4); the course's
    split reaches the bound; the ideal is a bound (no step's largest block is below its mean)."""
    from distlab.checks import lab10_layout
    layout = context.layout
    for p in (2, 4, 8):
        s = 1024 * p
        contiguous = layout.contiguous_layout(s, p)
        assert abs(layout.imbalance(contiguous) - (2 * p - 1)) / (2 * p - 1) < 0.01
        assert abs(layout.penalty(contiguous) - (2 - 1 / p)) < 1e-3
        limit, error = lab10_layout._penalty_and_error(p)
        assert abs(limit - (2 - 1 / p)) < error / 100                # the extrapolation holds
        assert layout.penalty(answers.causal_layout(s, p)) == 1.0
        work = layout.step_work(layout.striped_layout(s, p)).double()
        small = torch.randperm(8 * p, generator=torch.Generator().manual_seed(p)).view(p, 8)
        assert layout.step_work(small).tolist() == [       # the batched count, pair by pair
            [layout.block_work(small[r], small[(r - t) % p]) for r in range(p)] for t in range(p)]
        assert (work.max(1).values >= work.mean(1)).all()
        assert work.sum() == s * (s + 1) / 2
    text = _prose()
    assert f"({lab10_layout.contiguous_penalty_limit(4):.2f} at p = 4)" in text
    assert "about 2 − 1/p times the ideal" in text and "about 2p−1 times rank 0's work" in text
    import inspect
    per_rank = inspect.signature(layout.penalty_table).parameters["tokens_per_rank"].default
    assert f"p = 2, 4 and 8 with s/p = {per_rank:,} tokens" in text


def test_the_hinted_design_and_its_stated_numbers():
    """Hint 2's numbers come from the striped layout: its penalty 1 + (p−1)/(s+1), 1.046 on the
    critical path and 1.097 by total work at the demo size, within 5% from the sizes stated."""
    from distlab.labs.context.demos import DEMO
    layout = context.layout
    for s, p in ((64, 4), (128, 8), (96, 4), (64, 2), (512, 8)):
        assert layout.penalty(layout.striped_layout(s, p)) == pytest.approx(1 + (p - 1) / (s + 1))
    s, p = DEMO["seq"], DEMO["world_size"]
    striped = layout.striped_layout(s, p)
    text = _prose()
    assert f"(s = {s}, p = {p}) {layout.penalty(striped):.3f} on the critical path " \
           f"({layout.imbalance(striped):.3f} by each rank's total work, max/min)" in text
    assert layout.imbalance(striped) > 1.05 > layout.penalty(striped)
    for p in (4, 8):
        first = next(s for s in range(1, 10_000) if 1 + (p - 1) / (s + 1) <= 1.05)
        assert f"s ≥ {first} at p = {p}" in text
        assert first + 1 >= 20 * (p - 1) > first
    assert "once s + 1 ≥ 20·(p − 1)" in text


def test_the_scale_separates_the_hinted_design_from_the_bar():
    """At every size the lab's layout cells grade, the hinted design is above the bar and the
    course's split at the bound; a contiguous split fails the hinted design's step."""
    from distlab.checks import lab10_layout
    import ast
    calls = re.findall(r"check_causal_layout(_better)?\(causal_layout(?:, sizes=(.*?))?\)\s",
                       SOURCE.read_text())
    assert len(calls) == 4
    sizes = [size for better, given in calls for size in
             (ast.literal_eval(given) if given else [(4, 64) if better else (2, 64)])]
    assert len(sizes) == 7
    for p, s in sizes:
        bars = lab10_layout.layout_bars(s, p)
        assert bars["bound"] < bars["bar"] < bars["hinted"]
        assert context.layout.critical_path(answers.causal_layout(s, p)) == bars["bound"]
        assert context.layout.critical_path(context.contiguous_layout(s, p)) > bars["hinted"]


@pytest.mark.stored_data     # against plain causal attention's stored output
def test_demo_runs_the_readers_ring_on_the_readers_layout(capsys):
    ns = solution_namespace()
    shown = context.ring_with_layout(ns["ring_attention"], ns["causal_layout"])
    assert shown["max_error"] < 1e-12
    # float64 rounding shows as its bound (32 ulps of the output's largest |value|), not digits
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.search(r"largest difference from plain causal attention < 1e-1[2-5]$", line), line
    assert shown["rows"][1]["max/min"] == "1.000"


@pytest.mark.stored_data     # against plain attention's stored gradient
def test_training_through_the_readers_ring_matches_one_process(capsys):
    """The lab's claim: dL/dW through the reader's ring, summed over the ranks, equals plain
    attention's on one process (stored, and the stored value is plain attention's)."""
    from distlab.labs.context import demos
    ns = solution_namespace()
    assert context.ring_gradients(ns["ring_attention"], ns["ring_attention_backward"]) < 1e-12
    line = capsys.readouterr().out.strip()
    assert re.search(r"against one process: largest difference < 1e-1[1-5]$", line), line
    from distlab.checks.stored import EXACT64, tolerance
    stored = demos.stored_set("demos")
    problem = {key: stored[f"grad.{key}"] for key in ("x", "w", "dy")}
    # float64, from the stored inputs: equal but for the order of sums on this CPU
    torch.testing.assert_close(demos.plain_weight_grad(
        context.dense_attention, problem, demos.GRAD_DEMO["heads"]), stored["grad.dw"],
        **tolerance(stored["grad.dw"], rel=EXACT64))


# ---------------------------------------------------------------------------------------------
# Route 3 of issue 41: data moved outside the record

# Samples whose values and record are right, whose traffic is not (tests/submissions/unrecorded.py)
UNRECORDED = [unrecorded.RING_FORWARD]


@pytest.mark.skipif(wire.count([]) is None,
                    reason="the kernel's TCP counters (sock_diag) cannot be read here")
def test_a_ring_whose_blocks_travel_outside_the_record_loses_its_test(monkeypatch):
    """The values are right and the record is a ring's (it passes when the bytes that crossed
    are not compared); the kernel counted the unrecorded all-gather on every case."""
    name, cell, old, new, loses = unrecorded.RING_FORWARD
    ns = solution_namespace((cell, old, new))
    for world_size, seed, sizes in ((2, None, {}), (4, 7, HIDDEN)):
        with pytest.raises(CheckFailed, match="crossed outside it"):
            lab10.check_ring_forward(ns["ring_attention"], world_size, seed, **sizes)
    monkeypatch.setattr(lab10, "assert_crossed_as_recorded", lambda out, what: None)
    lab10.check_ring_forward(ns["ring_attention"], 4, 7, **HIDDEN)


# ---------------------------------------------------------------------------------------------
# Through the grader: solution full marks, student version zero, each mistake its own test

SAMPLE_KINDS = ()


def own_graded_samples() -> dict:
    """{(student, lab): notebook}: the solution, the untouched lab and the mistakes, in as few
    notebooks as keep each the one reason its test fails (tests/submissions/packing.py); those
    only the grader catches alone."""
    import submissions
    from submissions import packing
    return {("solution", LAB): submissions.solved(LAB), ("untouched", LAB): submissions.student(LAB),
            **packing.packed_samples(LAB, _planted(), alone=[m[0] for m in UNRECORDED])}


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}."""
    return {name: (loses, [(cell, old, new)]) for name, cell, old, new, loses in MISTAKES + UNRECORDED}


def lab_points() -> float:
    """The points of every graded cell of the lab (16 of them this module's exercises')."""
    import jupytext
    cells = jupytext.read(SOURCE, fmt="py:percent").cells
    return float(sum(c.metadata.get("nbgrader", {}).get("points", 0) for c in cells))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grader_scores_lab10(graded_samples):
    rows = {student: row for (student, lab), row in graded_samples["rows"].items() if lab == LAB}
    # a notebook of several mistakes loses each one's test, none other (tests/submissions/packing.py)
    from submissions import packing
    planted = _planted()
    packed = packing.grouped(LAB, planted, alone=[m[0] for m in UNRECORDED])
    expected = {"solution": set(), "untouched": set(GRADED_TESTS),
                **{sample: {t for name in group for t in packing.tests(planted[name][0])}
                   for sample, group in packed.items()}}
    assert {name for group in packed.values() for name in group} == set(planted)
    for student, lost in expected.items():
        row = rows[student]
        assert {t for t in GRADED_TESTS if row[t] != "pass"} == lost, (student, row)
    assert float(rows["solution"]["score"]) == float(rows["solution"]["max_score"]) == lab_points()
    assert float(rows["untouched"]["score"]) == 0


def test_the_student_version_imports_only_what_it_uses():
    """fresh_seed is the hidden tests' (imported in their own block), not the student's."""
    import nbformat
    nb = nbformat.read(SOURCE.parents[2] / "notebooks" / SOURCE.parent.name / f"{SOURCE.stem}.ipynb", 4)
    assert "fresh_seed" not in "".join(cell.source for cell in nb.cells)


# ----------------------------------------------------------------------------- answers out of reach

@pytest.mark.stored_data
def test_visible_checks_read_stored_outputs(monkeypatch):
    """A handout has no dense_attention: the visible checks and the demo read stored sets."""
    ns = solution_namespace()

    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    from distlab.checks import lab10_problems
    monkeypatch.setattr(lab10_problems, "dense_attention", withheld)
    assert set(run_checks(ns).values()) == {"pass"}
