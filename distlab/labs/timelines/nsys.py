"""NVIDIA Nsight Systems for the runs of lab 6: the commands, and a reader for its sqlite export.

On a GPU node the workflow is three commands (``commands`` writes them for a run):

1. ``nsys profile`` around ``torchrun``: one report holding every rank's process. ``-t cuda,nvtx``
   records kernels (NCCL's included: ``ncclDevKernel_*`` / ``ncclKernel_*``), CUDA API calls and
   NVTX ranges; ``--capture-range=cudaProfilerApi`` records only between the script's
   ``torch.cuda.profiler.start()`` and ``stop()``, so warm-up steps stay out. PyTorch emits an NVTX
   range per operator inside ``torch.autograd.profiler.emit_nvtx()`` (``distlab.labs.timelines.runs``
   does both), and NCCL emits its own (``ncclAllReduce``, ``ncclSend``, ...).
2. ``nsys stats``: tables from the report (kernel time by name, NVTX range time, API calls).
3. ``nsys export --type sqlite``: the report as a SQLite database, which ``read_nsys`` loads into
   the same ``distlab.labs.timelines.trace.Timeline`` as torch.profiler traces, so the same plot and measures
   apply. Times in the database are nanoseconds on one session clock for all processes.

Which process is which rank: nsys knows processes, not ranks. With one GPU per rank, ranks are
numbered here by the device their kernels ran on (rank r on GPU r, torchrun's usual placement).
"""
from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

from distlab import paths
from distlab.labs.tables import format_table
from distlab.labs.timelines.trace import Span, Timeline, _nccl_kernel_op

# A real 2-GPU export shipped with the course (trimmed; notice in data/traces/NOTICE.md).
SAMPLE = paths.data() / "traces" / "nsys_2gpu_sendrecv.sqlite"
NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange in ENUM_NSYS_EVENT_TYPE
PID_BITS = 24           # a globalTid is (globalPid | tid): the low 24 bits are the thread


def commands(run: str = "tp", nproc: int = 2, out: str = "distlab_tp", steps: int = 5) -> list[str]:
    """The shell commands that profile ``python -m distlab.labs.timelines.runs RUN`` on ``nproc`` GPUs
    with nsys, print its summary tables, and export it for ``read_nsys``."""
    return [
        f"nsys profile -t cuda,nvtx,osrt -s none --cpuctxsw=none "
        f"--capture-range=cudaProfilerApi --capture-range-end=stop -o {out} --force-overwrite=true "
        f"torchrun --standalone --nproc-per-node={nproc} -m distlab.labs.timelines.runs {run} --steps {steps}",
        f"nsys stats --report cuda_gpu_kern_sum,nvtx_sum --format table {out}.nsys-rep",
        f"nsys export --type sqlite --output {out}.sqlite --force-overwrite=true {out}.nsys-rep",
    ]


def available(nproc: int = 2) -> tuple[bool, str]:
    """(can this machine record an nsys profile of ``nproc`` ranks?, why not)."""
    import torch
    if shutil.which("nsys") is None:
        return False, "the `nsys` command is not installed here (it ships with CUDA / Nsight Systems)"
    if torch.cuda.device_count() < nproc:
        return False, f"{nproc} GPUs are needed, {torch.cuda.device_count()} found"
    return True, ""


