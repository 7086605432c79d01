"""distlab.labs.timelines.nsys: the commands, the availability test, and the reader, checked against the real
2-GPU nsys export the course ships (data/traces, trimmed) with independent SQL queries; the
shipped copies are checked against the digests of the originals in data/traces/manifest.json
(tests/trace_digests.py wrote them after checking the copies against the originals), so the
check runs on any clone."""
from __future__ import annotations

import json
import math
import sqlite3

import pytest

import trace_digests
from distlab.labs.timelines import gpu_traces, nsys
from distlab.checks import lab06

SAMPLE = nsys.SAMPLE   # the shipped, trimmed export


def digests(name: str) -> dict:
    """The manifest's entry for a shipped trace."""
    return json.loads((gpu_traces.folder() / trace_digests.MANIFEST).read_text())["files"][name]


def test_commands_profile_torchrun_then_stats_then_export():
    profile, stats, export = nsys.commands("pp", nproc=4, out="rep", steps=3)
    assert profile.startswith("nsys profile ") and "-t cuda,nvtx" in profile
    assert "--capture-range=cudaProfilerApi" in profile and "-o rep " in profile
    assert "torchrun --standalone --nproc-per-node=4 -m distlab.labs.timelines.runs pp --steps 3" in profile
    assert stats.startswith("nsys stats ") and stats.endswith("rep.nsys-rep")
    assert export.startswith("nsys export --type sqlite --output rep.sqlite")


def test_available_says_why_not(monkeypatch):
    monkeypatch.setattr(nsys.shutil, "which", lambda name: None)
    ok, why = nsys.available()
    assert not ok and "nsys" in why
    monkeypatch.setattr(nsys.shutil, "which", lambda name: "/usr/bin/nsys")
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ok, why = nsys.available(2)
    assert not ok and "2 GPUs" in why
    with pytest.raises(RuntimeError, match="2 GPUs"):
        nsys.record("tp", 2)


def test_missing_file_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="commands"):
        nsys.read_nsys(tmp_path / "none.sqlite")
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("create table StringIds (id int, value text)").connection.commit()
    with pytest.raises(ValueError, match="-t cuda"):
        nsys.read_nsys(empty)


@pytest.fixture(scope="module")
def sample():
    return nsys.read_nsys(SAMPLE)


def test_reader_counts_match_sql(sample):
    db = sqlite3.connect(SAMPLE)
    per_device = dict(db.execute("select deviceId, count(*) from CUPTI_ACTIVITY_KIND_KERNEL group by deviceId"))
    nccl = dict(db.execute(
        "select k.deviceId, count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s "
        "on k.shortName = s.id where s.value like 'nccl%' group by k.deviceId"))
    assert sample.world_size == len(per_device) == 2
    for rank, device in enumerate(sorted(per_device)):
        comm = sample.of(rank, "comm")
        kernels = [s for s in sample.of(rank, "compute") if s.name not in ("memcpy", "memset")]
        assert len(comm) == nccl[device] and {s.op for s in comm} == {"send_recv"}
        assert len(comm) + len(kernels) == per_device[device]
    ranges = db.execute("select count(*) from NVTX_EVENTS where eventType in (59, 60) "
                        "and end is not null").fetchone()[0]
    assert len([s for s in sample.spans if s.kind == "range"]) == ranges


