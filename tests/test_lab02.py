"""Lab 2, data parallelism: the plumbing, the checks on the solution, and wrong submissions.

Wrong submissions are made from the solution's own cells by a textual edit (never a hand-copied
notebook), so they stay in step with the lab.
"""
from __future__ import annotations

import math

import pytest
import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks import lab02
from distlab.course import solutions
from distlab.labs.data_parallel import (Setup, flat, format_gradient_average, gradient_average,
                                        gradient_average_demo, loss_fn, optimizer_state_bytes,
                                        reference_training, shard_bounds)

LAB = lab02.LAB


def solution_namespace(edit: tuple[str, str, str] | None = None) -> dict:
    """The solution cells and the imports, run, with one planted edit (grade_id, old, new)."""
    return solutions.solution_namespace(LAB, [edit] if edit else [])


# ---- single-process plumbing -------------------------------------------------------------

def test_mean_of_shard_gradients_is_full_batch_gradient():
    table = gradient_average_demo(world_size=4, setup=Setup(seed=3))
    # The mean's difference is float64 rounding: shown as its bound, never as digits.
    assert table.splitlines()[-2].endswith(" < 1e-14")
    assert float(table.splitlines()[-1].split()[-1]) > 1e-2
    numbers = gradient_average(4, Setup(seed=3))
    assert numbers["mean_diff"] < 1e-14 and numbers["sum_diff"] > 1e-2


def test_a_residue_is_shown_as_its_bound_and_a_difference_as_digits():
    from distlab.labs.tables import residue
    eps = torch.finfo(torch.float64).eps
    assert residue(2.78e-17, scale=0.41) == residue(1.04e-17, scale=0.41) == "< 1e-14"
    assert residue(0.205, scale=0.41) == "2.05e-01"
    assert residue(3e-13, scale=0.41) == "3.00e-13"               # a bug's size, not rounding
    assert residue(1e-6, scale=1.0, eps=torch.finfo(torch.float32).eps) == "< 1e-05"
    assert residue(33 * eps, scale=1.0) == "< 1e-14"


@pytest.mark.stored_data
def test_ddp_equals_the_stored_single_process_run():
    """The lab's DDP comparison reads the visible tests' stored reference (no reference_training
    in a handout); DDP's parameters equal it to float64 rounding on the CPU that made data/, and
    on another CPU within what its float32 weight init carries through 3 AdamW steps, said so."""
    from distlab.checks.stored import load, tolerance
    from distlab.labs.data_parallel import compare_with_ddp
    text = compare_with_ddp(world_size=2, bucket_bytes=8192)
    lines = [line for line in text.splitlines() if "max |DDP" in line]
    assert len(lines) == 2
    if all(line.endswith("after 3 steps < 1e-14") for line in lines):
        return
    assert "made on a CPU whose float32 random draws round otherwise" in text, text
    bound = tolerance(load(LAB, "adamw_3_steps")["params"], steps=lab02.STEPS)["atol"]
    assert max(float(line.rsplit("= ", 1)[1]) for line in lines if "= " in line) < bound


@pytest.mark.stored_data
def test_the_labs_gradient_average_table_is_the_stored_one():
    """A Lab 2 handout has no gradient_average: the lab's case prints the stored numbers, which
    are what the course's computation gives on any CPU, to the tolerance of values drawn in
    float32 (the weights' init) and computed in float64; the mean's residue, whose digits are
    the CPU's, is printed as its bound, so the table is the same text everywhere."""
    from distlab.checks.stored import load, tolerance
    stored, fresh = load(LAB, "gradient_average"), gradient_average(4)
    for key in stored:
        if key == "mean_diff":      # rounding alone: under the bound the table prints
            assert max(stored[key], fresh[key]) < 1e-14
            continue
        torch.testing.assert_close(fresh[key], stored[key], **tolerance(stored[key]),
                                   msg=lambda m, key=key: f"{key}: {m}")
    assert gradient_average_demo(world_size=4) == format_gradient_average(fresh)


def test_reference_training_learns_and_is_deterministic():
    a, b = reference_training(Setup(seed=1), 3), reference_training(Setup(seed=1), 3)
    assert a["losses"][-1] < a["losses"][0]
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    n = sum(p.numel() for p in a["params"])
    # AdamW: exp_avg and exp_avg_sq per element (float64 here) plus a step scalar per tensor.
    assert a["state_bytes"] == 2 * 8 * n + sum(4 for _ in a["params"]) or a["state_bytes"] > 16 * n


