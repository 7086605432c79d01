"""Lab 10's measurements and planner questions (``distlab.labs.context.traffic``, ``memory``,
``timeline``, ``distlab.labs.planning.context``, ``distlab.checks.lab10_plan``): the formulas
equal the collective records' bytes, the prediction and the CP question grade right and wrong
answers, Lab 7's planner is unchanged at cp = 1, the timeline shows transfers under compute on
every rank, and the memory table comes from measurements. The course's own ring and Ulysses
(``distlab.labs.context.answers``) stand for the reader's.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from distlab import paths
from distlab.checks import lab10_plan
from distlab.checks.assertions import CheckFailed
from distlab.labs.context import answers
from distlab.labs.context.memory import measure_memory
from distlab.labs.context.traffic import (CASES, METHODS, allgather_attention, bytes_table,
                                          formula_bytes, measure_bytes, ring_overlap)
from distlab.labs.planning import (H100_16x8, LLAMA3_70B, LLAMA3_405B, LLAMA3_405B_PUBLISHED,
                                   ParallelConfig, candidates, comm_bytes_per_step,
                                   memory_per_gpu)
from distlab.labs.planning.context import (LLAMA3_405B_128K_GPUS, LLAMA3_405B_128K_PUBLISHED,
                                           cp_comm_bytes_per_step, cp_layouts, cp_memory_per_gpu)
from distlab.labs.planning.shapes import GB

LAB = lab10_plan.LAB


@pytest.fixture(scope="module")
def byte_rows():
    return measure_bytes(answers.ring_attention, answers.ulysses_attention,
                         ring_formula=lab10_plan.ring_bytes_formula)


@pytest.fixture(scope="module")
def stored_data(tmp_path_factory):
    """lab10_plan's stored sets written as ``distlab references`` writes them, in a data folder
    of their own (``distlab.checks.lab10.make_references`` merges them into the lab's)."""
    from distlab.course.references import serialize
    folder = tmp_path_factory.mktemp("data") / LAB
    folder.mkdir()
    files = {}
    for name, content in lab10_plan.make_references().items():
        blob = serialize({k: v for k, v in content.items() if k != "seed"})
        (folder / f"{name}.pt").write_bytes(blob)
        files[f"{name}.pt"] = {"seed": content["seed"], "sha256": hashlib.sha256(blob).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps({"lab": LAB, "files": files}))
    return folder.parent


@pytest.fixture
def with_stored(stored_data, monkeypatch):
    monkeypatch.setattr(paths, "data", lambda: stored_data)


# ---------------------------------------------------------------------------------------------
# Bytes per rank

def test_every_rank_moves_what_the_formulas_say(byte_rows):
    assert [r["method"] for r in byte_rows] == [m for m in METHODS for _ in CASES]
    for r in byte_rows:
        assert len(r["bytes per rank"]) == r["p"]
        assert all(b == r["formula"] for b in r["bytes per rank"]), r
        assert r["source"] == "measured"
    assert "✗" not in bytes_table(byte_rows)


def test_ring_and_all_gather_move_the_same_bytes_and_ulysses_stays_bounded():
    b, h, d = 2, 4, 8
    for p in (2, 4, 8, 64):
        s = 16 * p
        ring = lab10_plan.ring_bytes_formula(s, p, h, h, d, b, 4)
        assert ring == formula_bytes("all-gather", p, s, b, h, d)
        # Ulysses at fixed s/p: under 4·(s/p)·h·d·b whatever p (DeepSpeed-Ulysses §3)
        assert formula_bytes("Ulysses", p, s, b, h, d) < 4 * 16 * h * d * 4 * b
    assert formula_bytes("Ulysses", 64, 1024, b, h, d) / formula_bytes("Ulysses", 2, 32, b, h, d) \
        == pytest.approx((63 / 64) / (1 / 2))


def test_allgather_attention_is_attention():
    import torch

    import distlab
    from distlab.labs.context.dense import dense_attention

    def body(rank, world_size, q, k, v, positions):
        mine = [t[:, :, positions[rank]] for t in (q, k, v)]
        return allgather_attention(*mine, positions=positions)[0]

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 4, generator=g, dtype=torch.float64) for _ in range(3))
    positions = answers.causal_layout(16, 2)
    out = distlab.run(body, 2, q, k, v, positions)
    want = dense_attention(q, k, v, causal=True)[0]
    for r in range(2):
        torch.testing.assert_close(out[r], want[:, :, positions[r]])