def test_reader_times_are_seconds_from_the_first_event(sample):
    db = sqlite3.connect(SAMPLE)
    lo, hi = db.execute("select min(start), max(end) from CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    kernels = [s for s in sample.spans if s.kind in ("compute", "comm") and s.name not in ("memcpy", "memset")]
    t0 = min(s.start for s in sample.spans)
    assert t0 == 0.0
    span = max(s.end for s in kernels) - min(s.start for s in kernels)
    assert math.isclose(span, (hi - lo) * 1e-9, rel_tol=1e-9)
    nvtx_names = {s.name for s in sample.spans if s.kind == "range"}
    assert {"ncclSend", "ncclRecv", "ncclGroupStart"} <= nvtx_names


def test_summary_uses_the_lab_measures(sample):
    rows = nsys.kernel_summary(sample)
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        comm = [(s.start, s.end) for s in sample.of(r["rank"], "comm")]
        assert math.isclose(r["comm_ms"], lab06.length(comm) * 1e3)
        assert 0 < r["comm_share"] < 1 and r["nccl_kernels"] == len(comm)
    header, rule, *lines = (line.split() for line in nsys.format_summary(rows).splitlines())
    assert " ".join(header) == "rank kernels NCCL window ms compute ms NCCL ms NCCL share"
    assert lines == [[str(r["rank"]), str(r["kernels"]), str(r["nccl_kernels"]),
                      f"{r['window_ms']:.1f}", f"{r['compute_ms']:.1f}", f"{r['comm_ms']:.1f}",
                      f"{r['comm_share']:.1%}"] for r in rows]


def test_lab_falls_back_to_the_sample(monkeypatch, capsys):
    monkeypatch.setattr(nsys, "available", lambda nproc=2: (False, "no nsys in this test"))
    tl = nsys.timeline_for_lab()
    out = capsys.readouterr().out
    assert "no nsys in this test" in out and tl is not None and tl.world_size == 2


# ---- the copies shipped with the course (data/traces) ---------------------------------------

def test_lab_reads_the_shipped_export_where_nsys_is_absent(monkeypatch, capsys):
    from distlab import paths
    assert nsys.SAMPLE.is_relative_to(paths.data()) and nsys.SAMPLE.exists()
    monkeypatch.setattr(nsys.shutil, "which", lambda name: None)
    timeline = nsys.timeline_for_lab("tp", nproc=2)
    assert timeline is not None and timeline.world_size == 2
    assert "No fresh nsys profile" in capsys.readouterr().out


def test_trimmed_export_reads_exactly_as_the_original():
    entry = digests(gpu_traces.NSYS_2GPU)
    assert SAMPLE == gpu_traces.trace_path(gpu_traces.NSYS_2GPU)
    assert trace_digests.file_sha256(SAMPLE) == entry["sha256"]
    assert trace_digests.spans_sha256(SAMPLE) == entry["spans_sha256"]


@pytest.mark.parametrize("name", trace_digests.UNCHANGED)
def test_shipped_kineto_traces_are_the_originals_unchanged(name):
    assert trace_digests.file_sha256(gpu_traces.trace_path(name)) == digests(name)["sha256"]


def test_the_manifest_covers_every_shipped_trace():
    shipped = {p.name for p in gpu_traces.folder().iterdir()} - {"NOTICE.md", trace_digests.MANIFEST}
    assert set(json.loads((gpu_traces.folder() / trace_digests.MANIFEST).read_text())["files"]) \
        == shipped


def test_shipped_traces_carry_their_notice():
    notice = (gpu_traces.folder() / "NOTICE.md").read_text()
    for name in (gpu_traces.KINETO_A100, gpu_traces.NSYS_2GPU):
        assert name in notice and gpu_traces.trace_path(name).exists()
    assert "GindaChen" in notice and "Meta Platforms" in notice and "MIT" in notice


def test_gpu_measures_equal_the_checks_references():
    for timeline in (gpu_traces.a100_timeline(), gpu_traces.nsys_timeline()):
        for rank in range(timeline.world_size):
            window = gpu_traces.gpu_window(timeline, rank)
            got = gpu_traces.measures(timeline, rank)
            assert got["nccl_share"] == pytest.approx(lab06.reference_comm_share(timeline, rank, window))
            assert got["exposed_s"] == pytest.approx(lab06.reference_exposed_comm(timeline, rank, window))
    a100 = gpu_traces.a100_timeline()
    assert gpu_traces.measures(a100, 0)["overlap"] == pytest.approx(lab06.reference_overlap_fraction(a100, 0))
    assert 0 < gpu_traces.measures(a100, 0)["overlap"] < 1   # DDP's all-reduces partly hidden
