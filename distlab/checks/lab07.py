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
   DP x TP run on 4 ranks (visible) and PP x DP x TP on 8 ranks (hidden): every block linear must
   be sharded over TP and the losses must equal single-process training.

References come from the reference implementations in ``distlab.labs.planning`` and
``distlab.labs.mesh``; visible tests read the stored sets (``data/07_3d_parallelism/``),
hidden tests draw fresh cases from ``seed=fresh_seed()``.
"""
from __future__ import annotations

import torch

import distlab
from distlab.checks.stored import load as load_stored
from distlab.checks.assertions import CheckFailed, assert_close
from distlab.checks.ranks import backends, rank_timeout
from distlab.labs.mesh import (LOSS_ATOL, LOSS_RTOL, MeshShape, TinyConfig, reference_losses,
                                   train_on_mesh)
from distlab.labs.planning import (GB, H100_16x8, LLAMA3_70B, LLAMA3_405B, LLAMA3_405B_CLUSTER,
                                   LLAMA3_405B_JOB, RESOLUTION, TERMS, ZERO_ACCUMULATION, Cluster,
                                   Job, Model, ParallelConfig, acceptable_layout, bubble_fraction,
                                   candidates, comm_bytes_per_step, divisors, memory_per_gpu,
                                   reference_choose_degrees, step_time, why_invalid)

LAB = "07_3d_parallelism"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# torch._dynamo (with DTensor and FSDP): an optimizer's constructor imports it, 0.4-0.8 s a rank.
RANK_IMPORTS = ("torch._dynamo", "torch.distributed.pipelining")
SEED = 707
RECOMPUTE = ("none", "selective", "full")
HEADROOM = 0.10          # the memory a defensible 70B layout leaves free
AXES = ("tp", "pp", "dp")
JOB_70B = Job(seq_len=4096, global_batch=1024, micro_batch=1, zero_stage=1)  # 4M tokens per step
VISIBLE_MESH = MeshShape(pp=1, dp=2, tp=2)
HIDDEN_MESH = MeshShape(pp=2, dp=2, tp=2)
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


# ---------------------------------------------------------------------------------------------
# Random cases, as integer rows a reference file can store

def _pick(g: torch.Generator, options):
    return options[int(torch.randint(len(options), (1,), generator=g))]


def _random_model(g: torch.Generator, max_layers: int = 96) -> Model:
    heads = _pick(g, [8, 16, 32, 48, 64, 96, 128])
    head_dim = _pick(g, [64, 128])
    hidden = heads * head_dim
    kv = _pick(g, [k for k in divisors(heads) if k <= 16])
    ffn = 256 * round(hidden * _pick(g, [2.67, 3.5, 4.0]) / 256)
    layers = int(torch.randint(4, max_layers + 1, (1,), generator=g))
    return Model(f"random {layers}L x {hidden}", layers, hidden, heads, kv, ffn,
                 _pick(g, [32000, 50304, 128256]))


def _random_job(g: torch.Generator, dp: int) -> Job:
    micro = _pick(g, [1, 2, 4])
    return Job(seq_len=_pick(g, [1024, 2048, 4096, 8192]),
               global_batch=micro * dp * int(torch.randint(1, 65, (1,), generator=g)),
               micro_batch=micro, zero_stage=int(torch.randint(0, 4, (1,), generator=g)),
               recompute=_pick(g, RECOMPUTE), sequence_parallel=bool(_pick(g, [True, False])),
               grad_bytes=_pick(g, [2, 4]), zero_accumulation=_pick(g, ZERO_ACCUMULATION))


def _model_row(m: Model) -> list[int]:
    return [m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab]


def _job_row(j: Job) -> list[int]:
    return [j.seq_len, j.global_batch, j.micro_batch, j.zero_stage, RECOMPUTE.index(j.recompute),
            int(j.sequence_parallel), j.grad_bytes, ZERO_ACCUMULATION.index(j.zero_accumulation)]


def _job_from(row) -> Job:
    seq, gb, mb, zero, rec, sp, gbytes, acc = (int(v) for v in row)
    return Job(seq, gb, mb, zero, RECOMPUTE[rec], bool(sp), gbytes,
               zero_accumulation=ZERO_ACCUMULATION[acc])


def _model_from(row) -> Model:
    layers, hidden, heads, kv, ffn, vocab = (int(v) for v in row)
    return Model(f"{layers}L x {hidden}", layers, hidden, heads, kv, ffn, vocab)


def memory_rows(seed: int, count: int = 12) -> torch.Tensor:
    """Random (model, layout, job) rows, (count, 17) int64: drawn without any answer, so a
    visible test can compare them with the stored set's."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        model = _random_model(g)
        tp = _pick(g, [t for t in divisors(8) if model.heads % t == 0])
        pp = _pick(g, [p for p in (1, 2, 4, 8, 16) if p <= model.layers])
        dp = _pick(g, [1, 2, 4, 8, 16, 64])
        rows.append(_model_row(model) + [tp, pp, dp] + _job_row(_random_job(g, dp)))
    return torch.tensor(rows, dtype=torch.int64)


