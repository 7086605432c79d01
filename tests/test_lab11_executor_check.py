"""Lab 11, Section 3: the executor exercise's check passes the solution's ``run_table`` on the
stored case and on fresh ones, and each planted mistake loses exactly its test, told why; a
deadlock is reported as one, within the check's timeout, not at the grader's. torch's own
schedules, run for real on the same model, give the executor's gradients.

Wrong submissions are the solution's own cell with a textual edit (``solution_namespace``), so
they stay in step with the lab.
"""
from __future__ import annotations

import time

import pytest
import torch

from distlab.checks import lab11, lab11_executor
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.course.notebooks import source_notebook
from distlab.runtime.per_rank import PerRank

LAB = "11_pipeline_schedules"
CELL = "executor"
SEND_LINE = "            sends.append(dist.isend(tensor, placement[stage], tag=tag(kind, stage, i)))"
WAIT_LINES = ("    for work in sends:                        # a send's buffer lives until it is "
              "received\n        work.wait()")
# (name, [(old, new)] in the solution's executor cell, what the failure must say)
MISTAKES = [
    # every send posted after the row's receives, each of which blocks until it arrives
    ("send_posted_after_a_blocking_receive",
     [(SEND_LINE, "            sends.append((tensor, placement[stage], tag(kind, stage, i)))"),
      (WAIT_LINES, "    works = [dist.isend(t, dst, tag=g) for t, dst, g in sends]   # at the end\n"
                   "    for work in works:\n        work.wait()")],
     "a deadlock"),
    # no tags (every message tag 0): in a V the activations and the gradients between a pair
    # of ranks share one stream and take each other's place. (A tag without the microbatch, or
    # the stage alone, passes: each stream then still matches in the order it was posted.)
    ("no_tags",
     [("        return 2 * (stage * m + i) + (kind == \"B\")",
       "        return 0")],
     "Does every tag tell them apart"),
    # every B the input's gradient only: tables without W never add the weights' gradients
    ("every_b_without_its_weights",
     [("weights=(s, i) not in with_w)", "weights=False)")],
     "no B of stage"),
]


def _setup() -> tuple[str, ...]:
    """The lab's locked import cells (every section's: the solution cells need them)."""
    return tuple(c.metadata["nbgrader"]["grade_id"] for c in source_notebook(LAB).cells
                 if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked")
                 and c.metadata["nbgrader"]["grade_id"].endswith("imports"))


def _run_table(edits=()):
    ns = solutions.solution_namespace(LAB, [(CELL, old, new) for old, new in edits], _setup())
    return ns["run_table"]


def _verdict(run_table, **case) -> str:
    try:
        return lab11.check_executor(run_table, **case)
    except CheckFailed as err:
        return f"FAILED: {err}"


CASES = [{}, dict(seed=7, world_size=2, num_microbatches=4)]


def test_the_solution_passes_on_the_stored_case_and_a_fresh_one():
    run_table = _run_table()
    for case in CASES:
        line = _verdict(run_table, **case)
        assert not line.startswith("FAILED"), line
        # its figures: the tables' messages per step, as compare.messages counts them
        assert ("interleaved 1F1B (v = 2) 112, ZB-H1 48, zero-bubble V 96" in line if not case
                else "interleaved 1F1B (v = 2) 24, ZB-H1 8, zero-bubble V 16" in line), line


