"""Lab 7's random cases for exercises 1 and 2 (``distlab.checks.lab07`` grades with them):
(model, layout, job) and (model, cluster, job) drawn from a seed, as integer rows a reference
file can store, with the reference numbers beside them."""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed
from distlab.labs.planning import (TERMS, ZERO_ACCUMULATION, Cluster, Job, Model, ParallelConfig,
                                   candidates, divisors, memory_per_gpu,
                                   reference_choose_degrees, step_time)

RECOMPUTE = ("none", "selective", "full")


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
