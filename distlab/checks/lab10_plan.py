"""Lab 10's measurements and planner questions (served by ``distlab.checks.lab10``, which the
judge serves and which defines the ``check_*`` wrappers):

- the graded prediction, ``predict_ring_bytes(seq_len, world_size, q_heads, kv_heads, head_dim,
  batch, itemsize)``: the bytes one rank sends in one ring-attention forward (Liu et al., arXiv
  2310.01889 §3), against ``ring_bytes_formula``; the lab then prints it beside the records
  (``traffic.measure_bytes``);
- the planner question, ``smallest_cp(model, job, tp, pp, dp, gpu_mem_gb)``: the smallest
  power-of-two context-parallel degree whose memory per GPU (``planning.context.cp_memory_per_gpu``)
  fits, against ``reference_smallest_cp``; the lab's case is Llama 3 405B's 128K-token stage at
  its published TP 8, PP 16, DP 8 (arXiv 2407.21783, Table 4);
- ``make_references()``: the stored sets these need ("ring_prediction", "cp_degree") and the
  course's measurements a handout shows until its functions are written ("measured").

Visible cases read the stored sets (a handout has neither reference); hidden cases are drawn
from the seed and computed in the judge.
"""
from __future__ import annotations

import math
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.shown import joined
from distlab.checks.stored import expected_values
from distlab.labs.planning.context import CP_DEGREES, LLAMA3_405B_128K_JOB, cp_memory_per_gpu
from distlab.labs.planning.shapes import GB, LLAMA3_8B, LLAMA3_70B, LLAMA3_405B, Job, Model, \
    ParallelConfig

LAB = "10_context_parallel"
SEED = 1010
# (seq_len, world_size, q_heads, kv_heads, head_dim, batch, itemsize): two of the lab's measured
# sizes (as many K/V heads as query heads), Llama 3 405B's 128K stage (128 query heads, 8 K/V
# heads of 128 dimensions, CP 16, bf16: arXiv 2407.21783 Table 3 and §3.3.2), an odd one.
RING_CASES = ((32, 2, 4, 4, 8, 2, 4), (128, 4, 4, 4, 8, 2, 4), (131072, 16, 128, 8, 128, 1, 2),
              (6, 3, 4, 2, 2, 1, 8))
# The lab's question: Llama 3 405B at 128K tokens, the published TP, PP and DP (Table 4).
CP_QUESTION = (LLAMA3_405B, LLAMA3_405B_128K_JOB, 8, 16, 8, 80.0)
MODELS = {m.name: m for m in (LLAMA3_8B, LLAMA3_70B, LLAMA3_405B)}


# ---------------------------------------------------------------------------------------------
# The prediction: bytes one rank sends per ring forward

