"""Lab 12's restartable training under torchrun, whose agent restarts every worker when one
dies (``--max-restarts``); the workers resume from the newest complete checkpoint::

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m distlab.labs.checkpoint.torchrun_job FOLDER --steps 6 --save-every 2 --crash-at 1:5

``--crash-at RANK:STEP``: that worker kills itself (SIGKILL) on reaching STEP, once per FOLDER,
so that the restarted workers go past it. Rank 0 writes what the final workers saw to
FOLDER/result.pt: {"resumed_from", "losses", "params", "restart"} (torchrun's restart count).
The loop is ``distlab.labs.checkpoint.restart.train_resumable``, the one ``distlab.run`` runs.
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
    args = parser.parse_args(argv)
    crash = tuple(int(v) for v in args.crash_at.split(":")) if args.crash_at else None
    import distlab
    from distlab.labs.checkpoint.restart import train_resumable
    world_size = int(os.environ["WORLD_SIZE"])
    out = distlab.run(train_resumable, world_size, args.folder, args.steps, args.save_every,
                      asynchronous=args.asynchronous, crash_once=crash)
    if int(os.environ["RANK"]) == 0:
        result = dict(out[0], restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)))
        path = os.path.join(args.folder, "result.pt")
        torch.save(result, path + ".tmp")
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
