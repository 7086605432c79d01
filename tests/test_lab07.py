"""Lab 07, 3D parallelism: the planning math (distlab.labs.planning), the mesh run
(distlab.labs.mesh) and the graded checks (distlab.checks.lab07).

The correct answers are the lab's own solutions (``solution_functions()``); the wrong ones below
are mistakes the checks must catch, each with the message a student would read.
"""
import math
from pathlib import Path

import pytest
import torch

from distlab.labs import planning as P
from distlab.checks.assertions import CheckFailed
from distlab.checks import lab07
from distlab.course.solutions import solution_functions
from distlab.labs.mesh import (MeshShape, TinyConfig, build_model, make_batches,
                                   megatron_plan, reference_losses, run_mesh, split_stage)

SOURCE = Path(__file__).resolve().parents[1] / "solutions" / lab07.LAB / f"{lab07.LAB}.py"


@pytest.fixture(scope="module")
def sol():
    return solution_functions(lab07.LAB, ("memory_per_gpu", "choose_degrees", "tp_plan"))


# ----------------------------------------------------------------------------- memory math


def test_params_match_published_sizes():
    # Llama 3's names round the counts; the shapes must give about those sizes.
    for model, billions in [(P.LLAMA3_8B, 8.0), (P.LLAMA3_70B, 70.6), (P.LLAMA3_405B, 405.9)]:
        assert model.params / 1e9 == pytest.approx(billions, abs=0.1)


def test_bytes_per_parameter_without_sharding_or_activations():
    # One GPU, no model parallelism: 2 + 4 + 4 + 4 + 4 = 18 bytes per parameter (fp32 gradients),
    # 16 with bf16 gradients, as the ZeRO paper counts.
    model = P.LLAMA3_8B
    for grad_bytes, per_param in [(4, 18), (2, 16)]:
        cfg = P.ParallelConfig(1, 1, 1, P.Job(zero_stage=0, grad_bytes=grad_bytes))
        mem = P.memory_per_gpu(model, cfg)
        assert (mem["total"] - mem["activations"]) == pytest.approx(per_param * model.params,
                                                                    rel=1e-3)


@pytest.mark.parametrize("zero,divided", [(0, set()), (1, {"master_weights", "adam_m", "adam_v"}),
                                          (2, {"gradients", "master_weights", "adam_m", "adam_v"}),
                                          (3, {"weights", "gradients", "master_weights", "adam_m",
                                               "adam_v"})])
def test_zero_stages_divide_the_right_terms(zero, divided):
    base = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 1, 1, P.Job(zero_stage=zero, global_batch=8)))
    wide = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 1, 8, P.Job(zero_stage=zero, global_batch=8)))
    for term in P.TERMS:
        assert wide[term] == pytest.approx(base[term] / (8 if term in divided else 1))


def test_activation_formulas_are_korthikantis():
    model, s, b = P.LLAMA3_70B, 2048, 2
    sbh, ash = s * b * model.hidden, 5 * model.heads * s / model.hidden
    act = lambda t, **kw: P.activation_bytes_per_layer(model, t, P.Job(seq_len=s, micro_batch=b, **kw))
    assert act(1, recompute="none", sequence_parallel=False) == pytest.approx(sbh * (34 + ash))
    assert act(8, recompute="none", sequence_parallel=False) == pytest.approx(sbh * (10 + 3 + ash / 8))
    assert act(8, recompute="none", sequence_parallel=True) == pytest.approx(sbh * (34 + ash) / 8)
    assert act(8, recompute="selective", sequence_parallel=True) == pytest.approx(34 * sbh / 8)
    assert act(8, recompute="full", sequence_parallel=True) == pytest.approx(2 * sbh / 8)
    with pytest.raises(ValueError, match="recompute must be"):
        act(1, recompute="some")


def test_pipeline_holds_about_all_layers_of_activations_on_stage_0():
    # 1F1B: p micro-batches in flight through L/p layers each, so PP does not divide activations.
    job = P.Job(global_batch=64)
    one = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 1, 16, job))["activations"]
    four = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 4, 4, job))["activations"]
    assert four == pytest.approx(one)


def test_rule_of_thumb():
    assert P.rule_of_thumb_gpus(70e9, 80) == pytest.approx(70 * 18 * 1.25 / 80)


# ----------------------------------------------------------------------------- time and traffic


