"""Lab 12's restartable training under torchrun, whose agent restarts every worker when one
dies (``--max-restarts``); the workers resume from the newest complete checkpoint::

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m distlab.labs.checkpoint.torchrun_job FOLDER --steps 6 --save-every 2 --crash-at 1:5

``--crash-at RANK:STEP``: that worker kills itself (SIGKILL) on reaching STEP, once per FOLDER,
so that the restarted workers go past it. Rank 0 writes what the final workers saw to
FOLDER/result.pt: {"resumed_from", "losses", "params", "restart"} (torchrun's restart count).
The loop is ``distlab.labs.checkpoint.restart.train_resumable``, the one ``distlab.run`` runs,
or, with ``--loop FILE``, a loop of your own: ``(train, save, load)`` pickled with cloudpickle
(``restart_views.torchrun_restart`` writes it), ``train(rank, world_size, folder, steps,
save_every, save, load)``; there the crashing worker kills itself as its loop is about to save
STEP (a multiple of --save-every).
"""
from __future__ import annotations

import argparse
import os

import torch


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--asynchronous", action="store_true")
    parser.add_argument("--crash-at", default=None, help="RANK:STEP")
    parser.add_argument("--loop", default=None, help="a cloudpickle file: (train, save, load)")
    args = parser.parse_args(argv)
    crash = tuple(int(v) for v in args.crash_at.split(":")) if args.crash_at else None
    import distlab
    from distlab.labs.checkpoint.restart import train_resumable
    world_size = int(os.environ["WORLD_SIZE"])
    if args.loop:
        out = distlab.run(run_loop, world_size, args.folder, args.steps, args.save_every,
                          args.loop, crash)
    else:
        out = distlab.run(train_resumable, world_size, args.folder, args.steps, args.save_every,
                          asynchronous=args.asynchronous, crash_once=crash)
    if int(os.environ["RANK"]) == 0:
        result = dict(out[0], restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
        path = os.path.join(args.folder, "result.pt")
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)


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


if __name__ == "__main__":
    main()
