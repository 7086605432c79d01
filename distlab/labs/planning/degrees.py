"""The choice of (TP, PP, DP) degrees: the rules a layout must keep, every candidate, the fastest
valid one by step_time, and the layouts that tie with it within the model's resolution. Lab 7."""
from __future__ import annotations

from distlab.labs.planning.communication import zero_charge
from distlab.labs.planning.memory import memory_per_gpu
from distlab.labs.planning.shapes import GB, Cluster, Job, Model, ParallelConfig
from distlab.labs.planning.step_time import step_time

# Layouts whose modelled step times differ by less than this are a tie: the cost model leaves out
# overlap, kernel shapes and the interleaved schedule, which move real step times by more.
RESOLUTION = 0.05


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def why_invalid(model: Model, cluster: Cluster, cfg: ParallelConfig, memory=memory_per_gpu) -> str:
    """The first rule ``cfg`` breaks, or "" if it is a valid layout for this cluster."""
    job = cfg.job
    if cfg.gpus != cluster.gpus:
        return f"t*p*d = {cfg.gpus}, the cluster has {cluster.gpus} GPUs"
    if cfg.tp > cluster.gpus_per_node or cluster.gpus_per_node % cfg.tp:
        return f"TP={cfg.tp} does not fit within a node of {cluster.gpus_per_node} GPUs (NVLink)"
    if model.heads % cfg.tp:
        return f"TP={cfg.tp} does not divide the {model.heads} attention heads"
    if cfg.pp > model.layers:
        return f"PP={cfg.pp} is more stages than the {model.layers} layers"
    if job.global_batch % (job.micro_batch * cfg.dp):
        return (f"global batch {job.global_batch} is not a multiple of DP x micro-batch = "
                f"{cfg.dp * job.micro_batch}")
    total = memory(model, cfg)["total"]
    if total > cluster.gpu_mem_gb * GB:
        return f"needs {total / GB:.1f} GB per GPU, the GPU has {cluster.gpu_mem_gb:g} GB"
    return ""