def test_ring_overlap_crossover_is_liu_et_al_block_size():
    r = ring_overlap(1024, 1, 128, tflops=1000.0, bandwidth_gbs=500.0, itemsize=2)
    assert r["crossover s/p"] == pytest.approx(1000e12 / 500e9)          # F/B in bf16
    assert ring_overlap(r["crossover s/p"], 1, 128, 1000.0, 500.0)["compute / transfer"] == \
        pytest.approx(1.0)


def _stub(*args, **kwargs):
    raise NotImplementedError("yours to write")


def test_stubs_show_the_stored_records(with_stored):
    rows = measure_bytes(_stub, _stub, ring_formula=lab10_plan.ring_bytes_formula)
    for r in rows:
        assert (r["source"] == "measured") == (r["method"] == "all-gather")
        assert all(b == r["formula"] for b in r["bytes per rank"]), r
    assert all(r["formula"] is None for r in measure_bytes(_stub, None, ring_formula=_stub,
                                                           methods=("ring",)))


def test_stubs_show_the_stored_memory_and_no_timeline(with_stored):
    from distlab.labs.context.timeline import profile_ring
    stored = measure_memory(_stub, seq_lens=(256,), world_sizes=(2, 4))
    measured = measure_memory(answers.ring_attention, seq_lens=(256,), world_sizes=(2, 4))
    for got, want in zip(stored, measured):
        assert got["peak"] == want["peak"]
        assert got["source"].startswith("stored") == (got["method"] == "ring")
    assert profile_ring(_stub, world_size=2, seq_len=64, show=False) is None


# ---------------------------------------------------------------------------------------------
# The graded prediction

def test_prediction_passes_the_formula(with_stored):
    lab10_plan.grade_ring_prediction(lab10_plan.ring_bytes_formula)            # visible: stored
    lab10_plan.grade_ring_prediction(lab10_plan.ring_bytes_formula, seed=12345)  # hidden


