"""Lab 9, expert parallelism: the checks pass the solution on 2 and 4 ranks, each planted mistake
loses exactly its own test (directly, and through the grader), and the numbers the lab states
come from code checked here.

Wrong submissions are made from the solution's own cells by a textual edit (never a hand-copied
notebook), so they stay in step with the lab.
"""
from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest
import torch

from distlab.checks import lab09
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.labs import experts
from check_verdicts import verdicts  # tests/check_verdicts.py

# A difference that is float32 rounding, as the lab prints it: its bound, never its digits (which
# differ from CPU to CPU); a real difference would print as digits ("3.12e-01").
BOUND = r"< 1e-0[4-7]"
DIGITS = r"\d\.\d+e-\d"

LAB = "09_expert_parallel"
SOURCE = Path(__file__).resolve().parents[1] / f"solutions/{LAB}/{LAB}.py"
HIDDEN = dict(tokens=10, hidden=128, ffn=12, experts=8, k=2)

# A correctness mistake in the design exercise loses both its tests (the bar's reuses the run).
PADDED_TESTS = ("test_padded_moe", "test_padded_moe_bar")


def _padded_body(source: str) -> str:
    """The body of the solution's padded_moe_forward (between its solution markers)."""
    start = source.index("    ### BEGIN SOLUTION\n", source.index("def padded_moe_forward("))
    start += len("    ### BEGIN SOLUTION\n")
    # as a notebook cell holds it: no newline after the last line
    return source[start:source.index("    ### END SOLUTION\n", start)].rstrip("\n")


SOLVED_PADDED = _padded_body(SOURCE.read_text())
HINTED_PADDED = (  # Hint 3's layout: expert e's C slots its own, Exercise 3's keep
    '    p = dist.get_world_size(group)\n'
    '    tokens, h = x.shape\n'
    '    gates, idx = torch.softmax(router(x), dim=-1).topk(k, dim=-1)     # (T, k)\n'
    '    cap = math.ceil(capacity_factor * tokens * k / num_experts)\n'
    '    # Queue places, first choices first (its own copy of the rule: this cell stands alone).\n'
    '    onehot = F.one_hot(idx.t().reshape(-1), num_experts)              # (k*T, E) slot-major\n'
    '    place = ((onehot.cumsum(0) * onehot).sum(1) - 1).view(k, tokens).t()   # (T, k)\n'
    '    keep = place < cap\n'
    '    t, j = keep.nonzero(as_tuple=True)                                # kept assignments\n'
    '    slot = idx[t, j] * cap + place[t, j]                              # row in the (E*C, h) buffer\n'
    '    send = x.new_zeros(num_experts * cap, h).index_copy(0, slot, x[t])\n'
    '    recv = torch.empty_like(send)\n'
    '    dist.all_to_all_single(recv, send, group=group)                   # equal splits\n'
    '    recv = recv.view(p, num_experts // p, cap, h)                     # (source, local expert, slot)\n'
    '    out = torch.stack([expert(recv[:, e]) for e, expert in enumerate(experts)], 1)\n'
    '    back = torch.empty_like(send)\n'
    '    dist.all_to_all_single(back, out.reshape(-1, h).contiguous(), group=group)\n'
    '    y = x.new_zeros(tokens, h).index_add(0, t, gates[t, j, None] * back[slot])\n'
    '    return y, keep'
)


def lost(loses) -> set[str]:
    """The tests a mistake loses: one (a str) or several (a tuple)."""
    return {loses} if isinstance(loses, str) else set(loses)


