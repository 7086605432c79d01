"""A merged timeline as a Chrome / Perfetto trace, and back: one process per rank, one row per
kind (ranges, compute, communication)."""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

from distlab.labs.timelines.trace import ROW_OF, Span, Timeline, load_trace

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
        raise ValueError("not a distlab timeline export; read a torch.profiler trace with merge_traces([...])")
    spans = [Span(e["pid"], e["cat"], e["name"], e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6,
                  e["args"].get("op", ""), int(e["args"].get("bytes", 0)))
             for e in trace["traceEvents"] if e.get("ph") == "X"]
    return Timeline(spans, meta["world_size"], meta["source"], meta["label"])



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

