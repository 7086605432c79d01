"""A student's ranks have no channel between them but the network (counted) and the store: each
writes only a folder of its own and cannot read another's, nor another rank's /proc entries
(distlab.runtime.rank._isolate)."""
import os

import pytest

from distlab import paths
from distlab.grading.settings import SYSTEM_READS, python_installation
from distlab.runtime.landlock import landlock_abi
from distlab.runtime.launch import Launcher, LaunchSettings

pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="Landlock is not available here")


def _probe(rank, world_size):
    """Rank 0 leaves a note in its folder and a pipe's end open; rank 1 looks for both."""
    import time
    import torch.distributed as dist
    found = {"cwd": os.getcwd()}
    if rank == 0:
        with open("note.txt", "w") as f:
            f.write("the answer")
        reading, _ = os.pipe()
        found["pipe"] = reading
    dist.barrier()
    shared = os.path.dirname(os.getcwd())
    pids = [None] * world_size
    dist.all_gather_object(pids, (os.getpid(), found.get("pipe"), os.getcwd()))
    if rank == 1:
        pid0, pipe0, folder0 = pids[0]
        for name, attempt in {
                "list the shared folder": lambda: os.listdir(shared),
                "read rank 0's note": lambda: open(os.path.join(folder0, "note.txt")).read(),
                "write beside rank 0": lambda: open(os.path.join(folder0, "mine.txt"), "w"),
                "write in the shared folder": lambda: open(os.path.join(shared, "x.txt"), "w"),
                "open rank 0's pipe": lambda: os.open(f"/proc/{pid0}/fd/{pipe0}", os.O_RDONLY),
                "read rank 0's environment": lambda: open(f"/proc/{pid0}/environ").read()}.items():
            try:
                attempt()
                found[name] = "allowed"
            except OSError as exc:
                found[name] = type(exc).__name__
        with open("own.txt", "w") as f:        # its own folder stays writable
            found["own folder"] = f.write("ok")
    dist.barrier()
    time.sleep(0.1)
    return found


def test_a_student_s_ranks_cannot_reach_each_other_but_through_the_network(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    # the ranks import this module (the probe's home) and the package, nothing else of the course
    readable = (*SYSTEM_READS, *python_installation(), str(paths.PACKAGE),
                os.path.dirname(__file__))
    launcher = Launcher(LaunchSettings(distrust=True, cwd=str(scratch), confine=(str(scratch),),
                                       readable=readable))
    try:
        out = launcher.run(_probe, 2, backend="gloo")
    finally:
        launcher.close()
    rank0, rank1 = out
    assert rank0["cwd"] != rank1["cwd"] and os.path.dirname(rank0["cwd"]) == str(scratch)
    denied = {k: v for k, v in rank1.items() if k not in ("cwd", "own folder")}
    assert denied and all(v != "allowed" for v in denied.values()), denied
    assert rank1["own folder"] == 2
