"""Lab 12's restartable training under torchrun, whose agent restarts every worker when one
dies (``--max-restarts``); the workers resume from the newest complete checkpoint::

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m distlab.labs.checkpoint.torchrun_job FOLDER --steps 6 --save-every 2 --crash-at 1:5

``--crash-at RANK:STEP``: that worker kills itself (SIGKILL) on reaching STEP, once per FOLDER,
so that the restarted workers go past it. Rank 0 writes what the final workers saw to
FOLDER/result.pt (or ``--result PATH``): {"resumed_from", "losses", "params", "restart"
(torchrun's restart count on rank 0's node), "restarts" (each rank's)}, and prints a summary.
Under Slurm: cluster/slurm/restart.sbatch, one torchrun agent per node.
The loop is ``distlab.labs.checkpoint.restart.train_resumable``, the one ``distlab.run`` runs,
or, with ``--loop FILE``, a loop of your own: ``(train, save, load)`` pickled with cloudpickle
(``restart_views.torchrun_restart`` writes it), ``train(rank, world_size, folder, steps,
save_every, save, load)``; there the crashing worker kills itself as its loop is about to save
STEP (a multiple of --save-every).

torch's agent shares its rendezvous TCPStore with the workers (unless
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), and that store outlives a restart: restarted gloo workers
would read their peers' addresses of the attempt before and fail to connect. On one node the
workers here make their group on keys of their own attempt (``join_group``); across nodes the
agents' restart counts differ (each counts its own), so there the setting is needed, and
cluster/slurm/torchrun.sh sets it whenever MAX_RESTARTS > 0.
"""
from __future__ import annotations

import argparse
import atexit
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def join_group(timeout: float = 300) -> None:
    """Make the default process group under torchrun's shared store, on keys prefixed by the
    restart count (TORCHELASTIC_RESTART_COUNT): each attempt's workers meet afresh. Without a
    shared store (TORCHELASTIC_USE_AGENT_STORE not True) ``distlab.run`` makes the group as usual.
    """
    if dist.is_initialized() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", 1))
    if nodes > 1 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", 0)) > 0:
        # A node whose workers did not fail restarts them without counting: the attempts'
        # numbers differ between nodes, and the restarted workers could never meet.
        raise SystemExit(
            f"rank {rank}: torchrun restarts workers on {nodes} nodes sharing its agents' store, "
            f"where restarted workers cannot meet (each agent counts its own restarts). Set "
            f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every node's environment before torchrun "
            f"starts (cluster/slurm/torchrun.sh does, with MAX_RESTARTS > 0).")
    from distlab.runtime.devices import pick_backend
    backend = pick_backend("auto", int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world_size, is_master=False, timeout=timedelta(seconds=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"distlab/attempt-{attempt}", store),
                            rank=rank, world_size=world_size)
    atexit.register(_leave_group)   # a gloo group alive at exit aborts the interpreter


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--asynchronous", action="store_true")
    parser.add_argument("--crash-at", default=None, help="RANK:STEP")
    parser.add_argument("--loop", default=None, help="a cloudpickle file: (train, save, load)")
    parser.add_argument("--result", default=None, help="default FOLDER/result.pt")
    args = parser.parse_args(argv)
    crash = tuple(int(v) for v in args.crash_at.split(":")) if args.crash_at else None
    import distlab
    from distlab.labs.checkpoint.restart import train_resumable
    world_size = int(os.environ["WORLD_SIZE"])
    join_group()
    if args.loop:
        out = distlab.run(run_loop, world_size, args.folder, args.steps, args.save_every,
                          args.loop, crash)
    else:
        out = distlab.run(train_resumable, world_size, args.folder, args.steps, args.save_every,
                          asynchronous=args.asynchronous, crash_once=crash)
    # Each agent counts its own restarts: a node whose workers did not fail may restart them
    # without counting (it joins the next round the failed node opened).
    restarts = [None] * world_size
    dist.all_gather_object(restarts, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
    if int(os.environ["RANK"]) == 0:
        result = dict(out[0], restart=restarts[0], restarts=restarts)
        path = args.result or os.path.join(args.folder, "result.pt")
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)
        _summary(result, path)


def run_loop(rank: int, world_size: int, folder: str, steps: int, save_every: int, loop: str,
             crash: tuple | None):
    """The pickled loop in ``loop``; worker crash[0] dies as it is about to save step crash[1],
    once per folder (``restart._crash_once``)."""
    import cloudpickle
    from distlab.labs.checkpoint.restart import _crash_once
    with open(loop, "rb") as f:
        train, save, load = cloudpickle.load(f)

    def save_or_die(trainer, root):
        if crash and rank == crash[0] and trainer.steps_done == crash[1]:
            _crash_once(root)
        return save(trainer, root)

    return train(rank, world_size, folder, steps, save_every, save_or_die, load)


def _summary(result: dict, path: str) -> None:
    start = result["resumed_from"]
    print(f"{len(result['restarts'])} ranks; torchrun's restarts per rank: "
          f"{' '.join(map(str, result['restarts']))}; "
          + ("trained from step 0" if start is None else f"resumed from step {start}"))
    print(f"{'step':>6}  loss")
    for step, loss in sorted(result["losses"].items()):
        print(f"{step:>6}  {loss!r}")
    print(f"losses and parameters written to {path}", flush=True)


if __name__ == "__main__":
    main()