def memory_cases(seed: int, count: int = 12) -> dict[str, torch.Tensor]:
    """Random (model, layout, job) rows and the reference terms in bytes, (count, 7) float64."""
    rows = memory_rows(seed, count)
    expected = []
    for row in rows:
        terms = memory_per_gpu(*_memory_case(row))
        expected.append([terms[k] for k in (*TERMS, "total")])
    return {"cases": rows, "expected": torch.tensor(expected, dtype=torch.float64)}


def _memory_case(row) -> tuple[Model, ParallelConfig]:
    return _model_from(row[:6]), ParallelConfig(int(row[6]), int(row[7]), int(row[8]),
                                                _job_from(row[9:]))


def degree_cases(seed: int, count: int = 4) -> dict[str, torch.Tensor]:
    """Random (model, cluster, job) rows with at least one valid layout, and the reference choice
    (tp, pp, dp, seconds per step)."""
    g = torch.Generator().manual_seed(seed)
    rows, expected, memory = [], [], []
    while len(rows) < count:
        gpn = _pick(g, [4, 8])
        cluster = Cluster("random", nodes=_pick(g, [1, 2, 4, 8, 16, 32]), gpus_per_node=gpn,
                          gpu_mem_gb=_pick(g, [24, 40, 80, 141]),
                          intra_node_gbs=_pick(g, [150.0, 300.0, 450.0, 900.0]),
                          inter_node_gbs=_pick(g, [12.5, 25.0, 50.0, 100.0]))
        model = _random_model(g, max_layers=64)
        job = _random_job(g, cluster.gpus)
        try:
            best = reference_choose_degrees(model, cluster, job)
        except ValueError:
            continue                                    # nothing fits: draw another case
        rows.append(_model_row(model) + [cluster.nodes, gpn, cluster.gpu_mem_gb,
                                         int(cluster.intra_node_gbs * 10),
                                         int(cluster.inter_node_gbs * 10)] + _job_row(job))
        expected.append([best.tp, best.pp, best.dp, step_time(model, cluster, best)["total"]])
        memory.append(_candidate_memory(model, cluster, job))
    width, f64 = max(len(m) for m in memory), torch.float64   # memory: padded with zero rows
    return {"cases": torch.tensor(rows, dtype=torch.int64), "expected": torch.tensor(expected, dtype=f64),
            "memory": torch.tensor([m + [[0.0] * 4] * (width - len(m)) for m in memory], dtype=f64)}


def _candidate_memory(model: Model, cluster: Cluster, job: Job) -> list[list[float]]:
    """(t, p, d, memory_per_gpu's total) of every candidate layout: what a visible test needs to
    judge any layout a student's choose_degrees returns, without the reference at hand."""
    return [[c.tp, c.pp, c.dp, memory_per_gpu(model, c)["total"]] for c in candidates(cluster, job)]


def _memory_lookup(table: torch.Tensor, what: str):
    """A ``memory(model, cfg) -> {"total": bytes}`` that reads a stored (t, p, d, total) table."""
    totals = {tuple(int(v) for v in row[:3]): float(row[3]) for row in table if row[0] > 0}

    def memory(model: Model, cfg: ParallelConfig) -> dict[str, float]:
        key = (cfg.tp, cfg.pp, cfg.dp)
        if key not in totals:
            raise CheckFailed(f"{what}: {cfg} is not a layout of this cluster: t*p*d must be its "
                              f"GPU count and t must divide its GPUs per node.")
        return {"total": totals[key]}
    return memory


def _degree_case(row) -> tuple[Model, Cluster, Job]:
    nodes, gpn, mem, intra, inter = (int(v) for v in row[6:11])
    cluster = Cluster(f"{nodes} nodes x {gpn} GPUs of {mem} GB", nodes=nodes, gpus_per_node=gpn,
                      gpu_mem_gb=mem, intra_node_gbs=intra / 10, inter_node_gbs=inter / 10)
    return _model_from(row[:6]), cluster, _job_from(row[11:])


def make_references() -> dict:
    """The visible sets: memory and degree cases from SEED (each degree case with the memory of
    every candidate layout), the memory of every layout of the 70B question, and the
    single-process losses of the visible mesh run. Visible tests read these and call no answer:
    a student's handout has none (distlab.grading.student_package)."""
    cfg = TinyConfig()
    return {"memory": {"seed": SEED, **memory_cases(SEED)},
            "degrees": {"seed": SEED, **degree_cases(SEED)},
            "layouts_70b": {"seed": SEED, "memory": torch.tensor(
                _candidate_memory(LLAMA3_70B, H100_16x8, JOB_70B), dtype=torch.float64)},
            "mesh": {"seed": SEED, "losses": reference_losses(cfg, SEED)}}


