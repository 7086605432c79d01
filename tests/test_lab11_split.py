"""Lab 11, Section 1, the backward split in two: the checks pass the solution on the visible and
fresh cases, each planted mistake loses exactly its own test (directly, and through the
grader), the bytes held between B and W measured by ``held_between`` equal the count from the
shapes (the prediction's formula, and torch 2.13's own split), and Section 3's executor runs the
pair it is given.

Wrong submissions are textual edits of the solution's own cells, so they stay in step with it.
"""
from __future__ import annotations

import copy

import pytest
import torch

from distlab.checks import lab11, lab11_split
from distlab.course import solutions
from distlab.labs.pipeline import split_backward as split
from check_verdicts import verdicts  # tests/check_verdicts.py

LAB = "11_pipeline_schedules"
SETUP = ("split_imports",)
GRADED_TESTS = ["test_split_backward", "test_predict_held_bytes"]

# (name, grade_id of the solution cell, old text, new text, the test it must lose)
MISTAKES = [
    # B runs the whole backward (weights included), keeping the input's gradient
    ("b_runs_the_full_backward", "split_backward",
     "    (grad_input,) = torch.autograd.grad(output, [stage_input], grad_output, retain_graph=True)\n"
     "    return grad_input, kept",
     "    output.backward(grad_output, retain_graph=True)\n"
     "    return stage_input.grad, kept",
     "test_split_backward"),
    # B lets autograd free the graph: W has nothing left to walk
    ("b_frees_the_graph", "split_backward",
     "    (grad_input,) = torch.autograd.grad(output, [stage_input], grad_output, retain_graph=True)",
     "    (grad_input,) = torch.autograd.grad(output, [stage_input], grad_output)",
     "test_split_backward"),
    # W sets .grad instead of adding: the second microbatch's W erases the first's
    ("w_overwrites_grad", "split_backward",
     "            p.grad = g if p.grad is None else p.grad + g",
     "            p.grad = g",
     "test_split_backward"),
    # W is a full backward from the output: the input's gradient is computed again, into .grad
    ("w_runs_the_full_backward", "split_backward",
     "    grads = torch.autograd.grad(output, params, grad_output, allow_unused=True)\n"
     "    for p, g in zip(params, grads):\n"
     "        if g is not None:\n"
     "            p.grad = g if p.grad is None else p.grad + g",
     "    torch.autograd.backward(output, grad_output)",
     "test_split_backward"),
    # the recompute way counted as the graph alone, without what W starts from
    ("recompute_without_output_and_gradient", "predict_held_bytes",
     "\"recompute\": (2 * num_layers + 2) * act",
     "\"recompute\": 2 * num_layers * act",
     "test_predict_held_bytes"),
    # the keep way counted as the gradients alone, the Linears' inputs forgotten
    ("keep_without_the_inputs", "predict_held_bytes",
     "\"keep\": 2 * num_layers * act",
     "\"keep\": num_layers * act",
     "test_predict_held_bytes"),
]
HIDDEN = dict(layers=3, hidden=5, batch=4)


def solution_namespace(edit: tuple[str, str, str] | None = None) -> dict:
    return solutions.solution_namespace(LAB, [edit] if edit else [], SETUP)


def run_checks(ns: dict, seed: int | None = None, **sizes) -> dict[str, str]:
    """{test id: "pass" or the failure message}."""
    calls = {
        "test_split_backward": lambda: lab11.check_split_backward(
            ns["backward_input"], ns["backward_weight"], seed, **sizes),
        "test_predict_held_bytes": lambda: lab11.check_held_prediction(
            ns["predict_held_bytes"], seed),
    }
    return verdicts(calls)


# ---------------------------------------------------------------------------------------------
# The solution passes; each mistake loses exactly its own test, and is told why

def test_solution_passes_on_visible_and_fresh_cases():
    ns = solution_namespace()
    assert set(run_checks(ns).values()) == {"pass"}
    assert set(run_checks(ns, seed=7, **HIDDEN).values()) == {"pass"}


WHY = {"b_runs_the_full_backward": "computed 4 parameter gradient",
       "b_frees_the_graph": "retain_graph=True",
       "w_overwrites_grad": "W adds into p.grad",
       "w_runs_the_full_backward": "computed the stage input's gradient again",
       "recompute_without_output_and_gradient": "what else does W start from",
       "keep_without_the_inputs": "What does one Linear's weight gradient need"}


