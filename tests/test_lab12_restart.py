"""Lab 12's restart: a rank killed from outside with SIGKILL is reported as killed (not as a
hang), and the loop started again on the same folder resumes from its last complete checkpoint
and ends on the uninterrupted run's losses and parameters; the same under torchrun, whose agent
restarts the workers (--max-restarts) after one kills itself."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distlab
from distlab.labs.checkpoint.restart import KillAt, complete_checkpoints, train_resumable

REPO = Path(__file__).resolve().parents[1]
STEPS, SAVE_EVERY, VICTIM, KILL_AT = 6, 2, 1, 5     # killed before step 5: resumes from step 4


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab12-uninterrupted")
    out = distlab.run(train_resumable, 2, str(root), STEPS, SAVE_EVERY, timeout=240)
    shutil.rmtree(root)
    return out[0]


def _assert_lands_on(resumed: dict, reference: dict, first_step: int):
    assert sorted(resumed["losses"]) == list(range(first_step, STEPS + 1))
    for step, loss in resumed["losses"].items():
        assert loss == reference["losses"][step], step        # bit for bit
    for name, value in reference["params"].items():
        assert torch.equal(resumed["params"][name], value), name


def test_a_rank_killed_from_outside_is_reported_and_the_run_resumes(uninterrupted, tmp_path):
    with KillAt(str(tmp_path)) as killer:
        with pytest.raises(distlab.RankCrashed) as crashed:
            distlab.run(train_resumable, 2, str(tmp_path), STEPS, SAVE_EVERY,
                        kill=(VICTIM, KILL_AT), timeout=240)
    assert killer.killed is not None
    # the launcher names the rank and the signal: a death, not a hang
    assert f"rank {VICTIM} died: its process was killed by SIGKILL" in str(crashed.value)
    assert [step for step, _ in complete_checkpoints(str(tmp_path))] == [2, 4]
    out = distlab.run(train_resumable, 2, str(tmp_path), STEPS, SAVE_EVERY, timeout=240)
    assert out[0]["resumed_from"] == 4
    for rank in range(2):
        _assert_lands_on(out[rank], uninterrupted, 5)


def test_an_unfinished_save_is_skipped_on_restart(uninterrupted, tmp_path):
    # saved asynchronously up to step 4; then a rank died while step 6's save was written: no
    # .metadata, so the restart takes step 4's
    first = distlab.run(train_resumable, 2, str(tmp_path), 4, SAVE_EVERY, asynchronous=True,
                        timeout=240)
    assert first[0]["resumed_from"] is None
    (tmp_path / "step_000006").mkdir()
    (tmp_path / "step_000006" / "__0_0.distcp").write_bytes(b"half")
    out = distlab.run(train_resumable, 2, str(tmp_path), STEPS, SAVE_EVERY, timeout=240)
    assert out[0]["resumed_from"] == 4
    _assert_lands_on(out[0], uninterrupted, 5)


def test_torchrun_restarts_the_workers_and_the_run_lands_on_the_same_losses(uninterrupted,
                                                                          tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        TMPDIR=str(tmp_path),   # torchrun's own temporary files stay in the run's folder
        # torch 2.13's agent shares its TCPStore with the workers, and restarted gloo workers
        # then read their peers' addresses of the attempt before (pytorch issue 135712)
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    folder = tmp_path / "run"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=1", "-m", "distlab.labs.checkpoint.torchrun_job", str(folder),
         "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
         "--crash-at", f"{VICTIM}:{KILL_AT}"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "exitcode: -9" in done.stderr     # the agent saw the SIGKILL, then restarted
    result = torch.load(folder / "result.pt", weights_only=True)
    assert result["restart"] == 1 and result["resumed_from"] == 4
    _assert_lands_on(result, uninterrupted, 5)