def test_communication_formulas():
    model, job = P.LLAMA3_70B, P.Job(seq_len=4096, global_batch=64, zero_stage=1)
    cfg = P.ParallelConfig(8, 4, 4, job)
    m, act = 64 // 4, 4096 * model.hidden * 2
    comm = P.comm_bytes_per_step(model, cfg)
    assert comm["tp"] == pytest.approx(m * 20 * 4 * 2 * 7 / 8 * act)
    assert comm["pp"] == pytest.approx(m * 2 * act)
    assert comm["dp"] == pytest.approx(2 * 3 / 4 * P.stage_params(model, 8, 4) * 4)
    single = P.comm_bytes_per_step(model, P.ParallelConfig(1, 1, 1, job))
    assert single == {"tp": 0.0, "pp": 0.0, "dp": 0.0}
    zero3 = P.comm_bytes_per_step(model, P.with_job(cfg, zero_stage=3))
    assert zero3["dp"] == pytest.approx(comm["dp"] * 1.5)   # ZeRO-3: 1.5x the DP traffic


def test_bubble_and_axis_links():
    assert P.bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert P.bubble_fraction(1, 7) == 0
    bw = P.axis_bandwidth(P.H100_16x8, P.ParallelConfig(4, 2, 16))
    assert bw == {"tp": 450e9, "pp": 450e9, "dp": 50e9}          # t*p = 8 still in one node
    bw = P.axis_bandwidth(P.H100_16x8, P.ParallelConfig(8, 2, 8))
    assert bw == {"tp": 450e9, "pp": 50e9, "dp": 50e9}


def test_step_time_parts_add_up():
    st = P.step_time(P.LLAMA3_70B, P.H100_16x8, P.ParallelConfig(8, 2, 8, lab07.JOB_70B))
    assert st["total"] == pytest.approx(sum(v for k, v in st.items() if k != "total"))
    tokens = lab07.JOB_70B.global_batch * lab07.JOB_70B.seq_len
    assert st["compute"] == pytest.approx(6 * P.LLAMA3_70B.params * tokens / (128 * 989e12 * 0.4))


def test_choose_degrees_reports_and_refuses():
    tiny = P.Cluster("1 x 8 GPUs of 16 GB", 1, 8, 16)
    with pytest.raises(ValueError, match="No .* layout of Llama 3 405B fits"):
        P.reference_choose_degrees(P.LLAMA3_405B, tiny)


def test_model_of_size_is_about_that_size():
    for b in (1, 8, 70, 405):
        assert P.model_of_size(b).params / 1e9 == pytest.approx(b, rel=0.15)


def test_planner_builds():
    widget = P.planner()
    assert widget.children  # sliders and an output area


# ----------------------------------------------------------------------------- what the lab states


def test_lab_text_matches_the_math():
    """The closing note states the 70B answer and that 405B lands on the published layout."""
    text = SOURCE.read_text()
    best = P.reference_choose_degrees(P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B)
    assert f"**TP={best.tp}, PP={best.pp}, DP={best.dp}**" in text
    mem = P.memory_per_gpu(P.LLAMA3_70B, best)["total"] / P.GB
    assert f"{mem:.1f} GB per GPU" in text
    assert f"{P.step_time(P.LLAMA3_70B, P.H100_16x8, best)['total']:.1f} s per step" in text
    folk = P.ParallelConfig(8, 2, 8, lab07.JOB_70B)
    assert f"{P.memory_per_gpu(P.LLAMA3_70B, folk)['total'] / P.GB:.1f} GB" in text
    slower = P.step_time(P.LLAMA3_70B, P.H100_16x8, folk)["total"] \
        / P.step_time(P.LLAMA3_70B, P.H100_16x8, best)["total"] - 1
    assert f"about {round(100 * slower)}% slower" in text
    chosen = P.reference_choose_degrees(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB)
    published = P.LLAMA3_405B_PUBLISHED
    assert (chosen.tp, chosen.pp, chosen.dp) == (published.tp, published.pp, published.dp)
    assert "arXiv:2407.21783" in text


# ----------------------------------------------------------------------------- graded checks


def test_check_memory_per_gpu(sol):
    lab07.check_memory_per_gpu(sol["memory_per_gpu"])
    lab07.check_memory_per_gpu(sol["memory_per_gpu"], seed=11, count=30)
    lab07.check_memory_per_gpu(P.memory_per_gpu, seed=12)


