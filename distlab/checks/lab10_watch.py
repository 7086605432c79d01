"""What a rank's ring attention makes, watched while it runs (``distlab.checks.lab10``'s memory
bounds): the largest tensor any operation made, and the most bytes of receive buffers alive at
once. A dispatch mode sees every operation, the receives (``c10d.recv_``) included, whatever
code issued it. And what a rank's Ulysses does with heads that do not divide (``refusal``)."""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class RingWatch(TorchDispatchMode):
    """While active: the largest tensor (in elements) any operation made, and the most bytes of
    receive buffers alive at once, counted at every receive (``c10d.recv_``) as it starts."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # PyTorch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless this says
        # False, and that wrapper imports torch._dynamo (800 modules, sympy among them: 1.5-3
        # CPU-s) on the first operation a rank dispatches under the mode: every rank of every
        # run paid it. A rank compiles nothing here, so there is nothing for Dynamo to skip.
        return False

    def __init__(self):
        super().__init__()
        self.numel, self.shape = 0, ()
        self.buffers: list[weakref.ref] = []     # every tensor a receive wrote into
        self.most_received = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.c10d.recv_.default:
            self.buffers += [weakref.ref(t) for t in args[0]]
            alive = {id(t): t.nbytes for t in (r() for r in self.buffers) if t is not None}
            self.most_received = max(self.most_received, sum(alive.values()))
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape = t.numel(), tuple(t.shape)
        return out


class _Early(Exception):
    """A collective called where the heads do not divide: stopped before it can hang."""


def refusal(ulysses_attention, bad) -> tuple[str, str]:
    """(what the call with heads that do not divide did, its message): ("ValueError", ...), or
    ("collective", ...) when it called a collective first (stopped here, where it would hang or
    fail the ranks), ("no error", "") or (another exception's name, its message)."""
    import contextlib
    from unittest import mock
    import torch.distributed as dist

    def early(*args, **kwargs):
        raise _Early()
    with contextlib.ExitStack() as stack:
        for name in ("all_to_all", "all_to_all_single", "all_gather", "all_reduce", "broadcast",
                     "send", "recv", "isend", "irecv", "batch_isend_irecv"):
            stack.enter_context(mock.patch.object(dist, name, early))
        try:
            ulysses_attention(*bad, None, False)
        except ValueError as err:
            return ("ValueError", str(err))
        except _Early:
            return ("collective", "")
        except Exception as err:   # noqa: BLE001  (reported to the student)
            return (type(err).__name__, str(err))
    return ("no error", "")