def _stored(name: str, drawn: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored set, after checking that its inputs are the ``drawn`` cases from SEED today."""
    stored = load_stored(LAB, name)
    assert_close(drawn, stored["cases"], what=f"the visible {name} cases (stored vs drawn)")
    return stored


# ---------------------------------------------------------------------------------------------
# 1. memory_per_gpu

def check_memory_per_gpu(fn, *, seed: int | None = None, count: int = 12) -> None:
    """``fn(model, cfg)`` must return every term of TERMS and "total", in bytes."""
    ref = memory_cases(seed, count) if seed is not None else _stored("memory", memory_rows(SEED, count))
    for row, expected in zip(ref["cases"], ref["expected"]):
        model, cfg = _memory_case(row)
        got = fn(model, cfg)
        where = f"{model} with {cfg} and {cfg.job}"
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


# ---------------------------------------------------------------------------------------------
# 2-3. choose_degrees

def _check_choice(choice, model: Model, cluster: Cluster, job: Job, best: ParallelConfig,
                  what: str, memory=memory_per_gpu) -> None:
    """``choice`` is valid (by ``memory``: the reference, or a stored table) and as fast as
    ``best``."""
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


def check_choose_degrees(fn, *, seed: int | None = None, count: int = 4) -> None:
    """``fn(model, cluster, job)`` must return a valid layout as fast as the best one."""
    # Visible: the stored cases, their best layouts and every candidate's memory (drawing them
    # needs the reference, which a handout does not hold; `distlab references` keeps them fresh).
    ref = load_stored(LAB, "degrees") if seed is None else degree_cases(seed, count)
    for row, expected, table in zip(ref["cases"], ref["expected"], ref["memory"]):
        model, cluster, job = _degree_case(row)
        what = f"choose_degrees({model.name}, {cluster.name}, {job})"
        best = ParallelConfig(*(int(v) for v in expected[:3]), job)
        _check_choice(fn(model, cluster, job), model, cluster, job, best, what,
                      memory=_memory_lookup(table, what))


def check_production_answer(answer, *, model: Model = LLAMA3_70B, cluster: Cluster = H100_16x8,
                            job: Job = JOB_70B) -> None:
    """``answer`` must be the best layout for ``model`` on ``cluster`` (default: the 70B case)."""
    _check_choice(answer, model, cluster, job, reference_choose_degrees(model, cluster, job),
                  f"your answer for {model.name} on {cluster.name}")


def _layout_of(entry) -> tuple[int, int, int]:
    layout = entry.get("layout") if isinstance(entry, dict) else None
    if not (isinstance(layout, (tuple, list)) and len(layout) == 3):
        raise CheckFailed(f"each entry of your plans needs 'layout': (tp, pp, dp); got {entry!r:.200}")
    return tuple(int(v) for v in layout)


def _off(got: float, want: float) -> str:
    return f"{100 * (got / want - 1):+.2f}%" if want else f"{got:.3g} instead of 0"


def check_layout_numbers(plans, *, model: Model = LLAMA3_70B, job: Job = JOB_70B) -> None:
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


def check_70b_plan(plans, answer, *, model: Model = LLAMA3_70B, cluster: Cluster = H100_16x8,
                   job: Job = JOB_70B) -> None:
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


def check_405b_answer(answer) -> None:
    check_production_answer(answer, model=LLAMA3_405B, cluster=LLAMA3_405B_CLUSTER,
                            job=LLAMA3_405B_JOB)


# ---------------------------------------------------------------------------------------------
# 4. the tensor-parallel plan, on a real mesh

def check_tp_plan(plan_fn, *, shape: MeshShape = VISIBLE_MESH, seed: int | None = None) -> None:
    """Train the small transformer on ``shape`` with ``plan_fn()`` applied to every block; every
    block linear must be sharded over TP and each step's loss must equal single-process training."""
    cfg = TinyConfig()
    expected = load_stored(LAB, "mesh")["losses"] if seed is None else None
    seed = SEED if seed is None else seed
    if expected is None:
        expected = reference_losses(cfg, seed)
    try:
        runs = [(b, distlab.run(train_on_mesh, shape.world_size, shape, plan_fn, cfg, seed,
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


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB7_SHIPPED, CourseCode  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_memory_per_gpu", "check_choose_degrees", "check_tp_plan"],
    CourseCode(forbidden=LAB7_SHIPPED))
# Graded on values handed in (numbers and layouts the kernel computed): no course code runs on the judge's ranks for
# these, so there is nothing for a guard to notice.
GRADED_ON_VALUES = ("check_405b_answer", "check_70b_plan", "check_layout_numbers", "check_production_answer",)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
