"""What Lab 7 prints and draws: the search's report, memory tables and bars, one layout taken
apart, the near-tie table, the comparison with Llama 3 405B's published run, and the planner's
sliders."""
from __future__ import annotations

from dataclasses import replace

from distlab.labs.planning.communication import (axis_bandwidth, comm_bytes_per_step, dp_traffic,
                                                 zero_charge)
from distlab.labs.planning.degrees import (RESOLUTION, near_ties, plan_report,
                                           reference_choose_degrees)
from distlab.labs.planning.memory import memory_per_gpu, rule_of_thumb_gpus
from distlab.labs.planning.shapes import (GB, LLAMA3_405B, LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB,
                                          LLAMA3_405B_MFU, LLAMA3_405B_PUBLISHED,
                                          LLAMA3_405B_TFLOPS, TERMS, Cluster, Job, Model,
                                          ParallelConfig, model_of_size)
from distlab.labs.planning.step_time import (bubble_fraction, measured_step_seconds, model_mfu,
                                             step_time)


def memory_table(model: Model, configs: list[ParallelConfig], memory=memory_per_gpu) -> str:
    """GB per GPU by term, one column per layout."""
    cols = [memory(model, c) for c in configs]
    head = f"{'GB per GPU':16s}" + "".join(f"{str(c):>22s}" for c in configs)
    rows = [f"{term:16s}" + "".join(f"{col[term] / GB:22.1f}" for col in cols)
            for term in (*TERMS, "total")]
    return "\n".join([head, *rows])


