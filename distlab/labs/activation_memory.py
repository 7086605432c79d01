"""How many bytes autograd keeps for the backward (the activations), parameters excluded: the one
meter Labs 3 (sequence parallelism), 5 (GPipe against 1F1B) and the sharding lab measure with.

Counted through ``torch.autograd.graph.saved_tensors_hooks``, once per storage (views of one
buffer, or a tensor saved by two ops, count once). A storage leaves the count when autograd drops
its last saved reference (after the backward that used it), so ``live`` is what is held now and
``peak`` the most held at once::

    with ActivationMeter(model) as meter:    # or: meter = ActivationMeter(model); with meter.hooks():
        loss = model(x).sum()
    meter.live, meter.peak                   # bytes
"""
from __future__ import annotations

import collections
import weakref

import torch
import torch.nn as nn


class _Saved:
    """What autograd keeps in place of a saved tensor: freed with autograd's last reference."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class ActivationMeter:
    def __init__(self, params=None):
        if isinstance(params, nn.Module):
            params = params.parameters()
        self.param_storages = {p.untyped_storage().data_ptr() for p in params or ()}
        self.refs: collections.Counter = collections.Counter()
        self.live = self.peak = 0
        self._hooks = None

    def _pack(self, t):
        if not isinstance(t, torch.Tensor) or isinstance(t, nn.Parameter):
            return t
        key = t.untyped_storage().data_ptr()
        if key in self.param_storages:
            return t
        holder = _Saved(t)
        if self.refs[key] == 0:
            self.live += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        self.refs[key] += 1
        weakref.finalize(holder, self._release, key, t.untyped_storage().nbytes())
        return holder

    def _release(self, key, nbytes):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= nbytes

    @staticmethod
    def _unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    def hooks(self):
        """The context manager that counts what autograd saves while it is open."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self._hooks = self.hooks()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        """The most bytes held at once while the meter ran (a forward alone: all it saved)."""
        return self.peak
