"""What a rank keeps alive, measured: every tensor made while a ``TensorsMade`` mode is active is
remembered by a weak reference, so that at any moment the bytes of the storages those tensors
still hold can be summed, wherever the references that keep them live (an attribute, a closure,
a hook, autograd's graph, a C++ object). Counting only ``.grad`` would miss a full-size gradient
buffer kept in an attribute; this misses nothing made under the mode.

Also ``quiet_warnings``: the warnings raised on a rank while the student's code runs are recorded
(one of each) instead of printed once per call, so that a deprecated collective does not flood
the notebook; the check shows each once.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorsMade(TorchDispatchMode):
    """A dispatch mode that keeps a weak reference to every tensor an operation returns (not the
    tensors an in-place operation returns: those existed before)."""

    def __init__(self):
        super().__init__()
        self.refs: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t) not in inputs:
                self.refs.append(weakref.ref(t))
        return out

    def alive(self, exclude=()) -> dict[int, tuple[int, tuple]]:
        """{storage address: (bytes, shape of a tensor on it)} of the distinct storages the made
        tensors still hold (a freed storage counts 0), leaving out the storages behind
        ``exclude``."""
        skip = {t.untyped_storage().data_ptr() for t in exclude if t is not None}
        self.refs = [r for r in self.refs if r() is not None]
        seen: dict[int, tuple[int, tuple]] = {}
        for ref in self.refs:
            t = ref()
            if t is None:
                continue
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in skip:
                seen.setdefault(storage.data_ptr(), (storage.nbytes(), tuple(t.shape)))
        return seen


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors an optimizer holds: its parameters, their gradients and its state."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [v for p in params for v in optimizer.state.get(p, {}).values()
             if isinstance(v, torch.Tensor)]
    return params + [p.grad for p in params if p.grad is not None] + state


def kept_beyond(made: TensorsMade, known, exclude=()) -> dict:
    """Bytes the made tensors still hold beyond ``known`` tensors' storages (and ``exclude``'s):
    ``known_bytes``, ``other_bytes`` and the largest other tensors' ``(bytes, shape)``."""
    known = [t for t in known if t is not None]
    known_ptrs = {t.untyped_storage().data_ptr() for t in known}
    alive = made.alive(exclude)
    other = sorted((v for p, v in alive.items() if p not in known_ptrs), reverse=True)
    return {"known_bytes": sum(v[0] for p, v in alive.items() if p in known_ptrs),
            "other_bytes": sum(v[0] for v in other), "largest": other[:3]}


@contextlib.contextmanager
def quiet_warnings():
    """Record the warnings raised inside (each distinct message once, in order) into the list
    this yields, instead of printing them."""
    seen: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield seen
        finally:
            for w in caught:
                text = f"{w.category.__name__}: {w.message}"
                if text not in seen:
                    seen.append(text)
