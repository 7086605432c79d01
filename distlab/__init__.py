"""distlab: labs on training large models across many devices.

The labs call ``distlab.run(fn, world_size, *args)``, which runs ``fn(rank, world_size, *args)`` on
real ``torch.distributed`` ranks (gloo on CPU, NCCL when each rank can have a GPU) and returns the
ranks' results in rank order, with each rank's collective record in ``.comms``.
"""
import importlib as _importlib
import os as _os
import sys as _sys

__all__ = ["run", "warm_up", "Comm", "Results", "DistributedError", "RankError", "RankCrashed",
           "HangError"]


def __getattr__(name: str):
    # Imported on first use, not with the package: `python -m distlab.runtime.zygote` and
    # `python -m distlab.runtime.landlock` must confine themselves before torch starts its first thread.
    if name in __all__:
        module = _importlib.import_module("distlab.runtime.comms" if name == "Comm" else "distlab.runtime.launch")
        return getattr(module, name)
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")

# In a notebook, start the rank launcher while the student reads: the first run is then fast.
# The grader's kernels do not (DISTLAB_WARM_UP=0): a graded notebook's checks run on the judge's
# ranks, and a launcher started for nothing costs the grading machine seconds of CPU time.
if "ipykernel" in _sys.modules and not _os.environ.get("DISTLAB_ZYGOTE") \
        and not _os.environ.get("RANK") and _os.environ.get("DISTLAB_WARM_UP") != "0":
    __getattr__("warm_up")()
