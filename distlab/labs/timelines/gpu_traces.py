"""Real GPU traces shipped with the course (``data/traces/``, see its NOTICE.md), read with the
lab's own readers, and the figures that a 2-core CPU cannot show.

- ``kineto_2rank_a100_nccl.json.gz``: torch.profiler (Kineto) trace of rank 0 of a 2-rank A100
  DDP run (NCCL 2.17.1): 3 profiled iterations; NCCL all-reduce kernels of DDP's buckets run on
  their own stream while backward's kernels run.
- ``nsys_2gpu_sendrecv.sqlite``: an ``nsys export --type sqlite`` of a 2-GPU run (NCCL send/recv),
  trimmed by ``trim_nsys`` to the tables and columns ``distlab.labs.timelines.nsys`` reads.

The measures are the lab's definitions on the union of intervals (``distlab.labs.timelines.
intervals``): NCCL share = time in NCCL kernels / window; exposed communication = NCCL time during
which no other kernel runs; overlap fraction = 1 - exposed / NCCL time.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from distlab import paths
from distlab.labs.timelines.intervals import clip, length, minus
from distlab.labs.timelines.trace import Span, Timeline, load_trace, read_kineto

KINETO_A100 = "kineto_2rank_a100_nccl.json.gz"
NSYS_2GPU = "nsys_2gpu_sendrecv.sqlite"
# What read_nsys reads: table -> columns (everything else is dropped by trim_nsys).
NSYS_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "globalPid", "shortName", "deviceId"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "globalPid"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "globalPid"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "nameId", "globalTid"),
    "NVTX_EVENTS": ("start", "end", "text", "textId", "globalTid", "eventType"),
    "StringIds": ("id", "value"),
}


def folder() -> Path:
    return paths.data() / "traces"


def trace_path(name: str) -> Path:
    path = folder() / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the course ships it under data/traces/ "
                                f"(see data/traces/NOTICE.md); restore it from the repository")
    return path


def trim_nsys(source, target) -> Path:
    """Copy of an nsys sqlite export with only ``NSYS_COLUMNS`` (how data/traces/ was made from
    the original export, 2.6 MB)."""
    target = Path(target)
    target.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    dst = sqlite3.connect(target)
    try:
        for table, columns in NSYS_COLUMNS.items():
            cols = ", ".join(f'"{c}"' for c in columns)
            dst.execute(f'create table "{table}" ({cols})')
            rows = src.execute(f'select {cols} from "{table}"').fetchall()
            dst.executemany(f'insert into "{table}" values ({", ".join("?" * len(columns))})', rows)
        dst.commit()
        dst.execute("vacuum")
    finally:
        src.close()
        dst.close()
    return target


def a100_timeline() -> Timeline:
    """Rank 0 of the A100 run: its kernels (compute), NCCL kernels (comm), and one "step" range
    over the profiled window, from its first to its last GPU activity (3 iterations)."""
    spans = read_kineto(load_trace(trace_path(KINETO_A100)), 0)
    gpu = [s for s in spans if s.kind in ("compute", "comm")]
    t0, t1 = min(s.start for s in gpu), max(s.end for s in gpu)
    spans.append(Span(0, "range", "step", t0, t1))
    spans = [Span(s.rank, s.kind, s.name, s.start - t0, s.end - t0, s.op, s.bytes) for s in spans]
    return Timeline(spans, 1, "torch.profiler (nccl), A100",
                    "A100, 2-rank DDP, rank 0 (Kineto; data/traces)")


def nsys_timeline() -> Timeline:
    """The shipped nsys export, read by the lab's nsys reader."""
    from distlab.labs.timelines.nsys import read_nsys
    return read_nsys(trace_path(NSYS_2GPU), label="nsys export: 2-GPU run with NCCL send/recv "
                                                  "(data/traces)")


def gpu_window(timeline: Timeline, rank: int) -> tuple[float, float]:
    """First to last kernel (or copy) of ``rank``."""
    gpu = [s for s in timeline.of(rank) if s.kind in ("compute", "comm")]
    return min(s.start for s in gpu), max(s.end for s in gpu)


def measures(timeline: Timeline, rank: int) -> dict[str, float]:
    """NCCL share, exposed NCCL seconds and overlap fraction of ``rank`` over its GPU window."""
    window = gpu_window(timeline, rank)
    comm = clip([(s.start, s.end) for s in timeline.of(rank, "comm")], *window)
    compute = clip([(s.start, s.end) for s in timeline.of(rank, "compute")], *window)
    total, exposed = length(comm), length(minus(comm, compute))
    return {"window_s": window[1] - window[0], "comm_s": total,
            "nccl_share": total / (window[1] - window[0]), "exposed_s": exposed,
            "overlap": 1 - exposed / total if total else 0.0}


def beside(cpu_label: str, cpu_text: str, gpu: str = "a100") -> str:
    """A CPU figure and the GPU trace's figure of the same thing, for the labs to print."""
    tl = a100_timeline() if gpu == "a100" else nsys_timeline()
    m = measures(tl, 0)
    return (f"{cpu_label:<44}{cpu_text}\n"
            f"{'real GPUs, ' + tl.label:<44}\n"
            f"{'':<44}NCCL kernels {m['comm_s'] * 1e3:.1f} ms of a {m['window_s'] * 1e3:.1f} ms window "
            f"({m['nccl_share']:.1%}); {m['overlap']:.1%} of it overlapped by compute kernels, "
            f"{m['exposed_s'] * 1e3:.2f} ms exposed")


def overlap_beside_cpu(rows: list[dict]) -> str:
    """Lab 2: this CPU's naive and overlapped step times (rows of
    ``distlab.labs.data_parallel.compare_step_times``) beside the A100 trace's overlap."""
    ms = {r["strategy"]: r["ms_per_step"] for r in rows}
    cpu = (f"naive {ms.get('naive', float('nan')):.1f} ms/step, overlapped "
           f"{ms.get('overlapped', float('nan')):.1f} ms/step")
    return beside("this CPU (gloo, 2 ranks on shared cores):", cpu)
