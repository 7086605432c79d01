"""Lab 8, sharded data parallelism: the plumbing, the checks on the solution, and wrong
submissions, each of which must lose exactly its own exercise.

Wrong submissions are made from the solution's own cells by textual edits (never a hand-copied
notebook), so they stay in step with the lab.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

from distlab.checks import lab08, lab08_patterns
from distlab.checks.assertions import CheckFailed
from distlab.course import solutions
from distlab.checks.lab08_prediction import SCHEMES, formula_step_bytes
from distlab.labs.sharded import (CheckpointProblem, ShardSetup, alloc_storage, bind_params,
                                  block_profile, free_storage, padded_flat, saved_bytes,
                                  storage_bytes)
from distlab.labs.sharded.accounting import (STAGE_NAMES, bytes_per_param, computed_stage_bytes,
                                             format_bytes_per_param, format_stage_memory,
                                             format_volume, measure_stages, stage_table,
                                             volume_rows)
from distlab.labs.sharded.figures import checkpointing_measured, format_checkpointing

SOURCE = Path(__file__).resolve().parents[1] / \
    "solutions/08_sharded_data_parallel/08_sharded_data_parallel.py"
EXERCISES = {"zero2": ("Zero2AdamW", lab08.check_zero2_step),
             "zero3": ("Zero3Block", lab08.check_zero3_block),
             "prefetch": ("PrefetchingZero3", lab08.check_prefetch),
             "prediction": ("predict_step_bytes", lab08.check_step_bytes),
             "checkpoints": ("choose_checkpoints", lab08.check_choose_checkpoints),
             "design": ("design", lab08.check_design)}
ONE_PROCESS = ("prediction", "checkpoints")   # checks that take no world size


def solution_namespace(edits: list[tuple[str, str, str]] = ()) -> dict:
    """The solution cells and the imports, run, each planted edit (grade_id, old, new) applied."""
    return solutions.solution_namespace(LAB, edits)


def table_cells(text: str) -> list[list[str]]:
    """The cells of each line of a printed table (columns stand two or more spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines()]


def failing_exercises(ns: dict) -> dict[str, str]:
    """{exercise: the check's message} for every exercise whose visible check fails."""
    failed = {}
    for name, (obj, check) in EXERCISES.items():
        try:
            check(ns[obj]) if name in ONE_PROCESS else check(ns[obj], world_size=2)
        except CheckFailed as err:
            failed[name] = str(err)
    return failed


# ---- single-process plumbing -------------------------------------------------------------

def test_freed_buffer_releases_the_parameters_and_regathers_their_values():
    block = ShardSetup().model()[0]
    params = list(block.parameters())
    values = [p.detach().clone() for p in params]
    buffer = padded_flat(params, 4)
    bind_params(params, buffer)
    kept = buffer.clone()
    x = torch.randn(3, 16, dtype=torch.float64)
    out = block(x)
    free_storage(buffer)
    assert storage_bytes(params) == 0
    alloc_storage(buffer)
    buffer.copy_(kept)  # what an all-gather writes
    out.sum().backward()  # autograd's saved parameters are valid again
    assert storage_bytes(params) == buffer.numel() * 8
    assert all(torch.equal(p, v) for p, v in zip(params, values))


def test_block_profile_predicts_the_measured_stack():
    problem = CheckpointProblem(seed=3, widths=(8, 40, 24, 64))
    profile = block_profile(problem)
    for choice in itertools.product([False, True], repeat=4):
        predicted = sum(b["checkpointed_bytes"] if c else b["saved_bytes"]
                        for b, c in zip(profile, choice))
        assert saved_bytes(problem, choice) == predicted