# (name, grade_id of the solution cell, old text, new text, the test(s) it must lose)
MISTAKES = [
    ("all_gather_dispatch", "dispatch",
     "    recv = send.new_empty((sum(plan.recv_splits), x.shape[1]))        # (n_recv, h)\n"
     "    dist.all_to_all_single(recv, send, plan.recv_splits, plan.send_splits, group=group)\n",
     "    p, me, per = dist.get_world_size(group), dist.get_rank(group), num_experts // dist.get_world_size(group)\n"
     "    xs, ids = [torch.empty_like(x) for _ in range(p)], [torch.empty_like(expert_idx) for _ in range(p)]\n"
     "    dist.all_gather(xs, x.contiguous(), group=group)\n"
     "    dist.all_gather(ids, expert_idx.contiguous(), group=group)\n"
     "    rows = []\n"
     "    for xs_s, ids_s in zip(xs, ids):\n"
     "        flat = ids_s.reshape(-1)\n"
     "        sel = torch.argsort(flat, stable=True)\n"
     "        rows.append(xs_s[sel[flat[sel] // per == me] // k])\n"
     "    recv = torch.cat(rows)\n",
     "test_dispatch"),
    ("splits_from_own_counts", "dispatch",
     "dist.all_to_all_single(recv, send, plan.recv_splits, plan.send_splits, group=group)",
     "recv = send.new_empty((sum(plan.send_splits), x.shape[1]))\n"
     "    dist.all_to_all_single(recv, send, plan.send_splits, plan.send_splits, group=group)",
     "test_dispatch"),
    ("combine_without_gates", "moe_forward",
     "(per_slot.view(tokens, k, h) * gates.unsqueeze(-1)).sum(1)",
     "per_slot.view(tokens, k, h).sum(1)", "test_moe_layer"),
    ("capacity_without_k", "capacity",
     "math.ceil(capacity_factor * tokens * k / num_experts)",
     "math.ceil(capacity_factor * tokens / num_experts)", "test_capacity"),
    ("aux_loss_without_E", "aux_loss",
     "return num_experts * (f * probs.mean(0)).sum()",
     "return (f * probs.mean(0)).sum()", "test_aux_loss"),
    ("padded_bytes_without_ceil", "predict_all_to_all_bytes",
     "capacity = math.ceil(capacity_factor * tokens * k / experts)",
     "capacity = capacity_factor * tokens * k / experts", "test_predict_all_to_all_bytes"),
    ("padded_still_exchanges_counts", "padded_moe_forward",
     "    send = x.new_zeros(",
     "    counts = torch.bincount(idx.reshape(-1), minlength=num_experts)   # sizes the padding makes moot\n"
     "    dist.all_to_all_single(torch.empty_like(counts), counts, group=group)\n"
     "    send = x.new_zeros(", PADDED_TESTS),
    ("padded_receiver_without_gates", "padded_moe_forward",
     "(r_gates * hit)[at].sum(1, keepdim=True) * expert(recv[at])", "expert(recv[at])",
     PADDED_TESTS),
    # Hint 3's design, as the lab stood before the scale: every expert's C slots its own. It
    # meets the first test and not the bar (the stored routing: 6 dropped against a bar of 3).
    ("hinted_design", "padded_moe_forward", SOLVED_PADDED, HINTED_PADDED, "test_padded_moe_bar"),
]


def solution_namespace(edit: tuple[str, str, str] | None = None) -> dict:
    """The solution cells and the imports, run, with one planted edit (grade_id, old, new)."""
    return solutions.solution_namespace(LAB, [edit] if edit else [])


def run_checks(ns: dict, world_size: int = 2, seed: int | None = None, **sizes) -> dict[str, str]:
    """{test id: "pass" or the failure message} for the six graded checks."""
    calls = {
        "test_dispatch": lambda: lab09.check_dispatch(ns["dispatch"], world_size, seed, **sizes),
        "test_moe_layer": lambda: lab09.check_moe_layer(ns["moe_forward"], world_size, seed, **sizes),
        "test_capacity": lambda: lab09.check_capacity(ns["expert_capacity"], ns["capacity_mask"],
                                                      world_size, seed, **sizes),
        "test_aux_loss": lambda: lab09.check_aux_loss(ns["load_balancing_loss"], world_size, seed,
                                                      **sizes),
        "test_predict_all_to_all_bytes": lambda: lab09.check_predicted_bytes(
            ns["predict_all_to_all_bytes"], seed),
        "test_padded_moe": lambda: lab09.check_padded_moe(ns["padded_moe_forward"], world_size,
                                                          seed, **sizes),
        "test_padded_moe_bar": lambda: lab09.check_padded_moe_bar(ns["padded_moe_forward"],
                                                                  world_size, seed, **sizes),
    }
    return verdicts(calls)


# ---------------------------------------------------------------------------------------------
# The solution passes; each mistake loses exactly its own test

def test_solution_passes_on_stored_and_fresh_inputs():
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}
    assert set(run_checks(ns, 4, seed=5, **HIDDEN).values()) == {"pass"}
    assert set(run_checks(ns, 4, seed=6, tokens=7, hidden=6, ffn=12, experts=4, k=1).values()) == {"pass"}


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="NCCL needs a GPU per rank (2); this machine has "
                           f"{torch.cuda.device_count()}")
