"""The digests in data/traces/manifest.json, by which tests/test_nsys.py knows the shipped GPU
traces are the originals (or, for the trimmed nsys export, reads as the original) on a machine
that does not have the originals.

    .venv/bin/python tests/trace_digests.py ORIGINALS_DIR   # check, then write the manifest

writes the manifest only after checking the shipped files against the originals in
ORIGINALS_DIR: the Kineto traces byte for byte, the nsys export by the spans it reads.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from distlab.labs.timelines import gpu_traces, nsys

MANIFEST = "manifest.json"
UNCHANGED = (gpu_traces.KINETO_A100, "kineto_cpu_gloo_rank34.json.gz")   # shipped as they came
TRIMMED = gpu_traces.NSYS_2GPU                                           # trimmed by trim_nsys


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spans_sha256(path: Path) -> str:
    """sha256 of the spans ``nsys.read_nsys`` reads from ``path``, in a fixed order."""
    spans = sorted((s.rank, s.kind, s.start, s.end, s.name, s.op, s.bytes)
                   for s in nsys.read_nsys(path).spans)
    return hashlib.sha256(repr(spans).encode()).hexdigest()


def manifest(originals: Path) -> dict:
    """The manifest's entries, each checked against ``originals`` first."""
    shipped = gpu_traces.folder()
    files = {}
    for name in UNCHANGED:
        digest = file_sha256(shipped / name)
        if digest != file_sha256(originals / name):
            raise SystemExit(f"{shipped / name} is not the original {originals / name}")
        files[name] = {"sha256": digest, "as": "unchanged"}
    spans = spans_sha256(shipped / TRIMMED)
    if spans != spans_sha256(originals / TRIMMED):
        raise SystemExit(f"{shipped / TRIMMED} does not read as the original {originals / TRIMMED}")
    files[TRIMMED] = {"sha256": file_sha256(shipped / TRIMMED), "spans_sha256": spans,
                      "as": "trimmed by distlab.labs.timelines.gpu_traces.trim_nsys; "
                            "spans_sha256: what read_nsys reads, equal to the original's"}
    return {"files": files}


if __name__ == "__main__":
    target = gpu_traces.folder() / MANIFEST
    target.write_text(json.dumps(manifest(Path(sys.argv[1])), indent=1, sort_keys=True) + "\n")
    print(f"wrote {target}")