def plot_memory(model: Model, configs: list[ParallelConfig], gpu_mem_gb: float,
                memory=memory_per_gpu):
    """Stacked bars of the memory terms per layout, with the GPU's capacity as a line."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{c}\nZeRO-{c.job.zero_stage}" for c in configs]
    bottom = [0.0] * len(configs)
    for term in TERMS:
        values = [memory(model, c)[term] / GB for c in configs]
        ax.bar(labels, values, bottom=bottom, label=term)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(gpu_mem_gb, color="k", linestyle="--", linewidth=1)
    ax.text(len(configs) - 0.5, gpu_mem_gb, f" {gpu_mem_gb:g} GB GPU", va="bottom", ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("GB per GPU (log)")
    ax.set_title(f"{model.name}: memory per GPU by term")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    return fig


def layout_summary(model: Model, cluster: Cluster, cfg: ParallelConfig,
                   memory=memory_per_gpu) -> str:
    """Memory (by ``memory``: the lab passes its reader's memory_per_gpu), bubble and per-axis
    communication of one layout, as text."""
    mem, st = memory(model, cfg), step_time(model, cluster, cfg)
    comm, bw = comm_bytes_per_step(model, cfg), axis_bandwidth(cluster, cfg)
    job = cfg.job
    lines = [f"{model.name} on {cluster.name}, {cfg}, ZeRO-{job.zero_stage}, "
             f"m = {cfg.microbatches} micro-batches of {job.micro_batch} x {job.seq_len} tokens",
             "  memory per GPU: " + ", ".join(f"{k} {mem[k] / GB:.1f}" for k in TERMS)
             + f" = {mem['total'] / GB:.1f} GB of {cluster.gpu_mem_gb:g}",
             f"  bubble: (p-1)/(m+p-1) = {bubble_fraction(cfg.pp, cfg.microbatches):.3f} of the "
             f"pipeline's time"]
    lines.append(f"  DP charged as {zero_charge(job, cfg.microbatches)}")
    lines.append("  per step and GPU    GB sent   link GB/s   seconds")
    for axis in ("tp", "pp", "dp"):
        lines.append(f"    {axis.upper():4s}             {comm[axis] / GB:9.2f}   {bw[axis] / GB:9.0f}"
                     f"   {st[axis]:7.2f}")
    lines.append("    DP by collective: " + ", ".join(
        f"{k.replace('_', '-')} {v / GB:.2f} GB" for k, v in dp_traffic(model, cfg).items()))
    lines.append(f"  compute {st['compute']:.2f} s + bubble {st['bubble']:.2f} s + communication "
                 f"{st['tp'] + st['pp'] + st['dp']:.2f} s = {st['total']:.2f} s per step")
    return "\n".join(lines)


def near_tie_table(model: Model, cluster: Cluster, job: Job, within: float = RESOLUTION, *,
                   choose=reference_choose_degrees, memory=memory_per_gpu,
                   best: ParallelConfig | None = None) -> str:
    """The layouts within ``within`` of the fastest (``best``, else ``choose``'s layout): step
    time, its ratio to the fastest, memory. The lab passes its reader's choose_degrees and
    memory_per_gpu."""
    best = choose(model, cluster, job) if best is None else best
    lines = [f"{model.name} on {cluster.name}: layouts within {100 * within:g}% of the fastest",
             f"  (ZeRO-{job.zero_stage}, "
             + ("once per step" if job.zero_stage <= 1 else f"{job.zero_accumulation} over "
                f"micro-batches") + f"; {job.recompute} recompute)",
             f"  {'layout':20s} {'s/step':>8s} {'vs best':>8s} {'GB/GPU':>7s}"]
    for cfg, ratio in near_ties(model, cluster, job, within, best=best, memory=memory):
        lines.append(f"  {str(cfg):20s} {step_time(model, cluster, cfg)['total']:8.2f} "
                     f"{100 * (ratio - 1):+7.1f}% {memory(model, cfg)['total'] / GB:7.1f}")
    return "\n".join(lines)


def published_comparison(choose=reference_choose_degrees, memory=memory_per_gpu,
                         best: ParallelConfig | None = None) -> str:
    """Llama 3 405B: the layout ``choose`` picks (or ``best``) for its published cluster and
    batch, beside the published layout (TP 8, PP 16, DP 64 on 8,192 GPUs), and the model's whole
    step beside the measured one (430 TFLOP/s per GPU is end to end, so it implies the whole
    step)."""
    ours = choose(LLAMA3_405B, LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB) if best is None else best
    ours = ParallelConfig(ours.tp, ours.pp, ours.dp, LLAMA3_405B_JOB)
    cluster = LLAMA3_405B_CLUSTER
    lines = ["                    " + f"{'published (Llama 3, Table 4)':>30s}{'this model picks':>22s}"]
    for label, fn in [("layout", str),
                      ("ZeRO, recompute", lambda c: f"ZeRO-{c.job.zero_stage}, {c.job.recompute}"),
                      ("memory GB/GPU", lambda c: f"{memory(LLAMA3_405B, c)['total'] / GB:.1f}"),
                      ("bubble (p-1)/(m+p-1)", lambda c: f"{bubble_fraction(c.pp, c.microbatches):.3f}"),
                      ("step time s (model)", lambda c: f"{step_time(LLAMA3_405B, cluster, c)['total']:.1f}"),
                      ("MFU (model)", lambda c: f"{100 * model_mfu(LLAMA3_405B, cluster, c):.0f}%")]:
        lines.append(f"{label:20s}{fn(LLAMA3_405B_PUBLISHED):>30s}{fn(ours):>22s}")
    measured = measured_step_seconds(LLAMA3_405B, LLAMA3_405B_PUBLISHED, LLAMA3_405B_TFLOPS)
    lines.append(f"measured (paper): {LLAMA3_405B_TFLOPS:.0f} TFLOP/s per GPU, "
                 f"{100 * LLAMA3_405B_MFU:.0f}% MFU, end to end -> the whole 16M-token step takes "
                 f"{measured:.1f} s (6 N tokens, attention FLOPs left out)")
    return "\n".join(lines)


# The ways the published layout can charge ZeRO over its micro-batches, as (stage, accumulation).
ZERO_OPTIONS = ((1, "regather"), (2, "regather"), (2, "resident"), (3, "regather"), (3, "resident"))


def zero_options_table(model: Model, cluster: Cluster, cfg: ParallelConfig,
                       recomputes=("selective", "full"), memory=memory_per_gpu) -> str:
    """One layout under each ZeRO stage and charge (ZERO_OPTIONS) and each recompute setting:
    weights and total memory per GPU (by ``memory``: the lab passes its reader's), whether it
    fits, DP bytes per step and the step time."""
    lines = [f"{model.name}, {cfg} (m = {cfg.microbatches}) on {cluster.name}",
             f"  {'ZeRO':5s} {'over micro-batches':18s} {'recompute':10s} {'weights':>8s} "
             f"{'GB/GPU':>7s} {'fits':>5s} {'DP GB':>7s} {'s/step':>7s}"]
    for recompute in recomputes:
        for stage, acc in ZERO_OPTIONS:
            c = replace(cfg, job=replace(cfg.job, zero_stage=stage, zero_accumulation=acc,
                                         recompute=recompute))
            mem = memory(model, c)
            how = "once per step" if stage == 1 else acc
            lines.append(f"  {stage:<5d} {how:18s} {recompute:10s} {mem['weights'] / GB:8.1f} "
                         f"{mem['total'] / GB:7.1f} "
                         f"{'yes' if mem['total'] <= cluster.gpu_mem_gb * GB else 'no':>5s} "
                         f"{comm_bytes_per_step(model, c)['dp'] / GB:7.1f} "
                         f"{step_time(model, cluster, c)['total']:7.2f}")
    return "\n".join(lines)


def published_verdict(within: float = RESOLUTION, best: ParallelConfig | None = None,
                      memory=memory_per_gpu) -> str:
    """Where the published 405B layout lands among the near ties of the course's model (of
    ``best``, the fastest layout, and ``memory``), in one sentence."""
    model, cluster, job = LLAMA3_405B, LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB
    ties = near_ties(model, cluster, job, within, best=best, memory=memory)
    best = ties[0][0]
    pub = LLAMA3_405B_PUBLISHED
    gap = step_time(model, cluster, pub)["total"] / step_time(model, cluster, best)["total"] - 1
    among = any((c.tp, c.pp, c.dp) == (pub.tp, pub.pp, pub.dp) for c, _ in ties)
    where = (f"among the {len(ties)} near ties" if among else "outside the near ties")
    inside = "inside" if gap <= within else "outside"
    return (f"The published layout {pub} is {where}: {100 * gap:.1f}% slower than the fastest, "
            f"{best}, {inside} the model's {100 * within:g}% resolution (ZeRO-{job.zero_stage}, "
            f"{job.recompute} recompute).")


def published_report(choose=reference_choose_degrees, memory=memory_per_gpu) -> str:
    """Llama 3 405B's published run against ``choose``'s layout (published_comparison), its near
    ties (near_tie_table) and where the published layout lands (published_verdict), with
    ``choose`` called once. The lab passes its reader's choose_degrees and memory_per_gpu."""
    model, cluster, job = LLAMA3_405B, LLAMA3_405B_CLUSTER, LLAMA3_405B_JOB
    best = choose(model, cluster, job)
    best = ParallelConfig(best.tp, best.pp, best.dp, job)
    return "\n\n".join([published_comparison(memory=memory, best=best),
                        near_tie_table(model, cluster, job, memory=memory, best=best),
                        published_verdict(best=best, memory=memory)])


def planner(choose=reference_choose_degrees, memory=memory_per_gpu):
    """Sliders for model size, sequence length, GPUs per node, nodes and GPU memory; shows the
    chosen degrees (by ``choose``), memory per GPU by term (by ``memory``), the bubble and the
    communication per axis. The lab passes its reader's choose_degrees and memory_per_gpu."""
    import ipywidgets as w

    def show(params_b, seq_len, gpus_per_node, nodes, gpu_mem_gb, batch_m_tokens, zero_stage,
             recompute, zero_accumulation):
        model = model_of_size(params_b)
        cluster = Cluster(f"{nodes} x {gpus_per_node} GPUs", nodes, gpus_per_node, gpu_mem_gb)
        # The batch in sequences: the token budget rounded to a multiple of the GPU count.
        seqs = max(cluster.gpus, cluster.gpus * round(batch_m_tokens * 1e6 / seq_len / cluster.gpus))
        job = Job(seq_len=seq_len, global_batch=seqs, zero_stage=zero_stage, recompute=recompute,
                  zero_accumulation=zero_accumulation)
        print(f"{model.name}: {model.layers} layers, hidden {model.hidden}, {model.heads} heads "
              f"({model.params / 1e9:.1f}B params); batch {seqs} x {seq_len} tokens")
        print(f"rule of thumb: {rule_of_thumb_gpus(model.params, gpu_mem_gb):.1f} GPUs to hold it")
        try:
            cfg = choose(model, cluster, job)
        except ValueError as err:
            print(err)
            return
        print(layout_summary(model, cluster, ParallelConfig(cfg.tp, cfg.pp, cfg.dp, job), memory))

    style = {"description_width": "150px"}
    layout = w.Layout(width="480px")
    return w.interactive(
        show,
        params_b=w.FloatLogSlider(value=70, base=10, min=0, max=3, description="model (B params)",
                                  style=style, layout=layout),
        seq_len=w.SelectionSlider(options=[1024, 2048, 4096, 8192, 16384, 32768], value=4096,
                                  description="sequence length", style=style, layout=layout),
        gpus_per_node=w.SelectionSlider(options=[1, 2, 4, 8], value=8, description="GPUs per node",
                                        style=style, layout=layout),
        nodes=w.SelectionSlider(options=[2 ** k for k in range(12)], value=16, description="nodes",
                                style=style, layout=layout),
        gpu_mem_gb=w.SelectionSlider(options=[16, 24, 40, 48, 80, 96, 141, 192], value=80,
                                     description="GPU memory (GB)", style=style, layout=layout),
        batch_m_tokens=w.SelectionSlider(options=[0.5, 1, 2, 4, 8, 16], value=4,
                                         description="batch (M tokens)", style=style, layout=layout),
        zero_stage=w.Dropdown(options=[0, 1, 2, 3], value=1, description="ZeRO stage", style=style),
        recompute=w.Dropdown(options=["none", "selective", "full"], value="selective",
                             description="recompute", style=style),
        zero_accumulation=w.Dropdown(options=["regather", "resident"], value="regather",
                                     description="ZeRO-2/3 over micro-batches", style=style),
    )
