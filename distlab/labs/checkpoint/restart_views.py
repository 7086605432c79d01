"""What Lab 12's Section 4 shows with the student's own loop: a run that loses a rank (killed
from outside by the launcher, ``distlab.runtime.kill``), relaunched on its folder, drawn against
the uninterrupted run; and the same loop under ``torchrun --max-restarts``, whose agent restarts
the workers itself (``torchrun_job``)."""
from __future__ import annotations

import os
import subprocess
import sys

STEP_PREFIX = "step_"


def step_folders(root: str) -> list[dict]:
    """One row per step folder under ``root``: its step and whether the save finished (rank 0
    writes ``.metadata`` last)."""
    rows = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if name.startswith(STEP_PREFIX):
            done = os.path.exists(os.path.join(root, name, ".metadata"))
            rows.append({"folder": name, "complete": "yes" if done else "no (.metadata missing)"})
    return rows


def kill_and_relaunch(train, save, load, root: str, world_size: int = 2, steps: int = 8,
                      save_every: int = 2, victim: int = 1, kill_at: int = 6,
                      timeout: float = 120) -> dict:
    """``train(rank, world_size, folder, steps, save_every, save, load)`` three times under
    ``root``: uninterrupted (``root/uninterrupted``); killed from outside by SIGKILL as rank
    ``victim`` starts training step ``kill_at`` (``root/killed``); relaunched on that folder.
    Returns both runs' results, the launcher's message and the folders the kill left. The
    defaults are the check's visible case (``distlab.checks.lab12_restart``): the kill two steps
    after the second save, so that a complete save is surely left (step 2's, or step 4's where
    its write finished before the signal) and the relaunch has steps to train."""
    import distlab
    from distlab.runtime.kill import DEFAULT_GROUP, KillPlan, killing
    from distlab.runtime.outcome import RankCrashed
    clean, killed = os.path.join(root, "uninterrupted"), os.path.join(root, "killed")
    uninterrupted = distlab.run(train, world_size, clean, steps, save_every, save, load,
                                timeout=timeout)[0]
    message = "the run finished before the kill"
    with killing(KillPlan(rank=victim, call=kill_at)):
        try:
            distlab.run(train, world_size, killed, steps, save_every, save, load,
                        timeout=timeout)
        except RankCrashed as exc:
            message = str(exc).split("\nEvery rank was stopped")[0]
    left = step_folders(killed)
    relaunched = distlab.run(train, world_size, killed, steps, save_every, save, load,
                             timeout=timeout)
    return {"uninterrupted": uninterrupted, "relaunched": relaunched[0], "message": message,
            "left": left, "victim": victim, "kill_at": kill_at, "steps": steps,
            "trained": [sum(1 for c in rank if c.op == "all_reduce" and not c.threaded
                            and c.group_name == DEFAULT_GROUP) for rank in relaunched.comms]}


def same_to_the_bit(run: dict) -> bool:
    """The relaunch's losses and parameters equal the uninterrupted run's, bit for bit."""
    import torch
    a, b = run["relaunched"], run["uninterrupted"]
    return all(a["losses"][s] == b["losses"][s] for s in a["losses"]) and all(
        torch.equal(a["params"][k], b["params"][k]) for k in b["params"])


def plot_restart(run: dict, ax=None):
    """The uninterrupted run's loss per step, the relaunch's on top from the step it resumed at;
    the kill and the work it cost (from the checkpoint to the kill) marked."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    clean, again = run["uninterrupted"]["losses"], run["relaunched"]["losses"]
    ax.plot(sorted(clean), [clean[s] for s in sorted(clean)], "-", color="0.5", lw=2,
            label="uninterrupted")
    ax.plot(sorted(again), [again[s] for s in sorted(again)], "o", color="C3", ms=6, mfc="none",
            label="relaunched after the kill")
    resumed = run["relaunched"]["resumed_from"] or 0
    ax.axvline(run["kill_at"], color="k", ls=":", lw=1,
               label=f"rank {run['victim']} killed (SIGKILL) as step {run['kill_at']} began")
    ax.axvspan(resumed, run["kill_at"], color="C3", alpha=0.12,
               label=f"steps trained twice (checkpoint {resumed} to the kill)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over ranks)")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("A rank killed by SIGKILL, the run relaunched from its checkpoint")
    ax.figure.tight_layout()
    return ax


def _agent_line(line: str) -> bool:
    """The agent's own lines about a worker's failure and the restart (not the workers'
    tracebacks, which start with [rankN])."""
    return not line.startswith("[rank") and any(
        key in line for key in ("failed (exitcode", "closing signal", "will restart"))


def torchrun_restart(train, save, load, folder: str, steps: int = 8, save_every: int = 2,
                     crash_at: tuple[int, int] = (1, 5), nproc: int = 2,
                     timeout: float = 300) -> dict:
    """Run ``train`` under ``torchrun --standalone --nproc-per-node=nproc --max-restarts=1``
    (``torchrun_job --loop``): worker ``crash_at[0]`` kills itself (SIGKILL) as its loop is
    about to save step ``crash_at[1]`` (a multiple of save_every), once; the agent restarts
    both workers, which resume from the newest complete checkpoint. The loop travels to the
    workers as a file (cloudpickle) in ``folder``; torchrun's temporary files stay there too.
    Returns the final workers' result (``result.pt``) and the agent's lines about the failure
    and the restart."""
    import cloudpickle
    import torch
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(os.path.join(folder, "run"), exist_ok=True)
    loop = os.path.join(folder, "loop.pkl")
    with open(loop, "wb") as f:
        cloudpickle.dump((train, save, load), f)
    from distlab import paths
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(paths.PACKAGE.parent), os.environ.get("PYTHONPATH")])), TMPDIR=folder,
        # torch 2.13's agent shares its TCPStore with the workers, and restarted gloo workers
        # then read their peers' addresses of the attempt before (pytorch issue 135712)
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--max-restarts=1",
               "-m", "distlab.labs.checkpoint.torchrun_job", os.path.join(folder, "run"),
               "--steps", str(steps), "--save-every", str(save_every), "--loop", loop,
               "--crash-at", f"{crash_at[0]}:{crash_at[1]}"]
    done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(os.path.join(folder, "torchrun.log"), "w") as f:
        f.write(done.stderr)
    # the message, without the logger's prefix (level, time, pid, file)
    shown = ["agent: " + line.split("] ", 1)[-1] for line in done.stderr.splitlines()
             if _agent_line(line)]
    result = torch.load(os.path.join(folder, "run", "result.pt"), weights_only=True)
    shown_command = " ".join(os.path.relpath(a) if a.startswith(folder) else a
                             for a in command[3:])
    return {"command": "torchrun " + shown_command, "agent": shown, "result": result}
