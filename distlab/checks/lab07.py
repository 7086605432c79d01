"""Graded checks of Lab 7, "3D parallelism and the topology decision".

Exercises:
1. ``memory_per_gpu(model, cfg) -> {term: bytes}``: every term of ``distlab.labs.planning.TERMS`` and
   their "total", compared term by term with ``distlab.labs.planning.memory_per_gpu`` on random
   models and layouts (relative tolerance 1e-9: it is arithmetic).
2. ``choose_degrees(model, cluster, job) -> ParallelConfig``: valid (t*p*d = n, TP within a node and
   dividing the heads, PP at most the layers, the batch splitting into DP micro-batches, memory
   within the GPU) and as fast by ``distlab.labs.planning.step_time`` as the best valid layout.
3. The production answers. Llama 3 70B on 16 x 8 H100: the numbers the student computed for each
   layout they considered (memory per GPU, bubble, bytes per axis; visible) must be the model's,
   and the layout they chose must be within 5% of the fastest valid layout's modelled step time
   with at least 10% of the GPU's memory free (hidden); any such layout earns the points, and
   their written reasons go to the instructor (a manually graded cell). Llama 3 405B on the
   8,192 GPUs of its published run (hidden) is checked like 2.
4. ``tp_plan() -> {submodule: ParallelStyle}`` for one transformer block, used for a real
   TP run on 2 ranks (visible) and PP x DP x TP on 8 ranks (hidden): every block linear must
   be sharded over TP and the losses must equal single-process training. The plan is TP's alone:
   2 ranks of TP show a layer left out (a replicated weight) or a style swapped (wrong losses),
   as the 4-rank DP x TP run did at twice the ranks; the hidden run composes it with FSDP and the
   pipeline, and needs 8 ranks for each of the three axes to be larger than 1.
5. ``predict_traffic(shape, cfg, rank) -> {"tp", "pp", "dp"}``: the bytes a rank of the mesh run
   sends per step on each axis, against section 3's formulas (``lab07_prediction``).
6. ``place_mesh(shape, per_node, sent) -> layout[pp][dp][tp]``, the open design exercise, on a
   scale of two tests (``lab07_design``). The first: trained on real ranks with the student's
   plan, the losses must equal single-process training and the bytes sent across nodes stay
   within the best placement's (the lab's 8-rank mesh on nodes of 4, visible; a 4-rank mesh on
   nodes of 2, hidden), and on the scale's problem (8 ranks on 4 nodes of 2, counted without
   ranks: ``lab07_scale``) within the best order of the dimensions'. The second: the scale's
   problem within the bar, halfway from there to the least of every placement.

Grading cost: this lab's budget is ``GRADING_BUDGET_S``, not the course's 6 s, for its two
8-rank runs (4's hidden PP x DP x TP, every axis larger than 1; 6's visible mesh, three axes of
which only the outermost crosses nodes); every other run uses the fewest ranks its property needs
(closing note of the lab). Exercise 6's scale runs no rank: its problem's bytes are counted on a
table of calls (``lab07_scale``).

References come from the reference implementations in ``distlab.labs.planning`` and
``distlab.labs.mesh``; visible tests read the stored sets (``data/07_3d_parallelism/``),
hidden tests draw fresh cases from ``seed=fresh_seed()``.
"""
from __future__ import annotations

import torch

import distlab
from distlab.checks.stored import load as load_stored
from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.lab07_cases import (_candidate_memory, _degree_case, _memory_case,
                                        _memory_lookup, degree_cases, memory_cases, memory_rows)
from distlab.checks.ranks import backends, call_each, rank_timeout
from distlab.checks.shown import joined
from distlab.labs.mesh import (LOSS_ATOL, LOSS_RTOL, MeshShape, TinyConfig, mesh_shares,
                              reference_losses, train_on_mesh)
from distlab.runtime.per_rank import PerRank, reference
from distlab.labs.planning import (GB, H100_16x8, LLAMA3_70B, LLAMA3_405B, LLAMA3_405B_CLUSTER,
                                   LLAMA3_405B_JOB, RESOLUTION, TERMS, Cluster, Job, Model,
                                   ParallelConfig, acceptable_layout, bubble_fraction,
                                   comm_bytes_per_step, memory_per_gpu, reference_choose_degrees,
                                   step_time, why_invalid)

