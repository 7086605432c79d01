"""The storage plumbing of ZeRO-3 (what FSDP calls a flat parameter), so that the lab's exercises
are about the collectives and the hooks, not about tensor internals.

A block's parameters stay its ``nn.Parameter``s (autograd, ``state_dict`` and the optimizer see
them as before), but their data become views into one flat buffer of W * s elements
(``bind_params``). Freeing the buffer's storage (``free_storage``) frees every parameter of the
block at once while autograd keeps its references to them; ``alloc_storage`` gives the storage
back its bytes before an all-gather refills it. Writing into the buffer does not change the
parameters' version counters, so tensors autograd saved in forward are valid again in backward
once the buffer is gathered again (this is how FSDP's FlatParameter reshards).
"""
from __future__ import annotations

import torch


def bind_params(params, buffer: torch.Tensor) -> None:
    """Make each parameter's data a view of ``buffer``, in order: parameter k is elements
    [o_k, o_k + numel_k) with o_k the sum of the earlier numels (the padding stays at the end)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            p.data = buffer[offset:offset + p.numel()].view_as(p)
            offset += p.numel()


def free_storage(buffer: torch.Tensor) -> None:
    """Release the bytes behind ``buffer`` (and every parameter bound to it): its storage keeps
    existing, with size 0, so the views stay valid objects."""
    buffer.untyped_storage().resize_(0)


def alloc_storage(buffer: torch.Tensor) -> None:
    """Give ``buffer``'s storage its bytes back (contents undefined: gather into it next)."""
    need = buffer.numel() * buffer.element_size()
    if buffer.untyped_storage().nbytes() < need:
        buffer.untyped_storage().resize_(need)


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a freed storage counts 0): what those
    tensors hold in memory right now."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
