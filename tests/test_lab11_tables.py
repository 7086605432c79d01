"""Lab 11, Section 2 (schedules as tables): the checks pass the solution's tables and
prediction, each planted mistake loses exactly its own test (directly, and through the grader),
the formulas the checks grade against equal the replay of the course's tables and of torch's own,
and the numbers the lab's text states come from code checked here.

Wrong submissions are made from the solution's own cells by a textual edit, so they stay in step
with the lab."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from distlab.checks import lab11, lab11_tables
from distlab.checks.assertions import VERDICT_CHARS, CheckFailed
from distlab.checks.ranks import SubmittedError
from distlab.course import solutions
from distlab.labs.pipeline import tables
from distlab.labs.pipeline.compare import messages
from distlab.labs.pipeline.table_view import replay_table
from distlab.labs.pipeline.torch_tables import torch_table
from distlab.labs.pipeline.validity import table_problem
from check_verdicts import verdicts  # tests/check_verdicts.py

LAB = "11_pipeline_schedules"
SOURCE = Path(__file__).resolve().parents[1] / f"solutions/{LAB}/{LAB}.py"
SETUP = ("tables_imports",)
GRADED_TESTS = ["test_predict_interleaved", "test_interleaved_1f1b", "test_zb_h1", "test_zb_v"]

# (name, grade_id of the solution cell, old text, new text, the test it must lose)
MISTAKES = [
    ("warm_up_one_forward_too_many", "interleaved_1f1b",
     "warm = min((v - 1) * p + 2 * (p - 1 - r), total)",
     "warm = min((v - 1) * p + 2 * (p - 1 - r) + 1, total)",
     "test_interleaved_1f1b"),
    ("w_before_its_b", "zb_h1",
     "            row.append((\"B\", i, r))                      # one backward (the input's gradient)\n"
     "            waiting.append(i)\n"
     "            while len(waiting) > r:                      # rank r keeps up to r W waiting\n"
     "                row.append((\"W\", waiting.pop(0), r))\n",
     "            waiting.append(i)\n"
     "            while len(waiting) > r:\n"
     "                row.append((\"W\", waiting.pop(0), r))   # a W before its own B\n"
     "            row.append((\"B\", i, r))\n",
     "test_zb_h1"),
    ("v_placed_round_robin_the_wrong_way", "zb_v",
     "up, down = r, last - r ",
     "up, down = r, p + r ",
     "test_zb_v"),
    ("plain_1f1bs_bubble_predicted", "predict_interleaved",
     "bubble = (p - 1) / (v * m)",
     "bubble = (p - 1) / m",
     "test_predict_interleaved"),
]


def solution_namespace(edit=None) -> dict:
    return solutions.solution_namespace(LAB, [edit] if edit else [], SETUP)


def run_checks(ns: dict, seed: int | None = None) -> dict[str, str]:
    """{test id: "pass" or the failure message} for the section's graded checks."""
    calls = {
        "test_predict_interleaved": lambda: lab11.check_interleaved_prediction(
            ns["predict_interleaved"], seed),
        "test_interleaved_1f1b": lambda: lab11.check_interleaved_1f1b(ns["interleaved_1f1b"], seed),
        "test_zb_h1": lambda: lab11.check_zb_h1(ns["zb_h1"], seed),
        "test_zb_v": lambda: lab11.check_zb_v(ns["zb_v"], seed),
    }
    return verdicts(calls)


@pytest.fixture
def in_process(monkeypatch):
    """The student's functions called here rather than on a rank (the launch is tested by
    test_solution_passes_on_ranks and the grader): the grading logic alone, quickly."""
    from distlab.checks import ranks
    monkeypatch.setattr(ranks, "call_each", lambda fn, calls, names=None: [fn(*c) for c in calls])


# ---------------------------------------------------------------------------------------------
# The solution passes; each mistake loses exactly its own test