@pytest.mark.parametrize("name,cell,old,new,loses", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_exactly_its_own_test(name, cell, old, new, loses):
    results = run_checks(solution_namespace((cell, old, new)))
    assert {t for t, r in results.items() if r != "pass"} == {loses}, (name, results)
    assert WHY[name] in results[loses], results[loses]


def test_the_verdict_lines_show_the_figures():
    ns = solution_namespace()
    line = lab11.check_split_backward(ns["backward_input"], ns["backward_weight"])
    assert "first (B0 B1 W0 W1); middle (B0 W0 B1 W1); last (B0 B1 W1 W0)" in line
    line = lab11.check_held_prediction(ns["predict_held_bytes"])
    assert "num_layers=2, batch=8, hidden=16, itemsize=8: 6,144/4,096" in line


# ---------------------------------------------------------------------------------------------
# The ways of split_backward: equal to the full backward, and the bytes they hold

def _keep_way(case: dict) -> dict:
    """The keep way (keep_forward, keep_backward_input/weight) on a check's case."""
    from distlab.labs.losses import loss_fn
    case = copy.deepcopy(case)
    stage, m, kept, dxs = case["stage"], len(case["xs"]), {}, {}
    runs = []
    for i, x in enumerate(case["xs"]):
        x = x.clone().requires_grad_(case["input_grad"])
        y, linears = split.keep_forward(stage, x)
        if case["targets"] is not None:
            y = loss_fn(y, case["targets"][i]) / m
        runs.append((y, x, linears))
    for op, i in case["order"]:
        y, x, linears = runs[i]
        if op == "B":
            dy = None if case["dys"] is None else case["dys"][i]
            dxs[i], kept[i] = split.keep_backward_input(y, dy, x, linears)
        else:
            split.keep_backward_weight(kept.pop(i))
    return {"dx": [dxs[i] for i in range(m)],
            "grads": {n: p.grad for n, p in stage.named_parameters()}}


@pytest.mark.parametrize("seed", [0, 3])
def test_the_keep_way_equals_the_full_backward(seed):
    for case in lab11_split.split_cases(seed, **lab11_split.SIZES):
        want, got = lab11_split.full_backward(case), _keep_way(case)
        for g, w in zip(got["dx"], want["dx"]):
            assert (g is None) == (w is None)
            if w is not None:
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        for name, w in want["grads"].items():
            torch.testing.assert_close(got["grads"][name], w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_held_bytes_measured_equal_the_count_from_the_shapes(num_layers):
    """recompute (2L+2)·a, keep 2L·a (the prediction's formula), torch 2.13's split (3L−1)·a, as
    the lab states; W's matrix-multiply FLOPs (2L−1) products for recompute, L for the others."""
    batch, hidden = 4, 6
    ns = solution_namespace()
    rows = split.held_rows(ns["backward_input"], ns["backward_weight"], ns["predict_held_bytes"],
                           num_layers=num_layers, batch=batch, hidden=hidden)
    a, product = batch * hidden * 8, 2 * batch * hidden * hidden
    formula = lab11_split._held_bytes(num_layers, batch, hidden, 8)
    want = {"recompute": formula["recompute"], "keep": formula["keep"],
            "torch 2.13": (3 * num_layers - 1) * a}
    products = {"recompute": 2 * num_layers - 1, "keep": num_layers, "torch 2.13": num_layers}
    for row in rows:
        held = int(row["held between B and W (bytes)"].replace(",", ""))
        assert held == want[row["way"]], row
        assert int(row["W FLOPs"].replace(",", "")) == products[row["way"]] * product, row
        assert int(row["B FLOPs"].replace(",", "")) == num_layers * product, row
        if row["way"] != "torch 2.13":
            assert row["predicted"] == f"{want[row['way']]:,}", row


def test_the_course_answer_is_the_executors():
    """The course's pair passes its own check (it is what the executor runs by default)."""
    from distlab.labs.pipeline import executor
    assert executor.run_tables.__kwdefaults__["split_backward"] == (split.backward_input,
                                                                    split.backward_weight)
    assert "pass" == run_checks({"backward_input": split.backward_input,
                                 "backward_weight": split.backward_weight,
                                 "predict_held_bytes": lambda *a: lab11_split._held_bytes(*a)}
                                )["test_split_backward"]


def test_the_executor_runs_the_pair_it_is_given():
    """ZB-H1 on 2 ranks with the solution's B and W: equal to the single-process step (1e-6 in
    float64, as tests/test_lab11_executor.py); with a B that frees the graph, W fails there."""
    from distlab.labs.pipeline import tables
    from distlab.labs.pipeline.executor import run_tables, table_error
    from distlab.labs.pipeline.model import PipeSpec
    from distlab.runtime.outcome import DistributedError
    spec = PipeSpec(num_layers=4, hidden=8, batch=8)
    ns = solution_namespace()
    table = tables.zb_h1(2, 4)
    result = run_tables({"zb_h1": (table, list(range(2)))}, spec, 4, dtype=torch.float64,
                        split_backward=(ns["backward_input"], ns["backward_weight"]))["zb_h1"]
    assert max(table_error(result, spec, torch.float64)) < 1e-6
    bad = solution_namespace(MISTAKES[1][1:4])
    with pytest.raises(DistributedError, match="second time"):
        run_tables({"zb_h1": (table, list(range(2)))}, spec, 4, dtype=torch.float64,
                   split_backward=(bad["backward_input"], bad["backward_weight"]))


# ---------------------------------------------------------------------------------------------
# Through the grader: the solution passes these tests, the untouched lab fails them, each mistake
# loses its own

SAMPLE_KINDS = ()


def _planted() -> dict:
    return {name: (loses, [(cell, old, new)]) for name, cell, old, new, loses in MISTAKES}


