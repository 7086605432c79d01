"""The programs a student takes to a cluster (distlab/cluster/): their pieces, a small run of each
on local ranks, and the messages for settings that cannot work. README.md's "On a cluster"
commands, on a real two-node Slurm cluster, are tests/test_readme.py's ``test_cluster_commands``;
bench/gpu_check.sh's answer on a machine without a GPU is here too.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distlab.cluster import busbw, group, traffic, train3d
from distlab.cluster.group import Placement, SettingsError
from distlab.labs.mesh import MeshShape

REPO = Path(__file__).resolve().parents[1]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def program(module: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m distlab.cluster.MODULE ARGV`` with ``env`` added (a bound, not an assertion:
    each of these answers within seconds)."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", f"distlab.cluster.{module}", *argv], cwd=REPO,
                          env=dict(environ, PYTHONPATH=str(REPO), **env), capture_output=True,
                          text=True, timeout=240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Pieces

def test_sizes_are_read_and_doubled_as_nccl_tests_does():
    assert [busbw.parse_size(s) for s in ("8", "64K", "1M", "1G", "2 MiB")] == \
        [8, 64 << 10, 1 << 20, 1 << 30, 2 << 20]
    assert busbw.message_sizes(8, 64) == [8, 16, 32, 64]
    with pytest.raises(SettingsError, match="64X"):
        busbw.parse_size("64X")
    with pytest.raises(SettingsError, match="--min-bytes"):
        busbw.message_sizes(64, 8)


def test_bus_factors_are_nccl_tests():
    assert busbw.bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert all(busbw.bus_factor(op, 4) == pytest.approx(0.75)
               for op in ("all_gather", "reduce_scatter", "all_to_all"))


@pytest.mark.parametrize("op", busbw.OPS)
@pytest.mark.parametrize("nbytes", [8, 24, 64, 4096])
def test_buffers_hold_exactly_the_size_nccl_tests_counts(op, nbytes):
    x, y = busbw._buffers(op, nbytes, 4)
    counted = y if op == "all_gather" else x
    assert counted.numel() * counted.element_size() == nbytes
    if y is not None and op != "all_to_all":
        assert max(x.numel(), y.numel()) == 4 * min(x.numel(), y.numel())


def test_compare_takes_ranks_of_one_node_and_one_rank_of_each_node():
    within, across = busbw.compare_groups(Placement(8, 4, True))
    assert within[1] == [0, 1] and across[1] == [0, 4]
    with pytest.raises(SettingsError, match="2 nodes"):
        busbw.compare_groups(Placement(4, 4, True))


def test_mesh_puts_tp_inside_a_node_and_pp_dp_across():
    assert train3d.mesh_shape(Placement(16, 8, True), None, None) == MeshShape(pp=2, dp=1, tp=8)
    assert train3d.mesh_shape(Placement(32, 8, True), None, None) == MeshShape(pp=2, dp=2, tp=8)
    assert train3d.mesh_shape(Placement(24, 8, True), None, None) == MeshShape(pp=1, dp=3, tp=8)
    assert train3d.mesh_shape(Placement(8, 2, False), 2, 2) == MeshShape(pp=2, dp=2, tp=2)
    cfg = train3d.model_config(MeshShape(pp=2, dp=2, tp=8), 3)
    assert cfg.heads == 8 and cfg.batch % 4 == 0 and cfg.layers >= 2


def test_axis_groups_and_traffic_by_axis():
    shape = MeshShape(pp=2, dp=2, tp=2)
    groups = traffic.axis_groups(shape.coords, 8, 5, ("pp", "dp", "tp"))
    assert groups == {"pp": (1, 5), "dp": (5, 7), "tp": (4, 5)}
    calls = [((4, 5), "all_reduce", 100), ((1, 5), "isend", 10), ((1, 5), "irecv", 10),
             ((5, 7), "all_gather_into_tensor", 40), ((0, 1, 2, 3, 4, 5, 6, 7), "barrier", 0)]
    counted = traffic.per_axis(calls, groups)
    assert counted["tp"] == {"calls": 1, "bytes": 100}
    assert counted["pp"] == {"calls": 1, "bytes": 10}   # the receive is the sender's bytes
    assert counted["dp"] == {"calls": 1, "bytes": 40} and counted["other"]["calls"] == 1


def test_endpoint_check_names_host_and_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        group.check_endpoint("127.0.0.1", server.getsockname()[1], wait=5)   # answers: returns
    port = free_port()
    with pytest.raises(SettingsError, match=rf"127\.0\.0\.1:{port} cannot be reached: nothing"):
        group.check_endpoint("127.0.0.1", port, wait=0.5)
    with pytest.raises(SettingsError, match=r"no-such-host\.invalid:29500 .* does not resolve"):
        group.check_endpoint("no-such-host.invalid", 29500, wait=5)


# ---------------------------------------------------------------------------------------------
# Settings that cannot work: one message, status 2, before any rank waits

def test_more_processes_than_gpus_under_nccl():
    nproc = str(max(2, GPUS + 1))
    done = program("busbw", "--backend", "nccl", "--nproc", nproc)
    assert done.returncode == 2, done.stderr
    assert f"needs a GPU for every process of a node: {nproc} processes per node (--nproc " \
           f"{nproc}) but {GPUS} GPU(s)" in done.stderr, done.stderr
    # Under torchrun: the flag to change is torchrun's, and the sbatch scripts' setting.
    done = program("train3d", "--backend", "nccl", RANK="0", WORLD_SIZE=nproc,
                   LOCAL_WORLD_SIZE=nproc, LOCAL_RANK="0")
    assert done.returncode == 2, done.stderr
    assert f"(--nproc_per_node {nproc} (GPUS_PER_NODE in cluster/slurm/*.sbatch))" in done.stderr


def test_unreachable_rendezvous_endpoint_is_reported_by_host_and_port():
    port = free_port()     # nothing listens there
    done = program("busbw", RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DISTLAB_RENDEZVOUS_WAIT="1")
    assert done.returncode == 2, done.stderr
    assert f"rendezvous endpoint 127.0.0.1:{port} cannot be reached" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = program("train3d", RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="1", MASTER_PORT="29500",
                   MASTER_ADDR="no-such-host.invalid", DISTLAB_RENDEZVOUS_WAIT="1")
    assert done.returncode == 2 and "no-such-host.invalid:29500" in done.stderr, done.stderr


def test_each_node_checks_the_endpoint_before_its_torchrun_agent_starts():
    # What cluster/slurm/torchrun.sh runs on each node: the first node (which hosts the
    # endpoint) checks the name only, the others wait for an answer.
    port = free_port()
    done = program("group", f"127.0.0.1:{port}", "--node-rank", "1", "--wait", "1")
    assert done.returncode == 2, done.stderr
    assert f"rendezvous endpoint 127.0.0.1:{port} cannot be reached" in done.stderr
    assert program("group", f"127.0.0.1:{port}", "--node-rank", "0").returncode == 0
    done = program("group", "no-such-host.invalid:29500", "--node-rank", "0")
    assert done.returncode == 2 and "'no-such-host.invalid' does not resolve" in done.stderr
    script = (REPO / "cluster" / "slurm" / "torchrun.sh").read_text()
    assert '-m distlab.cluster.group "$MASTER_ADDR:$MASTER_PORT" --node-rank "$SLURM_PROCID"' \
        in script


def test_the_endpoint_check_imports_no_torch():
    # Each node of every Slurm job runs it before its torchrun agent: torch's import there was
    # about 2 CPU-seconds a node and a job, for a socket check.
    done = program("group", f"127.0.0.1:{free_port()}", "--node-rank", "0",
                   PYTHONPROFILEIMPORTTIME="1")
    assert done.returncode == 0, done.stderr
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", done.stderr, re.M)
    assert "distlab.cluster" in imported, done.stderr[-2000:]   # the listing works
    assert not [m for m in imported if m.split(".")[0] == "torch"], done.stderr[-2000:]


def test_failures_become_one_message_and_a_status():
    from distlab.runtime.outcome import RankCrashed

    def fails(exc):
        def main(argv):
            raise exc
        return main

    assert group.guarded("prog", fails(SettingsError("no such thing"))) == 2
    assert group.guarded("prog", fails(RankCrashed("rank 1 died"))) == 1
    with pytest.raises(KeyError):      # not a run's failure: the traceback, as before
        group.guarded("prog", fails(KeyError("x")))


def test_world_size_that_does_not_fit_the_mesh():
    done = program("train3d", "--nproc", "6", "--tp", "2", "--pp", "2")
    assert done.returncode == 2, done.stderr
    assert "world size 6 does not fit the mesh: TP=2 x PP=2 = 4" in done.stderr, done.stderr
    done = program("train3d", RANK="0", WORLD_SIZE="6", LOCAL_WORLD_SIZE="3")   # TP=3 x PP=2
    assert done.returncode == 2 and "world size 6 does not fit" not in done.stderr
    assert "heads" in done.stderr or "TP=3" in done.stderr, done.stderr
    done = program("train3d", "--nproc", "4", "--nproc-per-node", "2", "--tp", "4")
    assert done.returncode == 2 and "a TP group must lie inside one node" in done.stderr


# ---------------------------------------------------------------------------------------------
# Small runs on local ranks (gloo; the README test runs the README's commands and the Slurm ones)

def test_sweep_within_and_across_pretend_nodes():
    done = program("busbw", "--compare", "--max-bytes", "32", "--warmup", "1", "--iters", "2")
    assert done.returncode == 0, done.stderr
    assert "4 ranks = 2 node(s) x 2 process(es)" in done.stdout
    for label in ("# within a node (2 ranks of node 0)", "# across nodes (1 rank on each of 2"):
        section = done.stdout.split(label, 1)[1]
        for op in busbw.OPS:
            sizes = re.findall(rf"^{op}\s+(\d+ B)\s", section, re.M)[:3]
            assert sizes == ["8 B", "16 B", "32 B"], (op, done.stdout)
    assert re.search(r"^all_to_all\s+[\d.]+ GB/s within\s+[\d.]+ GB/s across", done.stdout, re.M)


def test_3d_run_on_four_ranks_equals_single_process_training():
    done = program("train3d", "--nproc", "4", "--tp", "2", "--pp", "2", "--steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mesh PP=2 x DP=1 x TP=2" in done.stdout
    assert "losses equal single-process training's" in done.stdout, done.stdout
    assert re.search(r"^tp\s+2\s+within a node\s+[\d.]+\s+[\d.]+$", done.stdout, re.M), done.stdout
    assert re.search(r"^pp\s+2\s+across nodes\s+[\d.]+\s+[\d.]+$", done.stdout, re.M), done.stdout


def test_3d_run_with_pp_and_dp_across_nodes_equals_single_process_training():
    # One process per pretend node, so PP=2 and DP=2 both cross nodes (the README's two Slurm
    # nodes, tests/test_readme.py, cross them with PP only; four slurmd daemons on two cores
    # took over 13 minutes in CI, so that case runs here, without Slurm).
    done = program("train3d", "--nproc", "4", "--tp", "1", "--pp", "2", "--steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 ranks = 4 node(s) x 1 process(es)" in done.stdout, done.stdout
    assert "mesh PP=2 x DP=2 x TP=1" in done.stdout
    assert "losses equal single-process training's" in done.stdout, done.stdout
    for axis in ("pp", "dp"):
        assert re.search(rf"^{axis}\s+2\s+across nodes\s+[\d.]+\s+[\d.]+$", done.stdout,
                         re.M), done.stdout


# ---------------------------------------------------------------------------------------------
# bench/gpu_check.sh

def test_gpu_check_without_a_gpu_says_so_and_exits(tmp_path):
    # No nvidia-smi on PATH: the script must not import torch or run anything else.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "date", "dirname", "grep", "hostname", "cat", "mkdir"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    reports = sorted((REPO / "bench" / "reports").iterdir())
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], cwd=tmp_path,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no NVIDIA GPU here" in done.stdout and "no report written" in done.stdout, done.stdout
    assert sorted((REPO / "bench" / "reports").iterdir()) == reports
