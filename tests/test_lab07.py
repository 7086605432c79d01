"""Lab 07, 3D parallelism: the planning math (distlab.labs.planning), the mesh run
(distlab.labs.mesh) and the graded checks (distlab.checks.lab07).

The correct answers are the lab's own solutions (``solution_functions()``); the wrong ones below
are mistakes the checks must catch, each with the message a student would read.
"""
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

from distlab.labs import planning as P
from distlab.checks.assertions import VERDICT_CHARS, CheckFailed
from distlab.checks.lab07_cases import _degree_case
from distlab.checks import lab07, lab07_design, lab07_prediction, lab07_scale
from distlab.course.solutions import solution_functions
from distlab.labs.mesh_traffic import (axis_traffic, cross_node_bytes, groups_of, megatron_layout,
                                       traced_run)
from distlab.labs.mesh import (MeshShape, TinyConfig, build_model, make_batches,
                                   megatron_plan, reference_losses, run_mesh, split_stage)

SOURCE = Path(__file__).resolve().parents[1] / "solutions" / lab07.LAB / f"{lab07.LAB}.py"


@pytest.fixture(scope="module")
def sol():
    return solution_functions(lab07.LAB, ("memory_per_gpu", "choose_degrees", "tp_plan",
                                          "predict_traffic", "place_mesh"))


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
    gathered = 2 * 2 * P.LLAMA3_70B.layer_params / 8 if zero == 3 else 0   # ZeRO-3: 2 whole layers
    for term in P.TERMS:
        extra = gathered if term == "weights" else 0
        assert wide[term] == pytest.approx(base[term] / (8 if term in divided else 1) + extra)


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
    # 1F1B: p micro-batches in flight through L/p layers each, so PP does not divide activations
    # (the single stage of p = 1 also holds the logits).
    job = P.Job(global_batch=64)
    one = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 1, 16, job))["activations"]
    four = P.memory_per_gpu(P.LLAMA3_70B, P.ParallelConfig(8, 4, 4, job))["activations"]
    assert four == pytest.approx(one - P.logits_bytes(P.LLAMA3_70B, 8, job))


def test_rule_of_thumb():
    assert P.rule_of_thumb_gpus(70e9, 80) == pytest.approx(70 * 18 * 1.25 / 80)


# ----------------------------------------------------------------------------- time and traffic


def test_communication_formulas():
    model, job = P.LLAMA3_70B, P.Job(seq_len=4096, global_batch=64, zero_stage=1)
    cfg = P.ParallelConfig(8, 4, 4, job)
    m, act = 64 // 4, 4096 * model.hidden * 2
    comm = P.comm_bytes_per_step(model, cfg)
    # Sequence parallelism: 4 all-reduces' worth (8) plus the backward's re-gathers of the
    # sequence shard (2), in (t-1)/t-sized collectives.
    assert comm["tp"] == pytest.approx(m * 20 * 10 * 7 / 8 * act)
    no_sp = P.comm_bytes_per_step(model, P.with_job(cfg, sequence_parallel=False))
    assert no_sp["tp"] == pytest.approx(m * 20 * 4 * 2 * 7 / 8 * act)
    assert comm["pp"] == pytest.approx(m * 2 * act)
    phi = P.stage_params(model, 8, 4)
    assert comm["dp"] == pytest.approx(3 / 4 * phi * (4 + 2))          # RS of grads + AG of bf16 weights
    single = P.comm_bytes_per_step(model, P.ParallelConfig(1, 1, 1, job))
    assert single == {"tp": 0.0, "pp": 0.0, "dp": 0.0}
    plain = P.comm_bytes_per_step(model, P.with_job(cfg, zero_stage=0))
    assert plain["dp"] == pytest.approx(2 * 3 / 4 * phi * 4)            # all-reduce of gradients


def test_sequence_parallel_counts_the_backward_all_gather():
    cfg = P.ParallelConfig(8, 1, 16, P.Job())
    assert P.tp_collectives_per_layer(cfg) == 10
    assert P.tp_collectives_per_layer(P.with_job(cfg, sequence_parallel=False)) == 8
    assert P.tp_collectives_per_layer(P.with_job(cfg, recompute="full")) == 14


def test_zero_volumes_follow_the_zero_paper():
    # One micro-batch per step: ZeRO-1/2 move (d-1)/d phi (g + w), ZeRO-3 (d-1)/d phi (g + 2w),
    # 1.5x DP when g = w (arXiv:1910.02054, Section 7.2).
    model = P.LLAMA3_70B
    cfg = P.ParallelConfig(8, 4, 4, P.Job(global_batch=4, grad_bytes=2))
    phi, share = P.stage_params(model, 8, 4), 3 / 4
    plain = P.comm_bytes_per_step(model, P.with_job(cfg, zero_stage=0))["dp"]
    for zero, volume in [(1, 2 + 2), (2, 2 + 2), (3, 2 + 2 * 2)]:
        dp = P.comm_bytes_per_step(model, P.with_job(cfg, zero_stage=zero))["dp"]
        assert dp == pytest.approx(share * phi * volume)
    assert P.comm_bytes_per_step(model, P.with_job(cfg, zero_stage=3))["dp"] == pytest.approx(1.5 * plain)


def test_405b_zero3_bytes_per_pass_were_40_8_and_are_27_2_gb():
    # The published layout, one micro-batch's forward and backward (m = 1): the old charge was
    # 2 (d-1)/d phi (g + w) = 40.8 GB, the right one (d-1)/d phi (g + 2w) = 27.2 GB.
    cfg = P.with_job(P.LLAMA3_405B_PUBLISHED, global_batch=64, zero_stage=3)
    job, d = cfg.job, cfg.dp
    phi = P.stage_params(P.LLAMA3_405B, cfg.tp, cfg.pp)
    old = 2 * (d - 1) / d * phi * job.grad_bytes + 2 * (d - 1) / d * phi * job.weight_bytes
    assert old / P.GB == pytest.approx(40.8, abs=0.05)
    assert P.comm_bytes_per_step(P.LLAMA3_405B, cfg)["dp"] / P.GB == pytest.approx(27.2, abs=0.05)