@pytest.mark.parametrize("name,edits,says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_loses_its_test_and_says_why(name, edits, says, monkeypatch):
    bound = 3 * lab11_executor.TIMEOUT + 10   # the check's own timeout's, with a busy machine's slack
    if name == "send_posted_after_a_blocking_receive":
        # The deadlocked ranks wait out the check's timeout on each case, idle: 3 s of it show
        # the same verdict as 10 s (a correct run takes < 1 s), and the bound below still tells
        # the check's timeout from rank_timeout()'s 60 s.
        monkeypatch.setattr(lab11_executor, "TIMEOUT", 3.0)
    run_table = _run_table(edits)
    for case in CASES:
        started = time.monotonic()
        verdict = _verdict(run_table, **case)
        assert verdict.startswith("FAILED") and says in verdict, (name, case, verdict)
        if name == "send_posted_after_a_blocking_receive":
            # stopped by the check's own timeout, not the grader's minute; generous bound for
            # a busy machine (the budget's slack), far below rank_timeout()'s 60 s
            assert time.monotonic() - started < bound


def test_blocking_sends_and_receives_are_refused():
    """A run that completes with dist.send / dist.recv (possible here: receives are waited for
    in the table's order) still loses: the contract allows isend/irecv only."""
    run_table = _run_table([
        ("            posted[k] = buf, dist.irecv(buf, placement[frm], tag=tag(kind, s, i))",
         "            posted[k] = buf, None"),
        ("        buf, work = posted.pop(k)\n        work.wait()",
         "        buf, _ = posted.pop(k)\n        dist.recv(buf, placement[frm], tag=tag(kind, s, i))")])
    verdict = _verdict(run_table)
    assert verdict.startswith("FAILED") and "called recv" in verdict, verdict


@pytest.mark.stored_data
def test_torchs_schedules_give_the_executors_gradients():
    """torch's ScheduleInterleaved1F1B, ScheduleZBVZeroBubble and ScheduleDualPipeV, each run
    with its own PipelineStages on the stored case's model (p = 4, m = 8, two stages per rank),
    give the gradients of the course's executor run on their own tables, and the stored set the
    lab shows is theirs."""
    from distlab.labs.pipeline.executor import run_table, run_tables
    from distlab.labs.pipeline.on_ranks import M, P, SPEC, TORCH, torch_stored
    from distlab.labs.pipeline.torch_runs import torch_grads
    from distlab.labs.pipeline.torch_tables import torch_table
    theirs = torch_grads(TORCH, P, M, SPEC)
    ours = run_tables({name: torch_table(name, P, M) for name in TORCH}, SPEC, M,
                      dtype=torch.float64, executor=run_table, timeout=120)
    stored = torch_stored()
    for name in TORCH:
        assert abs(theirs[name]["loss"] - ours[name]["loss"]) <= 1e-12
        for n, g in theirs[name]["grads"].items():
            # sums in another order: about 1e-15 of gradients of order 10; 1e-6 is the lab's bar
            torch.testing.assert_close(ours[name]["grads"][n], g, atol=1e-6, rtol=1e-6)
            # The stored set was made on another CPU: the model's float32 initial weights
            # (torch.randn) differ in their last bit between torch's vectorised and plain paths,
            # up to 2.5e-5 relative on these gradients (ATEN_CPU_CAPABILITY=default, measured)
            torch.testing.assert_close(stored[name][n], g, atol=1e-4, rtol=1e-4)


def test_ranks_get_their_own_inputs_and_no_expected_value(monkeypatch):
    """As tests/test_per_rank_checks.py checks Labs 7-10's: on a hidden case, every rank's task
    holds its own stages, rows and data (the batch where a table's first stage runs, NaN
    elsewhere), neither the seed nor a reference."""
    from distlab.runtime import launch
    from test_per_rank_checks import SEED, _inspect
    runs, real = [], launch._calls

    def spy(fn, args, kwargs, world_size):
        calls = real(fn, args, kwargs, world_size)
        runs.append((getattr(fn, "__name__", "?"), world_size,
                     [v for v in (*args, *kwargs.values()) if not isinstance(v, PerRank)],
                     [v.values for v in (*args, *kwargs.values()) if isinstance(v, PerRank)],
                     calls))
        return calls

    monkeypatch.setattr(launch, "_calls", spy)
    lab11.check_executor(_run_table(), seed=SEED, world_size=2, num_microbatches=4)
    assert _inspect(runs) == 4   # the stages, the batch, the target, the rows


def test_a_stage_refuses_an_action_whose_input_is_not_there():
    """TableStage's guards: each says which action, on which stage and rank, and why."""
    from distlab.labs.pipeline.model import partition_layers, stage_layers
    from distlab.labs.pipeline.table_stages import build_stages
    spec = lab11_executor.SPEC
    model, (x, target) = spec.model().double(), spec.data()
    bounds = partition_layers(spec.num_layers, 2)
    stages = build_stages(0, {0: stage_layers(model, 0, 2, bounds),
                              1: stage_layers(model, 1, 2, bounds)}, [0, 0], 2,
                          x.double(), target.double())
    with pytest.raises(RuntimeError, match="rank 0: W of microbatch 0 on stage 1: its B has not"):
        stages[1].weights(0)
    with pytest.raises(RuntimeError, match="B of microbatch 0 on stage 0: its F has not run"):
        stages[0].backward(0, stages[0].buffer())
    with pytest.raises(RuntimeError, match="x is None: pass the activation stage 0 sent"):
        stages[1].forward(0)
    y = stages[0].forward(0)
    assert stages[1].forward(0, y) is None and set(stages[1].losses) == {0}
    g = stages[1].backward(0, weights=False)
    with pytest.raises(RuntimeError, match="F of microbatch 0 on stage 0: microbatches run once"):
        stages[0].forward(0)
    assert stages[0].backward(0, g) is None
    stages[1].weights(0)
    assert [e.kind for s in (0, 1) for e in stages[s].events] == ["F", "B", "F", "B", "W"]


def test_the_course_executor_is_the_solution_cell():
    """``executor.run_table`` (the course's, withheld from the handout) is the solution cell's
    function, docstrings aside: the lab and the foundation run the same loop."""
    import ast
    import inspect
    from distlab.labs.pipeline import executor

    def body(source: str) -> str:
        fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)
                  and n.name == "run_table")
        if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
            fn.body = fn.body[1:]
        return ast.dump(fn)
    cell = next(c.source for c in source_notebook(LAB).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == CELL)
    assert body(cell) == body(inspect.getsource(executor.run_table))


