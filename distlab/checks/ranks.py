"""How a check runs a student's code on ranks: on which backends, and how long before the ranks
count as hung. The grader chooses both (``distlab grade --backend --rank-timeout``) and hands them
to every process that runs checks (its judge, the kernels) in the environment, read once per
call into an immutable ``CheckSettings``; a student's own notebook gets the defaults.
"""
from __future__ import annotations

import dataclasses
import os

from distlab.runtime.stuck import ENV_STUCK_AFTER

ENV_BACKEND, ENV_RANK_TIMEOUT = "DISTLAB_BACKEND", "DISTLAB_RANK_TIMEOUT"


@dataclasses.dataclass(frozen=True)
class CheckSettings:
    backend: str = "auto"        # gloo, nccl, auto, or both (gloo, and NCCL where GPUs allow)
    rank_timeout: float = 60.0   # seconds before a check's ranks are declared hung

    @classmethod
    def current(cls) -> "CheckSettings":
        return cls(backend=os.environ.get(ENV_BACKEND, cls.backend),
                   rank_timeout=float(os.environ.get(ENV_RANK_TIMEOUT, cls.rank_timeout)))

    def environ(self) -> dict[str, str]:
        """The environment variables that hand these settings to another process. Ranks that
        are stuck count as hung after ``rank_timeout`` in every run there, a lab helper's with a
        longer timeout included (``distlab.runtime.stuck.stuck_after``)."""
        return {ENV_BACKEND: self.backend, ENV_RANK_TIMEOUT: str(self.rank_timeout),
                ENV_STUCK_AFTER: str(self.rank_timeout)}


def rank_timeout() -> float:
    """Seconds a check's ``distlab.run`` waits before declaring the ranks hung."""
    return CheckSettings.current().rank_timeout


def backends(world_size: int) -> list[str]:
    """The backends each check runs on; "both" is gloo plus NCCL where every rank can have a GPU."""
    choice = CheckSettings.current().backend
    if choice != "both":
        return [choice]
    import torch
    return ["gloo"] + (["nccl"] if torch.cuda.device_count() >= world_size else [])


def run_each_backend(fn, world_size: int, *args) -> list:
    """[(backend, results)] of ``distlab.run(fn, world_size, *args)`` on each of ``backends()``."""
    import distlab
    return [(b, distlab.run(fn, world_size, *args, backend=b, timeout=rank_timeout()))
            for b in backends(world_size)]


def call_each(fn, calls: list[tuple]) -> list:
    """``[fn(*args) for args in calls]``, run on one rank in one launch. A check that calls a
    student's function on many cases (every step of every rank of a trace) pays one rank's start
    instead of one per call (in the judge, each call of a submitted function is a launch). Each
    call gets its own copy of its arguments, as a launch of its own would: a function that
    changes what it was given cannot change a later case."""
    import distlab
    return distlab.run(_call_each, 1, fn, [tuple(args) for args in calls], backend="gloo",
                       timeout=rank_timeout())[0]


def _call_each(rank: int, world_size: int, fn, calls: list[tuple]) -> list:
    import pickle
    # Copied by pickling (faster than deepcopy on a trace's dicts): calls may share a timeline.
    return [fn(*pickle.loads(pickle.dumps(args))) for args in calls]