LAB = "07_3d_parallelism"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# torch._dynamo (with DTensor and FSDP): an optimizer's constructor imports it, 0.4-0.8 s a rank.
RANK_IMPORTS = ("torch._dynamo", "torch.distributed.pipelining")
SEED = 707
HEADROOM = 0.10          # the memory a defensible 70B layout leaves free
AXES = ("tp", "pp", "dp")
JOB_70B = Job(seq_len=4096, global_batch=1024, micro_batch=1, zero_stage=1)  # 4M tokens per step
VISIBLE_MESH = MeshShape(pp=1, dp=1, tp=2)
HIDDEN_MESH = MeshShape(pp=2, dp=2, tp=2)
# The lab's own grading budget (CONTRIBUTING.md, "The grading budget"; bench/grading_budget.py):
# wall seconds for a full answer at --jobs 1 on an idle 2-core machine, above the course's 6 s.
# What needs it: 22 rank processes of DTensor, FSDP2 and a pipeline, each paying DTensor's first
# placements (a per-process cache: every rank pays it; the zygote, which runs no torch op, cannot
# fill it): exercise 4 trains on 2 ranks (visible) and on PP=2 x DP=2 x TP=2 (hidden: 8 ranks, the
# fewest with every axis larger than 1, so that the plan is tried under all three), exercise 6 on
# the lab's 8-rank mesh on nodes of 4 (visible: the one problem where TP across nodes and DP
# across nodes both show, as only the outermost of three axes crosses) and on 4 ranks (hidden).
# What made it cheaper: the pipeline halves each micro-batch's loss instead of dividing every
# gradient after backward (distlab.labs.mesh_steps), exercise 6 counts DTensor's collectives in the
# graded last step alone, the course-code guard calls in from the guarded code only
# (runtime/entry_hooks, not a profile hook on every call). Measured idle, the whole course side by
# side with main 00c1be4 (bench/grading_budget.py, 28 November 2026, 2-core AMD EPYC,
# load 1.3-2.1): 10.0 s and 16.8 CPU-s before, 5.7 s and 8.3 CPU-s after (place_mesh 45%, tp_plan
# 34%): within the course's 6 s on this machine, with too little margin for 8-rank runs on a slower
# one, so the lab keeps a budget of its own.
GRADING_BUDGET_S = 8.0
# Seconds before the mesh runs count as hung: 8 ranks setting up DTensor, FSDP2 and a pipeline on
# 2 shared cores take several seconds, more than a hang limit tuned for plain collectives.
MESH_TIMEOUT = 120

HINTS = {
    "weights": "weights = weight_bytes x params per GPU; only ZeRO-3 divides them by DP (not when "
               "'resident' over m > 1 micro-batches), and then adds two whole layers, gathered.",
    "gradients": "gradients = grad_bytes x params per GPU, divided by DP from ZeRO-2 on (not when "
                 "'resident' over m > 1 micro-batches).",
    "master_weights": "master weights are fp32 (4 bytes per parameter), divided by DP from ZeRO-1 on.",
    "adam_m": "Adam's first moment is fp32 (4 bytes per parameter), divided by DP from ZeRO-1 on.",
    "adam_v": "Adam's second moment is fp32 (4 bytes per parameter), divided by DP from ZeRO-1 on.",
    "activations": "activations = bytes per layer (Korthikanti's formula for the recompute and "
                   "sequence-parallel setting) x ceil(L/p) layers x min(p - s, m) micro-batches in "
                   "flight on stage s, plus the fp32 logits of one micro-batch on the last stage; "
                   "report the heavier of the first and the last stage.",
    "total": "total is the sum of the six terms.",
}