def test_solution_passes_on_ranks():
    """Visible cases and one hidden draw, the student's functions run on a rank as in grading;
    every verdict line shows the figures beside the expected ones, within the feedback's width."""
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}
    line = lab11.check_interleaved_1f1b(ns["interleaved_1f1b"], seed=11)
    assert re.search(r"bubble 0\.\d{4} \(expected 0\.\d{4}\), peak \d+ \(\d+\)", line), line
    assert len(line) <= VERDICT_CHARS and "seed" not in line


@pytest.mark.parametrize("seed", range(6))
def test_solution_passes_every_hidden_draw(seed, in_process):
    assert set(run_checks(solution_namespace(), seed).values()) == {"pass"}


@pytest.mark.parametrize("name,cell,old,new,loses", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_exactly_its_own_test(name, cell, old, new, loses, in_process):
    ns = solution_namespace((cell, old, new))
    for seed in (None, 3):
        results = run_checks(ns, seed)
        assert {t for t, r in results.items() if r != "pass"} == {loses}, (name, seed, results)


def test_the_mistakes_are_told_why(in_process):
    expect = {
        "warm_up_one_forward_too_many":
            r"interleaved_1f1b\(4, 8, 2\) is valid but holds more: rank 0 holds 12 "
            r"stage-microbatches.*expected at most 11.*more forwards before its first backward",
        "w_before_its_b":
            r"zb_h1\(4, 8\): rank 0 runs \('W', 0, 0\) \(action 4 of its list\) before "
            r"\('B', 0, 0\) \(action 5\), which it needs: a weights' gradient needs the output "
            r"gradient its B received\. Put \('B', 0, 0\) first\.",
        "v_placed_round_robin_the_wrong_way":
            r"zb_v\(4, 8\): rank 0 has \('F', 0, 4\), but stage 4 lives on rank 3 .*"
            r"In a V, rank r holds stage r and stage 2p-1-r",
        "plain_1f1bs_bubble_predicted": r"predict_interleaved",
    }
    for name, cell, old, new, loses in MISTAKES:
        message = run_checks(solution_namespace((cell, old, new)))[loses]
        assert re.search(expect[name], message), (name, message)


def test_the_untouched_functions_score_nothing(in_process):
    def stub(*args):
        raise NotImplementedError
    ns = {key: stub for key in ("predict_interleaved", "interleaved_1f1b", "zb_h1", "zb_v")}
    with pytest.raises(NotImplementedError):
        run_checks(ns)


def test_the_prediction_tells_the_usual_wrong_answers(in_process):
    right = solution_namespace()["predict_interleaved"]
    wrong = {
        "1F1B's bubble without virtual stages": lambda p, m, v: ((p - 1) / m, right(p, m, v)[1]),
        "idle share of the whole step": lambda p, m, v: (
            right(p, m, v)[0] / (1 + right(p, m, v)[0]), right(p, m, v)[1]),
        "in whole microbatches": lambda p, m, v: (right(p, m, v)[0], right(p, m, v)[1] / v),
        "One short": lambda p, m, v: (right(p, m, v)[0], right(p, m, v)[1] - 1),
    }
    for said, fn in wrong.items():
        with pytest.raises(CheckFailed, match=said):
            lab11.check_interleaved_prediction(fn)


# ---------------------------------------------------------------------------------------------
# What a table is graded against

def _figures(table, placement):
    bubble, peaks = lab11_tables.table_figures(table, placement)
    return bubble, max(peaks.values())


def _cases(kind):
    """The visible cases and the hidden ones of a few draws (one of each special kind first)."""
    return list(lab11_tables.VISIBLE[kind]) + [c for seed in range(4)
                                               for c, _ in lab11_tables.hidden_cases(kind, seed)]


COURSE = {"interleaved": lambda p, m, v: tables.interleaved_1f1b(p, m, v),
          "zb_h1": lambda p, m, v: tables.zb_h1(p, m), "zb_v": lambda p, m, v: tables.zb_v(p, m)}


@pytest.mark.parametrize("kind", ["interleaved", "zb_h1", "zb_v"])
def test_the_formulas_are_the_course_tables_replayed(kind):
    """Every case a check grades: the formula's bubble and peak equal the course's table
    replayed, and torch's own where torch builds that schedule (m a multiple of p at v = 1)."""
    for p, m, v in _cases(kind):
        placement = lab11_tables.placement_of(kind, p, v)
        table = COURSE[kind](p, m, v)
        assert table_problem(table, placement, m, "FB" if kind == "interleaved" else "FBW") is None
        bubble, peak = lab11_tables.formula_figures(kind, p, m, v)
        got = _figures(table, placement)
        assert got[0] == pytest.approx(bubble, rel=1e-12) and got[1] == peak, (kind, p, m, v)
        if kind != "zb_h1" or m % p == 0:
            mine = _figures(*torch_table(lab11_tables.TORCH[kind], p, m, v))
            assert mine[0] == pytest.approx(bubble, rel=1e-12) and mine[1] == peak


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_the_prediction_cases_are_the_replay(seed):
    for p, m, v in lab11_tables.interleaved_prediction_cases(seed):
        want = lab11_tables.formula_figures("interleaved", p, m, v)
        got = _figures(tables.interleaved_1f1b(p, m, v), tables.round_robin(p, v))
        assert got[0] == pytest.approx(want[0], rel=1e-12) and got[1] == want[1]


def test_a_handout_grades_the_visible_cases_against_torch(monkeypatch, in_process):
    """Where the formulas are withheld (a handout's stub raises NotImplementedError), the visible
    cases are graded against torch's own tables, replayed: the solution still passes and a wrong
    table still fails."""
    def withheld(*args):
        raise NotImplementedError("withheld")
    monkeypatch.setattr(lab11_tables, "formula_figures", withheld)
    assert set(run_checks(solution_namespace()).values()) == {"pass"}
    name, cell, old, new, loses = MISTAKES[0]
    assert run_checks(solution_namespace((cell, old, new)))[loses] != "pass"


# ---------------------------------------------------------------------------------------------
# Validity: what a student is told

def test_a_circle_of_waits_across_ranks_is_named():
    table = [[("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0)],
             [("F", 1, 1), ("B", 1, 1), ("F", 0, 1), ("B", 0, 1)]]
    problem = table_problem(table, [0, 1], 2, "FB")
    assert problem.startswith("the ranks wait for each other forever: rank 0 waits at "
                              "('B', 0, 0) for ('B', 0, 1) on rank 1; rank 1 waits at "
                              "('F', 1, 1) for ('F', 1, 0) on rank 0."), problem


def test_malformed_tables_are_refused_with_what_to_do():
    good = tables.zb_h1(2, 2)
    assert table_problem(good, [0, 1], 2) is None
    cases = {
        "must be a list of 2 lists, one per rank; got 1 lists": [good[0]],
        "rank 0's action 0 is ('X', 0, 0)": [[("X", 0, 0)] + good[0][1:], good[1]],
        "rank 0 runs ('F', 0, 0) twice": [[("F", 0, 0)] + good[0], good[1]],
        "rank 1 never runs ('W', 1, 1)": [good[0], [a for a in good[1] if a != ("W", 1, 1)]],
        "microbatches run 0..1": [good[0] + [("F", 5, 0)], good[1]],
        "stage 1 lives on rank 1": [good[0] + [("F", 0, 1)], good[1]],
    }
    for said, table in cases.items():
        assert said in table_problem(table, [0, 1], 2), (said, table_problem(table, [0, 1], 2))
    with pytest.raises(ValueError, match=r"^ZB-H1: rank 1 never runs"):
        replay_table(cases["rank 1 never runs ('W', 1, 1)"], [0, 1], 2, "ZB-H1")


def test_whole_backwards_tables_need_no_w():
    assert table_problem(tables.interleaved_1f1b(2, 4, 2), tables.round_robin(2, 2), 4, "FB") is None
    assert "op one of 'F', 'B'" in table_problem(tables.zb_h1(2, 4), [0, 1], 4, "FB")


# ---------------------------------------------------------------------------------------------
# The numbers the lab states

def _prose() -> str:
    return " ".join(line[2:] for line in SOURCE.read_text().splitlines() if line.startswith("# "))


def test_the_stated_figures_come_from_the_replay():
    """The text's peak and message counts of interleaving, ZB-H1's third and the V's bound, on
    the cases the lab shows and more."""
    text = _prose()
    for p, m, v in ((4, 8, 2), (3, 6, 3), (5, 10, 2)):
        table, placement = tables.interleaved_1f1b(p, m, v), tables.round_robin(p, v)
        peaks = lab11_tables.table_figures(table, placement)[1]
        assert peaks == {r: (v - 1) * p + 2 * (p - 1 - r) + 1 for r in range(p)}
        assert max(peaks.values()) / v == p + (p - 1) / v
        assert messages(table, placement) == 2 * m * (v * p - 1)
        assert messages(tables.one_f_one_b(p, m), list(range(p))) == 2 * m * (p - 1)
        one = _figures(tables.one_f_one_b(p, m), list(range(p)))
        assert one[0] == pytest.approx((p - 1) / m)
        assert _figures(tables.zb_h1(p, m), list(range(p)))[0] * 3 == pytest.approx(one[0])
        assert _figures(tables.zb_v(p, m), tables.v_shape(p)) == (pytest.approx((p - 1) / (6 * m)), 2 * p)
    for said in ("$(v-1)p + 2(p-1-r) + 1$ stage-microbatches, at most $(v+1)p-1$ on rank 0: "
                 "$p + (p-1)/v$ whole microbatches", "v·p−1 of them each way per microbatch",
                 "with equal times **a third**, $(p-1)/(3m)$", "a bubble of at least $(p-1)/(6m)$"):
        assert said in text, said


def test_the_prediction_is_asked_before_anything_answers_it():
    """Registered with the other labs' predictions (tests/test_predictions_unanswered.py)."""
    import test_predictions_unanswered as scan
    assert any(p.lab == LAB and p.test == "test_predict_interleaved" for p in scan.PREDICTIONS)


# ---------------------------------------------------------------------------------------------
# Through the grader: solution full marks on this section, untouched zero, each mistake its own

SAMPLE_KINDS = ()


def _planted() -> dict:
    return {name: (loses, [(cell, old, new)]) for name, cell, old, new, loses in MISTAKES}


TORCH_COPIES = {
    "test_interleaved_1f1b": ("interleaved_1f1b", "def interleaved_1f1b(p, m, v):\n"
                              "    from distlab.labs.pipeline.torch_tables import torch_table\n"
                              "    return torch_table('ScheduleInterleaved1F1B', p, m, v)[0]\n"),
    "test_zb_v": ("zb_v", "def zb_v(p, m):\n"
                  "    import types\n"
                  "    from torch.distributed.pipelining import schedules\n"
                  "    from distlab.labs.pipeline.torch_tables import _compute_actions\n"
                  "    stages = [types.SimpleNamespace(group_size=p, group_rank=0, num_stages=2 * p,\n"
                  "                                    submod=None, stage_index_to_group_rank=None)\n"
                  "              for _ in range(2)]\n"
                  "    order = schedules.ScheduleZBVZeroBubble(stages, m, loss_fn=None).pipeline_order\n"
                  "    return [[a for act in order[r] for a in _compute_actions(act, r)]\n"
                  "            for r in sorted(order)]\n"),
}


@pytest.mark.parametrize("test", list(TORCH_COPIES))
def test_torchs_own_table_handed_in_earns_nothing(test):
    """The comparison cell reads torch's tables; an answer that returns them (the course's
    converter, or torch's schedule class called directly) is refused on the rank, as course code."""
    from distlab.checks.course_code import guard_of
    from distlab.runtime.call_guard import guarding
    name, source = TORCH_COPIES[test]
    ns = solution_namespace()
    # a notebook cell's file name, as a kernel gives it (call_guard._kind: the student's code)
    exec(compile(source, "<ipython-input-7-0>", "exec"), ns)    # noqa: S102  (the cell, redefined)
    check = getattr(lab11, "check_" + name)
    with guarding(guard_of(check)):                    # as the judge runs it (grading/judge.py)
        with pytest.raises(SubmittedError, match="course's own implementation"):
            check(ns[name])
    assert run_checks(ns)[test] == "pass"     # unguarded, the copy is a valid table: the guard decides