@pytest.mark.parametrize("numel,ws", [(10, 4), (12, 4), (7, 2), (3, 4)])
def test_shard_bounds_partition_the_elements(numel, ws):
    bounds = [shard_bounds(numel, r, ws) for r in range(ws)]
    covered = [i for lo, hi in bounds for i in range(lo, hi)]
    assert covered == list(range(numel))
    assert all(hi - lo <= math.ceil(numel / ws) for lo, hi in bounds)


def test_optimizer_state_bytes_counts_adamw_state():
    p = torch.nn.Parameter(torch.zeros(10))
    opt = torch.optim.AdamW([p])
    assert optimizer_state_bytes(opt) == 0
    p.grad = torch.ones(10)
    opt.step()
    assert optimizer_state_bytes(opt) == 2 * 4 * 10 + 4


@pytest.mark.stored_data
def test_references_match_the_code():
    from distlab.checks.stored import tolerance
    from distlab.course.references import load
    stored = load(lab02.LAB, "adamw_3_steps")
    fresh = lab02.make_references()["adamw_3_steps"]
    # Not bit for bit: torch picks its CPU kernels by instruction set, and the weights are drawn
    # in float32 (a last bit apart across CPUs) before training in float64; AdamW carries that
    # through its 3 steps (7e-7 on parameters of 0.2 with ATEN_CPU_CAPABILITY=default). A change
    # to the reference code moves them by far more (a missing average: 2x the gradients).
    for key in ("params", "grads", "exp_avg"):
        torch.testing.assert_close(fresh[key], stored[key],
                                   **tolerance(stored[key], steps=lab02.STEPS),
                                   msg=lambda m, key=key: f"{key}: {m}")


# ---- the checks on real ranks ------------------------------------------------------------

@pytest.fixture(scope="module")
def solution():
    return solution_namespace()


def test_solution_passes_every_check(solution):
    lab02.check_data_parallel_step(solution["data_parallel_step"], world_size=2, seed=11)
    lab02.check_bucketed_all_reduce(solution["bucketed_all_reduce"], bucket_bytes=4096,
                                    world_size=4, seed=12, d_hidden=40)
    lab02.check_overlapped_all_reduce(solution["OverlappedAllReduce"], world_size=4, seed=13)
    lab02.check_sharded_adamw(solution["ShardedAdamW"], world_size=4, seed=14, d_hidden=50)


@pytest.mark.stored_data
def test_visible_checks_need_no_reference_implementation(solution, monkeypatch):
    """A handout has no reference_training: the visible path reads data/ only."""
    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld in the handout")
    monkeypatch.setattr(lab02, "reference_training", withheld)
    lab02.check_sharded_adamw(solution["ShardedAdamW"], world_size=2)
    lab02.check_data_parallel_step(solution["data_parallel_step"], world_size=2)
    with pytest.raises(ValueError, match="pass a seed"):
        lab02.check_data_parallel_step(solution["data_parallel_step"], d_hidden=48)


def test_missing_average_fails_the_gradient_checks():
    ns = solution_namespace(("data_parallel_step", "p.grad.div_(world_size)\n    ### END SOLUTION\n\n\ndef",
                             "pass\n    ### END SOLUTION\n\n\ndef"))
    with pytest.raises(CheckFailed, match="2 times the expected"):
        lab02.check_data_parallel_step(ns["data_parallel_step"], world_size=2, seed=5)


def test_missing_average_in_zero1_is_caught_by_adam_state():
    ns = solution_namespace(("sharded_adamw", "self.shard.grad = grad_shard.div_(self.world_size)",
                             "self.shard.grad = grad_shard"))
    with pytest.raises(CheckFailed, match="exp_avg"):
        lab02.check_sharded_adamw(ns["ShardedAdamW"], world_size=2, seed=6)


def test_bucket_counted_in_elements_fails_the_size_check():
    ns = solution_namespace(("bucketed_all_reduce", "per_bucket = bucket_bytes // buffer.element_size()",
                             "per_bucket = bucket_bytes"))
    with pytest.raises(CheckFailed, match="more than the bucket"):
        lab02.check_bucketed_all_reduce(ns["bucketed_all_reduce"], bucket_bytes=8192,
                                        world_size=2, seed=7)