def _record(*calls) -> list:
    """A rank's collective record made by hand: (op, bytes) per call, float64, rank 0."""
    from distlab.runtime.comms import Comm
    return [Comm(rank=0, seq=i, op=op, group=(0, 1), shapes=[(n // 8,)], dtype="float64", bytes=n)
            for i, (op, n) in enumerate(calls)]


def test_zero2_pattern_says_what_else_was_called_and_what_was_too_small():
    right = [("reduce_scatter_single", 800), ("all_gather_single", 800)] * 3   # 1 bucket, 3 steps
    lab08_patterns.check_zero2_pattern(_record(*right), 0, [100], 3)
    with pytest.raises(CheckFailed, match=r"rank 0, in 3 steps: it also called 3 × broadcast of "
                                          r"\[100\] \(800 bytes\); a ZeRO-2 step needs only"):
        lab08_patterns.check_zero2_pattern(_record(*right, *[("broadcast", 800)] * 3), 0, [100], 3)
    with pytest.raises(CheckFailed, match=r"all_gather_single #5 on \[50\] float64 moved 400 "
                                          r"bytes; less than a whole bucket \(800 bytes\)"):
        lab08_patterns.check_zero2_pattern(_record(*right[:5], ("all_gather_single", 400)), 0,
                                           [100], 3)
    with pytest.raises(CheckFailed, match=r"2 calls of all-gather \(2 × all_gather_single of \[100\] "
                                          r"\(800 bytes\)\), expected 3\. ZeRO-2 makes one per "
                                          r"bucket \(1 buckets\) per step.*All it issued: 3 × "
                                          r"reduce_scatter_single"):
        lab08_patterns.check_zero2_pattern(_record(*right[:5]), 0, [100], 3)


def test_bytes_per_param_are_the_zero_papers_figure_1():
    # ZeRO (arXiv:1910.02054) Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6, 1.88 GB.
    rows = {(r["convention"], r["world_size"], r["stage"]): r["total"]
            for r in bytes_per_param(world_sizes=(64,))}
    paper = "ZeRO paper (fp16 gradients)"
    gb = [round(7.5e9 * rows[(paper, 64, s)] / 1e9, 1) for s in range(4)]
    assert gb == [120.0, 31.4, 16.6, 1.9]
    assert rows[("Hugging Face (fp32 gradients)", 64, 0)] == 18


def test_bytes_per_param_table_shows_every_term_of_every_row():
    rows = bytes_per_param(world_sizes=(4, 64))
    header, rule, *lines = table_cells(format_bytes_per_param(rows))
    assert header == ["convention", "W", "stage", "weights", "gradients", "optimizer", "total"]
    assert lines == [[r["convention"], str(r["world_size"]), str(r["stage"])]
                     + [f"{r[k]:.3f}" for k in ("weights", "gradients", "optimizer", "total")]
                     for r in rows]


@pytest.fixture(scope="module")
def solution():
    return solution_namespace()


def test_memory_and_volume_measured_match_the_computed(solution):
    # hidden 63: 4,127 parameters per block, which 2 ranks do not divide (the buckets pad)
    stages = measure_stages(solution["Zero2AdamW"], solution["Zero3Block"], world_size=2,
                            setup=ShardSetup(d=32, hidden=63, blocks=3, dtype=torch.float32))
    # optimizer: AdamW's 4-byte step scalar per tensor it steps (at most 12 here) on top
    for row in stage_table(stages):
        for term, computed in row["computed"].items():
            assert 0 <= row["measured"][term] - computed <= 12 * 4, (row["stage"], term)
    assert computed_stage_bytes(3, 100, 4)["weights"] == 100
    # the lab's text: the optimizer column is 12/W for stages 1 and 2 (AdamW's two moments and the
    # fp32 shard the local AdamW steps), 8/W for stage 3 (the shards are the parameters), 8 at 0
    assert [computed_stage_bytes(s, 100, 4)["optimizer"] for s in range(4)] == [800, 300, 300, 200]
    assert [round(r["psi"], 2) for r in volume_rows(stages)] == [2.0, 2.0, 2.0, 3.0]
    # the prediction exercise's formula is the measured volume, padding included
    assert [r["bytes"] for r in volume_rows(stages)] == [
        formula_step_bytes(scheme, stages["block_numels"], 2, 4) for scheme in SCHEMES]
    caption, header, rule, *lines = table_cells(format_stage_memory(stages))
    assert header == ["stage", "weights", "gradients", "optimizer", "activations"]
    assert lines == [[STAGE_NAMES[r["stage"]]]
                     + [f"{r['computed'][k]:,.0f} / {r['measured'][k]:,}"
                        for k in ("weights", "gradients", "optimizer")]
                     + [f"{r['activations']:,}"] for r in stage_table(stages)]
    header, rule, *lines = table_cells(format_volume(stages))
    assert header == ["scheme", "collectives per step", "bytes moved", "measured", "paper"]
    assert [line[0] for line in lines] == ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert [line[3:] for line in lines] == [["2.00Ψ", "2Ψ"], ["2.00Ψ", "2Ψ"], ["2.00Ψ", "2Ψ"],
                                             ["3.00Ψ", "3Ψ"]]
    assert all(re.fullmatch(r"\d+ \w+(, \d+ \w+)*", line[1]) for line in lines), lines


def test_checkpointing_measurement_shows_the_quadratic_term():
    short, long = checkpointing_measured(seq_lens=(32, 64), layers=1)
    assert long["saved"] > 2.2 * short["saved"]                       # s^2 scores
    assert long["saved_checkpointed"] == 2 * short["saved_checkpointed"]  # the input only
    assert short["saved_checkpointed"] < short["saved"] / 10
    header, rule, *lines, growth, noise, rule_of_thumb = table_cells(format_checkpointing([short, long]))
    assert header == ["seq", "saved", "checkpointed", "ms/step", "ckpt ms", "saved / states"]
    assert [line[:3] for line in lines] == [[str(r["seq_len"]), f"{r['saved']:,}",
                                              f"{r['saved_checkpointed']:,}"] for r in (short, long)]
    assert growth[0].startswith("x2 sequence: saved x") and "1.25 rule, no published source" in rule_of_thumb[0]
    assert "read the bytes, not the milliseconds" in noise[0]


@pytest.mark.stored_data
def test_fsdp2_and_your_zero3_equal_one_process_and_differ_in_gathers(solution):
    from distlab.labs.sharded.fsdp import compare_with_fsdp, format_fsdp_comparison
    from distlab.checks.stored import tolerance
    from distlab.labs.sharded.problem import reference_params
    from distlab.labs.tables import residue
    rows = {r["variant"]: r for r in compare_with_fsdp(solution["Zero3Block"], world_size=2)}
    # against the stored run: float64 rounding on the CPU that made data/, on another what its
    # float32 weight init carries through 3 AdamW steps
    bound = tolerance(torch.cat(reference_params(ShardSetup(), 3)), steps=3)["atol"]
    assert all(r["max_diff"] < bound for r in rows.values()), rows
    ours, block, keep, whole = rows.values()
    block_bytes = 808 * 8  # one block's flat parameters (16*24 + 24 + 24*16 + 16), float64
    assert ours["gathers"] == block["gathers"] == 2 * 4 and keep["gathers"] == 4
    assert whole["gathers"] == 2
    assert ours["bytes"] == block["bytes"]                 # the same traffic, gathers and scatters
    assert block["peak_param_bytes"] <= 2 * block_bytes < keep["peak_param_bytes"]
    assert whole["peak_param_bytes"] == 4 * block_bytes
    header, rule, *lines = table_cells(format_fsdp_comparison(list(rows.values())))
    assert header == ["variant", "gathers/step", "bytes/step", "peak gathered", "ms/step",
                      "max |Δ| vs 1 process"]
    assert [line[:4] + line[5:] for line in lines] == [
        [r["variant"], str(r["gathers"]), f"{r['bytes']:,}", f"{r['peak_param_bytes']:,}",
         residue(r["max_diff"], r["scale"])] for r in rows.values()]


@pytest.mark.stored_data
def test_tp_within_fsdp_equals_one_process_and_runs_each_collective_on_its_axis():
    from distlab.labs.sharded.tp_fsdp import format_tp_fsdp, tp_within_fsdp
    from distlab.checks.stored import tolerance
    from distlab.labs.sharded.problem import reference_params
    result = tp_within_fsdp()
    # against the stored one-step run: as in test_fsdp2_and_your_zero3_equal_one_process_...
    assert result["max_diff"] < tolerance(torch.cat(reference_params(ShardSetup(), 1)))["atol"]
    assert result["tp_group"] == (0, 1) and result["dp_group"] == (0, 2)
    assert result["counts"] == {("all_gather_single", "dp"): 8, ("reduce_scatter_single", "dp"): 4,
                                ("all_reduce (functional)", "tp"): 7}
    assert result["local_shapes"][0] == (24 // 2 // 2, 16)   # Linear(16, 24): tp, then dp
    groups, diff, header, rule, *lines = table_cells(format_tp_fsdp(result))
    assert header == ["collective (rank 0, one step)", "axis", "count"]
    assert sorted(lines) == sorted([op, axis, str(n)] for (op, axis), n in result["counts"].items())


# ---- the checks on real ranks ------------------------------------------------------------

def test_solution_passes_every_check(solution):
    # the hidden tests' uneven shapes: P = 33 h + 16 elements per block, padded to W * s
    lab08.check_zero2_step(solution["Zero2AdamW"], world_size=4, seed=11, hidden=21)
    lab08.check_zero3_block(solution["Zero3Block"], world_size=4, seed=12, hidden=22, blocks=5)
    lab08.check_prefetch(solution["PrefetchingZero3"], world_size=4, seed=13, hidden=21)
    lab08.check_choose_checkpoints(solution["choose_checkpoints"], seed=14, fraction=0.4)
    lab08.check_step_bytes(solution["predict_step_bytes"], seed=15)
    lab08.check_design(solution["design"], world_size=4, seed=16)
    assert "within the bar" in lab08.check_design_bar(solution["design"], world_size=4, seed=17)
    assert failing_exercises(solution) == {}


# Each plausible mistake, and the words its own check must fail with.
MISTAKES = {
    "zero2": ([("zero2", "dist.reduce_scatter_single(shard_grad, grads)",
                "dist.all_reduce(grads); shard_grad.copy_(grads[self.rank * shard_grad.numel():"
                "(self.rank + 1) * shard_grad.numel()])")], "all_reduce"),
    "zero3": ([("zero3", "free_storage(self.full)\n        if output.requires_grad",
                "if output.requires_grad"),
               ("zero3", "q.grad = None\n        free_storage(self.full)", "q.grad = None")],
              "gathered parameters at once"),
    "prefetch": ([("prefetch", "self._issue(i + direction)         # runs while block i computes",
                   "pass"),
                  ("prefetch", "free_storage(self.buffers[i])\n        if output",
                   "free_storage(self.buffers[i])\n        if i + 1 < len(self.params):\n"
                   "            self._issue(i + 1)\n        if output")],
                 "after block 0's forward had ended"),
    "checkpoints": ([("choose_checkpoints", 'b["checkpointed_bytes"] if c else', "0 if c else")],
                    "over the budget"),
    # ZeRO-3 counted like ZeRO-2: the backward gather forgotten
    "prediction": ([("predict_step_bytes", '"ZeRO-3": 3}', '"ZeRO-3": 2}')], "the formula gives"),
    # sharded but no block checkpointed alone: the activations stay whole
    "design": ([("design", "[checkpoint_wrapper(block) for block in model]", "list(model)")],
               "This test's limit is Hint 3's design's peak"),
}

# Hint 3's design handed in (every block checkpointed and sharded): the first test of the scale
# passes, the bar's does not.
_OURS = "    # one Linear gathered at a time, not a block\n"
HINTED = [("design", _OURS + SOURCE.read_text().split(_OURS)[1].split("    return root")[0]
           + "    return root",
           "    blocks = [checkpoint_wrapper(block) for block in model]\n"
           "    for block in blocks:\n        fully_shard(block, mesh=mesh)\n"
           "    return fully_shard(torch.nn.Sequential(*blocks), mesh=mesh)")]


@pytest.mark.parametrize("exercise", list(MISTAKES))
def test_each_mistake_loses_exactly_its_own_exercise(exercise):
    edits, message = MISTAKES[exercise]
    failed = failing_exercises(solution_namespace(edits))
    assert list(failed) == [exercise], failed
    assert message in failed[exercise], failed[exercise]


def test_a_prefetch_waited_on_at_once_does_not_overlap():
    ns = solution_namespace([("prefetch", "async_op=True)\n",
                              "async_op=True)\n        self.pending[i].wait()\n")])
    with pytest.raises(CheckFailed, match="waited on before"):
        lab08.check_prefetch(ns["PrefetchingZero3"], world_size=2)


def test_zero2_keeping_full_gradients_fails_the_memory_check():
    ns = solution_namespace([("zero2", "p.grad = None                      # the full",
                              "pass  # p.grad = None                      # the full")])
    with pytest.raises(CheckFailed, match="bytes of gradients"):
        lab08.check_zero2_step(ns["Zero2AdamW"], world_size=2)


def test_hidden_tests_draw_blocks_whose_size_the_world_size_does_not_divide():
    import ast
    cells = SOURCE.read_text().split("### BEGIN HIDDEN TESTS")[1:]
    hidden = [node for cell in cells for node in ast.walk(ast.parse(
        cell.split("### END HIDDEN TESTS")[0].replace("\n    ", " ")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in
        ("check_zero2_step", "check_zero3_block", "check_prefetch")]
    uneven = {node.func.id for node in hidden
              if (lambda kw: (33 * kw.get("hidden", 24) + 16) % kw["world_size"])(
                  {k.arg: k.value.value for k in node.keywords if k.arg != "seed"})}
    assert uneven == {"check_zero2_step", "check_zero3_block", "check_prefetch"}


UNPADDED = [("zero2", "full = padded_flat(params, self.world_size)",
             "full = torch.cat([p.detach().reshape(-1) for p in params])"),
            ("zero2", "grads = padded_flat([p.grad for p in self.buckets[i]], self.world_size)",
             "grads = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])")]


def test_flat_buffers_without_padding_pass_even_blocks_and_fail_the_hidden_uneven_ones():
    ns = solution_namespace(UNPADDED)
    lab08.check_zero2_step(ns["Zero2AdamW"], world_size=2)           # 808 elements: no padding
    with pytest.raises(CheckFailed, match=r"(?s)Zero2AdamW \(fresh inputs, seed 5, hidden=21, "
                                          r"blocks=4\) on 4 ranks: the ranks failed.*Pad "
                                          r"each bucket's flat parameters and gradients to W·s"):
        lab08.check_zero2_step(ns["Zero2AdamW"], world_size=4, seed=5, hidden=21)


KEPT_GRADIENTS = [("zero2", "grads = padded_flat(",
                   "self.flat_grads = getattr(self, 'flat_grads', {})\n"
                   "        grads = self.flat_grads[i] = padded_flat(")]


def test_zero2_keeping_a_full_gradient_buffer_fails_the_memory_check():
    """p.grad is None after backward, but each bucket's padded gradient stays in an attribute."""
    ns = solution_namespace(KEPT_GRADIENTS)
    with pytest.raises(CheckFailed, match=r"rank 0 kept 25856 bytes of tensors alive after the "
                                          r"backward of step 0.*\(808,\) \(6464 bytes\).*at most "
                                          r"one more shard-sized buffer per bucket, 12928 bytes"):
        lab08.check_zero2_step(ns["Zero2AdamW"], world_size=2)


def test_zero3_without_the_backward_gather_is_told_what_happened():
    ns = solution_namespace([("zero3", "        if output.requires_grad:\n            output."
                              "register_hook(lambda grad: self.gather())", "        if False:\n"
                              "            pass")])
    with pytest.raises(CheckFailed) as failed:
        lab08.check_zero3_block(ns["Zero3Block"], world_size=2)
    message = str(failed.value)
    assert "Zero3Block (the stored inputs) on 2 ranks: the ranks failed" in message
    assert re.search(r"rank \d raised FreedParameters: the backward of block 3 needed its "
                     r"parameters, but their storage had been freed", message), message
    assert "output.register_hook" in message and "alloc_storage" in message
    assert "setStorage" not in message and "harness.py" not in message   # no raw PyTorch text


def test_a_deprecated_collective_is_named_once_and_not_printed_per_call(capfd):
    ns = solution_namespace([("zero2", "dist.reduce_scatter_single(shard_grad, grads)",
                              "dist.reduce_scatter_tensor(shard_grad, grads)")])
    with pytest.warns(UserWarning) as seen:
        lab08.check_zero2_step(ns["Zero2AdamW"], world_size=2)
    mine = [str(w.message) for w in seen if "on the ranks" in str(w.message)]
    assert len(mine) == 1, mine
    assert "Use dist.reduce_scatter_single instead of dist.reduce_scatter_tensor" in mine[0]
    assert "FutureWarning" not in capfd.readouterr().err


def test_rank_tracebacks_keep_the_students_frames_only():
    from distlab.checks.rank_failures import cut_tracebacks, student_frames
    tb = ('Traceback (most recent call last):\n'
          '  File "/work/main/distlab/runtime/rank.py", line 131, in _call_guarded\n'
          '    value = fn(rank, task.world_size, *args, **kwargs)\n'
          '  File "/tmp/ipykernel_77/123.py", line 9, in step\n'
          '    dist.all_gather_single(full, shard)\n'
          '  File "/usr/lib/python3/site-packages/torch/distributed/c10d_logger.py", line 83, in w\n'
          '    return func(*args, **kwargs)\n'
          'RuntimeError: sizes differ')
    cut, kept = student_frames(tb)
    assert kept == 1 and cut.splitlines() == [
        "Traceback (most recent call last):", "  (2 frames of the course's code, PyTorch and Python "
        "left out)", '  File "/tmp/ipykernel_77/123.py", line 9, in step',
        "    dist.all_gather_single(full, shard)", "RuntimeError: sizes differ"]
    message = f"rank 0 raised RuntimeError: x\n\n--- traceback on rank 0 ---\n{tb}\n\n--- the other"
    assert "c10d_logger" not in cut_tracebacks(message, tb)
    # The grader's ranks run a lab's student package, a copy of distlab elsewhere: course code too.
    view = ('Traceback (most recent call last):\n'
            '  File "/srv/grading/views/08_sharded_data_parallel/distlab/labs/sharded/harness.py", '
            'line 3, in run\n    step()\nRuntimeError: x')
    assert student_frames(view)[1] == 0


def test_zero2_missing_average_fails_the_values():
    ns = solution_namespace([("zero2", "shard_grad.div_(self.world_size)", "shard_grad")])
    with pytest.raises(CheckFailed, match="parameters after"):
        lab08.check_zero2_step(ns["Zero2AdamW"], world_size=2)


def test_passing_lines_show_the_bytes_and_the_checkpoints(solution):
    # What a pass shows: the student's figures (the reference's here, computed here).
    from distlab.checks.lab08_prediction import prediction_cases
    from distlab.labs.sharded import best_checkpoint_choice, budget_of, recompute_flops
    line = lab08.check_step_bytes(solution["predict_step_bytes"], seed=4)
    for scheme, blocks, world, item in prediction_cases(4):
        assert f"{scheme} {formula_step_bytes(scheme, blocks, world, item):,}" in line
    assert "seed" not in line
    problem = CheckpointProblem(fraction=0.3)
    budget = budget_of(problem)
    choice, least = best_checkpoint_choice(problem, budget)
    line = lab08.check_choose_checkpoints(solution["choose_checkpoints"], fraction=0.3)
    assert f"{saved_bytes(problem, choice):,} bytes kept (measured) within the budget of " \
           f"{budget:,}; recompute {recompute_flops(problem, choice):,} FLOPs, the least of every " \
           f"choice within the budget ({least:,})" in line


def test_greedy_choices_miss_the_least_recompute_on_the_labs_stack():
    """Exercise 5's hint: every block saves the same bytes per recomputed FLOP, so the choice is
    subset sum, and greedy rules (widest or narrowest first) overshoot at the visible budgets."""
    from distlab.labs.sharded import best_checkpoint_choice, budget_of, recompute_flops
    for fraction in lab08.VISIBLE_FRACTIONS:
        problem = CheckpointProblem(fraction=fraction)
        profile, budget = block_profile(problem), budget_of(problem)
        ratios = {(b["saved_bytes"] - b["checkpointed_bytes"]) / b["recompute_flops"] for b in profile}
        assert len(ratios) == 1
        least = best_checkpoint_choice(problem, budget)[1]
        for widest_first in (True, False):
            choice = [False] * len(profile)
            for b in sorted(profile, key=lambda b: b["hidden"], reverse=widest_first):
                if saved_bytes(problem, choice) <= budget:
                    break
                choice[b["block"]] = True
            assert saved_bytes(problem, choice) <= budget < sum(b["saved_bytes"] for b in profile)
            assert recompute_flops(problem, choice) > least, (fraction, widest_first)


def test_design_scale_bound_bar_hinted_and_every_plain_design_in_order():
    """The scale on 2 ranks: the bound < the bar < Hint 3's design's peak (as stored, and measured
    again exactly) < every plain design's; the course's design between the bound and the bar."""
    from distlab.checks.lab08_design import peak_scale, stored_design
    from distlab.labs.sharded.budget import course_design, hinted_design, measure_peak
    peaks, losses = stored_design()
    fig = peak_scale(peaks, 2)
    assert fig["bound"] < fig["bar"] < fig["hinted"] == peaks.course < min(peaks.plain.values())
    assert measure_peak(hinted_design, 2) == peaks.course        # the measurement repeats exactly
    assert fig["bound"] <= measure_peak(course_design, 2) <= fig["bar"]
    assert list(lab08.design_budget().values()) == [*peaks.plain.values(), fig["hinted"],
                                                    fig["bar"], fig["bound"]]


def test_the_bound_is_the_sum_the_lab_states():
    """design_bound counts what the lab's text lists, term by term, from the setup's shapes."""
    from distlab.labs.sharded.budget import DESIGN_SETUP, design_bound
    s = DESIGN_SETUP
    block = sum(p.numel() for p in s.model()[0].parameters())
    for w in (2, 4):
        n = s.batch // w
        assert design_bound(w) == (3 * n * s.d + 3 * s.blocks * block / w
                                   + (s.blocks - 1) * block / w + n * (s.hidden + s.d)) * 8


def test_hinted_design_passes_the_first_test_and_misses_the_bar_on_one_run(monkeypatch):
    """Hint 3's design: the first test's verdict shows its peak beside the scale; the bar's test
    reads the same run (no second launch) and fails naming the bar."""
    from distlab.checks import lab08_design
    hinted = solution_namespace(HINTED)["design"]
    line = lab08.check_design(hinted, world_size=2)
    fig = lab08_design.peak_scale(lab08_design.stored_design()[0], 2)
    assert (f"peak {fig['hinted']:,} bytes per rank; Hint 3's design {fig['hinted']:,}, the bar "
            f"{fig['bar']:,}, the bound {fig['bound']:,}: within Hint 3's design's peak") in line
    monkeypatch.setattr(lab08, "_run", None)     # a second launch would fail
    with pytest.raises(CheckFailed, match=r"This test's limit is the bar"):
        lab08.check_design_bar(hinted, world_size=2)


def test_the_first_test_run_again_grades_a_fixed_helper_afresh():
    """In a student's kernel: ``design`` calls a helper; the student fixes the helper and runs
    the test cell again without redefining ``design``. The same function object must be trained
    again (the stale run failed), and the bar's test then takes that new run."""
    from distlab.labs.sharded.budget import hinted_design
    helper = {"plan": lambda model, mesh: model}        # shards nothing: over Hint 3's peak

    def design(model, mesh):
        return helper["plan"](model, mesh)
    with pytest.raises(CheckFailed, match=r"This test's limit is Hint 3's design's peak"):
        lab08.check_design(design, world_size=2)
    helper["plan"] = hinted_design                       # the fix
    assert "within Hint 3's design's peak" in lab08.check_design(design, world_size=2)
    with pytest.raises(CheckFailed, match=r"peak [\d,]+ bytes per rank; Hint 3's design .* "
                                          r"This test's limit is the bar"):
        lab08.check_design_bar(design, world_size=2)


def test_a_design_that_steps_in_backward_is_refused():
    """The bound counts every gradient waiting for the check's AdamW: a design that steps and
    drops gradients in backward hooks is named, not scored."""
    from distlab.labs.sharded.budget import hinted_design

    def steps_itself(model, mesh):
        model = hinted_design(model, mesh)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        return model
    with pytest.raises(CheckFailed, match=r"had no gradient.*leave every gradient to it"):
        lab08.check_design(steps_itself, world_size=2)


def test_the_numbers_the_new_exercises_state_are_the_codes():
    """Exercise 4 names its visible cases, exercise 6 its model: both as the code has them."""
    from distlab.checks.lab08_prediction import VISIBLE
    from distlab.labs.sharded.accounting import MEASURED_SETUP
    from distlab.labs.sharded.budget import DESIGN_SETUP, DESIGN_STEPS
    text = " ".join(line.lstrip("# ") for line in SOURCE.read_text().splitlines())
    measured = [sum(p.numel() for p in b.parameters()) for b in MEASURED_SETUP.model()]
    assert VISIBLE[0] == (tuple(measured), 2, 4) and VISIBLE[1][1:] == (4, 8)
    assert f"4 blocks of {measured[0]:,} float32 parameters, W = 2" in text
    assert f"3 blocks of {VISIBLE[1][0][0]} float64 parameters on 4 ranks" in text
    numel = sum(p.numel() for p in DESIGN_SETUP.model().parameters())
    d, h = DESIGN_SETUP.d, DESIGN_SETUP.hidden
    assert f"{DESIGN_SETUP.blocks} MLP blocks {d} → {h} → {d}" in text
    assert f"({numel:,} float64 parameters), a batch of {DESIGN_SETUP.batch} rows" in text
    assert f"AdamW (lr {DESIGN_SETUP.lr:g}) for {DESIGN_STEPS} steps" in text


def test_design_without_sharding_fails_the_budget_and_names_it():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    def checkpointed_only(model, mesh):
        return torch.nn.Sequential(*(checkpoint_wrapper(block) for block in model))
    with pytest.raises(CheckFailed, match=r"rank \d held [\d,]+ bytes at its peak.*This test's "
                                          r"limit is Hint 3's design's peak.*which of the two"):
        lab08.check_design(checkpointed_only, world_size=2)


def test_checkpointing_everything_is_not_the_least_recompute():
    with pytest.raises(CheckFailed, match="recomputes only"):
        lab08.check_choose_checkpoints(lambda profile, budget: [True] * len(profile))


# ---- the grader on the lab: full marks, zero, and each mistake losing its own test --------

LAB = lab08.LAB
OWN_TEST = {"zero2": "test_zero2", "zero3": "test_zero3", "prefetch": "test_prefetch",
            "prediction": "test_predict_step_bytes", "checkpoints": "test_choose_checkpoints",
            "design": ("test_design", "test_design_bar")}   # over Hint 3's peak: over the bar too
POINTS = {"test_zero2": 3, "test_zero3": 3, "test_prefetch": 3, "test_predict_step_bytes": 2,
          "test_choose_checkpoints": 3, "test_design": 2, "test_design_bar": 1}


# Of the suite's shared grading run (tests/conftest.py): this lab's solution and untouched
# version, and each mistake, graded beside every other sample.
SAMPLE_KINDS = ()


def own_graded_samples() -> dict:
    """{(student, lab): notebook}: the solution, the untouched lab and the mistakes, in as few
    notebooks as keep each the one reason its test fails (tests/submissions/packing.py)."""
    import submissions
    from submissions import packing
    return {("solution", LAB): submissions.solved(LAB), ("untouched", LAB): submissions.student(LAB),
            **packing.packed_samples(LAB, _planted(), alone=GRADED_ONLY_MISTAKES)}


def _planted() -> dict:
    """{mistake: (the test it loses, its edits)}, the graded-only ones too."""
    return {**{exercise: (OWN_TEST[exercise], edits) for exercise, (edits, _) in MISTAKES.items()},
            **{name: (OWN_TEST[exercise], edits)
               for name, (exercise, edits) in GRADED_ONLY_MISTAKES.items()},
            "design_hinted": ("test_design_bar", HINTED)}


# Mistakes the visible checks let through or that only the whole grading shows, each losing its
# own test: flat buffers without padding (only the hidden tests' uneven blocks catch them) and a
# full-size gradient kept in an attribute (the memory check counts every byte a rank keeps).
GRADED_ONLY_MISTAKES = {"zero2_unpadded": ("zero2", UNPADDED),
                        "zero2_kept_gradients": ("zero2", KEPT_GRADIENTS)}


@pytest.fixture(scope="module")
def graded(graded_samples):
    """{student: CSV row} of this lab's samples."""
    return {student: row for (student, lab), row in graded_samples["rows"].items() if lab == LAB}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grader_gives_the_solution_full_marks_and_the_student_version_zero(graded):
    tests = list(POINTS)
    assert {t: graded["solution"][t] for t in tests} == dict.fromkeys(tests, "pass")
    assert float(graded["solution"]["score"]) == float(graded["solution"]["max_score"]) == \
        sum(POINTS.values())
    assert float(graded["untouched"]["score"]) == 0
    assert all(graded["untouched"][t] not in ("pass", "missing", "") for t in tests)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("exercise", list(MISTAKES) + list(GRADED_ONLY_MISTAKES) + ["design_hinted"])
def test_grader_takes_each_mistake_off_its_own_test_only(graded, exercise):
    """The mistake's notebook may hold other mistakes, each in a test of its own that cannot
    reach this one's cells (tests/submissions/packing.py): each loses its test, every other test
    passes."""
    from submissions import packing
    planted = _planted()
    sample, lost = packing.lost(packing.grouped(LAB, planted, alone=GRADED_ONLY_MISTAKES),
                                planted, exercise)
    row = graded[sample]
    assert packing.tests(planted[exercise][0]) <= lost
    statuses = {t: row[t] for t in POINTS}
    expected = {t: ("fail" if t in lost else "pass") for t in POINTS}
    assert statuses == expected
    assert float(row["score"]) == sum(POINTS.values()) - sum(POINTS[t] for t in lost)


@pytest.mark.slow
def test_graded_design_cells_print_the_scale_not_none(graded_samples):
    """Under the grader each design cell shows the verdict line the judge sends back: the
    solution's peak beside Hint 3's design's, the bar and the bound (the site shows the same
    comparison, from the executed solution), never a bare None."""
    import nbformat
    from distlab.labs.sharded.budget import design_bound
    nb = nbformat.read(graded_samples["autograded"]("solution", LAB), as_version=4)
    for grade_id, verdict in (("test_design", "within Hint 3's design's peak"),
                              ("test_design_bar", "within the bar")):
        cell = next(c for c in nb.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert verdict in text and f"the bound {design_bound(2):,}" in text, text
        assert "None" not in text.split(), text


def test_the_student_version_imports_only_what_it_uses():
    """fresh_seed is the hidden tests' (imported in their own block), not the student's."""
    import nbformat
    nb = nbformat.read(SOURCE.parents[2] / "notebooks" / SOURCE.parent.name / f"{SOURCE.stem}.ipynb", 4)
    assert "fresh_seed" not in "".join(cell.source for cell in nb.cells)


@pytest.mark.stored_data
def test_visible_tests_and_figures_read_stored_references(solution, monkeypatch):
    """A handout has no reference training (checks' _reference, reference_sharded_training): the
    visible test reads the stored set, and the FSDP2 and 2-D mesh figures' references for the
    lab's setup are stored too, equal to the reference training's."""
    from distlab.checks.stored import tolerance
    from distlab.labs.sharded import problem
    for steps in problem.STORED_STEPS:
        stored = problem.reference_params(ShardSetup(), steps)
        computed = lab08.reference_sharded_training(ShardSetup(), steps)["params"]
        # Float64 training from weights drawn in float32, a last bit apart on another CPU:
        # AdamW carries that through its steps (1.8e-7 of 0.26 with ATEN_CPU_CAPABILITY=default).
        for got, want in zip(computed, stored, strict=True):
            torch.testing.assert_close(got, want, **tolerance(want, steps=steps))

    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    monkeypatch.setattr(lab08, "_reference", withheld)
    monkeypatch.setattr(problem, "reference_sharded_training", withheld)
    assert len(problem.reference_params(ShardSetup(), 1)) == ShardSetup.blocks
    lab08.check_zero2_step(solution["Zero2AdamW"], world_size=2)


@pytest.mark.stored_data
def test_design_peaks_follow_the_shapes_not_the_seed():
    # a hidden case (4 ranks, a fresh seed) reads the 4-rank peaks stored once
    # (lab08_design.stored_peaks), not measured per student: they must not depend on the seed
    import dataclasses
    from distlab.checks.lab08_design import stored_peaks
    from distlab.labs.sharded.budget import (DESIGN_SETUP, course_design, design_bound,
                                             hinted_design, measure_peak)
    assert measure_peak(hinted_design, 2) == \
        measure_peak(hinted_design, 2, dataclasses.replace(DESIGN_SETUP, seed=12345))
    four = stored_peaks(4)
    assert design_bound(4) < four.course < min(four.plain.values())
    assert measure_peak(hinted_design, 4, dataclasses.replace(DESIGN_SETUP, seed=777)) == four.course
    # the course's design reaches the 4-rank bar too (the hidden case)
    assert measure_peak(course_design, 4) <= (four.course + design_bound(4)) // 2


def test_zero3_ranks_get_the_model_nan_outside_their_own_shard():
    """ZeRO-3's wrap receives the whole model (issue 41, DESIGN.md "The shape of a check"): each
    rank's copy holds the values of its flat shard of each block and NaN elsewhere, so a wrapper
    that reads another rank's part instead of gathering it computes NaN."""
    from distlab.labs.sharded.problem import blind_outside_shard, padded_flat
    model = ShardSetup(hidden=19).model()            # P = 643 a block: the last shard is padded
    for world_size in (2, 4):
        for rank in range(world_size):
            for blind, whole in zip(blind_outside_shard(model, rank, world_size), model):
                flat = padded_flat(list(blind.parameters()), world_size)
                true = padded_flat(list(whole.parameters()), world_size)
                s = flat.numel() // world_size
                mine = torch.zeros(flat.numel(), dtype=torch.bool)
                mine[rank * s:(rank + 1) * s] = True
                padding = torch.arange(flat.numel()) >= sum(p.numel() for p in whole.parameters())
                assert torch.equal(flat[mine], true[mine])
                assert flat[~mine & ~padding].isnan().all()
