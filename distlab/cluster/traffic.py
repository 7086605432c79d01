"""Bytes each axis of a device mesh moved, per rank: the collective record (``out.comms``) holds
what went through ``torch.distributed``'s Python functions (FSDP's all-gathers and
reduce-scatters, the pipeline's sends and receives); ``distlab.labs.functional_collectives``
counts DTensor's (tensor parallelism), which it does not see. Sizes are counted as nccl-tests
and ``distlab.Comm.bytes`` count them."""
from __future__ import annotations


def axis_groups(coords_of, world_size: int, rank: int, names=("pp", "dp", "tp")) -> dict:
    """{axis: global ranks of this rank's group along it}: the ranks whose other coordinates
    (``coords_of(r)``) equal this rank's."""
    mine = coords_of(rank)
    return {axis: tuple(r for r in range(world_size)
                        if all(c == m for j, (c, m) in enumerate(zip(coords_of(r), mine))
                               if j != i))
            for i, axis in enumerate(names)}


def axis_of(group: tuple, groups: dict) -> str:
    """The axis a call's group belongs to: the axis group it equals, else the one it lies in
    (a pipeline's send names its pair of ranks), else "other"."""
    for axis, ranks in groups.items():
        if tuple(group) == ranks:
            return axis
    for axis, ranks in groups.items():
        if len(ranks) > 1 and set(group) <= set(ranks):
            return axis
    return "other"


def per_axis(calls, groups: dict) -> dict[str, dict]:
    """{axis: {"calls", "bytes"}} of (group, op, bytes) calls; receives are not counted (the
    sender counted the message)."""
    out = {axis: {"calls": 0, "bytes": 0} for axis in list(groups) + ["other"]}
    for group, op, nbytes in calls:
        if op in ("recv", "irecv"):
            continue
        row = out[axis_of(group, groups)]
        row["calls"] += 1
        row["bytes"] += nbytes
    return out
