"""Lab 12's restart under torchrun as the lab's teaching cell and cluster/slurm/restart.sbatch run
it: torch's agent shares its rendezvous store with the workers and keeps it across a restart
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset), and the restarted workers still meet and land on the
uninterrupted run. The two-node Slurm run is tests/test_readme.py's
``test_cluster_restart_command``."""
import os
import socket
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import distlab
from distlab.labs.checkpoint.restart import train_resumable

REPO = Path(__file__).resolve().parents[1]
# The teaching cell's command, after torchrun's own arguments.
JOB = ["-m", "distlab.labs.checkpoint.torchrun_job", "run", "--steps", "6", "--save-every", "2",
       "--crash-at", "1:5"]
STEPS, SAVE_EVERY, CRASH_STEP = 6, 2, 5


def _environ(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                TMPDIR=str(tmp_path))   # torchrun's log folders, which it leaves behind


def test_the_teaching_command_restarts_on_torchruns_shared_store(tmp_path):
    root = tmp_path / "uninterrupted"
    reference = distlab.run(train_resumable, 2, str(root), STEPS, SAVE_EVERY, timeout=240)[0]
    shutil.rmtree(root)
    (tmp_path / "run").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=1", *JOB], env=_environ(tmp_path), cwd=tmp_path, capture_output=True,
        text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "exitcode: -9" in done.stderr     # the agent saw the SIGKILL, then restarted
    result = torch.load(tmp_path / "run" / "result.pt", weights_only=True)
    assert result["restarts"] == [1, 1] and result["restart"] == 1
    resumed_from = (CRASH_STEP - 1) // SAVE_EVERY * SAVE_EVERY
    assert result["resumed_from"] == resumed_from
    assert sorted(result["losses"]) == list(range(resumed_from + 1, STEPS + 1))
    for step, loss in result["losses"].items():
        assert loss == reference["losses"][step], step        # bit for bit
        assert f"{step:>6}  {loss!r}" in done.stdout, done.stdout
    for name, value in reference["params"].items():
        assert torch.equal(result["params"][name], value), name
    assert "resumed from step 4" in done.stdout and "restarts per rank: 1 1" in done.stdout


def test_the_batch_script_outside_slurm_says_how_to_submit_it(tmp_path):
    done = subprocess.run(["bash", str(REPO / "cluster" / "slurm" / "restart.sbatch")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("SLURM")})
    assert done.returncode != 0
    assert "submit this with sbatch (README.md, On a cluster)" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())      # nothing made before the check



def test_restarts_across_nodes_on_a_shared_store_are_refused_with_the_setting_to_use(tmp_path):
    # Two agents on this host, as two nodes would run them, without
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: each agent counts its own restarts, so restarted
    # workers could never meet; every worker stops at once, naming its rank and the setting.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "run").mkdir()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
         "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
         "--rdzv-id=lab12", *JOB[:3]], env=_environ(tmp_path), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [agent.communicate(timeout=300) for agent in agents]
    assert all(agent.returncode != 0 for agent in agents), outputs
    errors = "".join(err for _, err in outputs)
    for rank in range(2):
        assert f"rank {rank}: torchrun restarts workers on 2 nodes sharing its agents' store" \
            in errors, errors[-3000:]
    assert "Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every node's environment" in errors
    assert not list((tmp_path / "run").iterdir())     # refused before any step