def make_references() -> dict:
    """The visible sets: memory and degree cases from SEED (each degree case with the memory of
    every candidate layout), the memory of every layout of the 70B question, and the
    single-process losses of the visible mesh run. Visible tests read these and call no answer:
    a student's handout has none (distlab.grading.student_package). With them, the prediction's
    bytes per axis and the design exercise's budget and scale (lab07_prediction, lab07_design,
    lab07_scale)."""
    from distlab.checks.lab07_design import placement_set
    from distlab.checks.lab07_prediction import traffic_set
    from distlab.checks.lab07_scale import scale_set
    cfg = TinyConfig()
    return {"memory": {"seed": SEED, **memory_cases(SEED)},
            "degrees": {"seed": SEED, **degree_cases(SEED)},
            "layouts_70b": {"seed": SEED, "memory": torch.tensor(
                _candidate_memory(LLAMA3_70B, H100_16x8, JOB_70B), dtype=torch.float64)},
            "mesh": {"seed": SEED, "losses": reference_losses(cfg, SEED)},
            "traffic": traffic_set(), "placement": placement_set(),
            "placement_scale": scale_set()}


def _stored(name: str, drawn: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored set, after checking that its inputs are the ``drawn`` cases from SEED today."""
    stored = load_stored(LAB, name)
    assert_close(drawn, stored["cases"], what=f"the visible {name} cases (stored vs drawn)")
    return stored


# ---------------------------------------------------------------------------------------------
# 1. memory_per_gpu

def check_memory_per_gpu(fn, *, seed: int | None = None, count: int = 12) -> str:
    """``fn(model, cfg)`` must return every term of TERMS and "total", in bytes."""
    ref = memory_cases(seed, count) if seed is not None else _stored("memory", memory_rows(SEED, count))
    calls = [_memory_case(row) for row in ref["cases"]]
    wheres = [f"{model} with {cfg} and {cfg.job}" for model, cfg in calls]
    answers = call_each(fn, calls, names=wheres)   # every case in one launch
    for got, where, expected in zip(answers, wheres, ref["expected"]):
        if not isinstance(got, dict):
            raise CheckFailed(f"memory_per_gpu returned a {type(got).__name__}; return a dict with "
                              f"keys {[*TERMS, 'total']} (bytes). Case: {where}")
        for key, value in zip((*TERMS, "total"), expected.tolist()):
            if key not in got:
                raise CheckFailed(f"memory_per_gpu's result has no {key!r} term (it has "
                                  f"{sorted(got)}). {HINTS[key]}")
            g = float(got[key])
            if abs(g - value) > 1e-9 * max(abs(value), 1.0):
                raise CheckFailed(
                    f"memory_per_gpu: {key!r} is {g / GB:.4f} GB, expected {value / GB:.4f} GB "
                    f"({value:.6g} bytes) for {where}.\n{HINTS[key]}")
    return _memory_line(answers, calls)


def _memory_line(answers: list[dict], calls: list) -> str:
    """What a pass verified: the totals' range and the largest case's terms (the student's)."""
    totals = [float(a["total"]) for a in answers]
    big = max(range(len(totals)), key=totals.__getitem__)
    model, cfg = calls[big]
    terms = ", ".join(f"{k.replace('master_weights', 'master')} {float(answers[big][k]) / GB:.1f}"
                      for k in TERMS)
    return (f"memory_per_gpu: every term and the total equal the model's (relative 1e-9) on "
            f"{len(calls)} random models and layouts, totals {min(totals) / GB:.2f} to "
            f"{max(totals) / GB:.1f} GB per GPU; the largest ({model.name}, {cfg}, ZeRO-"
            f"{cfg.job.zero_stage}): {terms} GB")


# ---------------------------------------------------------------------------------------------
# 2-3. choose_degrees

def _check_choice(choice, model: Model, cluster: Cluster, job: Job, best: ParallelConfig,
                  what: str, memory=memory_per_gpu) -> tuple[ParallelConfig, float, float, float]:
    """``choice`` is valid (by ``memory``: the reference, or a stored table) and as fast as
    ``best``; on a pass, its figures: (layout, seconds per step, the fastest's, GB per GPU)."""
    if not all(hasattr(choice, a) for a in ("tp", "pp", "dp")):
        raise CheckFailed(f"{what}: expected a ParallelConfig(tp, pp, dp, job), got "
                          f"{type(choice).__name__} {choice!r}.")
    cfg = ParallelConfig(int(choice.tp), int(choice.pp), int(choice.dp), job)
    reason = why_invalid(model, cluster, cfg, memory)
    if reason:
        raise CheckFailed(f"{what}: {cfg} is not a valid layout of {model.name} on {cluster.name}: "
                          f"{reason}.")
    seconds = step_time(model, cluster, cfg)["total"]
    best_seconds = step_time(model, cluster, best)["total"]
    if seconds > best_seconds * (1 + 1e-9):
        raise CheckFailed(
            f"{what}: {cfg} is valid but takes {seconds:.3f} s per step by step_time; {best} takes "
            f"{best_seconds:.3f} s. Compare every valid (t, p, d) by step_time(...)['total'] and "
            f"keep the smallest.")
    return cfg, seconds, best_seconds, memory(model, cfg)["total"] / GB


def check_choose_degrees(fn, *, seed: int | None = None, count: int = 4) -> str:
    """``fn(model, cluster, job)`` must return a valid layout as fast as the best one."""
    # Visible: the stored cases, their best layouts and every candidate's memory (drawing them
    # needs the reference, which a handout does not hold; `distlab references` keeps them fresh).
    ref = load_stored(LAB, "degrees") if seed is None else degree_cases(seed, count)
    calls = [_degree_case(row) for row in ref["cases"]]
    whats = [f"choose_degrees({model.name}, {cluster.name}, {job})" for model, cluster, job in calls]
    answers = call_each(fn, calls, names=whats)   # every case in one launch
    shown = []
    for (model, cluster, job), what, choice, expected, table in zip(
            calls, whats, answers, ref["expected"], ref["memory"]):
        best = ParallelConfig(*(int(v) for v in expected[:3]), job)
        cfg, seconds, _, used = _check_choice(choice, model, cluster, job, best, what,
                                              memory=_memory_lookup(table, what))
        shown.append(f"{cfg} {seconds:.2f} s, {used:.1f}/{cluster.gpu_mem_gb:g} GB")
    return joined(f"choose_degrees: on {len(calls)} random models and clusters each choice is "
                  f"valid and takes the fastest valid layout's seconds per step (step_time), "
                  f"GB per GPU of the GPU's: ", shown)


def check_production_answer(answer, *, model: Model = LLAMA3_70B, cluster: Cluster = H100_16x8,
                            job: Job = JOB_70B) -> str:
    """``answer`` must be the best layout for ``model`` on ``cluster`` (default: the 70B case)."""
    cfg, seconds, fastest, used = _check_choice(answer, model, cluster, job,
                                                reference_choose_degrees(model, cluster, job),
                                                f"your answer for {model.name} on {cluster.name}")
    return (f"your answer for {model.name} on {cluster.name}: {cfg}, valid and as fast as the "
            f"fastest valid layout by step_time: {seconds:.2f} s per step (fastest "
            f"{fastest:.2f}); {used:.1f} GB per GPU of {cluster.gpu_mem_gb:g}")


def _layout_of(entry) -> tuple[int, int, int]:
    layout = entry.get("layout") if isinstance(entry, dict) else None
    if not (isinstance(layout, (tuple, list)) and len(layout) == 3):
        raise CheckFailed(f"each entry of your plans needs 'layout': (tp, pp, dp); got {entry!r:.200}")
    return tuple(int(v) for v in layout)


def _off(got: float, want: float) -> str:
    return f"{100 * (got / want - 1):+.2f}%" if want else f"{got:.3g} instead of 0"


def check_layout_numbers(plans, *, model: Model = LLAMA3_70B, job: Job = JOB_70B) -> str:
    """``plans``: a list of at least two dicts, one per layout considered, each with "layout"
    (tp, pp, dp), "memory" (bytes per GPU, memory_per_gpu's total), "bubble" ((p-1)/(m+p-1)) and
    "bytes" ({"tp", "pp", "dp"}: bytes one GPU sends per step on each axis). Every number must be
    the model's (relative tolerance 1e-6)."""
    if not isinstance(plans, (list, tuple)) or len(plans) < 2:
        raise CheckFailed("plans_70b must be a list with one dict per layout you considered, at "
                          "least two: a choice is a comparison.")
    memory = memory_per_gpu
    if model == LLAMA3_70B and job == JOB_70B:     # the lab's question: its stored numbers
        memory = _memory_lookup(load_stored(LAB, "layouts_70b")["memory"],
                                f"plans_70b ({model.name} on {H100_16x8.name})")
    shown = []
    for entry in plans:
        t, p, d = _layout_of(entry)
        cfg = ParallelConfig(t, p, d, job)
        want = {"memory": memory(model, cfg)["total"],
                "bubble": bubble_fraction(p, cfg.microbatches),
                **{f"bytes {a}": v for a, v in comm_bytes_per_step(model, cfg).items()}}
        got = dict(entry)
        got.update({f"bytes {a}": (entry.get("bytes") or {}).get(a) for a in AXES})
        for key, value in want.items():
            if got.get(key) is None:
                raise CheckFailed(f"{cfg}: your entry has no {key!r} (keys: layout, memory, bubble, "
                                  f"bytes with tp, pp, dp).")
            g = float(got[key])
            if abs(g - value) > 1e-6 * max(abs(value), 1e-12):
                unit = "" if key == "bubble" else f" ({g / GB:.3f} GB vs {value / GB:.3f} GB)"
                raise CheckFailed(
                    f"{cfg}: your {key} is {g:.6g}, the model's {value:.6g}{unit}, "
                    f"{_off(g, value)}. Section 3's table gives each axis's bytes; the memory "
                    f"follows exercise 1's conventions; the bubble is (p-1)/(m+p-1).")
        shown.append(f"{cfg} {want['memory'] / GB:.1f} GB, bubble {want['bubble']:.3f}, GB sent "
                     + "/".join(f"{want[f'bytes {a}'] / GB:.1f}" for a in AXES))
    return joined(f"plans_70b: the memory, bubble and bytes of your {len(plans)} layouts equal "
                  f"the model's (relative 1e-6): ", shown, " (tp/pp/dp)")


def check_70b_plan(plans, answer, *, model: Model = LLAMA3_70B, cluster: Cluster = H100_16x8,
                   job: Job = JOB_70B) -> str:
    """The numbers of ``plans`` are the model's (check_layout_numbers), ``answer`` is one of the
    layouts considered, and it is within RESOLUTION (5%) of the fastest valid layout's modelled
    step time with at least HEADROOM (10%) of the GPU's memory free. Any such layout passes."""
    check_layout_numbers(plans, model=model, job=job)
    if not all(hasattr(answer, a) for a in ("tp", "pp", "dp")):
        raise CheckFailed(f"answer_70b: expected a ParallelConfig(tp, pp, dp, job), got "
                          f"{type(answer).__name__} {answer!r:.200}.")
    layout = (int(answer.tp), int(answer.pp), int(answer.dp))
    if layout not in [_layout_of(e) for e in plans]:
        raise CheckFailed(f"answer_70b {ParallelConfig(*layout)} is not among the layouts in "
                          f"plans_70b: add its numbers, the ones your choice rests on.")
    reason = acceptable_layout(model, cluster, ParallelConfig(*layout, job), RESOLUTION, HEADROOM)
    if reason:
        raise CheckFailed(f"answer_70b: {reason}.")
    cfg = ParallelConfig(*layout, job)
    fastest = step_time(model, cluster, reference_choose_degrees(model, cluster, job))["total"]
    seconds, used = step_time(model, cluster, cfg)["total"], memory_per_gpu(model, cfg)["total"]
    return (f"answer_70b {cfg}, one of your {len(plans)} layouts (their numbers the model's): "
            f"{seconds:.2f} s per step, {100 * (seconds / fastest - 1):.1f}% over the fastest "
            f"valid layout (allowed {100 * RESOLUTION:g}%); {used / GB:.1f} GB per GPU, "
            f"{100 * (1 - used / (cluster.gpu_mem_gb * GB)):.0f}% of {cluster.gpu_mem_gb:g} GB "
            f"free (at least {100 * HEADROOM:g}%)")


def check_405b_answer(answer) -> str:
    return check_production_answer(answer, model=LLAMA3_405B, cluster=LLAMA3_405B_CLUSTER,
                                   job=LLAMA3_405B_JOB)


# ---------------------------------------------------------------------------------------------
# 4. the tensor-parallel plan, on a real mesh

def check_tp_plan(plan_fn, *, shape: MeshShape = VISIBLE_MESH, seed: int | None = None) -> None:
    """Train the small transformer on ``shape`` with ``plan_fn()`` applied to every block; every
    block linear must be sharded over TP and each step's loss must equal single-process training.
    Two steps, as the design exercise's run (``lab07_design.CHECK_CFG``): the second is the first
    after set-up and its loss shows the first update; the visible run makes the stored run's first
    two steps (the same batches' first rows)."""
    from distlab.checks.lab07_design import CHECK_CFG
    cfg = CHECK_CFG
    expected = load_stored(LAB, "mesh")["losses"][:cfg.steps] if seed is None else None
    seed = SEED if seed is None else seed
    if expected is None:
        expected = reference_losses(cfg, seed)
    expected = reference(expected)
    try:
        # Each rank: its stage's initial weights (whole: the plan shards them there) and its
        # DP replica's rows, made here; not the seed, from which it could train one process.
        shares = PerRank(mesh_shares(shape, cfg, seed))
        runs = [(b, distlab.run(train_on_mesh, shape.world_size, shape, plan_fn, cfg, shares,
                                backend=b, timeout=max(rank_timeout(), MESH_TIMEOUT)))
                for b in backends(shape.world_size)]
    except distlab.RankError as err:
        raise CheckFailed(
            f"Training on {shape} with your plan failed on rank {err.rank} ({err.exc_type}):\n"
            f"{str(err).splitlines()[0]}\nColumn-parallel layers (split by output features) feed "
            f"attention heads and the MLP activation; row-parallel layers (split by input "
            f"features) bring the result back to the full hidden size.") from None
    for backend, out in runs:
        for rank, res in enumerate(out):
            for name, placement in res["placements"].items():
                if placement == "replicated":
                    raise CheckFailed(f"{name} is a plain replicated weight on rank {rank}: your "
                                      f"plan leaves it out, so every TP rank computes it whole. "
                                      f"Shard every linear layer of the block.")
        losses = next(r["losses"] for r in out if r["losses"] is not None)
        assert_close(losses, expected, what=f"the loss of each training step on {shape} "
                     f"({backend}) vs single-process training", atol=LOSS_ATOL, rtol=LOSS_RTOL,
                     hint="The weights are sharded, so the layout is right; the values are not: "
                          "check which layers are column- and which row-parallel.")


# ---------------------------------------------------------------------------------------------
# 5-6. the traffic of the mesh run: predicted, then placed on nodes

def check_traffic_prediction(predict_traffic, *, seed: int | None = None) -> str:
    """``predict_traffic(shape, cfg, rank) -> {"tp", "pp", "dp"}``: the bytes the rank sends per
    step of the mesh run on each axis, by section 3's formulas (``lab07_prediction``)."""
    from distlab.checks.lab07_prediction import grade_traffic_prediction
    return grade_traffic_prediction(predict_traffic, seed)


def check_mesh_placement(place_mesh, plan_fn, *, seed: int | None = None) -> str:
    """The open design exercise's first test: ``place_mesh(shape, per_node, sent)``, graded on a
    real run with ``plan_fn``'s TP plan by its losses and the bytes that cross nodes, and on the
    scale's problem at the best order's bytes (``lab07_design``)."""
    from distlab.checks.lab07_design import grade_placement
    from distlab.checks.lab07_scale import grade_scale
    return f"{grade_placement(place_mesh, plan_fn, seed)}; {grade_scale(place_mesh, seed, 'hinted')}"


def check_mesh_placement_bar(place_mesh, *, seed: int | None = None) -> str:
    """The second test: the scale's problem within the bar (``lab07_scale``)."""
    from distlab.checks.lab07_scale import grade_scale
    return grade_scale(place_mesh, seed, "bar")


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB7_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_memory_per_gpu", "check_choose_degrees", "check_tp_plan", "check_traffic_prediction",
    "check_mesh_placement", "check_mesh_placement_bar"],
    CourseCode(forbidden=LAB7_SHIPPED))
# Graded on values handed in (numbers and layouts the kernel computed): no course code runs on the judge's ranks for
# these, so there is nothing for a guard to notice.
GRADED_ON_VALUES = ("check_405b_answer", "check_70b_plan", "check_layout_numbers", "check_production_answer",)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