@pytest.mark.parametrize("mistake,message", [
    ("zero3_keeps_weights", "'weights' is"),
    ("no_inflight", "'activations' is"),
    ("missing_total", "no 'total' term"),
])
def test_check_memory_per_gpu_catches(mistake, message):
    def wrong(model, cfg):
        mem = dict(P.memory_per_gpu(model, cfg))
        if mistake == "zero3_keeps_weights" and cfg.job.zero_stage >= 3:
            mem["weights"] = cfg.job.weight_bytes * P.stage_params(model, cfg.tp, cfg.pp)
        if mistake == "no_inflight":
            mem["activations"] = P.activation_bytes_per_layer(model, cfg.tp, cfg.job) \
                * math.ceil(model.layers / cfg.pp)
        if mistake == "missing_total":
            del mem["total"]
        return mem
    with pytest.raises(CheckFailed, match=message):
        lab07.check_memory_per_gpu(wrong, seed=3, count=40)


def test_check_choose_degrees(sol):
    lab07.check_choose_degrees(sol["choose_degrees"])
    lab07.check_choose_degrees(sol["choose_degrees"], seed=21, count=6)


def test_check_choose_degrees_catches():
    def folk_rule(model, cluster, job):          # always a full node of TP, no PP: often invalid
        return P.ParallelConfig(cluster.gpus_per_node, 1, cluster.gpus // cluster.gpus_per_node, job)
    with pytest.raises(CheckFailed, match="not a valid layout|valid but takes"):
        lab07.check_choose_degrees(folk_rule, seed=5, count=6)

    def ignores_memory(model, cluster, job):     # the fastest layout, fitting or not
        return min(P.candidates(cluster, job),
                   key=lambda c: (P.why_invalid(model, cluster, c, memory=lambda m, c: {"total": 0})
                                  != "", P.step_time(model, cluster, c)["total"]))
    with pytest.raises(CheckFailed, match="needs .* GB per GPU, the GPU has 80 GB"):
        lab07.check_production_answer(ignores_memory(P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B))


def test_check_production_answers():
    lab07.check_production_answer(P.reference_choose_degrees(P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B))
    lab07.check_405b_answer(P.LLAMA3_405B_PUBLISHED)
    with pytest.raises(CheckFailed, match="valid but takes"):
        lab07.check_production_answer(P.ParallelConfig(8, 1, 16, lab07.JOB_70B))
    with pytest.raises(CheckFailed, match="expected a ParallelConfig"):
        lab07.check_production_answer((2, 16, 4))


# ----------------------------------------------------------------------------- the mesh run


def test_stages_reassemble_the_model():
    cfg = TinyConfig(layers=3)
    model = build_model(cfg, 0)
    tokens, _ = make_batches(cfg, 0)
    x = tokens[0]
    y = x
    for i in range(2):
        y = split_stage(model, 2, i)(y)
    torch.testing.assert_close(y, model(x))


def test_reference_losses_decrease():
    losses = reference_losses(TinyConfig(), 0)
    assert losses.shape == (3,) and losses[-1] < losses[0]


def test_mesh_2x2_matches_single_process():
    run = run_mesh(MeshShape(pp=1, dp=2, tp=2), seed=3)
    assert run.max_error <= 1e-5
    # TP halves every block linear; the embedding, norms and head stay whole; FSDP halves it all.
    assert run.results[0]["placements"]["attn.o (block 0)"] == "(Shard(dim=1),)"
    assert "step" in run.table()


def test_check_tp_plan(sol):
    lab07.check_tp_plan(sol["tp_plan"])


def test_check_tp_plan_catches_a_missing_layer():
    def partial():
        plan = megatron_plan()
        del plan["mlp.up"], plan["mlp.down"]
        return plan
    with pytest.raises(CheckFailed, match="mlp.up .block 0. is a plain replicated weight"):
        lab07.check_tp_plan(partial, seed=4)


def test_check_tp_plan_catches_swapped_styles():
    def swapped():
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        plan = megatron_plan()
        plan["attn.o"], plan["mlp.down"] = ColwiseParallel(), ColwiseParallel()
        return plan
    with pytest.raises(CheckFailed, match="failed on rank"):
        lab07.check_tp_plan(swapped, seed=4)


@pytest.mark.slow
def test_mesh_2x2x2_matches_single_process():
    run = run_mesh(MeshShape(pp=2, dp=2, tp=2), seed=5)
    assert run.max_error <= 1e-5
    assert sum(r["losses"] is not None for r in run.results) == 4   # the last stage's 4 ranks