# ---------------------------------------------------------------------------------------------
# Through the grader: the solution passes test_executor, the untouched lab fails it, and each
# planted mistake loses it and no other test of the lab (the deadlock stopped by the check's
# timeout, not the grader's)

SAMPLE_KINDS = ()


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}: all three edit the executor's cell, so each is
    graded in a notebook of its own (tests/submissions/packing.py)."""
    return {name: ("test_executor", [(CELL, old, new) for old, new in edits])
            for name, edits, _ in MISTAKES}


def test_the_costs_the_section_states():
    """The figures of "Where a zero-bubble schedule costs", from the replay and the tables."""
    from distlab.labs.pipeline.compare import messages
    from distlab.labs.pipeline.on_ranks import TORCH, stored_problem, stored_torch_tables
    from distlab.labs.pipeline.schedules import replay, schedule_order
    from distlab.labs.pipeline.torch_tables import torch_table
    course, _, _, _ = stored_problem()
    theirs = stored_torch_tables()
    # the stored tables are torch 2.13's own, as torch_tables reads them now
    assert theirs == {f"torch {n}": tuple(torch_table(n, 4, 8)) for n in TORCH}
    lab5 = [[(op, i, r) for op, i in order] for r, order in enumerate(schedule_order("1f1b", 4, 8))]
    tables = {"1F1B": (lab5, [0, 1, 2, 3]), **course, "DualPipeV": theirs["torch ScheduleDualPipeV"]}

    def peaks(name):
        table, placement = tables[name]
        v = len(placement) // 4
        r = replay(table, t_fwd=1 / v, t_bwd=1 / v, t_wgt=1 / v, placement=placement)
        return [r.peak[k] for k in range(4)]
    assert peaks("1F1B") == [4, 3, 2, 1] and peaks("ZB-H1") == [4, 4, 4, 4]
    assert peaks("zero-bubble V") == [8] * 4 and peaks("DualPipeV") == [9] * 4
    assert {name: messages(*tables[name]) for name in tables} == {
        "1F1B": 48, "interleaved 1F1B (v = 2)": 112, "ZB-H1": 48, "zero-bubble V": 96,
        "DualPipeV": 96}
