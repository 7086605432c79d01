"""Timelines of distributed training steps (lab 6): reading per-rank traces and merging them.

The other jobs live beside this module: ``profiling`` (profile every rank), ``chrome`` (the
Perfetto export), ``views`` (the lane plot and the tables the lab prints).

What is measured. ``profile_ranks`` runs a few training steps on every rank under
``torch.profiler`` (Kineto) with named ranges (``record_function``: "step", "forward",
"backward", "optimizer") and brings back each rank's Chrome trace. ``merge_traces`` reads the traces into
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

import contextlib
import dataclasses
import gc
import gzip
import json
import math
from pathlib import Path

KINDS = ("range", "compute", "comm")
ROW_OF = {"range": 0, "compute": 1, "comm": 2}   # lane order of a rank, top to bottom
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
        with _no_collection():
            return json.loads(gzip.decompress(source))
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f, _no_collection():
        return json.load(f)


@contextlib.contextmanager
def _no_collection():
    """The garbage collector paused while JSON is parsed: a trace is a million small objects and
    no cycles, and the collector's full passes over them and the rest of the heap cost up to 8x
    the parse (Lab 6's stored traces: 0.45 s, 0.05 s without, in a process that imported torch)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


def merge_traces(traces: list, *, align: str = "clock", label: str = "", source: str = "") -> Timeline:
    """One timeline from the Kineto traces of ranks 0..n-1 (dicts, paths or gzip bytes).

    align="clock": keep each trace's clock (right for ranks of one machine: one system clock).
    align="barrier": shift rank r by (end of rank 0's first barrier - end of rank r's first
    barrier), for traces from machines whose clocks disagree.
    Times are then shifted so that the earliest event of any rank is at 0.
    """
    traces = [load_trace(t) for t in traces]   # each parsed once (the backend is read below too)
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
    backend = next((t.get("distributedInfo", {}).get("backend") for t in traces), "")
    return Timeline([_shifted(s, -t0) for s in spans], len(traces),
                    source or f"torch.profiler ({backend or 'unknown backend'})", label)


def _shifted(s: Span, by: float) -> Span:
    return dataclasses.replace(s, start=s.start + by, end=s.end + by)


