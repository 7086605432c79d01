"""Lab 05, pipeline parallelism: the plumbing in distlab.labs.pipeline and the graded checks.

The correct step functions are the lab's own solutions (``solution_functions()``); the wrong ones
below are the mistakes the checks must catch, each with the message a student would read.
"""
import collections
import re

import pytest
import torch
import torch.distributed as dist

from distlab.checks.assertions import VERDICT_CHARS, CheckFailed, assert_close
from distlab.checks import lab05
from distlab.checks.stored import load as load_stored
from distlab.course import solutions
from distlab.course.solutions import solution_functions
from distlab.labs.pipeline import (SCHEDULES, PipeSpec, TimedStage, measured_bubble, library_step,
                              loss_fn, partition_layers, peak_in_flight, reference_step,
                              run_schedules, schedule_order, schedule_table, simulate, stage_layers,
                              theoretical_bubble, replay)
from distlab.labs.tables import residue


@pytest.fixture(scope="module")
def sol():
    return solution_functions(lab05.LAB, ("partition", "naive_step", "gpipe_step", "one_f_one_b_step"))


# ----------------------------------------------------------------------------- single process


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8), (4, 3), (3, 16)])
def test_simulated_bubble_and_memory(p, m):
    for kind in ("gpipe", "1f1b"):
        events = simulate(kind, p, m, t_bwd=2.0)
        assert measured_bubble(events, p) == pytest.approx(theoretical_bubble(p, m))
        assert len(events) == 2 * p * m
        expected = {s: m for s in range(p)} if kind == "gpipe" else {s: min(p - s, m) for s in range(p)}
        assert peak_in_flight(events) == expected
    assert measured_bubble(simulate("naive", p, m), p) == pytest.approx((p - 1) / p)


