"""distlab: labs on training large models across many devices.

The labs call ``distlab.run(fn, world_size, *args)``, which runs ``fn(rank, world_size, *args)`` on
real ``torch.distributed`` ranks (gloo on CPU, NCCL when each rank can have a GPU) and returns the
ranks' results in rank order, with each rank's collective record in ``.comms``.
"""
import os as _os
import sys as _sys

from distlab.comms import Comm
from distlab.launch import (DistributedError, HangError, RankCrashed, RankError, Results, run,
                            warm_up)

__all__ = ["run", "warm_up", "Comm", "Results", "DistributedError", "RankError", "RankCrashed",
           "HangError"]

# In a notebook, start the rank launcher while the student reads: the first run is then fast.
if "ipykernel" in _sys.modules and not _os.environ.get("DISTLAB_ZYGOTE") \
        and not _os.environ.get("RANK"):
    warm_up()
