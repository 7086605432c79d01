"""DTensor's collectives, counted. The collective record (``out.comms``) holds what goes through
``torch.distributed``'s Python functions (FSDP's all-gathers and reduce-scatters, a pipeline's
sends); DTensor (tensor parallelism) issues *functional* collectives, which it does not see. So
``FunctionalCollectives`` counts those while a step runs, as a dispatch mode (as PyTorch's own
``CommDebugMode`` is), each with the time it was issued, its group and the bytes of its whole
buffer as nccl-tests and ``distlab.Comm.bytes`` count them. Lab 7's mesh traffic and the
cluster's 3-D run read it."""
from __future__ import annotations

import time

from torch.utils._python_dispatch import TorchDispatchMode

# _c10d_functional op -> (index of the group name in its arguments, the whole buffer's bytes from
# the input's bytes and the group's size)
_COUNTED = {
    "all_reduce": (2, lambda nbytes, n: nbytes),
    "all_gather_into_tensor": (2, lambda nbytes, n: nbytes * n),
    "reduce_scatter_tensor": (3, lambda nbytes, n: nbytes),
    "all_to_all_single": (3, lambda nbytes, n: nbytes),
}


class FunctionalCollectives(TorchDispatchMode):
    """``with FunctionalCollectives() as seen:`` ``seen.calls``: (perf_counter time, global ranks
    of the group, op, bytes of the whole buffer) of every functional collective this thread
    issued, forward and backward."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[float, tuple, str, int]] = []
        self._groups: dict[str, tuple] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented   # let DTensor run first: its collectives come back through here
        if getattr(func, "namespace", None) == "_c10d_functional" and func._opname in _COUNTED:
            where, size = _COUNTED[func._opname]
            ranks = self._ranks(args[where])
            nbytes = args[0].numel() * args[0].element_size()
            self.calls.append((time.perf_counter(), ranks, func._opname, size(nbytes, len(ranks))))
        return func(*args, **(kwargs or {}))

    def _ranks(self, name: str) -> tuple:
        if name not in self._groups:
            import torch.distributed as dist
            from torch.distributed.distributed_c10d import _resolve_process_group
            self._groups[name] = tuple(dist.get_process_group_ranks(_resolve_process_group(name)))
        return self._groups[name]