def test_one_bucket_per_parameter_fails_the_count_check():
    def per_parameter(params, bucket_bytes):
        import torch.distributed as dist
        for p in params:
            for piece in p.grad.view(-1).split(bucket_bytes // p.grad.element_size()):
                dist.all_reduce(piece)
            p.grad.div_(dist.get_world_size())
    with pytest.raises(CheckFailed, match="at most"):
        lab02.check_bucketed_all_reduce(per_parameter, bucket_bytes=8192, world_size=2, seed=8)


def test_all_reduce_after_backward_is_not_overlap():
    class AfterBackward:
        def __init__(self, params):
            self.params = params

        def wait(self):
            import torch.distributed as dist
            works = [dist.all_reduce(p.grad, async_op=True) for p in self.params]
            for p, w in zip(self.params, works):
                w.wait()
                p.grad.div_(dist.get_world_size())
    with pytest.raises(CheckFailed, match="after backward"):
        lab02.check_overlapped_all_reduce(AfterBackward, world_size=2, seed=9)


def test_replicated_optimizer_state_fails_the_memory_check():
    class Replicated:
        def __init__(self, params, **kw):
            import torch.distributed as dist
            self.params = list(params)
            self.local_optimizer = torch.optim.AdamW(self.params, **kw)
            self.dist = dist

        def zero_grad(self):
            self.local_optimizer.zero_grad()

        def step(self):
            for p in self.params:
                self.dist.all_reduce(p.grad)
                p.grad.div_(self.dist.get_world_size())
            self.local_optimizer.step()
    with pytest.raises(CheckFailed):
        lab02.check_sharded_adamw(Replicated, world_size=2, seed=10)


# Values right, communication wrong: each must fail the ZeRO-1 pattern check, saying why.
ZERO1_PATTERN_MISTAKES = {
    # every rank receives the whole gradient sum: twice ZeRO-1's traffic
    "all_reduce_then_slice": (
        ("dist.reduce_scatter_single(grad_shard, grads)",
         "dist.all_reduce(grads); grad_shard.copy_(grads[self.rank * self.shard_numel:"
         "(self.rank + 1) * self.shard_numel])"), 11, "all_reduce.*reduce-scatter"),
    "two_gathers_per_step": (
        ("dist.all_gather_single(full, self.shard.detach())",
         "dist.all_gather_single(full, self.shard.detach()); "
         "dist.all_gather_single(full, self.shard.detach())"), 12, "one all-gather"),
}


@pytest.mark.parametrize("mistake", list(ZERO1_PATTERN_MISTAKES))
def test_zero1_pattern_check_fails_each_communication_mistake(mistake):
    edit, seed, message = ZERO1_PATTERN_MISTAKES[mistake]
    ns = solution_namespace(("sharded_adamw", *edit))
    with pytest.raises(CheckFailed, match=message):
        lab02.check_sharded_adamw(ns["ShardedAdamW"], world_size=2, seed=seed)


def test_cpu_overlap_figure_is_shown_beside_the_gpu_trace():
    from distlab.labs.data_parallel import overlap_beside_gpu
    from distlab.labs.timelines.gpu_traces import a100_timeline, measures
    rows = [{"strategy": "naive", "ms_per_step": 30.0},
            {"strategy": "overlapped", "ms_per_step": 43.0}]
    text = overlap_beside_gpu(rows)
    assert "naive 30.0 ms/step, overlapped 43.0 ms/step" in text
    assert "A100" in text and "overlapped by compute kernels" in text
    # The stored measures (a Lab 2 handout has no trace readers) are the trace's, read now.
    assert f"{measures(a100_timeline(), 0)['overlap']:.1%} of it overlapped" in text


# ----------------------------------------------------------------------------- the prediction


def test_state_bytes_prediction_matches_the_measurement_and_catches_mistakes():
    """The formula the prediction is graded against is the measured state of the lab's
    ShardedAdamW and of AdamW on the benchmark model; a planted mistake fails only this check."""
    from distlab.checks import lab02_prediction
    from distlab.course.solutions import solution_functions
    from distlab.labs.data_parallel import BENCH_SETUP
    from distlab.labs.data_parallel.memory import optimizer_memory
    f = solution_functions(lab02.LAB, ("predict_state_bytes", "ShardedAdamW"))
    lab02.check_predicted_state_bytes(f["predict_state_bytes"])
    lab02.check_predicted_state_bytes(f["predict_state_bytes"], seed=4)
    sizes = [p.numel() for p in BENCH_SETUP.model().parameters()]
    assert (sum(sizes), len(sizes)) == lab02_prediction.BENCH
    for row in optimizer_memory(f["ShardedAdamW"], world_sizes=(2, 4))[1:]:
        w = row["world_size"]
        assert row["zero1"] == lab02_prediction._state_bytes(sum(sizes), len(sizes), w, True)
        assert row["adamw"] == lab02_prediction._state_bytes(sum(sizes), len(sizes), w, False)

    def no_step_counters(numel, num_tensors, world_size, sharded):
        return 8 * (math.ceil(numel / world_size) if sharded else numel)
    with pytest.raises(CheckFailed, match="a 0-d float32 step is 4 bytes"):
        lab02.check_predicted_state_bytes(no_step_counters)