def test_solution_passes_on_nccl_too(monkeypatch):
    """The same checks with DISTLAB_BACKEND=both: gloo, then NCCL against the same references."""
    monkeypatch.setenv("DISTLAB_BACKEND", "both")
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}


@pytest.mark.parametrize("name,cell,old,new,loses", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_exactly_its_own_test(name, cell, old, new, loses):
    ns = solution_namespace((cell, old, new))
    for world_size, seed, sizes in ((2, None, {}), (4, 7, HIDDEN)):
        results = run_checks(ns, world_size, seed, **sizes)
        failed = {t for t, r in results.items() if r != "pass"}
        assert failed == lost(loses), (name, world_size, results)


def test_dispatch_pattern_names_a_wrong_size_and_a_missing_count_exchange():
    from distlab.runtime.comms import Comm

    def record(*calls) -> list:  # (dtype, bytes) of each all_to_all_single rank 1 called
        return [Comm(rank=1, seq=i, op="all_to_all_single", group=(0, 1), shapes=[(n // 8,)],
                     dtype=dt, bytes=n) for i, (dt, n) in enumerate(calls)]
    kinds = [lab09.NO_TOKEN_GATHER, lab09._count_exchange(4, 2),
             lab09._token_all_to_alls(1, "Send the T·k rows in one.", 384)]
    lab09.expect_collectives(record(("int64", 32), ("float32", 384)), "dispatch, rank 1", kinds)
    with pytest.raises(CheckFailed, match=r"dispatch, rank 1: all_to_all_single #0 on \[40\] int64 "
                                          r"moved 320 bytes; more than p·E = 8 integers"):
        lab09.expect_collectives(record(("int64", 320), ("float32", 384)), "dispatch, rank 1", kinds)
    with pytest.raises(CheckFailed, match=r"moved 192 bytes; expected 384\. Send the T·k rows"):
        lab09.expect_collectives(record(("int64", 32), ("float32", 192)), "dispatch, rank 1", kinds)
    with pytest.raises(CheckFailed, match=r"0 calls of integers \(the count exchange\), expected 1\. "
                                          r"Exchange the per-expert counts once.*All it issued: "
                                          r"all_to_all_single of \[48\] \(384 bytes\)"):
        lab09.expect_collectives(record(("float32", 384)), "dispatch, rank 1", kinds)


def test_all_gather_dispatch_is_told_why():
    ns = solution_namespace(MISTAKES[0][1:4])
    with pytest.raises(CheckFailed, match=r"all_gather .*Gathering the tokens gives every rank "
                                          r"all p·T tokens, p/k times the bytes"):
        lab09.check_dispatch(ns["dispatch"])


def test_wrong_splits_are_explained():
    ns = solution_namespace(MISTAKES[1][1:4])
    with pytest.raises(CheckFailed, match="output_split_sizes are the counts every \\*source\\*"):
        lab09.check_dispatch(ns["dispatch"])


def test_a_backward_that_does_not_reverse_the_splits_fails():
    """An AllToAll whose backward repeats the forward's splits instead of swapping them."""
    ns = solution_namespace(("moe_forward",
                             "dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)",
                             "dist.all_to_all_single(back, grad.contiguous(), out_splits, in_splits, group=ctx.group)"))
    with pytest.raises(CheckFailed, match="moe_forward on the stored inputs .*the ranks failed"):
        lab09.check_moe_layer(ns["moe_forward"])


def test_a_rank_whose_experts_get_no_token_still_joins_the_backward():
    """The hidden test's starved routing: the solution passes it; a layer that skips experts with
    no rows leaves that rank out of the backward's all-to-alls, and the other ranks' wait is
    reported instead of hanging, with the hint for a missing all-to-all (not the splits')."""
    starved = dict(tokens=7, hidden=6, ffn=12, experts=4, k=1, starve=True)
    lab09.check_moe_layer(solution_namespace()["moe_forward"], 4, seed=1, **starved)
    skipping = solution_namespace(("moe_forward",
                                   "        out = out.index_copy(0, rows, expert(recv[rows]))",
                                   "        if len(rows):\n"
                                   "            out = out.index_copy(0, rows, expert(recv[rows]))"))
    with pytest.raises(CheckFailed, match=r"rank 3's experts get no token.*the ranks failed") as failed:
        lab09.check_moe_layer(skipping["moe_forward"], 4, seed=1, **starved)
    assert lab09.MISSING_HINT in str(failed.value)
    assert lab09.SPLITS_HINT not in str(failed.value)


def test_starve_runs_with_the_default_seed_and_starves_by_construction():
    """A student runs the named special case as it is: seed None draws the starved routing from
    the lab's seed at once (no search), for the default sizes and the hidden test's."""
    from distlab.checks.lab09_problems import moe_problem, starved
    lab09.check_moe_layer(solution_namespace()["moe_forward"], starve=True)
    for seed in range(20):
        for world_size, shape in ((2, lab09.SHAPE), (4, dict(tokens=7, hidden=6, ffn=12, experts=4,
                                                              k=1))):
            problem = moe_problem(seed, world_size, **shape, starve=True)
            assert starved(problem, world_size, shape["experts"])
            per = shape["experts"] // world_size
            assert world_size - 1 not in (problem["idx"] // per).flatten().tolist()


def test_the_splits_hint_comes_only_with_a_size_mismatch():
    sizes = "rank 1 raised RuntimeError: Split sizes doesn't match total dim 0 size ... all_to_all_single"
    missing = ("a rank can never finish: rank 0 waits in all_to_all_single #5 on [7, 6] float32, "
               "but rank 3 has already returned from your function without calling it.")
    other = "rank 0 raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (all_to_all_single #3)"
    assert lab09.failure_hint(sizes) == lab09.SPLITS_HINT
    assert lab09.failure_hint(missing) == lab09.MISSING_HINT
    assert lab09.failure_hint(other) == ""
    assert lab09.failure_hint("rank 0 raised ValueError: bad gates") == ""


def test_a_rank_traceback_shows_the_students_frames_only():
    ns = solution_namespace(("moe_forward", "    back = AllToAll.apply(out,",
                             "    raise ValueError('my bug')\n    back = AllToAll.apply(out,"))
    with pytest.raises(CheckFailed) as failed:
        lab09.check_moe_layer(ns["moe_forward"])
    message = str(failed.value)
    assert "ValueError: my bug" in message and "09_expert_parallel.py" in message
    assert "distlab/runtime" not in message and "distlab/checks" not in message


def test_a_padded_layer_that_still_exchanges_counts_is_told_why():
    ns = solution_namespace(MISTAKES[6][1:4])
    with pytest.raises(CheckFailed, match=r"rank 0: 1 call of integer collectives \(a count or "
                                          r"size exchange\).*expected 0\. Padding to the capacity"):
        lab09.check_padded_moe(ns["padded_moe_forward"])


def test_a_padded_layer_that_drops_the_wrong_tokens_is_told_the_order():
    """Last come first served: where the slots run short (seed 1 at the hidden sizes; at the
    stored sizes every token fits), an assignment Exercise 3's rule keeps is dropped."""
    ns = solution_namespace(("padded_moe_forward", "(onehot.cumsum(0) * onehot)",
                             "(onehot.flip(0).cumsum(0).flip(0) * onehot)"))
    with pytest.raises(CheckFailed, match=r"(?s)padded_moe_forward: keep on .*first come first served"):
        lab09.check_padded_moe(ns["padded_moe_forward"], 4, seed=1, **HIDDEN)


def test_the_hinted_design_passes_the_first_test_not_the_bar():
    """Hint 3's layout meets the first test and, graded on one run, misses the bar with its
    figures beside the scale; the solution reaches the bound on the stored routing."""
    hinted = solution_namespace(MISTAKES[-1][1:4])["padded_moe_forward"]
    assert "within the budget" in lab09.check_padded_moe(hinted)
    with pytest.raises(CheckFailed, match=r"6 of 48 assignments dropped; Exercise 3's rule \(Hint "
                                          r"3's design\) drops 6, the bar 3, the bound 0\. This "
                                          r"test's limit is the bar"):
        lab09.check_padded_moe_bar(hinted)
    solved = solution_namespace()["padded_moe_forward"]
    verdict = lab09.check_padded_moe_bar(solved)
    assert "0 of 48 assignments dropped" in verdict and "within the bar" in verdict
    for seed in (1, 2):     # where the slots run short, the solution reaches the bound too
        verdict = lab09.check_padded_moe(solved, 4, seed=seed, **HIDDEN)
        got, bound = re.search(r"(\d+) of 80 assignments dropped.* the bound (\d+)", verdict).groups()
        assert got == bound, verdict


def test_fewest_drops_is_the_least_any_choice_of_rows_drops():
    """The bound against every choice of tokens for each destination's rows (small cases,
    routings drawn from seeds), under the contract: Exercise 3's kept assignments stay kept."""
    import itertools
    from distlab.checks.lab09_design import fewest_drops
    from distlab.labs.experts.moe import reference_keep
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        tokens, experts, k, p, factor = 6, 4, 2, 2, 0.5
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        must = reference_keep(idx, experts, factor)
        rows = experts // p * math.ceil(factor * tokens * k / experts)
        dest, best = idx // (experts // p), 0
        for d in range(p):
            on_d = (dest == d).sum(1)
            forced = set(((dest == d) & must).any(1).nonzero().flatten().tolist())
            least = min(int(on_d.sum()) - sum(int(on_d[t]) for t in chosen)
                        for n in range(rows + 1) for chosen in itertools.combinations(range(tokens), n)
                        if forced <= set(chosen))
            best += least
        assert fewest_drops(idx, must, experts, p, rows) == best, seed


def test_a_padded_all_to_all_of_another_size_names_the_budget():
    """Padding to the largest queue (a size the ranks could only agree on by talking) is not the
    fixed size: the check says which it expected."""
    ns = solution_namespace(("padded_moe_forward", "    cap = math.ceil(capacity_factor * tokens * k / num_experts)",
                             "    cap = math.ceil(capacity_factor * tokens * k / num_experts) + 1"))
    with pytest.raises(CheckFailed, match=r"moved 896 bytes; expected 768 \(E·C·h·4"):
        lab09.check_padded_moe(ns["padded_moe_forward"])


# ---------------------------------------------------------------------------------------------
# The references and the numbers the lab states

def test_prediction_formulas_and_their_stored_values():
    from distlab.checks.lab09_prediction import KEYS, _a2a_bytes, a2a_cases
    # T=10, h=6, E=8, k=2, p=4, c=1.25: C = ceil(3.125) = 4 slots; 8·4 rows of 6 floats
    # T·k = 20 assignments fill 20 of the 32 rows: 12 rows of 6 floats are zeros at the least
    assert _a2a_bytes(10, 6, 8, 2, 4, 1.25) == {"padded": 768, "padding": 288,
                                               "padded_off_rank": 576}
    # the lab's table: at c = 1.0 with E dividing T·k, the padded message is the dropless one
    assert _a2a_bytes(64, 32, 4, 2, 2, 1.0)["padding"] == 0
    assert _a2a_bytes(64, 32, 4, 2, 2, 1.0)["padded"] == 64 * 2 * 32 * 4
    stored = lab09.make_references()["prediction"]["bytes"].tolist()
    assert stored == [[_a2a_bytes(*c)[key] for key in KEYS] for c in a2a_cases(None)]


def test_prediction_passing_line_shows_the_bytes():
    # What a pass shows: the student's three figures per case (the reference's, computed here).
    from distlab.checks.lab09_prediction import KEYS, _a2a_bytes, a2a_cases
    predict = solution_namespace()["predict_all_to_all_bytes"]
    for seed in (None, 8):
        line = lab09.check_predicted_bytes(predict, seed)
        for t, h, e, k, p, c in a2a_cases(seed):
            figures = "/".join(f"{_a2a_bytes(t, h, e, k, p, c)[key]:,.0f}" for key in KEYS)
            assert f"T={t} h={h} E={e} k={k} p={p} c={c:g}: {figures}" in line
        assert "seed" not in line


def test_padded_table_measures_what_the_prediction_says(capsys):
    """The table after Exercise 5: the records hold the predicted sizes; at c = 2.0 nothing is
    dropped (what the text after it says; at c = 1.0 the drops are the reader's layout's)."""
    ns = solution_namespace()
    traffic = experts.measure_traffic(ns["moe_forward"])
    line = capsys.readouterr().out.strip().splitlines()[-1]         # against the stored output
    assert re.fullmatch(rf"largest difference from the plain layer's output: EP {BOUND}, "
                        rf"TP {BOUND}", line), line
    rows = experts.padded_traffic(ns["padded_moe_forward"], ns["predict_all_to_all_bytes"], traffic)
    size = inspect.signature(experts.padded_traffic).parameters
    t, h, k = (size[name].default for name in ("tokens", "hidden", "k"))
    assert rows[0]["measured"] == str([t * k * h * 4] * 2)      # Exercise 1's contract, each rank
    for row in rows[1:]:
        assert row["measured"] == str([row["your prediction"]])
        # the fewest zeros predicted are what the padded message sends beyond the dropless one
        assert row["over the dropless, measured"] == str([row["padding, predicted"]])
    assert rows[1]["padding, predicted"] == 0 < rows[2]["padding, predicted"]
    assert rows[-1]["dropped, per rank"] == str(["0%", "0%"])

def test_references_are_the_plain_layer():
    ref = lab09.make_references()["moe"]
    moe = experts.MoE(8, 16, 4, 2)
    moe.load_state_dict({k[6:]: v for k, v in ref.items() if k.startswith("param.")})
    torch.testing.assert_close(moe(ref["x"]), ref["y"])
    sends = torch.stack([torch.bincount(ref["idx"][r * 12:(r + 1) * 12].reshape(-1) // 2, minlength=2)
                         for r in range(2)])                  # (source, destination)
    assert sends[0, 1] != sends[1, 0], f"the stored routing should send uneven splits: {sends}"


def test_capacity_and_aux_loss_references_follow_the_papers():
    assert experts.reference_capacity(12, 2, 4, 1.0) == 6          # ceil(1.0 * 12 * 2 / 4)
    assert experts.reference_capacity(10, 2, 8, 1.25) == 4         # ceil(3.125)
    idx = torch.tensor([[0], [0], [0], [1]])
    assert experts.reference_keep(idx, 2, 1.0).squeeze(1).tolist() == [True, True, False, True]
    uniform = torch.full((6, 3), 1 / 3)
    balanced = torch.tensor([[0], [1], [2], [0], [1], [2]])
    assert experts.reference_aux_loss(uniform, balanced, 3).item() == pytest.approx(1.0)
    collapsed = torch.zeros(6, 1, dtype=torch.long)
    one_hot = torch.nn.functional.one_hot(collapsed.squeeze(1), 3).float()
    assert experts.reference_aux_loss(one_hot, collapsed, 3).item() == pytest.approx(3.0)


def test_traffic_table_and_closing_note_come_from_the_records(capsys):
    ns = solution_namespace()
    rows = experts.measure_traffic(ns["moe_forward"], world_size=2, tokens=16, hidden=8, ffn=16,
                                   experts=4, k=2)
    line = capsys.readouterr().out.strip().splitlines()[-1]         # against the plain layer now
    assert re.fullmatch(rf"largest difference from the plain layer's output: EP {BOUND}, "
                        rf"TP {BOUND}", line), line
    summary = experts.traffic_summary(rows)
    assert summary["EP"]["dispatch_matches_formula"]
    assert summary["EP"]["calls_per_rank"] == 4 and summary["TP"]["calls_per_rank"] == 2
    # the combines return exactly what was dispatched: over the ranks, 4 T k h b per rank on average
    assert summary["EP"]["bytes_per_rank"] == 4 * 16 * 2 * 8 * 4
    assert summary["TP"]["bytes_per_rank"] == 2 * 2 * 16 * 8 * 4
    note = experts.moe_closing_note(summary, 2, 16, 8, 2, "< 1e-05",
                                    {"without": 0.75, "with": 0.05})
    assert "matched one plain step (largest difference < 1e-05)" in note
    assert "EP sent 4096 token bytes" in note and "T·k·h·4 = 1024 bytes (as the formula says)" in note
    assert "2048 bytes per rank" in note and "75% of tokens dropped" in note
    assert "on the wire" in note and "EP 2048 and TP 2048 bytes, k/p = 1." in note
    # on the wire (what leaves a rank): the measured messages times (p-1)/p (all-to-all) and
    # 2(p-1)/p (ring all-reduce): EP sends k/p of TP's bytes, equal at k = p = 2 (the lab's text)
    wire = experts.wire_bytes(2, 16, 8, 2)
    assert wire["EP"] == summary["EP"]["bytes_per_rank"] / 2 == 2048
    assert wire["TP"] == summary["TP"]["bytes_per_rank"] * 2 / 2 == 2048


@pytest.mark.stored_data     # the lab's case: the layer's output is the course's stored one
def test_routing_demo_shows_its_rounding_as_a_bound(capsys):
    experts.show_routing(**experts.demos.ROUTING)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(rf"max \|layer - token-by-token sum\|: {BOUND}", line), line


def test_on_the_wire_ep_sends_k_over_p_of_tp_and_a_gather_dispatch_p_over_k():
    for p, k in ((2, 2), (4, 2), (8, 1), (8, 2), (4, 4)):
        wire = experts.wire_bytes(p, 64, 32, k)
        assert wire["EP/TP"] == pytest.approx(k / p)
        assert wire["gather/all-to-all"] == pytest.approx(p / k)
    table = experts.format_wire_bytes(64, 32, 2)
    assert "1.00" in table.splitlines()[2] and "0.50" in table.splitlines()[3]


@pytest.mark.stored_data     # the lab's case: the plain step is the course's stored one
def test_ep_dp_step_equals_single_process(capsys):
    ns = solution_namespace()
    out = experts.ep_dp_step(ns["moe_forward"])
    assert out["max_diff"] < 1e-5 and re.fullmatch(BOUND, out["shown"]), out["shown"]
    table = capsys.readouterr().out.split("\n\nrank 0 issued")[0].splitlines()
    assert table[0].endswith("max |Δ| after the step") and len(table) == 2 + 4
    assert all(re.search(rf"  {BOUND}$", row) and not re.search(DIGITS, row) for row in table[2:])
    ops = [(c.op, len(c.group)) for c in out["comms"][0]]
    # counts, dispatch, combine; backward only the combine's reverse: the layer's input is data
    # (no gradient wanted), so autograd never runs the dispatch's backward
    assert ops.count(("all_to_all_single", 2)) == 4 and ("all_reduce", 4) in ops


def test_balancing_loss_spreads_the_load_and_cuts_drops():
    task = experts.ToyTask(steps=40)
    without, with_aux = experts.train(task, 0.0), experts.train(task, 0.3)
    # without: expert 0 takes every token, capacity T/4 keeps a quarter (what the lab's text says)
    assert without["load"][-10:, 0].min() == 1.0 and without["dropped"][-10:].tolist() == [0.75] * 10
    assert with_aux["dropped"][-10:].mean() < 0.2
    assert with_aux["load"][-10:].mean(0).max() < 0.4 < without["load"][-10:].mean(0).max()


def test_timeline_shows_both_all_to_alls_and_the_experts_on_every_rank(capfd):
    import matplotlib
    matplotlib.use("Agg")
    prof = experts.profile_moe_step(world_size=2, tokens=64, hidden=16, ffn=32)
    printed = capfd.readouterr()
    assert "profiler_start" not in printed.out + printed.err   # kineto's log stays out
    tl = prof.timeline
    for rank in range(2):
        names = {s.name for s in tl.spans if s.rank == rank and s.kind == "range"}
        assert {"dispatch all-to-all", "experts", "combine all-to-all"} <= names
        assert sum(1 for s in tl.spans if s.rank == rank and s.kind == "comm"
                   and s.op.startswith("all_to_all")) >= 4   # dispatch, combine; each way
    rows = experts.phase_times(tl)
    assert all(r["experts"] > 0 for r in rows)


# ---------------------------------------------------------------------------------------------
# Through the grader: solution full marks, student version zero, each mistake its own test

# Of the suite's shared grading run (tests/conftest.py): this lab's solution and untouched
# version, and each mistake, graded beside every other sample.
SAMPLE_KINDS = ()
GRADED_TESTS = ["test_dispatch", "test_moe_layer", "test_capacity", "test_aux_loss",
                "test_predict_all_to_all_bytes", "test_padded_moe", "test_padded_moe_bar"]


def own_graded_samples() -> dict:
    """{(student, lab): notebook}: the solution, the untouched lab and the mistakes, in as few
    notebooks as keep each the one reason its test fails (tests/submissions/packing.py); those
    only the grader catches alone."""
    import submissions
    from submissions import packing
    return {("solution", LAB): submissions.solved(LAB), ("untouched", LAB): submissions.student(LAB),
            **packing.packed_samples(LAB, _planted(), alone=[m[0] for m in GRADED_ONLY_MISTAKES])}


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}."""
    return {name: (loses, [(cell, old, new)]) for name, cell, old, new, loses in MISTAKES + GRADED_ONLY_MISTAKES}


# A mistake only a hidden test catches (the starved routing): graded, it loses its own test.
GRADED_ONLY_MISTAKES = [
    ("skips_experts_without_tokens", "moe_forward",
     "        out = out.index_copy(0, rows, expert(recv[rows]))",
     "        if len(rows):\n            out = out.index_copy(0, rows, expert(recv[rows]))",
     "test_moe_layer")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grader_scores_lab9(graded_samples):
    rows = {student: row for (student, lab), row in graded_samples["rows"].items() if lab == LAB}
    # a notebook of several mistakes loses each one's test, none other (tests/submissions/packing.py)
    from submissions import packing
    planted = _planted()
    packed = packing.grouped(LAB, planted, alone=[m[0] for m in GRADED_ONLY_MISTAKES])
    expected = {"solution": set(), "untouched": set(GRADED_TESTS),
                **{sample: {t for name in group for t in lost(planted[name][0])}
                   for sample, group in packed.items()}}
    assert {name for group in packed.values() for name in group} == set(planted)
    for student, losses in expected.items():
        row = rows[student]
        assert {t for t in GRADED_TESTS if row[t] != "pass"} == losses, (student, row)
    assert float(rows["solution"]["score"]) == float(rows["solution"]["max_score"]) == 15
    assert float(rows["untouched"]["score"]) == 0


def test_the_student_version_imports_only_what_it_uses():
    """fresh_seed is the hidden tests' (imported in their own block), not the student's."""
    import nbformat
    nb = nbformat.read(SOURCE.parents[2] / "notebooks" / SOURCE.parent.name / f"{SOURCE.stem}.ipynb", 4)
    assert "fresh_seed" not in "".join(cell.source for cell in nb.cells)


# ----------------------------------------------------------------------------- answers out of reach

@pytest.mark.stored_data
def test_visible_checks_and_figures_read_stored_outputs(monkeypatch):
    """A handout has no plain layer, reference_keep or reference_aux_loss: the visible capacity
    and aux-loss tests read stored sets, and the figures' plain outputs for the lab's cases are
    stored too (equal to the plain layer's)."""
    ns = solution_namespace()

    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    for name in ("reference_keep", "reference_capacity", "reference_aux_loss"):
        monkeypatch.setattr(lab09, name, withheld)
    from distlab.checks import lab09_design, lab09_prediction
    for module, name in ((lab09_design, "padded_reference"), (lab09_design, "reference_keep"),
                         (lab09_design, "_contributions"), (lab09_design, "fewest_drops"),
                         (lab09_prediction, "_a2a_bytes")):
        monkeypatch.setattr(module, name, withheld)
    lab09.check_capacity(ns["expert_capacity"], ns["capacity_mask"])
    lab09.check_aux_loss(ns["load_balancing_loss"])
    lab09.check_predicted_bytes(ns["predict_all_to_all_bytes"])
    lab09.check_padded_moe(ns["padded_moe_forward"])
    lab09.check_padded_moe_bar(ns["padded_moe_forward"])
    with pytest.raises(CheckFailed, match="stored references are for capacity factor 1.0"):
        lab09.check_capacity(ns["expert_capacity"], ns["capacity_mask"], capacity_factor=1.5)
    monkeypatch.undo()
    # Recomputed from the same seeds on this CPU: float32 draws and sums a few ulps from the CPU
    # that made data/ (2.5e-7 of the largest output with ATEN_CPU_CAPABILITY=default).
    from distlab.checks.stored import tolerance
    for key, value in lab09.demo_references().items():
        stored = experts.stored.stored_output(key)
        torch.testing.assert_close(value, stored, **tolerance(stored),
                                   msg=lambda m, key=key: f"{key}: {m}")


def test_the_training_figure_runs_on_the_readers_layer():
    """compare_training with the reader's moe_forward (on one rank) and capacity_mask trains the
    block as the course's plain layer does: without the aux loss, the same numbers."""
    ns = solution_namespace()
    task = experts.ToyTask(steps=5)
    import distlab
    runs = distlab.run(experts.training._runs_on_rank, 1, task, 0.3, ns["load_balancing_loss"],
                       ns["capacity_mask"], ns["moe_forward"])[0]
    plain = experts.train(task, 0.0)
    torch.testing.assert_close(runs["without"]["loss"], plain["loss"])
    torch.testing.assert_close(runs["without"]["dropped"], plain["dropped"])
    with pytest.raises(ValueError, match="needs top-1 routing"):
        experts.compare_training(experts.ToyTask(k=2), capacity_mask=ns["capacity_mask"],
                                 moe_forward=ns["moe_forward"])