def candidates(cluster: Cluster, job: Job) -> list[ParallelConfig]:
    """Every (t, p, d) with t * p * d = n and t a divisor of the GPUs per node."""
    n = cluster.gpus
    return [ParallelConfig(t, p, n // (t * p), job)
            for t in divisors(cluster.gpus_per_node) if n % t == 0
            for p in divisors(n // t)]


def valid_layouts(model: Model, cluster: Cluster, job: Job):
    """(valid layouts, [(rejected layout, reason)])."""
    valid, rejected = [], []
    for cfg in candidates(cluster, job):
        reason = why_invalid(model, cluster, cfg)
        (rejected.append((cfg, reason)) if reason else valid.append(cfg))
    return valid, rejected


def reference_choose_degrees(model: Model, cluster: Cluster, job: Job = Job(),
                             verbose: bool = False) -> ParallelConfig:
    """The valid layout with the least step_time()["total"]; ties go to the smaller t * p (less
    model parallelism), then the smaller p. Raises ValueError if nothing fits."""
    valid, rejected = valid_layouts(model, cluster, job)
    if not valid:
        least = min(candidates(cluster, job), key=lambda c: memory_per_gpu(model, c)["total"])
        raise ValueError(
            f"No (TP, PP, DP) layout of {model.name} fits {cluster.name}: the least memory is "
            f"{memory_per_gpu(model, least)['total'] / GB:.1f} GB at {least}. Use ZeRO-3, full "
            f"recompute, a smaller micro-batch or more GPUs.")
    best = min(valid, key=lambda c: (step_time(model, cluster, c)["total"], c.tp * c.pp, c.pp))
    if verbose:
        print(plan_report(model, cluster, best, valid, rejected))
    return best


def near_ties(model: Model, cluster: Cluster, job: Job, within: float = RESOLUTION,
              best: ParallelConfig | None = None,
              memory=memory_per_gpu) -> list[tuple[ParallelConfig, float]]:
    """The valid layouts (by ``memory``) within ``within`` (a fraction) of ``best``'s step time
    and no faster, with each one's step time relative to it (1.0 for ``best``), fastest first.
    ``best`` is the fastest valid layout (default: reference_choose_degrees'); the lab passes its
    reader's choose_degrees and memory_per_gpu."""
    if best is None:
        best = reference_choose_degrees(model, cluster, job)
    best = ParallelConfig(best.tp, best.pp, best.dp, job)
    reason = why_invalid(model, cluster, best, memory)
    if reason:   # the ties of a valid layout only: this lists what is no faster than ``best``
        raise ValueError(f"{best} is not a valid layout of {model.name} on {cluster.name}: "
                         f"{reason}. Pass the fastest valid layout (your choose_degrees').")
    fastest = step_time(model, cluster, best)["total"]
    valid = [c for c in candidates(cluster, job) if not why_invalid(model, cluster, c, memory)]
    times = sorted(((step_time(model, cluster, c)["total"], c.tp * c.pp, c.pp, c) for c in valid),
                   key=lambda r: r[:3])
    return [(c, t / fastest) for t, _, _, c in times if fastest <= t <= fastest * (1 + within)]


def acceptable_layout(model: Model, cluster: Cluster, cfg: ParallelConfig,
                      within: float = RESOLUTION, headroom: float = 0.10) -> str:
    """"" if ``cfg`` is valid, within ``within`` of the fastest valid layout's modelled step time
    and leaves at least ``headroom`` of the GPU's memory free; otherwise which number fails and by
    how much."""
    reason = why_invalid(model, cluster, cfg)
    if reason:
        return f"{cfg} is not a valid layout: {reason}"
    best = reference_choose_degrees(model, cluster, cfg.job)
    fastest = step_time(model, cluster, best)["total"]
    seconds = step_time(model, cluster, cfg)["total"]
    if seconds > fastest * (1 + within):
        return (f"{cfg} takes {seconds:.2f} s per step, {100 * (seconds / fastest - 1):.1f}% more "
                f"than {best} ({fastest:.2f} s); the limit is {100 * within:g}%")
    used, limit = memory_per_gpu(model, cfg)["total"], cluster.gpu_mem_gb * GB * (1 - headroom)
    if used > limit:
        return (f"{cfg} needs {used / GB:.1f} GB per GPU, {(used - limit) / GB:.1f} GB more than "
                f"the {limit / GB:.0f} GB that leaves {100 * headroom:g}% of "
                f"{cluster.gpu_mem_gb:g} GB free")
    return ""


def plan_report(model, cluster, best, valid, rejected, shown: int = 5) -> str:
    """A few lines saying what was ruled out, why, and how the fastest layouts compare."""
    lines = [f"{model.name} ({model.params / 1e9:.1f}B params) on {cluster.name} "
             f"({cluster.gpus} GPUs, {cluster.gpu_mem_gb:g} GB each): "
             f"{len(valid)} valid layouts, {len(rejected)} ruled out."]
    for cfg, reason in rejected[:shown]:
        lines.append(f"  ruled out {cfg}: {reason}")
    if len(rejected) > shown:
        lines.append(f"  ... and {len(rejected) - shown} more")
    lines.append("  fastest valid layouts (seconds per step):")
    ranked = sorted(valid, key=lambda c: step_time(model, cluster, c)["total"])
    for cfg in ranked[:shown]:
        st, mem = step_time(model, cluster, cfg), memory_per_gpu(model, cfg)["total"]
        lines.append(f"    {str(cfg):20s} {st['total']:7.2f} s  (bubble {st['bubble']:.2f}, "
                     f"TP {st['tp']:.2f}, PP {st['pp']:.2f}, DP {st['dp']:.2f})  {mem / GB:5.1f} GB")
    lines.append(f"  chosen: {best}; DP charged as {zero_charge(best.job, best.microbatches)}")
    return "\n".join(lines)
