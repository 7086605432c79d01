"""Timelines of distributed training steps (lab 6): profile every rank, merge, draw, export.

What is measured. ``profile_ranks`` runs a few training steps on every rank under
``torch.profiler`` (Kineto) with named ranges (``record_function``: "step", "forward",
"backward", "optimizer") and brings back each rank's Chrome trace. ``merge`` reads the traces into
one ``Timeline``: a flat list of ``Span`` (rank, kind, name, start, end in seconds) on one clock.
Kinds:

- ``range``: a named region the code marked (``record_function`` on the CPU; ``gpu_user_annotation``
  when Kineto projected it onto the GPU);
- ``compute``: work that is not communication: on CPU ranks the outermost operators
  (``aten::mm``, ...) of each thread, on GPU ranks the kernels, copies and memsets that are not NCCL's;
- ``comm``: the execution of a collective or point-to-point message: gloo's ``gloo:<op>`` regions
  (they run on gloo's own threads for collectives, so an asynchronous all-reduce appears where it
  really ran) or NCCL's kernels on the GPU. A communication span lasts from the moment the rank
  enters the collective until its part is done, so it includes *waiting for slower peers*.

The same structure is filled from an ``nsys export --type sqlite`` file by ``distlab.labs.timelines.nsys``, so the
measures, the lane plot (``plot``) and the Perfetto export (``to_chrome``) apply to both.

Clocks. Kineto stamps CPU events with one system-wide clock, so traces of ranks on one machine
merge as they are (``align="clock"``). Across machines clocks differ by up to milliseconds:
``align="barrier"`` shifts each rank so that the ends of the first barrier coincide (every rank
leaves a barrier within a few microseconds of the last one arriving). ``profile_ranks`` starts its
recording with a barrier for that reason.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

KINDS = ("range", "compute", "comm")
COMM_PREFIXES = ("gloo:", "nccl:")
# Bytes per element of the dtype names traces use: gloo's "Input type" (C++ names) and NCCL's
# "dtype" argument (ATen scalar-type names).
ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
            "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
            "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
            "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
# NCCL's "Collective name" argument and kernel names, in torch.distributed's words.
NCCL_OPS = {"allreduce": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
            "allgather": "all_gather", "all_gather": "all_gather", "reducescatter": "reduce_scatter",
            "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all", "send": "send",
            "recv": "recv", "sendrecv": "send_recv", "_allgather_base": "all_gather",
            "_reduce_scatter_base": "reduce_scatter", "all_to_allv": "all_to_all"}
POINT_TO_POINT = {"send", "recv", "send_recv", "isend", "irecv"}


@dataclasses.dataclass(frozen=True)
class Span:
    """One interval of one rank's timeline. ``start``/``end`` in seconds on the timeline's clock;
    for ``comm`` spans ``op`` is the collective (``all_reduce``, ``send``, ...) and ``bytes`` the
    size of the tensors the rank passed to it (0 where the trace does not say)."""
    rank: int
    kind: str
    name: str
    start: float
    end: float
    op: str = ""
    bytes: int = 0

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclasses.dataclass
class Timeline:
    """Spans of every rank on one clock (seconds, 0 = the first event), with where they came from."""
    spans: list[Span]
    world_size: int
    source: str = ""
    label: str = ""

    def of(self, rank: int, kind: str | None = None, name: str | None = None) -> list[Span]:
        """Rank ``rank``'s spans (of one kind, one name), in start order."""
        return sorted((s for s in self.spans if s.rank == rank and (kind is None or s.kind == kind)
                       and (name is None or s.name == name)), key=lambda s: (s.start, -s.end))

    def steps(self, rank: int) -> list[tuple[float, float]]:
        """(start, end) of each range named "step" on ``rank``."""
        return [(s.start, s.end) for s in self.of(rank, "range", "step")]

    def unlabelled(self) -> "Timeline":
        """The same spans with the label removed (for the recognition exercise)."""
        return dataclasses.replace(self, label="")


# ---------------------------------------------------------------------------------------------
# Reading torch.profiler (Kineto) Chrome traces