def test_zero_with_microbatches_charges_memory_or_traffic():
    # 32 micro-batches: regathering keeps the 1/d but pays ZeRO-3's collectives 32 times;
    # resident pays them once and keeps full weights and gradients.
    model, cfg = P.LLAMA3_405B, P.with_job(P.LLAMA3_405B_PUBLISHED, zero_stage=3)
    m, d = cfg.microbatches, cfg.dp
    assert m == 32
    phi = P.stage_params(model, cfg.tp, cfg.pp)
    regather = P.with_job(cfg, zero_accumulation="regather")
    resident = P.with_job(cfg, zero_accumulation="resident")
    assert P.comm_bytes_per_step(model, regather)["dp"] == pytest.approx((d - 1) / d * phi * m * (4 + 2 * 2))
    assert P.comm_bytes_per_step(model, resident)["dp"] == pytest.approx((d - 1) / d * phi * (4 + 2))
    mem = P.memory_per_gpu(model, resident)
    assert mem["weights"] == pytest.approx(2 * phi) and mem["gradients"] == pytest.approx(4 * phi)
    # Regathering holds the shard and two whole gathered layers: never 0.1 GB of weights.
    mem = P.memory_per_gpu(model, regather)
    assert mem["weights"] == pytest.approx(2 * phi / d + 2 * 2 * model.layer_params / cfg.tp)
    assert mem["weights"] / P.GB > 1.0
    # ZeRO-2 regathering: gradients reduce-scattered per micro-batch, weights gathered once.
    z2 = P.with_job(cfg, zero_stage=2)
    assert P.comm_bytes_per_step(model, z2)["dp"] == pytest.approx((d - 1) / d * phi * (m * 4 + 2))
    with pytest.raises(ValueError, match="zero_accumulation"):
        P.memory_per_gpu(model, P.with_job(cfg, zero_accumulation="lazy"))


def test_efficiency_is_inside_kernels_and_the_405b_step_is_compared_whole():
    # 430 TFLOP/s is end to end: 6 N tokens / (8192 x 430e12) is the whole measured step.
    cfg = P.LLAMA3_405B_PUBLISHED
    measured = P.measured_step_seconds(P.LLAMA3_405B, cfg, P.LLAMA3_405B_TFLOPS)
    assert measured == pytest.approx(11.6, abs=0.05)
    cluster = P.LLAMA3_405B_CLUSTER
    assert not hasattr(cluster, "mfu") and cluster.kernel_efficiency == P.Cluster("x", 1, 8, 80).kernel_efficiency
    st = P.step_time(P.LLAMA3_405B, cluster, cfg)
    # The model's MFU counts the whole modelled step, so it is below the kernels' efficiency; it
    # does not count the full recompute's extra forward (8 N tokens computed, 6 N counted).
    assert cfg.job.recompute == "full"
    assert P.model_mfu(P.LLAMA3_405B, cluster, cfg) == pytest.approx(
        st["compute"] / st["total"] * cluster.kernel_efficiency * 6 / 8)
    text = P.published_comparison()
    assert f"{measured:.1f} s" in text and "MFU (model)" in text


def test_405b_job_is_zero1_charged_once_per_step():
    # A pipeline pairs with ZeRO-1: the published layout keeps its stage's whole bf16 weights and
    # fp32 gradients and moves (d-1)/d phi (g + w) once per step, however many micro-batches.
    model, pub = P.LLAMA3_405B, P.LLAMA3_405B_PUBLISHED
    assert pub.job.zero_stage == 1 and pub.microbatches == 32
    phi, d = P.stage_params(model, pub.tp, pub.pp), pub.dp
    mem = P.memory_per_gpu(model, pub)
    assert mem["weights"] == pytest.approx(2 * phi) and mem["weights"] / P.GB > 6
    assert mem["gradients"] == pytest.approx(4 * phi)
    assert P.comm_bytes_per_step(model, pub)["dp"] == pytest.approx((d - 1) / d * phi * (4 + 2))
    assert mem["total"] <= 0.9 * P.LLAMA3_405B_CLUSTER.gpu_mem_gb * P.GB
    # Every report says which stage and which charge it used.
    summary = P.layout_summary(model, P.LLAMA3_405B_CLUSTER, pub)
    assert "DP charged as ZeRO-1: optimizer state sharded over DP; one reduce-scatter of the " \
           "gradients and one all-gather of the weights per step" in summary
    assert "ZeRO-1, once per step" in P.near_tie_table(model, P.LLAMA3_405B_CLUSTER, pub.job)
    assert "ZeRO-1, full" in P.published_comparison()
    z3 = P.zero_charge(P.with_job(pub, zero_stage=3).job, 32)
    assert "regathering" in z3 and "each of the 32 micro-batches" in z3
    assert "kept resident" in P.zero_charge(P.with_job(pub, zero_stage=2, zero_accumulation="resident").job, 32)


def test_zero_options_show_why_pipelines_pair_with_zero1():
    model, cluster, pub = P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_PUBLISHED
    rows = [r.split() for r in P.zero_options_table(model, cluster, pub).splitlines()[2:]]
    assert len(rows) == 2 * len(P.ZERO_OPTIONS)
    z1 = [r for r in rows if r[0] == "1"]
    z3 = [r for r in rows if r[0] == "3" and "regather" in r]
    assert [r[-3] for r in z1] == ["no", "yes"]          # ZeRO-1 fits only with full recompute
    assert [r[-3] for r in z3] == ["yes", "yes"]
    assert float(z3[0][-2]) > 40 * float(z1[0][-2])      # regathering ZeRO-3: m (g + 2w) against g + w
    assert float(z3[1][-1]) > float(z1[1][-1])           # and a slower step than ZeRO-1


