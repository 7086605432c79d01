"""The same tensor-parallel plans written for DTensor's ``parallelize_module``, and a
``CommDebugMode`` that records each of DTensor's collectives (phase, shape, bytes)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.runtime.devices import device as rank_device

def dtensor_plan(kind: str) -> dict:
    """The `parallelize_module` plan equivalent to the hand-written layers above.

    "mlp" / "swiglu": column-parallel first layer(s), row-parallel last layer, replicated input
    and output (one all-reduce each way). "block_sp": sequence parallelism around a `Block`:
    the norm and dropout see sequence shards Shard(1), the MLP input is all-gathered and its output
    reduce-scattered back to Shard(1).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)
    if kind == "mlp":
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    if kind == "swiglu":
        return {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    if kind == "block_sp":
        return {"norm": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.fc1": ColwiseParallel(),
                "mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
                # a plain tensor out, so the residual add sees two local (b, s/p, h) tensors
                "drop": SequenceParallel(use_local_output=True)}
    raise ValueError(f"unknown plan {kind!r}: use 'mlp', 'swiglu' or 'block_sp'")


def comm_debug_mode_class():
    from torch.distributed.tensor.debug import CommDebugMode

    class DTensorComms(CommDebugMode):
        """CommDebugMode that also keeps each collective's phase, input shape and bytes, so DTensor's
        collectives can be tabulated like `out.comms` (which never sees functional collectives)."""

        def __init__(self):
            super().__init__()
            self.records: list[dict] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = sum(self.comm_counts.values())
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if sum(self.comm_counts.values()) > before:
                t = args[0]
                out_t = out if isinstance(out, torch.Tensor) else t
                # nccl-tests bytes: the tensor for all-reduce, the whole gathered buffer for
                # all-gather and reduce-scatter.
                big = max(t.numel(), out_t.numel()) * t.element_size()
                self.records.append({"phase": "backward" if self.advanced_module_tracker.is_bw else "forward",
                                     "op": func._overloadpacket.__name__, "shape": tuple(t.shape),
                                     "bytes": big})
            return out

    return DTensorComms


def parallelize(model: nn.Module, kind: str, group=None) -> nn.Module:
    """`model` sharded in place by `parallelize_module` with `dtensor_plan(kind)` on a 1-D mesh."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    mesh = DeviceMesh(rank_device().type, ranks)
    return parallelize_module(model, mesh, dtensor_plan(kind))