def load_trace(source) -> dict:
    """A Chrome trace as a dict, from a dict, a path (``.json`` or ``.json.gz``) or gzip bytes."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (bytes, bytearray)):
        return json.loads(gzip.decompress(source))
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _elements(dims) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def comm_fields(event: dict) -> tuple[str, int] | None:
    """(op, bytes) if ``event`` is the execution of a collective, else None.

    gloo (CPU): a ``user_annotation`` named ``gloo:<op>``; its "Input Dims" and "Input type"
    (recorded with ``record_shapes=True``) give the tensors. NCCL (GPU): a kernel whose name starts
    with "nccl"; its "Collective name", "In msg nelems" and "dtype" arguments give the message.
    """
    name, cat, args = event.get("name", ""), event.get("cat", ""), event.get("args") or {}
    if cat == "user_annotation" and name.startswith("gloo:"):
        dims, types = args.get("Input Dims") or [], args.get("Input type") or []
        nbytes = sum(_elements(d) * ITEMSIZE.get(t, 0) for d, t in zip(dims, types)
                     if isinstance(d, list))
        return name.split(":", 1)[1], nbytes
    if cat == "kernel" and name.lower().startswith("nccl"):
        collective = str(args.get("Collective name", "")).lower()
        op = NCCL_OPS.get(collective) or _nccl_kernel_op(name)
        nbytes = int(args.get("In msg nelems", 0) or 0) * ITEMSIZE.get(str(args.get("dtype")), 0)
        return op, nbytes
    return None


def _nccl_kernel_op(name: str) -> str:
    """``ncclKernel_AllReduce_RING_LL_Sum_float`` / ``ncclDevKernel_SendRecv`` -> all_reduce / send_recv."""
    word = name.split("(")[0].split("_")[1] if "_" in name else name
    return NCCL_OPS.get(word.lower(), word.lower())


def collective_events(trace) -> list[tuple[str, int, float, float]]:
    """Every collective a rank executed, from its Kineto trace: (op, bytes, start s, duration s),
    in start order (times on the trace's own clock, microseconds turned into seconds)."""
    found = []
    for e in load_trace(trace)["traceEvents"]:
        fields = comm_fields(e) if e.get("ph") == "X" else None
        if fields:
            found.append((fields[0], fields[1], e["ts"] * 1e-6, e.get("dur", 0) * 1e-6))
    return sorted(found, key=lambda c: (c[2], c[3]))


def _compute_ops(events: list[dict]) -> list[dict]:
    """The largest operators of one thread that contain no communication.

    Kineto nests events by time on a thread. An operator that wraps a collective (a custom
    autograd Function calling all_reduce, autograd's evaluate_function around its backward) spends
    part of its time blocked on the network; it is not compute as a whole, so descend into its
    children and keep those that do not communicate. The blocked time between them is left out.
    """
    roots, stack = [], []
    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        node = {"e": e, "end": e["ts"] + e.get("dur", 0), "kids": [], "comm": _is_comm_op(e["name"])}
        while stack and stack[-1]["end"] <= e["ts"]:
            stack.pop()
        (stack[-1]["kids"] if stack else roots).append(node)
        stack.append(node)

    def has_comm(node) -> bool:
        node["comm"] = any([has_comm(k) for k in node["kids"]]) or node["comm"]
        return node["comm"]

    out = []

    def emit(nodes) -> None:
        for node in nodes:
            if not node["comm"]:
                out.append(node["e"])
            elif not _is_comm_op(node["e"]["name"]):
                emit(node["kids"])

    for root in roots:
        has_comm(root)
    emit(roots)
    return out


def _is_comm_op(name: str) -> bool:
    return name.startswith(("c10d::", "nccl:", "gloo:")) or name == "record_param_comms"


def read_kineto(trace, rank: int) -> list[Span]:
    """Rank ``rank``'s spans from its Kineto trace, times in seconds on the trace's clock."""
    events = [e for e in load_trace(trace)["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    on_gpu = any(e.get("cat") == "kernel" for e in events)
    # Ranges: on GPU ranks their projection onto the GPU, where the work they launch runs; a range
    # Kineto did not project (it launched no kernel itself) keeps its CPU times.
    on_gpu_names = {e["name"] for e in events if e.get("cat") == "gpu_user_annotation"}
    spans = []
    for e in events:
        fields = comm_fields(e)
        if fields:
            spans.append(_span(rank, "comm", e, op=fields[0], nbytes=fields[1]))
        elif e.get("cat") in ("user_annotation", "gpu_user_annotation") \
                and not _is_comm_op(e["name"]) and not e["name"].startswith("ProfilerStep") \
                and (e["cat"] == "gpu_user_annotation" or e["name"] not in on_gpu_names):
            spans.append(_span(rank, "range", e))
    if on_gpu:  # the GPU's own work: kernels, copies, memsets that are not NCCL's
        spans += [_span(rank, "compute", e) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and not comm_fields(e)]
    else:       # the CPU's: outermost operators of each thread, outside communication
        by_thread: dict = {}
        for e in events:
            if e.get("cat") == "cpu_op" or (e.get("cat") == "user_annotation" and _is_comm_op(e["name"])):
                by_thread.setdefault(e.get("tid"), []).append(e)
        for ops in by_thread.values():
            spans += [_span(rank, "compute", e) for e in _compute_ops(ops)]
    return spans


def _span(rank: int, kind: str, e: dict, op: str = "", nbytes: int = 0) -> Span:
    start = e["ts"] * 1e-6
    return Span(rank, kind, e["name"], start, start + e.get("dur", 0) * 1e-6, op, nbytes)


def merge(traces: list, *, align: str = "clock", label: str = "", source: str = "") -> Timeline:
    """One timeline from the Kineto traces of ranks 0..n-1 (dicts, paths or gzip bytes).

    align="clock": keep each trace's clock (right for ranks of one machine: one system clock).
    align="barrier": shift rank r by (end of rank 0's first barrier - end of rank r's first
    barrier), for traces from machines whose clocks disagree.
    Times are then shifted so that the earliest event of any rank is at 0.
    """
    per_rank = [read_kineto(t, r) for r, t in enumerate(traces)]
    if align == "barrier":
        ends = []
        for r, spans in enumerate(per_rank):
            barriers = [s.end for s in spans if s.kind == "comm" and s.op == "barrier"]
            if not barriers:
                raise ValueError(f"align='barrier': rank {r}'s trace has no barrier; record one "
                                 f"(dist.barrier()) inside the profiled region, or use align='clock'")
            ends.append(min(barriers))
        per_rank = [[_shifted(s, ends[0] - ends[r]) for s in spans] for r, spans in enumerate(per_rank)]
    elif align != "clock":
        raise ValueError(f"align must be 'clock' or 'barrier', not {align!r}")
    spans = [s for spans in per_rank for s in spans]
    t0 = min((s.start for s in spans), default=0.0)
    backend = next((load_trace(t).get("distributedInfo", {}).get("backend") for t in traces), "")
    return Timeline([_shifted(s, -t0) for s in spans], len(traces),
                    source or f"torch.profiler ({backend or 'unknown backend'})", label)


def _shifted(s: Span, by: float) -> Span:
    return dataclasses.replace(s, start=s.start + by, end=s.end + by)


# ---------------------------------------------------------------------------------------------
# Profiling a step function on every rank

def _profiled_rank(rank: int, world_size: int, make_step: Callable, args: tuple, steps: int,
                   warmup: int) -> bytes:
    """Rank body: build the step, run ``warmup`` steps, then ``steps`` under torch.profiler.
    Returns the rank's Chrome trace, gzipped (mtime 0, so equal traces give equal bytes)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    step = make_step(rank, world_size, *args)
    for _ in range(warmup):  # first steps pay for allocation and connection set-up
        step()
    on_gpu = dist.get_backend() == "nccl"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    dist.barrier()
    # record_shapes: gloo's regions carry their tensors' shapes only when shapes are recorded.
    with profile(activities=activities, record_shapes=True) as prof:
        dist.barrier()  # a common instant on every rank, for align="barrier"
        for _ in range(steps):
            with record_function("step"):
                step()
        if on_gpu:
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"rank{rank}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            return gzip.compress(f.read(), mtime=0)


@dataclasses.dataclass
class Profile:
    """A profiled run: each rank's Kineto trace (gzip bytes) and the merged timeline."""
    traces: list[bytes]
    timeline: Timeline

    def save(self, folder) -> list[Path]:
        """Write ``rank{r}_trace.json.gz`` per rank into ``folder`` (Perfetto opens them)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for r, blob in enumerate(self.traces):
            paths.append(folder / f"rank{r}_trace.json.gz")
            paths[-1].write_bytes(blob)
        return paths


def profile_ranks(make_step: Callable, world_size: int, *args, steps: int = 3, warmup: int = 1,
                  label: str = "", backend: str = "auto", timeout: float = 120) -> Profile:
    """Run ``make_step(rank, world_size, *args)`` on fresh ranks; it returns ``step()``, one
    training step. ``warmup`` steps run unrecorded, then ``steps`` steps under torch.profiler,
    each inside a range named "step". Returns the traces and their merged timeline."""
    from distlab import run
    out = run(_profiled_rank, world_size, make_step, args, steps, warmup, backend=backend,
              timeout=timeout)
    return Profile(list(out), merge(list(out), label=label))


# ---------------------------------------------------------------------------------------------
# Chrome / Perfetto export of a merged timeline

ROW_OF = {"range": 0, "compute": 1, "comm": 2}


def to_chrome(timeline: Timeline, path=None) -> dict:
    """The timeline as one Chrome trace: a process per rank, a thread per row (ranges, compute,
    communication), times in microseconds. Open it at https://ui.perfetto.dev (or chrome://tracing).
    Writes it to ``path`` (``.json`` or ``.json.gz``) when given."""
    events = []
    for r in range(timeline.world_size):
        events.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        for kind, row in ROW_OF.items():
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": row,
                           "args": {"name": kind}})
    for s in sorted(timeline.spans, key=lambda s: (s.rank, s.start)):
        args = {"op": s.op, "bytes": s.bytes} if s.kind == "comm" else {}
        events.append({"ph": "X", "name": s.name, "cat": s.kind, "pid": s.rank,
                       "tid": ROW_OF.get(s.kind, 3), "ts": s.start * 1e6, "dur": s.duration * 1e6,
                       "args": args})
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"distlab": {"world_size": timeline.world_size, "source": timeline.source,
                                       "label": timeline.label}}}
    if path is not None:
        path = Path(path)
        data = json.dumps(trace).encode()
        path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return trace


def from_chrome(source) -> Timeline:
    """Read back a timeline written by ``to_chrome``."""
    trace = load_trace(source)
    meta = trace.get("otherData", {}).get("distlab")
    if meta is None:
        raise ValueError("not a distlab timeline export; read a torch.profiler trace with merge([...])")
    spans = [Span(e["pid"], e["cat"], e["name"], e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6,
                  e["args"].get("op", ""), int(e["args"].get("bytes", 0)))
             for e in trace["traceEvents"] if e.get("ph") == "X"]
    return Timeline(spans, meta["world_size"], meta["source"], meta["label"])


# ---------------------------------------------------------------------------------------------
# The lane plot

RANGE_COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868"}
COMM_COLOURS = {"all_reduce": "#C44E52", "send": "#8172B3", "recv": "#937860",
                "send_recv": "#8172B3", "all_gather": "#DA8BC3", "reduce_scatter": "#CCB974",
                "broadcast": "#64B5CD", "barrier": "#BBBBBB"}


def plot(timeline: Timeline, *, window: tuple[float, float] | None = None, ax=None, title=None):
    """One lane per rank, three rows each: the named ranges, compute, communication; colours by
    range name and by collective. ``window`` = (start, end) seconds limits what is drawn."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lo, hi = window or (0.0, max((s.end for s in timeline.spans), default=1.0))
    n = timeline.world_size
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.9 * n))
    seen: dict[str, str] = {}
    for s in _drawn(timeline):
        if s.end < lo or s.start > hi:
            continue
        y = (n - 1 - s.rank) * 4 + (2 - ROW_OF[s.kind])
        if s.kind == "range":
            key = s.name if s.name in RANGE_COLOURS else "other range"
            colour = RANGE_COLOURS.get(s.name, "#CFCFCF")
        elif s.kind == "compute":
            colour, key = "#8C8C8C", "compute"
        else:
            colour, key = COMM_COLOURS.get(s.op, "#C44E52"), s.op or "comm"
        seen.setdefault(key, colour)
        ax.broken_barh([((s.start - lo) * 1e3, max(s.duration * 1e3, 1e-3))], (y + 0.1, 0.8),
                       facecolors=colour, edgecolor="none")
    for r in range(n):  # step boundaries as thin lines
        for a, b in timeline.steps(r):
            if lo <= a <= hi:
                ax.axvline((a - lo) * 1e3, color="black", lw=0.4, alpha=0.3)
    ticks = [(n - 1 - r) * 4 + 2 - ROW_OF[k] + 0.5 for r in range(n) for k in KINDS]
    ax.set_yticks(ticks, [f"rank {r} {k}" for r in range(n) for k in KINDS], fontsize=8)
    ax.set_xlim(0, (hi - lo) * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_title(title if title is not None else (timeline.label or timeline.source))
    ax.legend(handles=[Patch(color=c, label=k) for k, c in seen.items()], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def _drawn(timeline: Timeline) -> list[Span]:
    """What the lanes show: compute and comm spans, and the outermost ranges other than "step"
    (nested ones, like PyTorch's own "Optimizer.step#SGD.step", would hide their parents)."""
    out = [s for s in timeline.spans if s.kind in ("compute", "comm")]
    for r in range(timeline.world_size):
        end = -math.inf
        for s in timeline.of(r, "range"):
            if s.name != "step" and s.start >= end:
                out.append(s)
                end = s.end
    return out


# ---------------------------------------------------------------------------------------------
# Tables of the lab's measures (the measures are the student's functions, passed in)

def share_table(timeline: Timeline, comm_share: Callable, exposed_comm: Callable) -> list[dict]:
    """Per rank and step: step length, communication share and exposed communication, printed."""
    rows = []
    print(f"{timeline.label or timeline.source}\n{'rank':>4} {'step':>4} {'step ms':>8} "
          f"{'comm share':>11} {'exposed ms':>11}")
    for r in range(timeline.world_size):
        for i, window in enumerate(timeline.steps(r)):
            row = {"rank": r, "step": i, "ms": (window[1] - window[0]) * 1e3,
                   "share": comm_share(timeline, r, window),
                   "exposed_ms": exposed_comm(timeline, r, window) * 1e3}
            rows.append(row)
            print(f"{r:>4} {i:>4} {row['ms']:>8.1f} {row['share']:>11.1%} {row['exposed_ms']:>11.2f}")
    return rows


def peek(trace, names=("gloo:all_reduce", "c10d::allreduce_", "forward", "aten::addmm")) -> None:
    """Print the first raw event of each name in a Kineto trace, as the trace stores it."""
    events = load_trace(trace)["traceEvents"]
    print(f"{len(events)} events; keys of the trace: {sorted(load_trace(trace))}")
    for name in names:
        found = next((e for e in events if e.get("name") == name), None)
        if found is not None:
            print(json.dumps(found, indent=None)[:600])


def export(timeline: Timeline, name: str, folder=None) -> Path:
    """Write the merged timeline for Perfetto as ``<folder>/<name>.json`` (default: a distlab
    folder in the system's temporary directory, so the lab's folder stays clean); print the path."""
    folder = Path(folder) if folder is not None else Path(tempfile.gettempdir()) / "distlab_timelines"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    to_chrome(timeline, path)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB): open https://ui.perfetto.dev and "
          f"drag the file in (or 'Open trace file'); one process per rank, rows ranges/compute/comm.")
    return path


def overlap_table(timelines: dict, overlap_fraction: Callable) -> dict:
    """``overlap_fraction(timeline, rank)`` for every rank of each named timeline, printed."""
    print(f"{'run':<16}" + "".join(f"{'rank ' + str(r):>9}" for r in range(max(
        t.world_size for t in timelines.values()))))
    out = {}
    for name, tl in timelines.items():
        out[name] = [overlap_fraction(tl, r) for r in range(tl.world_size)]
        print(f"{name:<16}" + "".join(f"{v:>9.1%}" for v in out[name]))
    return out