def test_simulator_reports_a_deadlocking_order(monkeypatch):
    import distlab.labs.pipeline.schedules as pl
    # Stage 0 wants B0 before F1, stage 1 wants F1 before B0: each waits for the other.
    monkeypatch.setattr(pl, "schedule_order", lambda kind, p, m: [
        [("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]])
    with pytest.raises(RuntimeError, match="deadlocks: stage 0 at .'B', 0."):
        pl.simulate("gpipe", 2, 2)


def test_1f1b_order_has_warmup_steady_cooldown():
    orders = schedule_order("1f1b", 4, 6)
    assert orders[0][:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]   # 3 warm-up forwards, then F3
    assert orders[0][4] == ("B", 0)
    assert orders[3][:2] == [("F", 0), ("B", 0)]                        # last stage: no warm-up
    for order in orders:
        assert sorted(order) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])


def test_partition_layers_is_balanced_and_contiguous():
    for L, p in [(8, 2), (7, 2), (10, 4), (4, 4), (13, 5)]:
        ranges = partition_layers(L, p)
        sizes = [b - a for a, b in ranges]
        assert ranges[0][0] == 0 and ranges[-1][1] == L and max(sizes) - min(sizes) <= 1
        assert all(ranges[s][1] == ranges[s + 1][0] for s in range(p - 1))
    with pytest.raises(ValueError, match="at least one layer"):
        partition_layers(3, 4)


def test_check_partition(sol):
    line = lab05.check_partition(sol["partition"])
    # the line shows the student's cut of the largest case that does not divide evenly
    L, p = max((L, p) for L, p in lab05.PARTITION_CASES if L % p)
    ranges = sol["partition"](L, p)
    assert f"{len(lab05.PARTITION_CASES)} cuts" in line and len(line) <= VERDICT_CHARS, line
    assert f"your partition({L}, {p}) = {ranges}: sizes {'/'.join(str(b - a) for a, b in ranges)}" in line
    assert f"{L}/{p} = {L / p:.3g}" in line
    line = lab05.check_partition(sol["partition"], seed=123)
    assert "12 cuts" in line and "seed" not in line and len(line) <= VERDICT_CHARS, line

    def remainder_on_last(L, p):
        return [(s * (L // p), (s + 1) * (L // p) if s < p - 1 else L) for s in range(p)]
    with pytest.raises(CheckFailed, match="sizes as equal"):
        lab05.check_partition(remainder_on_last)
    with pytest.raises(CheckFailed, match="begin where the previous one stops"):
        lab05.check_partition(lambda L, p: [(0, L // p)] * p)


def test_timed_stage_records_microbatches_and_activation_memory():
    spec = PipeSpec(num_layers=3, hidden=8, batch=8, seed=1)
    _, ref = reference_step(spec)
    stage = TimedStage(stage_layers(spec.model(), 0, 1), rank=0)
    x, target = spec.data()
    ys = [stage(a) for a in x.chunk(4)]                        # 4 x (2, 8)
    per_mb = stage.peak_activation_bytes // 4
    # each block saves its linear input and the linear output (for gelu): 2 tensors of (2, 8)
    assert per_mb == 3 * 2 * 2 * 8 * 4
    for y, t in zip(ys, target.chunk(4)):
        (loss_fn(y, t) / 4).backward()
    assert stage._meter.live == 0
    for name, p in stage.layers.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], atol=1e-6, rtol=1e-5)
    assert sorted((e.kind, e.mb) for e in stage.events) == sorted(
        [("F", i) for i in range(4)] + [("B", i) for i in range(4)])
    assert all(e.end >= e.start for e in stage.events)
    assert peak_in_flight(stage.events) == {0: 4}


@pytest.mark.stored_data
def test_stored_references_match_the_code():
    stored = load_stored(lab05.LAB, "visible")
    loss, grads = reference_step(lab05.VISIBLE)
    # Not bit for bit: the stored set was made with another torch build and CPU, whose float32
    # draws and sums differ in the last bits (39.662827 stored, 39.662830 with torch 2.13 here).
    from distlab.checks.stored import tolerance
    torch.testing.assert_close(torch.tensor(loss), stored["loss"], **tolerance(stored["loss"]))
    for name, g in grads.items():
        want = stored[f"grad.{name}"]
        torch.testing.assert_close(g, want, **tolerance(want))


# ----------------------------------------------------------------------------- on real ranks


def test_solutions_pass_every_check(sol):
    from distlab.checks.messenger import run_check
    _, line = run_check(lab05.check_naive.__judged__, sol["naive_step"], world_size=2)
    # the passing line shows the student's gradients, not the check's look at its stored batch
    assert "checks passed" in line and "naive_step: gradient of" in line, line
    assert "stored vs drawn" not in line, line
    lab05.check_gpipe(sol["gpipe_step"], world_size=4, num_microbatches=2, num_layers=5, seed=7)
    run = lab05.check_1f1b(sol["one_f_one_b_step"], world_size=4, num_microbatches=8, batch=16,
                           num_layers=7, seed=11)
    assert run.in_flight == {0: 4, 1: 3, 2: 2, 3: 1}          # p - s, measured


def test_all_schedules_and_the_library_agree(sol):
    spec = PipeSpec(num_layers=4, hidden=16, batch=8, seed=3)
    runs = run_schedules({"naive": (sol["naive_step"], None), "GPipe": (sol["gpipe_step"], 4),
                          "1F1B": (sol["one_f_one_b_step"], 4),
                          "torch GPipe": (library_step("ScheduleGPipe"), 4),
                          "torch 1F1B": (library_step("Schedule1F1B"), 4)}, 2, spec, warmup=1)
    lab05.check_library_matches(runs, spec)
    for run in runs.values():
        # whatever the schedule, rank 0 sends the whole (b, h) batch of activations once
        assert run.sent_bytes[0] == spec.batch * spec.hidden * 4
        assert 0 < run.bubble < 1 and run.step_time > 0
    assert runs["GPipe"].in_flight == runs["torch GPipe"].in_flight == {0: 4, 1: 4}
    assert runs["1F1B"].in_flight == runs["torch 1F1B"].in_flight == {0: 2, 1: 1}
    assert runs["1F1B"].activation_bytes[0] < runs["GPipe"].activation_bytes[0]


def _withhold(monkeypatch, *targets):
    """Make the course objects ``(module, name)`` raise, as their stubs do in a handout."""
    def withheld(*args, **kwargs):
        raise NotImplementedError("not in the handout")
    for module, name in targets:
        monkeypatch.setattr(module, name, withheld)


def test_visible_checks_need_no_answer_of_the_course(sol, monkeypatch):
    """In a handout the visible tests read the stored partitions and gradients, and the ranks get
    their stage's layers as data: no partition_layers, reference step or library there. The hidden
    path computes them (in the judge, which has them); in a handout, it says there are no stored
    values for that case and which cases are stored."""
    import distlab.labs.pipeline.model as model
    import distlab.labs.pipeline.runs as runs_module
    _withhold(monkeypatch, (lab05, "partition_layers"), (lab05, "reference_step"),
              (lab05, "_reference"), (model, "partition_layers"), (model, "reference_step"),
              (runs_module, "partition_layers"), (runs_module, "reference_step"))
    lab05.check_partition(sol["partition"])
    lab05.check_naive(sol["naive_step"], world_size=2)
    lab05.check_gpipe(sol["gpipe_step"], world_size=4, num_microbatches=2)
    with pytest.raises(CheckFailed, match="no stored expected values for 23 layers on 6 stages"):
        lab05.check_partition(sol["partition"], seed=5)
    # a case without stored values: the check says so and names the stored ones, not the stub
    with pytest.raises(CheckFailed, match=r"no stored expected values for seed=5.*Stored: the "
                                          r"model and batch of seed 505"):
        lab05.check_naive(sol["naive_step"], world_size=2, seed=5)
    with pytest.raises(CheckFailed, match=r"no stored expected values for 6 layers on 3 stages"
                                          r".*\(6, 2\), \(6, 4\)") as info:
        lab05.check_naive(sol["naive_step"], world_size=3)
    assert "partition_layers" not in str(info.value)


def test_stages_follow_the_bounds_they_are_given(sol):
    spec = PipeSpec(num_layers=5, hidden=8, batch=4, seed=2)
    layers = stage_layers(spec.model(), 1, 2, [(0, 1), (1, 5)])
    assert list(layers._modules) == ["1", "2", "3", "4"]
    run = run_schedules({"naive": (sol["naive_step"], None)}, 2, spec, bounds=[(0, 1), (1, 5)])["naive"]
    assert [sorted(g) for g in run.grads] == [["0.lin.bias", "0.lin.weight"],
                                              sorted(f"{i}.lin.{p}" for i in range(1, 5)
                                                     for p in ("bias", "weight"))]
    for bad in ([(0, 2), (3, 5)], [(0, 5)], [(0, 0), (0, 5)], "0-5"):
        with pytest.raises(ValueError, match="bounds="):
            run_schedules({"naive": (sol["naive_step"], None)}, 2, spec, bounds=bad)


def test_stored_library_runs_are_the_librarys_schedules():
    """The lab shows torch.distributed.pipelining's runs as recorded (a handout has no
    library_step): GPipe holds all m microbatches, 1F1B p - s; both send the whole batch once
    and match the single-process gradients."""
    runs = lab05.stored_library_runs()
    spec = lab05.MEASURED
    assert list(runs) == ["torch GPipe", "torch 1F1B"]
    assert runs["torch GPipe"].in_flight == {0: 4, 1: 4} and runs["torch 1F1B"].in_flight == {0: 2, 1: 1}
    for run in runs.values():
        assert run.sent_bytes[0] == spec.batch * spec.hidden * 4
        assert run.grad_error < 1e-4 and 0 < run.bubble < 1
        assert sorted((e.kind, e.mb) for e in run.events if e.rank == 0) == sorted(
            [("F", i) for i in range(4)] + [("B", i) for i in range(4)])
    table = schedule_table(runs)
    assert "torch 1F1B" in table and "max |dgrad|" not in table


def test_schedule_table_measures_gradients_against_a_run_of_its_own(sol):
    spec = PipeSpec(num_layers=4, hidden=16, batch=8, seed=3)
    runs = run_schedules({"naive": (sol["naive_step"], None), "GPipe": (sol["gpipe_step"], 4)},
                         2, spec)
    runs |= lab05.stored_library_runs()
    rows = {line.split()[0] + line.split()[1]: line for line in
            schedule_table(runs, baseline="naive").splitlines()[2:]}
    # float32 gradients: a difference that is rounding shows as its bound, in float32 units of
    # the gradients' largest |value| (no digits of a residue, which differ by CPU)
    reference = {n: g for grads in runs["naive"].grads for n, g in grads.items()}
    scale = max(g.abs().max().item() for g in reference.values())
    bound = residue(0.0, scale, eps=torch.finfo(torch.float32).eps)
    assert re.fullmatch(r"< 1e-\d\d", bound)
    for name in ("naive2", "GPipe2", "torchGPipe", "torch1F1B"):      # stored runs: as recorded
        assert rows[name].endswith(f"  {bound}"), rows[name]
    assert runs["torch 1F1B"].grad_error < float(bound[2:])


def gpipe_unscaled(rank, world_size, stage, x, target, num_microbatches):
    """GPipe that forgets to divide each microbatch loss by m."""
    first, last, m = rank == 0, rank == world_size - 1, num_microbatches
    pairs = []
    for xi, ti in zip(x.chunk(m), target.chunk(m)):
        a = xi if first else torch.empty_like(xi)
        if not first:
            dist.recv(a, src=rank - 1)
            a.requires_grad_()
        y = stage(a)
        if last:
            y = loss_fn(y, ti)
        else:
            dist.send(y.detach(), dst=rank + 1)
        pairs.append((a, y))
    for a, y in pairs:
        if last:
            y.backward()
        else:
            g = torch.empty_like(y)
            dist.recv(g, src=rank + 1)
            y.backward(g)
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return sum(y.item() for _, y in pairs) / m if last else None


def test_gpipe_check_names_the_missing_scaling():
    with pytest.raises(CheckFailed, match=r"4 x the expected one.*1/4"):
        lab05.check_gpipe(gpipe_unscaled, world_size=2, num_microbatches=4)


def test_a_correct_gpipe_passes_on_a_seed_whose_gradients_reach_100(sol, monkeypatch):
    """Seed 294 in the shape of a hidden test, at the visible width (32): float32 sums over 8
    microbatches differ from the whole batch's by about 1e-7 of the gradients' magnitude
    (0.lin.weight's reaches 110), more than a fixed atol of 1e-5 on its elements near zero; the
    tolerance scales with the tensor."""
    monkeypatch.setattr(lab05, "HIDDEN_WIDTH", lab05.VISIBLE.hidden)
    lab05.check_gpipe(sol["gpipe_step"], world_size=4, num_microbatches=8, batch=16,
                      num_layers=9, seed=294)
    _, ref = reference_step(PipeSpec(num_layers=9, hidden=lab05.VISIBLE.hidden, batch=16, seed=294))
    grad = ref["0.lin.weight"]
    off = grad.clone()
    off[0, 0] += 1e-3 * grad.abs().max()    # a real error, small against the largest element
    scale = f"allowed {lab05.ATOL:g} x {grad.abs().max().item():.3g} (the largest |expected|)"
    with pytest.raises(CheckFailed, match=re.escape(scale)):
        assert_close(off, grad, what="0.lin.weight", atol=lab05.ATOL, rtol=lab05.RTOL)


def test_1f1b_check_rejects_gpipe(sol):
    with pytest.raises(CheckFailed, match="held the activations of 4 microbatches"):
        lab05.check_1f1b(sol["gpipe_step"], world_size=2, num_microbatches=4)


def test_naive_check_rejects_a_step_without_backward_on_stage_0():
    def forward_only(rank, world_size, stage, x, target):
        if rank == 0:
            dist.send(stage(x).detach(), dst=1)
            return None
        a = torch.empty_like(x)
        dist.recv(a, src=0)
        loss = loss_fn(stage(a), target)
        loss.backward()
        return loss.item()
    with pytest.raises(CheckFailed, match="is None: backward never reached"):
        lab05.check_naive(forward_only, world_size=2)


def _deadlocked_1f1b():
    """The recv-before-send 1F1B of the grading samples (tests/submissions)."""
    import submissions
    namespace = {"torch": torch, "dist": dist, "loss_fn": loss_fn}
    exec(submissions.DEADLOCKED_1F1B, namespace)
    return namespace["one_f_one_b_step"]


def test_deadlocking_1f1b_fails_with_the_hang_diagnosis(monkeypatch):
    monkeypatch.setattr(lab05, "TIMEOUT", 5)
    with pytest.raises(CheckFailed) as info:
        lab05.check_1f1b(_deadlocked_1f1b(), world_size=2, num_microbatches=4)
    message = str(info.value)
    assert "did not finish on 2 ranks" in message
    assert "rank 0: in recv" in message and "from rank 1" in message   # the launcher's diagnosis
    assert "rank 1: in recv" in message and "from rank 0" in message


def test_schedule_explorer_redraws_when_a_control_moves(monkeypatch):
    import matplotlib.pyplot as plt
    from distlab.labs.pipeline import schedule_explorer

    titles = []

    def show(*args, **kwargs):  # what a kernel would display: the chart's title tells p and m
        titles.append(plt.gcf().axes[0].get_title(loc="left"))
        plt.close("all")

    monkeypatch.setattr(plt, "show", show)
    explorer = schedule_explorer()
    controls = {c.description: c for c in explorer.children if hasattr(c, "description")}
    assert titles[-1].startswith("1f1b: p=4, m=8: bubble 0.273")
    controls["micro m"].value = 12
    assert titles[-1].startswith("1f1b: p=4, m=12: bubble 0.200")   # 3 / 15: no ranks were run
    controls["schedule"].value = "gpipe"
    assert titles[-1].startswith("gpipe: p=4, m=12")
    assert "in flight per stage [12, 12, 12, 12]" in titles[-1]


def _1f1b_with_warmups(warmups: str):
    """The lab's 1F1B with another number of warm-up forwards (a textual edit of its cell)."""
    return solutions.solution_namespace(lab05.LAB, [(
        "one_f_one_b_step", "warmup = min(world_size - rank - 1, m)", f"warmup = {warmups}")]
    )["one_f_one_b_step"]


def test_1f1b_check_rejects_gpipe_with_fewer_microbatches_than_stages(sol):
    # m = 3 < p = 4: GPipe holds 3 on every stage, within p but above p - s on stages 2 and 3.
    with pytest.raises(CheckFailed, match=r"stage 2.*min\(p - s, m\) = 2"):
        lab05.check_1f1b(sol["gpipe_step"], world_size=4, num_microbatches=3, batch=12,
                         seed=7)


def test_1f1b_check_rejects_p_minus_1_warmups_on_every_stage():
    with pytest.raises(CheckFailed, match=r"stage 1.*min\(p - s, m\) = 1"):
        lab05.check_1f1b(_1f1b_with_warmups("min(world_size - 1, m)"), world_size=2,
                         num_microbatches=4)


def test_1f1b_check_rejects_a_schedule_that_does_not_alternate():
    # Too few warm-ups keeps memory low but idles: stage 0 must run F F then alternate on 3 stages.
    with pytest.raises(CheckFailed, match="alternate"):
        lab05.check_1f1b(_1f1b_with_warmups("0"), world_size=3, num_microbatches=4, batch=8)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 3), (3, 16)])
def test_every_stage_idles_p_minus_1_forward_and_backward_slots(p, m):
    from distlab.labs.pipeline_bubble import (bubble_of_compute, bubble_of_step, idle_per_stage,
                                              step_share_from_compute_ratio)
    for kind in ("gpipe", "1f1b"):
        idle = idle_per_stage(simulate(kind, p, m, t_fwd=1.0, t_bwd=2.0), p)
        assert idle == {s: pytest.approx(3 * (p - 1)) for s in range(p)}   # not 2(p - 1)
    assert step_share_from_compute_ratio(bubble_of_compute(p, m)) == pytest.approx(bubble_of_step(p, m))
    assert bubble_of_step(p, m) == pytest.approx(theoretical_bubble(p, m))


# ----------------------------------------------------------------------------- prediction, design


def _budget_with_warmups(warmups: str):
    """Hint 3's design (1F1B, its warm-up capped) handed in as budget_step, with ``warmups``
    warm-up forwards (a textual edit of the solution's cell: ``CAPPED``)."""
    (cell, old, new), = CAPPED
    capped = new.replace("min(max_in_flight - 1, world_size - rank - 1, m)", warmups)
    return solutions.solution_namespace(lab05.LAB, [(cell, old, capped)])["budget_step"]


def test_the_design_exercise_and_the_prediction_pass_with_the_solution(sol):
    from distlab.checks import lab05_design
    f = solution_functions(lab05.LAB, ("budget_step", "predict_sent_bytes"))
    lab05.check_predicted_traffic(f["predict_sent_bytes"])
    lab05.check_predicted_traffic(f["predict_sent_bytes"], seed=12)
    line = lab05.check_memory_budget(f["budget_step"], world_size=4, num_microbatches=8,
                                     max_in_flight=2)
    assert "in flight per stage 2/2/2/1" in line
    # the verdict shows the student's bubble beside Hint 3's design's, the bar and the bound
    fig = lab05_design.figures(4, 8, 2, visible=True)
    assert (f"Hint 3's design {fig['hinted']:.3f}, the bar {fig['bar']:.3f}, the bound "
            f"{fig['bound']:.3f}: within the budget") in line
    assert "within the bar" in lab05.check_bubble_bar(f["budget_step"], world_size=4,
                                                      num_microbatches=8, max_in_flight=2)
    lab05.check_memory_budget(f["budget_step"], world_size=2, num_microbatches=4,
                              max_in_flight=1, seed=5)
    from distlab.checks.stored import EXACT64
    stored = load_stored(lab05.LAB, "design")
    for p, m, k in lab05_design.DESIGN_CASES:      # the stored budgets are the code's (float64)
        assert stored[f"budget.p{p}_m{m}_k{k}"].item() == \
            pytest.approx(lab05_design._budget(p, m, k), rel=EXACT64)
    # the budget sits between 1F1B's bubble (no cap) and one microbatch at a time
    assert theoretical_bubble(4, 8) < lab05_design._budget(4, 8, 2) < lab05_design._budget(4, 8, 1)
    assert lab05_design._budget(4, 8, 4) == pytest.approx(theoretical_bubble(4, 8))


def test_the_design_tests_grade_one_run(monkeypatch):
    """The bar's test grades the first test's run (issue 45: one launch, not two), hidden
    problems too; a rerun of the first test runs again."""
    f = solution_functions(lab05.LAB, ("budget_step",))["budget_step"]
    launches, run = [], lab05._run
    monkeypatch.setattr(lab05, "_run", lambda *a: launches.append(a[1]) or run(*a))
    for seed in (None, None):   # the first test, the bar's; then both again
        lab05.check_memory_budget(f, world_size=2, num_microbatches=4, max_in_flight=1, seed=seed)
        assert "within the bar" in lab05.check_bubble_bar(f, world_size=2, num_microbatches=4,
                                                          max_in_flight=1, seed=seed)
    assert launches == ["budget_step", "budget_step"]


def test_planted_uncapped_1f1b_loses_only_the_design_test():
    # A plain 1F1B handed in as budget_step: a correct Exercise 4, over the memory budget.
    uncapped = _budget_with_warmups("min(world_size - rank - 1, m)")
    lab05.check_1f1b(_1f1b_with_warmups("min(world_size - rank - 1, m)"), world_size=4,
                     num_microbatches=8)
    with pytest.raises(CheckFailed, match=r"stage 0 \(rank 0\) held the activations of 4 "
                                          r"microbatches.*max_in_flight = 2"):
        lab05.check_memory_budget(uncapped, world_size=4, num_microbatches=8, max_in_flight=2)


def test_design_check_rejects_one_microbatch_at_a_time():
    # Within the memory budget, but it idles more than the budget allows; the message says how much.
    one_at_a_time = _budget_with_warmups("0")
    with pytest.raises(CheckFailed, match=r"bubble on paper 0\.750; Hint 3's design 0\.652, the "
                                          r"bar 0\.576, the bound 0\.500. This test's limit is "
                                          r"the budget, 0\.652"):
        lab05.check_memory_budget(one_at_a_time, world_size=4, num_microbatches=8,
                                  max_in_flight=2)


def test_prediction_check_names_the_microbatch_mistake():
    def per_message_times_m(rank, world_size, batch, hidden, num_microbatches):
        return batch * hidden * 4 * num_microbatches * ((rank < world_size - 1) + (rank > 0))
    with pytest.raises(CheckFailed, match="how many messages go, not how many bytes"):
        lab05.check_predicted_traffic(per_message_times_m)


def test_visible_design_checks_need_no_answer_of_the_course(monkeypatch):
    from distlab.checks import lab05_design
    _withhold(monkeypatch, (lab05_design, "_capped_order"), (lab05_design, "_boundary_bytes"))
    f = solution_functions(lab05.LAB, ("budget_step", "predict_sent_bytes"))
    lab05.check_predicted_traffic(f["predict_sent_bytes"])
    lab05.check_memory_budget(f["budget_step"], world_size=4, num_microbatches=4, max_in_flight=3)
    with pytest.raises(CheckFailed, match="no stored expected values for the cases drawn from "
                                          "seed=3") as info:
        lab05.check_predicted_traffic(f["predict_sent_bytes"], seed=3)
    assert "_boundary_bytes" not in str(info.value)
    with pytest.raises(CheckFailed, match=r"world_size=4, num_microbatches=2, max_in_flight=1.*"
                                          r"Stored: world_size=4, num_microbatches=8"):
        lab05.check_memory_budget(f["budget_step"], world_size=4, num_microbatches=2,
                                  max_in_flight=1)


GRADED_CASES = [(4, 8, 2), (4, 4, 3), (4, 6, 2), (2, 4, 1), (4, 6, 3)]   # the lab's test cells


def _planned(p, m, k):
    """The solution's plan, replayed on paper: what its ranks run, timed as the check times it."""
    plan = solutions.solution_namespace(lab05.LAB, [(
        "budget_step", "    first, last, m = rank == 0, rank == world_size - 1, num_microbatches\n",
        "    return budget_plan(world_size, num_microbatches, max_in_flight)\n")])["budget_step"]
    return replay(plan(0, p, None, None, None, m, k))


@pytest.mark.parametrize("p,m,k", GRADED_CASES)
def test_the_solution_reaches_the_bar_and_no_schedule_beats_the_bound(p, m, k):
    from distlab.checks import lab05_design
    from distlab.labs.pipeline_bubble import budget_bound
    events = _planned(p, m, k)
    bubble, fig = measured_bubble(events, p), lab05_design.figures(p, m, k, visible=False)
    assert max(peak_in_flight(events).values()) <= k
    assert fig["bound"] - 1e-9 <= bubble <= fig["bar"] + 1e-9 <= fig["hinted"] + 1e-9
    assert fig["bound"] == budget_bound(p, m, k)
    # the bound is the stage-0 floor where the cap binds, the flushed pipeline's where it does not
    assert budget_bound(4, 8, 2) == 0.5 and budget_bound(4, 8, 4) == theoretical_bubble(4, 8)


def test_the_bound_holds_for_every_order_of_a_small_case():
    """Every per-stage order of p = 2, m = 3 within k = 1 and k = 2, replayed: none beats it."""
    import itertools
    from distlab.labs.pipeline_bubble import budget_bound
    ops = [("F", i) for i in range(3)] + [("B", i) for i in range(3)]
    orders = [o for o in itertools.permutations(ops)
              if all(o.index(("F", i)) < o.index(("B", i)) for i in range(3))]
    for k in (1, 2):
        best = 1.0
        for first, second in itertools.product(orders, repeat=2):
            try:
                events = replay([list(first), list(second)])
            except RuntimeError:
                continue
            if max(peak_in_flight(events).values()) <= k:
                best = min(best, measured_bubble(events, 2))
        assert best >= budget_bound(2, 3, k) - 1e-9


def test_planted_capped_1f1b_meets_the_budget_and_misses_the_bar():
    """Hint 3's design alone: the first test passes, the second fails, showing the figures."""
    capped = _budget_with_warmups("min(max_in_flight - 1, world_size - rank - 1, m)")
    line = lab05.check_memory_budget(capped, world_size=4, num_microbatches=8, max_in_flight=2)
    assert "bubble on paper 0.652" in line and "within the budget" in line
    with pytest.raises(CheckFailed, match=r"bubble on paper 0\.652; Hint 3's design 0\.652, the "
                                          r"bar 0\.576, the bound 0\.500. This test's limit is "
                                          r"the bar"):
        lab05.check_bubble_bar(capped, world_size=4, num_microbatches=8, max_in_flight=2)


def test_messages_say_what_happened():
    from distlab.checks.lab05_messages import assert_equal_split, deadlock_advice
    with pytest.raises(CheckFailed, match=r"x\.chunk\(5\) returns 4 piece\(s\) of \[2, 2, 2, 2\] "
                                          r"rows.*\(1, 2, 4, 8\)"):
        assert_equal_split(8, 5)
    assert_equal_split(8, 4)
    both_send = ("  rank 0: in send #1 to rank 1 on [64] float32, entered and never returned\n"
                 "  rank 1: in send #1 to rank 0 on [64] float32, entered and never returned")
    advice = deadlock_advice(both_send)
    assert advice.startswith("rank 0 is stuck in send to rank 1; rank 1 is stuck in send to "
                             "rank 0. Each is sending and none is receiving")
    assert "recv) for a message" not in advice
    both_recv = both_send.replace("send #1 to", "recv #1 from")
    assert "Each is receiving" in deadlock_advice(both_recv)


# ----------------------------------------------------------------------------- graded for real

SAMPLE_KINDS = ()
BAR = "test_budget_step_bar"
# Hint 3's design handed in as budget_step: the solution's plan replaced by capped 1F1B.
CAPPED = [("budget_step", "    for op, i in budget_plan(world_size, m, max_in_flight)[rank]:\n"
           "        if op == \"F\":\n            forward(i)\n        else:\n"
           "            backward()                                  # the oldest held: the plan's i\n",
           "    w = min(max_in_flight - 1, world_size - rank - 1, m)\n"
           "    for i in range(w):\n        forward(i)\n    for i in range(w, m):\n"
           "        forward(i)\n        backward()\n    for _ in range(w):\n        backward()\n")]


def own_graded_samples() -> dict:
    """{(student, lab): notebook}: the solution, the untouched lab and Hint 3's design alone."""
    import submissions
    return {("solution", lab05.LAB): submissions.solved(lab05.LAB),
            ("untouched", lab05.LAB): submissions.student(lab05.LAB),
            ("mistake_capped_1f1b", lab05.LAB): submissions.edited_cells(lab05.LAB, CAPPED)}


@pytest.fixture(scope="module")
def graded(graded_samples):
    return {student: row for (student, lab), row in graded_samples["rows"].items()
            if lab == lab05.LAB}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_graded_solution_full_untouched_zero_and_capped_1f1b_loses_only_the_bar(graded):
    solution, capped = graded["solution"], graded["mistake_capped_1f1b"]
    # the scores CSV has every graded lab's tests as columns: this lab's are the ones filled in
    tests = [t for t in solution if t.startswith("test_") and solution[t]]
    assert BAR in tests and all(solution[t] == "pass" for t in tests), solution
    assert float(solution["score"]) == float(solution["max_score"])
    assert float(graded["untouched"]["score"]) == 0
    assert {t for t in tests if capped[t] != "pass"} == {BAR}, capped
    assert float(capped["score"]) == float(solution["max_score"]) - 2


@pytest.mark.slow
def test_graded_design_cells_print_the_figures_not_none(graded_samples):
    """Under the grader a passing check's verdict line comes back from the judge: the cell shows
    the student's bubble beside the budget, the bar and the bound, never a bare None."""
    import nbformat
    nb = nbformat.read(graded_samples["autograded"]("solution", lab05.LAB), as_version=4)
    for grade_id, verdict in (("test_budget_step", "within the budget"),
                              (BAR, "within the bar")):
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert verdict in text and "the bound 0.500" in text, text
        assert "None" not in text.split(), text



def test_the_prediction_is_asked_before_anything_answers_it():
    """Nothing above Exercise 6's prediction cell, and no docstring of Lab 5's checks and helpers
    (kept in a handout), states the bytes it predicts or the formula that gives them."""
    import ast
    from pathlib import Path
    from distlab import paths
    answer = lab05_answer_bytes()
    answers = (str(answer), f"{answer // 1024} KiB", "b*h*4", "b * h * 4", "batch * hidden * 4",
               "whatever m", "changes nothing in the sum")
    source = paths.lab_source(lab05.LAB).read_text()
    above = source[:source.index('"grade_id": "predict_sent_bytes"')]
    assert not [a for a in answers if a in above]
    root = Path(lab05.__file__).parents[1]
    files = [*root.glob("checks/lab05*.py"), *root.glob("labs/pipeline/*.py"),
             root / "labs" / "pipeline_bubble.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node) or ""
                assert not [a for a in answers if a in doc], (path.name, getattr(node, "name", ""))


def lab05_answer_bytes() -> int:
    """The measured section's rank 0 bytes, as the solution's prediction computes them."""
    predict = solution_functions(lab05.LAB, ("predict_sent_bytes",))["predict_sent_bytes"]
    return predict(0, 2, 256, 512, 4)
