"""What Lab 2's checks hand each rank: the model (data parallelism replicates it), the
optimizer's settings and the rank's own rows; never the seed that draws every rank's rows, nor
an expected result (those stay in the judge, ``distlab.checks.lab02``)."""
from __future__ import annotations

import dataclasses

from distlab.labs.data_parallel import Setup, rank_rows
from distlab.runtime.per_rank import PerRank, nan_outside



@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The setup's optimizer settings, without the seed that draws the data."""
    lr: float
    weight_decay: float
    optimizer = Setup.optimizer     # the setup's own construction, from these two settings


def rank_inputs(setup: Setup, world_size: int, whole_batch: bool = False) -> tuple:
    """(model, optimizer settings, PerRank of (x, y)): each rank's own rows; with
    ``whole_batch`` (an interface that takes the full batch) the full shape, NaN outside the
    rank's rows, so a step on the whole batch yields NaN."""
    x, y = setup.data()
    n = setup.batch // world_size
    if whole_batch:
        rows = [(slice(r * n, (r + 1) * n),) for r in range(world_size)]
        data = [(nan_outside(x, keep), nan_outside(y, keep)) for keep in rows]
    else:   # copies: a view would pickle the whole batch
        data = [(rank_rows(x, r, world_size).clone(), rank_rows(y, r, world_size).clone())
                for r in range(world_size)]
    return setup.model(), Optimizer(setup.lr, setup.weight_decay), PerRank(data)