def test_405b_published_layout_is_a_near_tie():
    # Charged as ZeRO-3 over 32 micro-batches the published layout was 25% behind; with ZeRO-1, as
    # pipelines run, it is within the model's resolution of the fastest.
    model, cluster, job = P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB
    pub = P.LLAMA3_405B_PUBLISHED
    ties = P.near_ties(model, cluster, job)
    assert (pub.tp, pub.pp, pub.dp) in [(c.tp, c.pp, c.dp) for c, _ in ties]
    assert {c.tp for c, _ in ties} == {8}
    assert not P.acceptable_layout(model, cluster, pub)
    family = [P.step_time(model, cluster, P.ParallelConfig(8, p, 8192 // (8 * p), job))["total"]
              for p in (8, 16, 32)]
    assert max(family) / min(family) - 1 < P.RESOLUTION
    verdict = P.published_verdict()
    gap = P.step_time(model, cluster, pub)["total"] / P.step_time(model, cluster, ties[0][0])["total"] - 1
    assert verdict.startswith(f"The published layout {pub} is among the {len(ties)} near ties: "
                              f"{100 * gap:.1f}% slower than the fastest, {ties[0][0]}, inside")


def test_405b_near_ties():
    ties = P.near_ties(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB)
    assert ties[0][1] == 1.0 and all(1.0 <= r <= 1 + P.RESOLUTION for _, r in ties)
    best = P.reference_choose_degrees(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB)
    assert (ties[0][0].tp, ties[0][0].pp) == (best.tp, best.pp)
    table = P.near_tie_table(P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B)
    assert len(table.splitlines()) >= 4                     # several 70B layouts tie within 5%


def test_activations_count_logits_and_llama_differs_from_gpt():
    model, job = P.LLAMA3_70B, P.Job(seq_len=4096, global_batch=16)
    one = P.memory_per_gpu(model, P.ParallelConfig(8, 1, 16, job))
    per_layer = P.activation_bytes_per_layer(model, 8, job)
    logits = 4 * 4096 * model.vocab / 8
    assert P.logits_bytes(model, 8, job) == pytest.approx(logits)
    assert one["activations"] == pytest.approx(per_layer * 80 + logits)
    # With a pipeline the first stage (p micro-batches in flight, no logits) is the heavier.
    four = P.memory_per_gpu(model, P.ParallelConfig(8, 4, 4, job))
    assert four["activations"] == pytest.approx(per_layer * 20 * 4)
    # Llama's layer: 12 + 4 r + 6 f/h (r = 1/8, f/h = 3.5: 33.5) against GPT's 34, in s b h bytes.
    sbh = 4096 * model.hidden
    llama = P.llama_activation_bytes_per_layer(model, 1, P.Job(seq_len=4096))
    assert llama == pytest.approx(sbh * (12 + 4 / 8 + 6 * 3.5))
    assert P.activation_bytes_per_layer(model, 1, P.Job(seq_len=4096)) == pytest.approx(34 * sbh)
    no_sp = P.llama_activation_bytes_per_layer(model, 8, P.Job(seq_len=4096, sequence_parallel=False))
    assert no_sp == pytest.approx(sbh * (8 + (4.5 + 21) / 8))


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
    assert P.H100_16x8.kernel_efficiency == 0.4


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
    """The closing note states the 70B answer, its near ties and the folk layout's cost."""
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
    assert P.acceptable_layout(P.LLAMA3_70B, P.H100_16x8, folk)          # outside the 5%
    alt = P.ParallelConfig(4, 4, 8, lab07.JOB_70B)
    assert not P.acceptable_layout(P.LLAMA3_70B, P.H100_16x8, alt)
    gap = P.step_time(P.LLAMA3_70B, P.H100_16x8, alt)["total"] \
        / P.step_time(P.LLAMA3_70B, P.H100_16x8, best)["total"] - 1
    assert f"within {100 * gap:.1f}% at {P.memory_per_gpu(P.LLAMA3_70B, alt)['total'] / P.GB:.1f} GB" in text
    assert "arXiv:2407.21783" in text and "arXiv:2205.05198" in text
    assert "land on the published degrees" not in text


def test_405b_text_matches_the_model():
    """Lab 7's 405B paragraphs: ZeRO-1 against regathering, why the job recomputes, whole steps
    compared with the measured one, and the published layout among the near ties."""
    text = " ".join(SOURCE.read_text().replace("# ", " ").split())
    model, cluster, job = P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB
    pub = P.LLAMA3_405B_PUBLISHED
    st = P.step_time(model, cluster, pub)
    measured = P.measured_step_seconds(model, pub, P.LLAMA3_405B_TFLOPS)
    assert f"about {measured:.1f} s *in all*" in text
    assert f"model's total, {st['total']:.1f} s for the published layout" in text
    assert f"an MFU of {100 * P.model_mfu(model, cluster, pub):.0f}%" in text
    assert f"compute alone, {st['compute']:.1f} s" in text and st["compute"] > measured
    z3 = P.with_job(pub, zero_stage=3, recompute="selective")
    z1 = P.with_job(pub, recompute="selective")
    dp3, dp1 = (P.comm_bytes_per_step(model, c)["dp"] for c in (z3, z1))
    assert f"sends {dp3 / P.GB:.0f} GB per GPU per step on the DP axis, " \
           f"{round(dp3 / dp1)} times ZeRO-1's {dp1 / P.GB:.1f} GB" in text
    assert f"full bf16 weights, {P.memory_per_gpu(model, pub)['weights'] / P.GB:.1f} GB" in text
    selective = P.memory_per_gpu(model, z1)
    assert f"ZeRO-1 with selective recompute needs {selective['total'] / P.GB:.1f} GB" in text
    assert f"about `L` layers of activations, {selective['activations'] / P.GB:.0f} GB" in text
    assert selective["total"] > 80 * P.GB and "**ZeRO-1, charged once per step**" in text
    family = [P.step_time(model, cluster, P.ParallelConfig(8, p, 8192 // (8 * p), job))["total"]
              for p in (8, 16, 32)]
    assert f"within {round(100 * (max(family) / min(family) - 1))}% of each other" in text
    assert "print(published_report(choose_degrees, memory_per_gpu))" in text
    assert "among the near ties" in text
    assert "does not land on the published" not in text and "% behind" not in text


def test_lab_states_the_conventions_memory_needs():
    text = " ".join(SOURCE.read_text().replace("# ", " ").split())
    for phrase in ("on both the first stage (embedding) and the last (output head)",
                   "under sequence parallelism the whole", "full recompute keeps `2S/t`",
                   "adds its logits, `4·s·b·V/t`", "two gathered layers", '"resident"'):
        assert phrase in text, phrase


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
    best_405b = P.reference_choose_degrees(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB)
    lab07.check_405b_answer(best_405b)
    with pytest.raises(CheckFailed, match="valid but takes"):
        lab07.check_405b_answer(P.LLAMA3_405B_PUBLISHED)         # a near tie, not the fastest
    with pytest.raises(CheckFailed, match="valid but takes"):
        lab07.check_production_answer(P.ParallelConfig(8, 1, 16, lab07.JOB_70B))
    with pytest.raises(CheckFailed, match="expected a ParallelConfig"):
        lab07.check_production_answer((2, 16, 4))


def test_passing_lines_show_the_memory_and_the_layouts(sol):
    # What a pass shows: the student's figures (here the reference's, computed here), beside
    # the fastest layout's time and the GPU's memory.
    from distlab.checks.lab07_cases import _memory_case, degree_cases, memory_rows
    totals = [P.memory_per_gpu(*_memory_case(row))["total"] for row in memory_rows(lab07.SEED)]
    line = lab07.check_memory_per_gpu(sol["memory_per_gpu"])
    assert f"on 12 random models and layouts, totals {min(totals) / P.GB:.2f} to " \
           f"{max(totals) / P.GB:.1f} GB per GPU" in line and len(line) <= VERDICT_CHARS
    line = lab07.check_choose_degrees(sol["choose_degrees"])
    for row in degree_cases(lab07.SEED)["cases"]:
        model, cluster, job = _degree_case(row)
        best = P.reference_choose_degrees(model, cluster, job)
        assert (f"{best} {P.step_time(model, cluster, best)['total']:.2f} s, "
                f"{P.memory_per_gpu(model, best)['total'] / P.GB:.1f}/{cluster.gpu_mem_gb:g} GB") in line
    best = P.reference_choose_degrees(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, P.LLAMA3_405B_JOB)
    seconds = P.step_time(P.LLAMA3_405B, P.LLAMA3_405B_CLUSTER, best)["total"]
    assert f"{best}, valid and as fast as the fastest valid layout by step_time: {seconds:.2f} s " \
           f"per step (fastest {seconds:.2f})" in lab07.check_405b_answer(best)


def test_passing_lines_show_the_plans_and_the_predicted_bytes(sol):
    layouts = [(2, 16, 4), (4, 4, 8)]
    plans, answer = _plans(layouts), P.ParallelConfig(4, 4, 8, lab07.JOB_70B)
    line = lab07.check_layout_numbers(plans)
    for plan in plans:
        assert (f"{P.ParallelConfig(*plan['layout'])} {plan['memory'] / P.GB:.1f} GB, bubble "
                f"{plan['bubble']:.3f}, GB sent {plan['bytes']['tp'] / P.GB:.1f}/") in line
    fastest = P.step_time(P.LLAMA3_70B, P.H100_16x8, P.reference_choose_degrees(
        P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B))["total"]
    seconds = P.step_time(P.LLAMA3_70B, P.H100_16x8, answer)["total"]
    assert f"{seconds:.2f} s per step, {100 * (seconds / fastest - 1):.1f}% over the fastest " \
           f"valid layout (allowed 5%); {plans[1]['memory'] / P.GB:.1f} GB per GPU" \
           in lab07.check_70b_plan(plans, answer)
    line = lab07.check_traffic_prediction(sol["predict_traffic"], seed=3)
    for shape, cfg in dict.fromkeys((s, c) for s, c, _ in lab07_prediction.mesh_traffic_cases(3)):
        sent = [lab07_prediction.formula_traffic(shape, cfg, r) for r in range(shape.world_size)]
        rank = max(range(shape.world_size), key=lambda r: (sum(sent[r].values()), r))
        assert f"{shape}, rank {rank} (the most): tp {sent[rank]['tp']:,.0f}" in line
    assert "seed" not in line and len(line) <= VERDICT_CHARS


def _plans(layouts, job=lab07.JOB_70B):
    out = []
    for t, p, d in layouts:
        cfg = P.ParallelConfig(t, p, d, job)
        out.append({"layout": (t, p, d), "memory": P.memory_per_gpu(P.LLAMA3_70B, cfg)["total"],
                    "bubble": P.bubble_fraction(p, cfg.microbatches),
                    "bytes": P.comm_bytes_per_step(P.LLAMA3_70B, cfg)})
    return out


def test_check_70b_plan_accepts_any_defensible_layout(sol):
    # Every layout within 5% of the fastest and with 10% of the memory free passes.
    ties = P.near_ties(P.LLAMA3_70B, P.H100_16x8, lab07.JOB_70B)
    passing = [c for c, _ in ties if P.memory_per_gpu(P.LLAMA3_70B, c)["total"] <= 72 * P.GB]
    assert len(passing) >= 3
    for cfg in passing:
        plans = _plans([(cfg.tp, cfg.pp, cfg.dp), (8, 2, 8)])
        lab07.check_70b_plan(plans, cfg)


@pytest.mark.parametrize("mistake,message", [
    # The fastest layout by a model that ignores headroom: 76.5 GB of 80.
    ("no_headroom", r"TP=2 PP=32 DP=2 needs 76.5 GB per GPU, 4.5 GB more than the 72 GB"),
    # The folk rule: a whole node of TP, 10% slower.
    ("folk_layout", r"TP=8 PP=2 DP=8 takes 42.83 s per step, 9.8% more than TP=2 PP=16 DP=4"),
    # Sequence parallelism's traffic "the same volume as TP": no backward all-gather.
    ("sp_same_as_tp", r"your bytes tp is .*-20.00%"),
    # ZeRO-1 charged as an all-reduce (2g) instead of reduce-scatter + all-gather (g + w).
    ("zero_as_allreduce", r"your bytes dp is .*\+33.33%"),
    # The bubble as (p-1)/m of compute rather than of the pipeline's time.
    ("bubble_over_m", r"your bubble is"),
    # The memory without the logits on the last stage (the p = 1 layout shows it).
    ("no_logits", r"TP=8 PP=1 DP=16: your memory is"),
    ("one_layout", r"at least two"),
    ("answer_not_considered", r"not among the layouts in plans_70b"),
])
def test_check_70b_plan_catches(mistake, message):
    layouts = [(2, 32, 2), (8, 2, 8), (2, 16, 4)]
    if mistake == "no_logits":
        layouts.append((8, 1, 16))
    plans = _plans(layouts)
    answer = P.ParallelConfig(2, 16, 4, lab07.JOB_70B)
    for entry in plans:
        t, p, d = entry["layout"]
        cfg = P.ParallelConfig(t, p, d, lab07.JOB_70B)
        if mistake == "sp_same_as_tp":
            entry["bytes"]["tp"] *= 8 / 10
        if mistake == "zero_as_allreduce":
            entry["bytes"]["dp"] *= (2 * 4) / (4 + 2)
        if mistake == "bubble_over_m":
            entry["bubble"] = (p - 1) / cfg.microbatches
        if mistake == "no_logits" and p == 1:
            entry["memory"] -= P.logits_bytes(P.LLAMA3_70B, t, cfg.job)
    if mistake == "no_headroom":
        answer = P.ParallelConfig(2, 32, 2, lab07.JOB_70B)
    if mistake == "folk_layout":
        answer = P.ParallelConfig(8, 2, 8, lab07.JOB_70B)
    if mistake == "one_layout":
        plans = plans[:1]
    if mistake == "answer_not_considered":
        answer = P.ParallelConfig(4, 4, 8, lab07.JOB_70B)
    with pytest.raises(CheckFailed, match=message):
        lab07.check_70b_plan(plans, answer)


def test_check_memory_per_gpu_catches_the_new_conventions():
    def no_logits(model, cfg):
        mem = dict(P.memory_per_gpu(model, cfg))
        if cfg.pp == 1:
            mem["activations"] -= P.logits_bytes(model, cfg.tp, cfg.job)
            mem["total"] -= P.logits_bytes(model, cfg.tp, cfg.job)
        return mem

    def always_sharded(model, cfg):           # ZeRO-2/3's best case for memory and traffic at once
        return P.memory_per_gpu(model, P.with_job(cfg, zero_accumulation="regather"))

    def no_gathered_layers(model, cfg):
        mem = dict(P.memory_per_gpu(model, cfg))
        if cfg.job.zero_stage >= 3 and cfg.dp > 1 and mem["weights"] < cfg.job.weight_bytes \
                * P.stage_params(model, cfg.tp, cfg.pp):
            extra = cfg.job.weight_bytes * 2 * model.layer_params / cfg.tp
            mem["weights"] -= extra
            mem["total"] -= extra
        return mem

    for wrong, message in [(no_logits, "'activations' is"), (always_sharded, "'(weights|gradients)' is"),
                           (no_gathered_layers, "'weights' is")]:
        with pytest.raises(CheckFailed, match=message):
            lab07.check_memory_per_gpu(wrong, seed=3, count=40)


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
    # float32 losses: the table shows their rounding as its bound, never its digits
    head = run.table().splitlines()[0]
    assert re.search(r"\(max \|loss - single process\|: < 1e-0[3-6]; tolerance", head), head
    assert not re.search(r"\d\.\d+e-\d", head) and "step" in run.table()


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


def test_answers_cell_runs_the_new_checks_and_a_manual_cell_collects_reasons():
    from distlab.course.notebooks import BEGIN_HIDDEN, END_HIDDEN, _regions, source_notebook
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in source_notebook(lab07.LAB).cells}
    test = cells["test_answers"].source
    hidden, _ = _regions(test, BEGIN_HIDDEN, END_HIDDEN)
    assert test.startswith("check_layout_numbers(plans_70b)")
    assert "check_70b_plan(plans_70b, answer_70b)" in " ".join(hidden)
    assert "check_405b_answer(answer_405b)" in " ".join(hidden)
    manual = cells["justify_70b"]
    meta = manual.metadata["nbgrader"]
    assert manual.cell_type == "markdown" and meta["solution"] and meta["grade"] and meta["points"] > 0


# ----------------------------------------------------------------------------- answers out of reach


def test_the_labs_tables_run_on_the_readers_functions(sol):
    """The teaching cells pass the reader's memory_per_gpu and choose_degrees (a handout has
    neither reference): with the solutions the tables are the reference's, and the near ties
    start only from a valid layout (they never find a faster one than the layout given)."""
    mine, choose = sol["memory_per_gpu"], sol["choose_degrees"]
    job = lab07.JOB_70B
    assert P.near_tie_table(P.LLAMA3_70B, P.H100_16x8, job, choose=choose, memory=mine) \
        == P.near_tie_table(P.LLAMA3_70B, P.H100_16x8, job)
    assert P.published_report(choose, mine) == P.published_report()
    assert P.layout_summary(P.LLAMA3_70B, P.H100_16x8, P.ParallelConfig(8, 2, 8, job), mine) \
        == P.layout_summary(P.LLAMA3_70B, P.H100_16x8, P.ParallelConfig(8, 2, 8, job))
    with pytest.raises(ValueError, match="is not a valid layout"):
        P.near_ties(P.LLAMA3_70B, P.H100_16x8, job, best=P.ParallelConfig(1, 1, 128, job), memory=mine)


def test_visible_checks_read_stored_numbers_not_the_reference(sol, monkeypatch):
    """The visible tests of exercises 1-3 run without memory_per_gpu or the reference search
    (a handout has neither): the stored sets hold every number they compare with."""
    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    from distlab.checks import lab07_cases
    for name in ("memory_per_gpu", "reference_choose_degrees"):
        monkeypatch.setattr(lab07, name, withheld)
        monkeypatch.setattr(lab07_cases, name, withheld)
    lab07.check_memory_per_gpu(sol["memory_per_gpu"])
    lab07.check_choose_degrees(sol["choose_degrees"])
    lab07.check_layout_numbers(_plans([(2, 16, 4), (8, 2, 8)]))
    with pytest.raises(CheckFailed, match="is not a layout of this cluster"):
        lab07.check_layout_numbers(_plans([(2, 16, 4), (8, 2, 4)]))


# ----------------------------------------------------------------------------- traffic and placement


MESH_3D = MeshShape(pp=2, dp=2, tp=2)


@pytest.fixture(scope="module")
def traced_3d():
    return traced_run(MESH_3D)


def _measured_matches_formula(out, shape):
    layout = megatron_layout(shape)
    for rank in range(shape.world_size):
        got = axis_traffic(out[rank], out.comms[rank], rank, layout)
        want = lab07_prediction.formula_traffic(shape, TinyConfig(), rank)
        assert got == {**{a: pytest.approx(v, abs=0.5) for a, v in want.items()}, "other": 0}, rank


def test_formula_traffic_is_what_the_records_hold(traced_3d):
    """Exercise 5's formulas against the run's records, every rank and axis, byte for byte; the
    design's budget is the bytes the course's layout sends across nodes, measured."""
    _measured_matches_formula(traced_3d, MESH_3D)
    _measured_matches_formula(traced_run(MeshShape(pp=1, dp=2, tp=2)), MeshShape(pp=1, dp=2, tp=2))
    crossed = sum(cross_node_bytes(traced_3d[r], traced_3d.comms[r], r, 4) for r in range(8))
    assert crossed == lab07_design._budget(MESH_3D, 4, TinyConfig()) == lab07_design.placement_budget()
    want = lab07_prediction.formula_traffic(MESH_3D, TinyConfig(), 0)
    assert want["tp"] > want["dp"] > want["pp"] > 0          # why only PP should cross nodes


def test_counting_the_last_step_alone_finds_what_counting_every_step_finds_there(traced_3d):
    """The placement check counts DTensor's collectives in the graded (last) step alone
    (``traced_mesh_rank(..., last_step_only=True)``): in that step every rank's bytes on every
    axis are those a run counted throughout finds, and nothing is counted before it."""
    import distlab
    from distlab.labs.mesh_traffic import traced_mesh_rank
    out = distlab.run(traced_mesh_rank, MESH_3D.world_size, MESH_3D, None, TinyConfig(), 0,
                      megatron_plan, True, timeout=300)
    layout = megatron_layout(MESH_3D)
    for rank in range(MESH_3D.world_size):
        start = out[rank]["step_windows"][-1][0]
        assert out[rank]["functional"] and all(t >= start for t, *_ in out[rank]["functional"])
        assert len(traced_3d[rank]["functional"]) > len(out[rank]["functional"])
        assert axis_traffic(out[rank], out.comms[rank], rank, layout) == \
            axis_traffic(traced_3d[rank], traced_3d.comms[rank], rank, layout), rank


@pytest.mark.parametrize("triple", [(2, 2, 2), *lab07_design.HIDDEN_TRIPLES])
def test_budget_is_the_least_of_every_placement_of_the_mesh(triple):
    """The design's budget, the least bytes across nodes (by the formulas) of every placement of
    the coordinates on the nodes, is what the course's layout sends and the least of the six
    row-major orders of the dimensions; TP across nodes is over it."""
    import itertools
    shape, cfg = MeshShape(*triple), TinyConfig()
    per_node = 4 if shape.world_size == 8 else lab07_design.HIDDEN_PER_NODE
    sizes = {"pp": shape.pp, "dp": shape.dp, "tp": shape.tp}
    budget, crossing = lab07_design._budget(shape, per_node, cfg), {}
    least, tried = lab07_design.least_crossing(shape, per_node, cfg)
    nodes = shape.world_size // per_node                       # every set partition into nodes
    assert tried == math.factorial(shape.world_size) // (
        math.factorial(per_node) ** nodes * math.factorial(nodes))
    assert least == budget
    for order in itertools.permutations(("pp", "dp", "tp")):
        grid = torch.arange(shape.world_size).reshape(*[sizes[a] for a in order])
        layout = grid.permute(*[order.index(a) for a in ("pp", "dp", "tp")]).tolist()
        crossing[order] = sum(lab07_prediction.formula_traffic(shape, cfg, r)[a]
                              for r in range(shape.world_size)
                              for a in lab07_design._spanning(layout, r, per_node))
    assert min(crossing.values()) == budget
    if shape.tp > 1:
        assert crossing[("tp", "pp", "dp")] > budget
    if shape.dp > 1 and shape.pp > 1:                 # the planted dp_across_nodes: DP outermost
        assert crossing[("dp", "pp", "tp")] > budget


def test_least_crossing_counts_as_the_check_does():
    """The exhaustive search's cost of a layout is the measured crossing's, by the formulas: on the
    course's layout and on a placement that is no order of the dimensions (each stage keeps a
    different axis inside a node), for 8 ranks on 4 nodes of 2, where both axes differ."""
    shape, cfg = MESH_3D, TinyConfig()
    calls = lab07_design._calls(shape, cfg)
    mixed = [[[0, 2], [1, 3]], [[4, 5], [6, 7]]]      # stage 0: DP pairs on a node; stage 1: TP
    for layout in (megatron_layout(shape), mixed):
        node_of = {(p, d, t): layout[p][d][t] // 2 for p in range(2) for d in range(2) for t in range(2)}
        want = sum(lab07_prediction.formula_traffic(shape, cfg, megatron_layout(shape)[p][d][t])[a]
                   for p in range(2) for d in range(2) for t in range(2)
                   for a in lab07_design._spanning(layout, layout[p][d][t], 2))
        assert lab07_design.crossing(calls, node_of) == want


def test_check_runs_the_stored_batches_first_steps():
    """The checks' shorter runs (CHECK_CFG: the design exercise's and the TP plan's) train on the
    first steps of the batches the stored losses were made from, so those losses' first steps
    are their reference."""
    short, full = lab07_design.CHECK_CFG, TinyConfig()
    assert 2 <= short.steps < full.steps
    for a, b in zip(make_batches(short, lab07_design.SEED), make_batches(full, lab07_design.SEED)):
        assert torch.equal(a, b[:short.steps])
    from distlab.checks.stored import load
    from distlab.labs.mesh import LOSS_ATOL, LOSS_RTOL
    got = reference_losses(short, lab07_design.SEED)
    assert lab07.SEED == lab07_design.SEED
    for name in ("placement", "mesh"):
        stored = load(lab07.LAB, name)["losses"]
        assert torch.allclose(got, stored[:short.steps], rtol=LOSS_RTOL, atol=LOSS_ATOL), name


def test_check_traffic_prediction(sol):
    lab07.check_traffic_prediction(sol["predict_traffic"])
    for seed in range(6):
        lab07.check_traffic_prediction(sol["predict_traffic"], seed=seed)


@pytest.mark.parametrize("mistake,message", [
    ("fused_qkv", "bytes on tp"),            # Lab 4's one qkv layer: 4 TP collectives, not 6
    ("pp_both_ways", "bytes on pp"),         # every stage sending forward and back
    ("dp_gathers_twice", "bytes on dp"),     # FSDP regathering for backward
    ("not_a_dict", "expected a dict"),
])
def test_check_traffic_prediction_catches(mistake, message):
    def wrong(shape, cfg, rank):
        out = dict(lab07_prediction.formula_traffic(shape, cfg, rank))
        if mistake == "fused_qkv":
            out["tp"] *= 4 / 6
        if mistake == "pp_both_ways" and shape.pp > 1:
            out["pp"] = 2 * 2 * (cfg.batch // (shape.dp * 2)) * cfg.seq * cfg.dim * 4
        if mistake == "dp_gathers_twice":
            out["dp"] *= 3 / 2
        return list(out.values()) if mistake == "not_a_dict" else out
    with pytest.raises(CheckFailed, match=message):
        lab07.check_traffic_prediction(wrong)


def test_check_mesh_placement(sol):
    line, budget = lab07.check_mesh_placement(sol["place_mesh"], sol["tp_plan"]), lab07_design.placement_budget()
    assert f"{budget:.0f} bytes per step cross nodes (budget {budget:.0f}: the least of every " \
           f"placement of the ranks on nodes" in line
    fig = lab07_scale.problem(None)[2]
    assert f"{lab07_scale.comparison(fig['bound'], fig)}: within the best order's bytes" in line
    for seed in (0, 1, 5):                                   # every hidden mesh (4 ranks, nodes of 2)
        lab07.check_mesh_placement(sol["place_mesh"], sol["tp_plan"], seed=seed)


def _tp_across_nodes(shape, per_node, sent):
    return torch.arange(shape.world_size).reshape(shape.tp, shape.pp, shape.dp).permute(1, 2, 0).tolist()


def _dp_outermost(shape, per_node, sent):       # Llama 3's order: here DP moves more than PP
    return torch.arange(shape.world_size).reshape(shape.dp, shape.pp, shape.tp).permute(1, 0, 2).tolist()


@pytest.mark.parametrize("place,message", [
    (_tp_across_nodes, r"sent 196608 bytes on groups that span nodes \(tp 196608 bytes\); the budget is 32768"),
    (_dp_outermost, r"\(dp 171008 bytes\); the budget is 32768"),
    (lambda shape, per_node, sent: [[[0, 1], [2, 3]], [[4, 5], [6, 6]]], "every rank 0..7 must appear exactly once"),
    (lambda shape, per_node, sent: [[0, 1, 2, 3], [4, 5, 6, 7]], r"a layout of shape \(2, 4\)"),
])
def test_check_mesh_placement_catches(place, message):
    with pytest.raises(CheckFailed, match=message):
        lab07.check_mesh_placement(place, megatron_plan)


@pytest.mark.parametrize("place,seed,message", [
    (_tp_across_nodes, 0, r"\(tp \d+ bytes\); the budget is"),      # (2, 1, 2) on nodes of 2
    (_dp_outermost, 1, r"\(dp \d+ bytes\); the budget is"),         # (2, 2, 1) on nodes of 2
])
def test_check_mesh_placement_catches_on_the_hidden_meshes(place, seed, message):
    with pytest.raises(CheckFailed, match=message):
        lab07.check_mesh_placement(place, megatron_plan, seed=seed)


def test_placement_text_names_its_sources():
    text = " ".join(SOURCE.read_text().replace("# ", " ").split())
    ratio = P.H100_16x8.intra_node_gbs / P.H100_16x8.inter_node_gbs
    assert f"about {ratio:.0f} times slower per GPU on the H100 nodes of section 3 " \
           f"({P.H100_16x8.inter_node_gbs:.0f} against {P.H100_16x8.intra_node_gbs:.0f} GB/s)" in text
    groups = groups_of(megatron_layout(MESH_3D), 0)
    assert groups == {"pp": (0, 4), "dp": (0, 2), "tp": (0, 1)}
    tried = [lab07_design.least_crossing(MeshShape(*t), n, TinyConfig())[1]
             for t, n in [((2, 2, 2), 4), (lab07_design.HIDDEN_TRIPLES[0], lab07_design.HIDDEN_PER_NODE)]]
    scale = lab07_design.least_crossing(lab07_scale.SHAPE, lab07_scale.PER_NODE, TinyConfig())[1]
    assert f"every way to put the coordinates on the nodes ({tried[0]} for the visible mesh, " \
           f"{tried[1]} for each hidden one, {scale} for 8 ranks on 4 nodes of 2)" in text


# ----------------------------------------------------------------------------- the design's scale


def _best_order(shape, per_node, sent):
    """Hint 3's design: the order of the dimensions whose layout sends the least across nodes, by
    the bytes per rank the check hands over."""
    return min((lab07_scale.order_layout(shape, order) for order in lab07_scale.ORDERS),
               key=lambda layout: _spanning_bytes(shape, per_node, sent, layout))


def _spanning_bytes(shape, per_node, sent, layout):
    course = megatron_layout(shape)          # sent's ranks: the row-major numbering
    return sum(sent[course[p][d][t]][a]
               for p in range(shape.pp) for d in range(shape.dp) for t in range(shape.tp)
               for a in lab07_design._spanning(layout, layout[p][d][t], per_node))


def _sent(shape, cfg):
    return lab07_design.sent_dicts(lab07_design.sent_rows(shape, cfg))


def test_scale_figures_are_the_best_order_and_the_least_of_every_placement():
    """The visible problem as stored: the best of the six orders (Hint 3's design) above the bar,
    halfway to the least of every placement (the bound), the three as computed today."""
    cfg, table, fig = lab07_scale.problem(None)
    shape, per_node = lab07_scale.SHAPE, lab07_scale.PER_NODE
    assert cfg == lab07_scale.VISIBLE_CFG
    orders = {order: _spanning_bytes(shape, per_node, _sent(shape, cfg),
                                     lab07_scale.order_layout(shape, order))
              for order in lab07_scale.ORDERS}
    assert orders == lab07_scale.order_crossings(shape, per_node, cfg)
    least = lab07_design.least_crossing(shape, per_node, cfg)[0]
    assert fig == {"hinted": min(orders.values()), "bar": (min(orders.values()) + least) / 2,
                   "bound": least}
    assert fig["bound"] < fig["bar"] < fig["hinted"] < orders[("pp", "dp", "tp")]   # not the course's order
    assert lab07_scale.placement_scale().startswith(lab07_scale.problem_line(cfg))


def test_scale_bytes_are_what_a_run_on_the_layout_sends():
    """The scale's count, on its call table, against a real 8-rank run of its visible model on
    4 nodes of 2: the bytes its records hold across nodes, on a placement that is no order (each
    stage keeps another axis on a node) and on the best order's."""
    shape, per_node, cfg = lab07_scale.SHAPE, lab07_scale.PER_NODE, lab07_scale.VISIBLE_CFG
    table = lab07_scale.problem(None)[1]
    best = _best_order(shape, per_node, _sent(shape, cfg))
    for layout in ([[[0, 2], [1, 3]], [[4, 5], [6, 7]]], best):
        out = traced_run(shape, megatron_plan, layout, dataclasses.replace(cfg, steps=2))
        measured = sum(cross_node_bytes(out[r], out.comms[r], r, per_node) for r in range(8))
        assert measured == lab07_scale.crossed(table, layout, per_node) \
            == _spanning_bytes(shape, per_node, _sent(shape, cfg), layout)


def test_every_hidden_model_gains_and_the_solution_reaches_each_bound(sol):
    """The grid holds models whose least is MIN_GAIN below the best order's, of both kinds (the
    best order keeps TP on a node, or DP); the solution reaches the bound on each, the best
    order only its own figure; hidden draws are among them."""
    from distlab.checks.common import design_scale
    gaining, kinds = [], set()
    for cfg in lab07_scale._grid_models(0):
        orders = lab07_scale.order_crossings(lab07_scale.SHAPE, lab07_scale.PER_NODE, cfg)
        hinted, bound = min(orders.values()), lab07_design.least_crossing(
            lab07_scale.SHAPE, lab07_scale.PER_NODE, cfg)[0]
        if bound <= hinted * (1 - lab07_scale.MIN_GAIN):
            gaining.append(cfg)
            kinds.add(min(orders, key=orders.get)[-1])
            table = lab07_scale.call_table(lab07_scale.SHAPE, cfg)
            sent = _sent(lab07_scale.SHAPE, cfg)
            layout = sol["place_mesh"](lab07_scale.SHAPE, lab07_scale.PER_NODE, sent)
            assert lab07_scale.crossed(table, layout, lab07_scale.PER_NODE) == bound, cfg
            best = _best_order(lab07_scale.SHAPE, lab07_scale.PER_NODE, sent)
            assert lab07_scale.crossed(table, best, lab07_scale.PER_NODE) == hinted, cfg
    assert len(gaining) >= 20 and kinds == {"tp", "dp"}
    for seed in range(5):
        cfg, _, fig = lab07_scale.problem(seed)
        assert cfg in gaining and fig == design_scale(fig["hinted"], fig["bound"])


def test_the_visible_scale_reads_stored_numbers_not_the_search(sol, monkeypatch):
    """A handout withholds the search, the orders' count and the call tables: the bar's visible
    test and the printed scale read the stored set."""
    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld")
    for name in ("call_table", "order_crossings", "_figures", "hidden_model", "sent_rows"):
        monkeypatch.setattr(lab07_scale, name, withheld)
    monkeypatch.setattr(lab07_design, "sent_rows", withheld)
    for name in ("least_crossing", "_calls", "_placements", "crossing"):
        monkeypatch.setattr(lab07_design, name, withheld)
    fig = lab07_scale.problem(None)[2]
    assert "within the bar" in lab07.check_mesh_placement_bar(sol["place_mesh"])
    assert f"the bound {fig['bound']:,.0f} (no placement sends less)" in lab07_scale.placement_scale()


def _planted_best_order():
    """The graded sample's best_order mistake (MISTAKES), as a function."""
    ns = {}
    exec("def place_mesh(shape, per_node, sent):\n" + PLACE + BEST_ORDER, ns)
    return ns["place_mesh"]


def test_hinted_design_passes_the_first_test_and_misses_the_bar():
    """Hint 3's design (the best order, by the bytes handed over; as the graded sample plants
    it): the first test's verdict shows its bytes beside the scale; the bar's test fails naming
    the bar and asking Hint 4's question."""
    fig, planted = lab07_scale.problem(None)[2], _planted_best_order()
    for shape, per_node, cfg in ((MESH_3D, 4, TinyConfig()),
                                 (lab07_scale.SHAPE, lab07_scale.PER_NODE, lab07_scale.VISIBLE_CFG)):
        sent = _sent(shape, cfg)
        assert planted(shape, per_node, sent) == _best_order(shape, per_node, sent)
    line = lab07.check_mesh_placement(_best_order, megatron_plan)
    assert f"{lab07_scale.comparison(fig['hinted'], fig)}: within the best order's bytes" in line
    with pytest.raises(CheckFailed, match=rf"This test's limit is the bar, {fig['bar']:,.0f} "
                                          r"bytes\. Does every stage"):
        lab07.check_mesh_placement_bar(_best_order)
    with pytest.raises(CheckFailed, match="This test's limit is the bar"):
        lab07.check_mesh_placement_bar(_best_order, seed=3)


def test_the_course_order_everywhere_misses_the_first_tests_scale():
    """TP innermost and PP outermost on every problem (what Hints 1 and 2 alone suggest): on 4
    nodes of 2 it is not the best order for the visible model, and the first test says so."""
    course = lambda shape, per_node, sent: megatron_layout(shape)        # noqa: E731
    cfg, table, fig = lab07_scale.problem(None)
    got = lab07_scale.crossed(table, megatron_layout(lab07_scale.SHAPE), lab07_scale.PER_NODE)
    assert got > fig["hinted"]
    with pytest.raises(CheckFailed, match=re.escape(lab07_scale.comparison(got, fig)) +
                       r"\. This test's limit is the best order's bytes"):
        lab07.check_mesh_placement(course, megatron_plan)


def test_closing_note_gives_the_scales_figures():
    text = " ".join(SOURCE.read_text().replace("# ", " ").split())
    fig = lab07_scale.problem(None)[2]
    assert f"the best order sends {fig['hinted']:,.0f} bytes per step across nodes, the course's " \
           f"placement {fig['bound']:,.0f}, the bound ({1 - fig['bound'] / fig['hinted']:.1%} " \
           f"less); each hidden model has a bound at least {lab07_scale.MIN_GAIN:.0%} below" in text


# ----------------------------------------------------------------------------- graded: each mistake its own test

LAB = lab07.LAB
POINTS = {"test_memory_per_gpu": 3, "test_choose_degrees": 3, "test_answers": 3, "test_tp_plan": 2,
          "test_predict_traffic": 2, "test_place_mesh": 2, "test_place_mesh_bar": 1}
PLACE = "    import torch\n"          # the solution's first line: a mistake returns right after it
BOTH = ("test_place_mesh", "test_place_mesh_bar")   # over the first test's limits: over the bar too
BEST_ORDER = """\
    import itertools
    sizes, best = {"pp": shape.pp, "dp": shape.dp, "tp": shape.tp}, None
    for order in itertools.permutations(sizes):
        grid = torch.arange(shape.world_size).reshape(*[sizes[a] for a in order])
        grid = grid.permute(*[order.index(a) for a in sizes])                # (pp, dp, tp)
        cost = 0.0
        for p, d, t in itertools.product(range(shape.pp), range(shape.dp), range(shape.tp)):
            mine = sent[(p * shape.dp + d) * shape.tp + t]
            for axis, group in (("pp", grid[:, d, t]), ("dp", grid[p, :, t]), ("tp", grid[p, d, :])):
                if len(set((group // per_node).tolist())) > 1:
                    cost += mine[axis]
        if best is None or cost < best[0]:
            best = (cost, grid.tolist())
    return best[1]
"""
# {mistake: (the test(s) it must lose, [(solution cell, old, new)])}
MISTAKES = {
    # Lab 4's fused qkv counted: four TP all-reduces per block and micro-batch instead of six
    "fused_qkv": ("test_predict_traffic", [("predict_traffic", "m * blocks * 6 * 2", "m * blocks * 4 * 2")]),
    # TP outermost: every TP pair split across the two nodes
    "tp_across_nodes": (BOTH, [("place_mesh", PLACE, PLACE + "    return torch.arange(shape.world_size)"
                                ".reshape(shape.tp, shape.pp, shape.dp).permute(1, 2, 0).tolist()\n")]),
    # Llama 3's order, DP outermost: TP stays inside a node, but DP sends more than PP here
    "dp_across_nodes": (BOTH, [("place_mesh", PLACE, PLACE + "    return torch.arange(shape.world_size)"
                                ".reshape(shape.dp, shape.pp, shape.tp).permute(1, 0, 2).tolist()\n")]),
    # Hint 3's design: the best of the six orders by the student's prediction (the bar's test only)
    "best_order": ("test_place_mesh_bar", [("place_mesh", PLACE, PLACE + BEST_ORDER)]),
}
SAMPLE_KINDS = ()


def own_graded_samples() -> dict:
    """{(student, lab): notebook}: the solution, the untouched lab and the planted mistakes, in
    as few notebooks as keep each the one reason its test fails (tests/submissions/packing.py)."""
    import submissions
    from submissions import packing
    return {("solution", LAB): submissions.solved(LAB), ("untouched", LAB): submissions.student(LAB),
            **packing.packed_samples(LAB, MISTAKES)}


@pytest.fixture(scope="module")
def graded(graded_samples):
    return {student: row for (student, lab), row in graded_samples["rows"].items() if lab == LAB}


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_grader_gives_the_solution_full_marks_and_the_student_version_zero(graded):
    assert {t: graded["solution"][t] for t in POINTS} == dict.fromkeys(POINTS, "pass")
    assert float(graded["untouched"]["score"]) == 0
    assert all(graded["untouched"][t] not in ("pass", "missing", "") for t in POINTS)


@pytest.mark.slow
@pytest.mark.timeout(5400)
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_grader_takes_each_mistake_off_its_own_test_only(graded, mistake):
    """The mistake's notebook may hold other mistakes, each in a test of its own that cannot
    reach this one's cells: each loses its test, every other test passes."""
    from submissions import packing
    sample, lost = packing.lost(packing.grouped(LAB, MISTAKES), MISTAKES, mistake)
    row = graded[sample]
    assert packing.tests(MISTAKES[mistake][0]) <= lost
    assert {t: row[t] for t in POINTS} == {t: "fail" if t in lost else "pass" for t in POINTS}
    assert float(row["score"]) == float(graded["solution"]["score"]) - sum(POINTS[t] for t in lost)


@pytest.mark.slow
def test_graded_design_cells_print_the_scale_not_none(graded_samples):
    """Under the grader each design cell shows the verdict line the judge sends back: the
    solution's bytes beside the best order's, the bar and the bound (the site shows the same
    comparison, from the executed solution), never a bare None."""
    import nbformat
    fig = lab07_scale.problem(None)[2]
    nb = nbformat.read(graded_samples["autograded"]("solution", LAB), as_version=4)
    for grade_id, verdict in (("test_place_mesh", "within the best order's bytes"),
                              ("test_place_mesh_bar", "within the bar")):
        cell = next(c for c in nb.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert f"{lab07_scale.comparison(fig['bound'], fig)}: {verdict}" in text, text
        assert "None" not in text.split(), text


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
def test_the_courses_stage_layout_is_the_solutions_placement(seed):
    """``mesh_traffic.stage_layout`` (the course's answer, withheld from the handout; the
    delegation samples hand it in) places the scale's problem as the solution does."""
    from distlab.checks.lab07_design import sent_dicts
    from distlab.labs.mesh_traffic import stage_layout
    _, table, _ = lab07_scale.problem(seed)
    sent = sent_dicts(table["sent"])
    solution = solution_functions("07_3d_parallelism", ["place_mesh"])["place_mesh"]
    shape, per_node = lab07_scale.SHAPE, lab07_scale.PER_NODE
    assert stage_layout(shape, per_node, sent) == solution(shape, per_node, sent)