@pytest.mark.parametrize("wrong", [
    lambda s, p, hq, h, d, b, item: p * 2 * (s // p) * h * d * item * b,      # p hops, not p-1
    lambda s, p, hq, h, d, b, item: (p - 1) * (s // p) * h * d * item * b,    # K only
    lambda s, p, hq, h, d, b, item: (p - 1) * 2 * (s // p) * h * d * item,    # batch left out
])
def test_prediction_fails_a_wrong_count(wrong, with_stored):
    with pytest.raises(CheckFailed, match="the formula gives .* bytes"):
        lab10_plan.grade_ring_prediction(wrong)
    with pytest.raises(CheckFailed, match="p−1 times"):
        lab10_plan.grade_ring_prediction(wrong, seed=7)


def test_prediction_that_sends_the_query_heads_is_told_only_k_and_v_travel(with_stored):
    def query_heads(s, p, hq, hkv, d, b, item):
        return lab10_plan.ring_bytes_formula(s, p, hq, hq, d, b, item)
    with pytest.raises(CheckFailed, match="that counts 128 heads per block, the query heads"):
        lab10_plan.grade_ring_prediction(query_heads)


def test_prediction_refuses_a_non_number(with_stored):
    with pytest.raises(CheckFailed, match="expected a number of bytes"):
        lab10_plan.grade_ring_prediction(lambda *args: "many")


# ---------------------------------------------------------------------------------------------
# The planner: Lab 7 unchanged at cp = 1, and the CP question

def _lab7_layouts():
    from distlab.checks.lab07 import JOB_70B
    yield LLAMA3_70B, ParallelConfig(8, 4, 4, JOB_70B)
    yield LLAMA3_405B, LLAMA3_405B_PUBLISHED
    for cfg in candidates(H100_16x8, JOB_70B):
        yield LLAMA3_70B, cfg


def test_cp_1_is_lab_7():
    for model, cfg in _lab7_layouts():
        assert cfg.cp == 1 and cfg.gpus == cfg.tp * cfg.pp * cfg.dp
        assert str(cfg) == f"TP={cfg.tp} PP={cfg.pp} DP={cfg.dp}"
        assert cp_memory_per_gpu(model, cfg) == memory_per_gpu(model, cfg)
        assert cp_comm_bytes_per_step(model, cfg) == comm_bytes_per_step(model, cfg)


def test_cp_divides_activations_and_adds_kv_traffic():
    cfg = LLAMA3_405B_128K_PUBLISHED
    one = replace(cfg, cp=1)
    act = cp_memory_per_gpu(LLAMA3_405B, cfg)["activations"]
    assert act < cp_memory_per_gpu(LLAMA3_405B, one)["activations"] / 15
    comm = cp_comm_bytes_per_step(LLAMA3_405B, cfg)
    assert comm["cp"] > 0 and "cp" not in cp_comm_bytes_per_step(LLAMA3_405B, one)
    assert comm["tp"] == pytest.approx(comm_bytes_per_step(LLAMA3_405B, one)["tp"] / 16)
    # the published layout uses every GPU of Table 4 and gives each 8,192 tokens, the initial
    # pre-training's sequence (the lab's inference, not the paper's)
    assert cfg.gpus == LLAMA3_405B_128K_GPUS
    assert cfg.job.seq_len // cfg.cp == LLAMA3_405B_PUBLISHED.job.seq_len


def test_cp_question_answer_comes_from_the_planner():
    model, job, tp, pp, dp, mem = lab10_plan.CP_QUESTION
    answer = lab10_plan.reference_smallest_cp(*lab10_plan.CP_QUESTION)
    fits = [cp for cp in (1, 2, 4, 8, 16, 32) if cp_memory_per_gpu(
        model, ParallelConfig(tp, pp, dp, job, cp=cp))["total"] <= mem * GB]
    assert answer == fits[0] == 2
    assert 16 in fits and 1 not in fits            # the published CP fits; no CP does not
    # with fixed GPUs (Table 4's 16,384), CP trades DP: the published CP keeps 16 micro-batches
    at_16k = {c.cp: c for c in cp_layouts(model, job, tp, pp, gpus=LLAMA3_405B_128K_GPUS)}
    assert at_16k[16].dp == 8 and at_16k[16].microbatches == 16 and at_16k[2].microbatches == 2


def test_cp_question_grades(with_stored):
    lab10_plan.grade_cp_degree(lab10_plan.reference_smallest_cp)
    lab10_plan.grade_cp_degree(lab10_plan.reference_smallest_cp, seed=99)
    with pytest.raises(CheckFailed, match="smallest fitting degree is 2"):
        lab10_plan.grade_cp_degree(lambda *args: 16)


# ---------------------------------------------------------------------------------------------
# Timeline and memory

def test_timeline_shows_transfers_under_compute_on_every_rank():
    from distlab.labs.context.timeline import profile_ring, transfer_table
    p = 2
    prof = profile_ring(answers.ring_attention, world_size=p, seq_len=512, show=False)
    tl = prof.timeline
    for r in range(p):
        forward = tl.of(r, "range", "ring forward")[0]
        moves = [s for s in tl.of(r, "comm") if s.op in ("send", "recv")
                 and forward.start <= s.start <= forward.end]
        assert {s.op for s in moves} == {"send", "recv"} and len(moves) >= 2 * (p - 1)
        recv = max((s for s in moves if s.op == "recv"), key=lambda s: s.duration)
        assert any(c.start < recv.end and c.end > recv.start for c in tl.of(r, "compute")), \
            f"rank {r}: no compute under its transfer"
    rows = transfer_table(tl)
    assert [row["transfers"] for row in rows] == [2 * (p - 1)] * p


def test_memory_table_comes_from_measurements():
    rows = measure_memory(answers.ring_attention, seq_lens=(128, 256), world_sizes=(2,))
    dense = {r["s"]: r for r in rows if r["method"] == "dense"}
    ring = {r["s"]: r for r in rows if r["method"] == "ring"}
    for s in (128, 256):
        assert all(r["source"] == "measured" for r in (dense[s], ring[s]))
        # dense keeps about four s x s matrices at its peak (scores, exponentials, weights)
        assert 3.5 < dense[s]["peak"] / dense[s]["scores"] < 4.5
        assert ring[s]["peak"] < dense[s]["peak"] / 2
    assert dense[256]["peak"] / dense[128]["peak"] == pytest.approx(4, rel=0.05)   # ~ s²


# ---------------------------------------------------------------------------------------------
# The numbers the lab's text states come from this code

SOURCE = paths.root() / "solutions" / LAB / f"{LAB}.py"


def _text() -> str:
    """The lab source's prose (comment lines), joined so that a phrase may cross a line break."""
    lines = [line[2:] for line in SOURCE.read_text().splitlines() if line.startswith("# ")]
    return " ".join(lines)


def test_text_states_the_overlap_numbers():
    from distlab.labs.context.traffic import ring_overlap
    text, c = _text(), H100_16x8
    for stated in (f"{c.peak_tflops:g} TFLOP/s", f"{c.kernel_efficiency:.0%} kernel efficiency",
                   f"{c.intra_node_gbs:g} GB/s over NVLink", f"{c.inter_node_gbs:g} GB/s between"):
        assert stated in text
    tflops = c.peak_tflops * c.kernel_efficiency
    # the causal ring on a balanced split: every step's block half full, the crossover doubled
    nvlink = ring_overlap(1, 1, 1, tflops, c.intra_node_gbs, causal=True)["crossover s/p"]
    network = ring_overlap(1, 1, 1, tflops, c.inter_node_gbs, causal=True)["crossover s/p"]
    assert nvlink == pytest.approx(2 * ring_overlap(1, 1, 1, tflops, c.intra_node_gbs)["crossover s/p"])
    assert f"the causal ring hides its transfers from about {round(nvlink, -1):,.0f} tokens per rank" in text
    assert f"about {round(network, -2):,.0f}, since the network is " \
           f"{c.intra_node_gbs / c.inter_node_gbs:g} times slower" in text
    cfg = LLAMA3_405B_128K_PUBLISHED
    tokens = cfg.job.seq_len // cfg.cp
    assert f"CP {cfg.cp} gives each rank {tokens:,} tokens" in text
    assert 0.45 < tokens / network < 0.55 and "about half the crossover between nodes" in text
    heads, kv = LLAMA3_405B.heads, LLAMA3_405B.kv_heads
    assert f"{kv} K/V heads for {heads} query heads" in text
    assert f"{heads // kv} times smaller than Q" in text
    gqa = ring_overlap(1, kv, 1, tflops, c.inter_node_gbs, causal=True)
    gqa_crossover = gqa["crossover s/p"] * kv / heads     # compute of 128 heads, transfer of 8
    assert f"the crossover between nodes falls to about {round(gqa_crossover, -1):,.0f} tokens" in text
    assert "right at" not in text


def test_text_states_the_planner_numbers():
    from distlab.labs.planning.step_time import bubble_fraction
    text = _text()
    model, job, tp, pp, dp, mem = lab10_plan.CP_QUESTION

    def memory(cp):
        return cp_memory_per_gpu(model, ParallelConfig(tp, pp, dp, job, cp=cp))

    assert f"first stage needs {memory(1)['total'] / GB:.1f} GB " \
           f"({memory(1)['activations'] / GB:.1f} GB of it activations)" in text
    assert f"CP 2 brings it to {memory(2)['total'] / GB:.1f} GB" in text
    assert lab10_plan.reference_smallest_cp(*lab10_plan.CP_QUESTION) == 2
    assert "The planner says CP 2; Meta used CP 16" in text
    at_16k = {c.cp: c for c in cp_layouts(model, job, tp, pp, gpus=LLAMA3_405B_128K_GPUS)}
    for cp in (1, 2, 16):
        bubble = bubble_fraction(pp, at_16k[cp].microbatches)
        assert f"idles {bubble:.0%}" in text, cp
    assert at_16k[1].dp == 128 and cp_memory_per_gpu(model, at_16k[1])["total"] <= mem * GB
    selective = lab10_plan.reference_smallest_cp(model, replace(job, recompute="selective"),
                                                 tp, pp, dp, mem)
    assert f"the smallest CP that fits is {selective}" in text
    at_selective = cp_memory_per_gpu(model, ParallelConfig(tp, pp, dp, replace(
        job, recompute="selective"), cp=16))["total"] / GB
    assert at_selective > mem and f"CP 16 needs {at_selective:.1f} GB" in text
    assert "Memory is not what chose 16" not in text and "the planner's inference" in text
    assert f"{job.global_batch} sequences" in text and f"{LLAMA3_405B_128K_GPUS:,}" in text


def test_text_states_the_memory_ratio():
    rows = measure_memory(answers.ring_attention, seq_lens=(256, 512), world_sizes=())
    ratios = {round(r["peak"] / r["scores"], 1) for r in rows}
    assert ratios == {4.0}
    assert "peak / scores = 4.0" in _text()