def ring_bytes_formula(seq_len: int, world_size: int, q_heads: int, kv_heads: int, head_dim: int,
                       batch: int, itemsize: int) -> int:
    """The bytes one rank sends in one ring-attention forward (the prediction's reference)."""
    del q_heads
    return (world_size - 1) * 2 * (seq_len // world_size) * kv_heads * head_dim * itemsize * batch


def ring_bytes_cases(seed: int | None) -> list[tuple[int, ...]]:
    """RING_CASES (visible); or three cases drawn from ``seed`` (hidden)."""
    if seed is None:
        return list(RING_CASES)
    rng = random.Random(seed)
    cases = []
    for _ in range(3):
        p, kv = rng.choice([2, 3, 4, 8, 16]), rng.choice([1, 2, 8, 32])
        cases.append((p * rng.randint(1, 4096), p, kv * rng.choice([2, 4, 8, 16]), kv,
                      rng.choice([16, 64, 128]), rng.randint(1, 8), rng.choice([2, 4])))
    return cases


def ring_prediction_set() -> dict:
    return {"seed": SEED, "bytes": torch.tensor([ring_bytes_formula(*c) for c in RING_CASES],
                                                dtype=torch.int64)}


def grade_ring_prediction(predict_ring_bytes, seed: int | None = None) -> str:
    """``predict_ring_bytes(seq_len, world_size, q_heads, kv_heads, head_dim, batch, itemsize)``
    must equal
    the formula on every case of ``ring_bytes_cases(seed)``."""
    todo = ring_bytes_cases(seed)
    expected = expected_values(LAB, "ring_prediction", "bytes", seed, todo,
                               lambda case: ring_bytes_formula(*case))
    shown = []
    for (s, p, hq, hkv, d, b, item), want in zip(todo, expected):
        call = (f"predict_ring_bytes(seq_len={s}, world_size={p}, q_heads={hq}, kv_heads={hkv}, "
                f"head_dim={d}, batch={b}, itemsize={item})")
        got = predict_ring_bytes(s, p, hq, hkv, d, b, item)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{call} returned {got!r:.160}: expected a number of bytes.") \
                from None
        if hq != hkv and math.isclose(got, want * hq / hkv, rel_tol=1e-9):
            raise CheckFailed(
                f"{call} = {got:,.0f}: that counts {hq} heads per block, the query heads. Only K "
                f"and V travel around the ring, and they have {hkv} heads (grouped-query "
                f"attention): the formula gives {want:,} bytes.")
        if not math.isclose(got, want, rel_tol=1e-9):
            raise CheckFailed(
                f"{call} = {got:,.0f}; the formula gives {want:,} bytes ({got / want:.3g} times "
                f"yours). A rank holds a K block and a V block of s/p tokens, (batch, h, s/p, d) "
                f"each; it sends the blocks it holds to its right neighbour at every step but the "
                f"last, p−1 times: count the bytes of one block first.")
        shown.append(f"s={s:,}, p={p}, {hkv} KV heads: {got:,.0f} (formula {want:,})")
    return joined(f"predict_ring_bytes: your bytes per rank per ring forward equal the formula's "
                  f"(relative 1e-9) on {len(todo)} cases: ", shown)


# ---------------------------------------------------------------------------------------------
# The planner question: the smallest CP degree that fits

def reference_smallest_cp(model: Model, job: Job, tp: int, pp: int, dp: int,
                          gpu_mem_gb: float = 80.0) -> int | None:
    """The smallest degree of CP_DEGREES that splits the sequence and whose memory per GPU
    (``cp_memory_per_gpu``, heaviest stage) is at most ``gpu_mem_gb`` GB; None if none does."""
    for cp in CP_DEGREES:
        if job.seq_len % cp == 0 and cp_memory_per_gpu(
                model, ParallelConfig(tp, pp, dp, job, cp=cp))["total"] <= gpu_mem_gb * GB:
            return cp
    return None


def cp_cases(seed: int | None) -> list[tuple]:
    """The lab's question and two more published-model cases (visible); or three cases drawn
    from ``seed`` (hidden): a Llama 3 model, a long sequence, TP and PP it allows, a batch."""
    if seed is None:
        from dataclasses import replace
        return [CP_QUESTION,
                (LLAMA3_405B, replace(LLAMA3_405B_128K_JOB, recompute="selective"), 8, 16, 8, 80.0),
                (LLAMA3_70B, replace(LLAMA3_405B_128K_JOB, recompute="none", global_batch=64),
                 8, 4, 4, 80.0)]
    rng = random.Random(seed)
    cases = []
    for _ in range(3):
        model = rng.choice(list(MODELS.values()))
        pp = rng.choice([p for p in (1, 2, 4, 8, 16) if p <= model.layers])
        dp = rng.choice([1, 2, 4, 8])
        job = Job(seq_len=rng.choice([65536, 131072, 262144, 524288]),
                  global_batch=dp * rng.choice([1, 4, 16]), micro_batch=1,
                  zero_stage=rng.choice([1, 3]), recompute=rng.choice(["full", "selective"]))
        cases.append((model, job, rng.choice([4, 8]), pp, dp, rng.choice([80.0, 141.0])))
    return cases


def cp_degree_set() -> dict:
    return {"seed": SEED, "cp": torch.tensor([reference_smallest_cp(*c) or 0
                                              for c in cp_cases(None)], dtype=torch.int64)}


def grade_cp_degree(smallest_cp, seed: int | None = None) -> str:
    """``smallest_cp(model, job, tp, pp, dp, gpu_mem_gb)`` must be the reference's on every
    case of ``cp_cases(seed)`` (None where no degree of CP_DEGREES fits)."""
    todo = cp_cases(seed)
    if seed is None:
        from distlab.checks.stored import load
        expected = [v or None for v in load(LAB, "cp_degree")["cp"].tolist()]
    else:
        expected = [reference_smallest_cp(*case) for case in todo]
    shown = []
    for (model, job, tp, pp, dp, mem), want in zip(todo, expected):
        call = (f"smallest_cp({model.name}, Job(seq_len={job.seq_len}, global_batch="
                f"{job.global_batch}, zero_stage={job.zero_stage}, recompute={job.recompute!r}), "
                f"tp={tp}, pp={pp}, dp={dp}, gpu_mem_gb={mem:g})")
        call = ("a visible case, " if seed is None else f"a hidden case (seed {seed}), ") + call
        got = smallest_cp(model, job, tp, pp, dp, mem)
        if got != want:
            at = (f"at CP = {want}: {_gb(model, job, tp, pp, dp, want):.1f} GB" if want else
                  f"no degree up to {CP_DEGREES[-1]} fits")
            below = "" if not want or want == 1 else \
                f", at CP = {want // 2}: {_gb(model, job, tp, pp, dp, want // 2):.1f} GB"
            raise CheckFailed(
                f"{call} returned {got!r}; the planner's smallest fitting degree is {want} "
                f"(memory per GPU {at}{below}, against {mem:g} GB). Try the powers of two "
                f"{CP_DEGREES} in order, ParallelConfig(tp, pp, dp, job, cp=cp), and keep the "
                f"first whose cp_memory_per_gpu(...)['total'] is at most gpu_mem_gb·GB (GB = 1e9);"
                f" None if none does.")
        shown.append(_cp_figures(model, job, tp, pp, dp, mem, got))
    return joined(f"smallest_cp: your degree is the planner's smallest fitting one on "
                  f"{len(todo)} {'visible' if seed is None else 'hidden'} cases: ", shown)


def _cp_figures(model, job, tp, pp, dp, mem: float, cp) -> str:
    """One case of a pass: the student's degree, its memory and the next smaller degree's."""
    recompute = "no" if job.recompute == "none" else job.recompute
    where = (f"{model.name.removeprefix('Llama 3 ')} {job.seq_len // 1024}K, {recompute} "
             f"recompute, TP={tp} PP={pp} DP={dp}")
    if cp is None:
        most = CP_DEGREES[-1]
        return f"{where}: None (CP {most}: {_gb(model, job, tp, pp, dp, most):.1f} > {mem:g} GB)"
    below = f" (CP {cp // 2}: {_gb(model, job, tp, pp, dp, cp // 2):.1f})" if cp > 1 else ""
    return f"{where}: CP {cp}, {_gb(model, job, tp, pp, dp, cp):.1f} of {mem:g} GB{below}"


def _gb(model, job, tp, pp, dp, cp) -> float:
    return cp_memory_per_gpu(model, ParallelConfig(tp, pp, dp, job, cp=cp))["total"] / GB


# ---------------------------------------------------------------------------------------------
# Stored sets

def measured_set() -> dict:
    """The course's ring and Ulysses runs of the lab's measurements (bytes per rank of
    ``traffic.measure_bytes``, peak bytes of ``memory.measure_memory``'s ring rows): what a
    handout shows until the reader's functions are written."""
    from distlab.labs.context.answers import ring_attention, ulysses_attention
    from distlab.labs.context.memory import memory_set
    from distlab.labs.context.traffic import bytes_set
    return {"seed": 0, "bytes": bytes_set(ring_attention, ulysses_attention),
            "memory": memory_set(ring_attention)}


def make_references() -> dict[str, dict]:
    """This module's stored sets, for ``distlab.checks.lab10.make_references`` to merge into
    its own: ``{**lab10_plan.make_references(), ...}``."""
    return {"ring_prediction": ring_prediction_set(), "cp_degree": cp_degree_set(),
            "measured": measured_set()}


# What ``distlab.checks.lab10`` adds to its COURSE_CODE (the prediction's and the question's
# references: an answer that calls them earns nothing, and a handout has neither).
PLAN_SHIPPED = (f"{__name__}:ring_bytes_formula", f"{__name__}:reference_smallest_cp")