def record(run: str = "tp", nproc: int = 2, folder: str | Path = ".", steps: int = 5,
           timeout: float = 600) -> Path:
    """Run ``commands`` in ``folder`` (needs nsys and ``nproc`` GPUs); returns the sqlite path."""
    ok, why = available(nproc)
    if not ok:
        raise RuntimeError(f"cannot record with nsys: {why}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = f"distlab_{run}"
    for command in commands(run, nproc, out, steps):
        done = subprocess.run(command, shell=True, cwd=folder, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"`{command}` failed ({done.returncode}):\n{done.stderr[-2000:]}")
        print(done.stdout[-4000:])
    return folder / f"{out}.sqlite"


def _tables(db: sqlite3.Connection) -> set[str]:
    return {name for (name,) in db.execute("select name from sqlite_master where type='table'")}


def _ranks(db: sqlite3.Connection) -> dict[int, int]:
    """globalPid -> rank: processes that ran kernels, ordered by device (then by pid)."""
    rows = db.execute("select globalPid, min(deviceId) from CUPTI_ACTIVITY_KIND_KERNEL "
                      "group by globalPid order by min(deviceId), globalPid").fetchall()
    return {pid: rank for rank, (pid, _) in enumerate(rows)}


def read_nsys(path=SAMPLE, label: str = "") -> Timeline:
    """The timeline of an ``nsys export --type sqlite`` file: per rank (process with kernels),
    ``compute`` = its non-NCCL kernels, memcpys and memsets; ``comm`` = its NCCL kernels (op from
    the kernel name; bytes unknown: 0); ``range`` = NVTX ranges of its threads; ``api`` = CUDA
    runtime calls. Seconds, 0 = the first event."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; record one with the commands of "
                                f"distlab.labs.timelines.nsys.commands() on a GPU node")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = _tables(db)
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
            raise ValueError(f"{path} has no kernels: profile with `-t cuda` (and export to sqlite)")
        strings = dict(db.execute("select id, value from StringIds"))
        ranks = _ranks(db)
        spans = _kernels(db, strings, ranks) + _copies(db, tables, ranks)
        spans += _nvtx(db, tables, strings, ranks) + _api(db, tables, strings, ranks)
    finally:
        db.close()
    t0 = min((s.start for s in spans), default=0.0)
    spans = [Span(s.rank, s.kind, s.name, s.start - t0, s.end - t0, s.op, s.bytes) for s in spans]
    return Timeline(spans, len(ranks), f"nsys export ({path.name})", label)


def _kernels(db, strings, ranks) -> list[Span]:
    spans = []
    for start, end, pid, short in db.execute(
            "select start, end, globalPid, shortName from CUPTI_ACTIVITY_KIND_KERNEL"):
        name = strings.get(short, "?")
        comm = name.lower().startswith("nccl")
        spans.append(Span(ranks[pid], "comm" if comm else "compute", name, start * 1e-9, end * 1e-9,
                          _nccl_kernel_op(name) if comm else ""))
    return spans


def _copies(db, tables, ranks) -> list[Span]:
    spans = []
    for table, name in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if table in tables:
            spans += [Span(ranks[pid], "compute", name, start * 1e-9, end * 1e-9)
                      for start, end, pid in db.execute(f"select start, end, globalPid from {table}")
                      if pid in ranks]
    return spans


def _process(global_tid: int) -> int:
    return global_tid >> PID_BITS << PID_BITS


def _nvtx(db, tables, strings, ranks) -> list[Span]:
    if "NVTX_EVENTS" not in tables:
        return []
    spans = []
    rows = db.execute("select start, end, text, textId, globalTid from NVTX_EVENTS "
                      f"where eventType in {NVTX_RANGES} and end is not null")
    for start, end, text, text_id, tid in rows:
        rank = ranks.get(_process(tid))
        if rank is not None:
            spans.append(Span(rank, "range", text or strings.get(text_id, "?"), start * 1e-9, end * 1e-9))
    return spans


def _api(db, tables, strings, ranks) -> list[Span]:
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return []
    spans = []
    for start, end, name_id, tid in db.execute(
            "select start, end, nameId, globalTid from CUPTI_ACTIVITY_KIND_RUNTIME"):
        rank = ranks.get(_process(tid))
        if rank is not None:
            spans.append(Span(rank, "api", strings.get(name_id, "?"), start * 1e-9, end * 1e-9))
    return spans


def kernel_summary(timeline: Timeline, merge_intervals=None) -> list[dict]:
    """Per rank: kernels, NCCL kernels, and the GPU time each took over the rank's active window
    (first to last kernel), as the lab's measures define them: the length of the union of the
    intervals, by ``merge_intervals`` (in Lab 6: yours; by default the course's, which a Lab 6
    handout leaves out)."""
    if merge_intervals is None:
        from distlab.labs.timelines.intervals import union as merge_intervals
    rows = []
    for r in range(timeline.world_size):
        gpu = [s for s in timeline.of(r) if s.kind in ("compute", "comm")]
        lo, hi = min(s.start for s in gpu), max(s.end for s in gpu)
        busy = {kind: sum(b - a for a, b in merge_intervals([(s.start, s.end) for s in gpu
                                                             if s.kind == kind]))
                for kind in ("compute", "comm")}
        rows.append({"rank": r, "kernels": len(gpu),
                     "nccl_kernels": sum(s.kind == "comm" for s in gpu),
                     "window_ms": (hi - lo) * 1e3, "compute_ms": busy["compute"] * 1e3,
                     "comm_ms": busy["comm"] * 1e3, "comm_share": busy["comm"] / (hi - lo)})
    return rows


def format_summary(rows: list[dict]) -> str:
    """``kernel_summary``'s rows as a table: per rank, kernels and GPU milliseconds."""
    return format_table([{"rank": r["rank"], "kernels": r["kernels"], "NCCL": r["nccl_kernels"],
                          "window ms": f"{r['window_ms']:.1f}", "compute ms": f"{r['compute_ms']:.1f}",
                          "NCCL ms": f"{r['comm_ms']:.1f}", "NCCL share": f"{r['comm_share']:.1%}"}
                         for r in rows])


def timeline_for_lab(run: str = "tp", nproc: int = 2, folder=None) -> Timeline | None:
    """Record a fresh nsys profile where nsys and the GPUs are here; otherwise say so and read the
    sample export of a real 2-GPU run shipped with the course (``data/traces``). None if neither."""
    import tempfile
    ok, why = available(nproc)
    if ok:
        path = record(run, nproc, folder or Path(tempfile.gettempdir()) / "distlab_nsys")
        return read_nsys(path, label=f"nsys: {run} on {nproc} GPUs, recorded now")
    print(f"No fresh nsys profile: {why}.")
    if SAMPLE.exists():
        print(f"Reading instead {SAMPLE.name}, a real nsys export of a 2-GPU training run "
              f"(flash-attention and GEMM kernels, NCCL send/recv between the GPUs).")
        return read_nsys(SAMPLE, label="nsys sample: 2-GPU run with NCCL send/recv")
    print("No sample export in this checkout either: run the commands above on a GPU node and "
          "pass the .sqlite file to distlab.labs.timelines.nsys.read_nsys.")
    return None
