"""Bytes each axis of a device mesh moved, per rank: the collective record (``out.comms``) holds
what went through ``torch.distributed``'s Python functions (FSDP's all-gathers and
reduce-scatters, the pipeline's sends and receives); DTensor's collectives (tensor parallelism)
are functional collectives, which it does not see, so ``FunctionalCollectives`` counts those
while a step runs (a dispatch mode, as ``CommDebugMode`` is). Sizes are counted as nccl-tests
and ``distlab.Comm.bytes`` count them."""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

# _c10d_functional op -> (index of the group name in its arguments, the counted buffer's size in
# bytes from the input tensor and the group's size)
_COUNTED = {
    "all_reduce": (2, lambda nbytes, n: nbytes),
    "all_gather_into_tensor": (2, lambda nbytes, n: nbytes * n),
    "reduce_scatter_tensor": (3, lambda nbytes, n: nbytes),
    "all_to_all_single": (3, lambda nbytes, n: nbytes),
}


class FunctionalCollectives(TorchDispatchMode):
    """``with FunctionalCollectives() as seen:`` ``seen.calls``: (global ranks of the group,
    op, bytes) of every functional collective this thread issued (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[tuple, str, int]] = []
        self._groups: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented   # let DTensor run first: its collectives come back through here
        if getattr(func, "namespace", None) == "_c10d_functional" and func._opname in _COUNTED:
            where, size = _COUNTED[func._opname]
            ranks = self._ranks(args[where])
            tensor = args[0]
            self.calls.append((ranks, func._opname,
                               size(tensor.numel() * tensor.element_size(), len(ranks))))
        return func(*args, **(kwargs or {}))

    def _ranks(self, name: str) -> tuple:
        if name not in self._groups:
            import torch.distributed as dist
            from torch.distributed.distributed_c10d import _resolve_process_group
            self._groups[name] = tuple(dist.get_process_group_ranks(_resolve_process_group(name)))
        return self._groups[name]


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
