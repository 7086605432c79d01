"""The rank side of Lab 8: train the lab's model with a sharding scheme on this rank and report
what happened, for the checks and the lab's tables and figures.

``zero2_training`` runs a ZeRO-2 optimizer (the lab's exercise 1), ``zero3_training`` a ZeRO-3
wrapper (exercises 2 and 3). Both return plain data: losses, the rank's shards or parameters,
bytes measured, and (ZeRO-3) when each block's forward and backward ran, so that the collective
record (``out.comms``) can be matched against the computation.

How ZeRO-3 is observed: probes are hooks on every block, placed around the student's own hooks:
  fwd_start[i]   before any pre-forward hook of block i (prepended): the gather is not done yet;
  fwd_compute[i] after the pre-forward hooks: block i's compute starts;
  fwd_end[i]     after the forward, before any post-forward hook (prepended): the parameters
                 are still gathered; the gathered bytes are measured here;
  bwd_start[i]   when the gradient of block i's output arrives, before the student's hook on it:
                 block i+1's backward has produced it; gathered bytes measured here;
  bwd_compute[i] after the student's hook on it: block i's backward compute starts.
"""
from __future__ import annotations

import time

import torch

from distlab.labs.losses import loss_fn
from distlab.labs.sharded.alive import TensorsMade, kept_beyond, optimizer_tensors, quiet_warnings
from distlab.labs.sharded.flat import storage_bytes
from distlab.labs.sharded.problem import RankShare, ShardSetup, block_flats
from distlab.runtime.devices import device


def _rank_problem(setup: ShardSetup | RankShare, rank: int, world_size: int):
    """The model and this rank's rows: from the setup (the lab's runs) or from the rank's own
    share (a check's runs, ``ShardSetup.shares``: no seed reaches the rank)."""
    dev = device()
    model = setup.model().to(dev)
    x, y = (t.to(dev) for t in setup.rows(rank, world_size))
    return model, x, y


def grad_bytes(tensors) -> int:
    """Bytes of the gradients (``.grad``) that ``tensors`` hold now."""
    return storage_bytes([t.grad for t in tensors])


def zero2_training(rank: int, world_size: int, cls, setup: ShardSetup, steps: int) -> dict:
    """Train with ``cls(buckets, lr=, weight_decay=)`` (one bucket per block) for ``steps`` steps.
    Measured after each backward, before the step: the gradient bytes this rank holds (the
    parameters' ``.grad`` and its optimizer's shards' ``.grad``), and every byte the tensors made
    since the optimizer's construction keep alive beyond the model's parameters
    (``kept``: its local optimizer's shards, their gradients and state; anything else).
    Warnings raised meanwhile come back once each in ``warnings``, not printed."""
    model, x, y = _rank_problem(setup, rank, world_size)
    made = TensorsMade()
    with quiet_warnings() as seen, made:
        optimizer = cls([list(block.parameters()) for block in model], lr=setup.lr,
                        weight_decay=setup.weight_decay)
        local = getattr(optimizer, "local_optimizer", None)
        if not isinstance(local, torch.optim.Optimizer):
            raise TypeError("the ZeRO-2 optimizer must keep this rank's torch.optim.AdamW over its "
                            "shards in the attribute local_optimizer")
        shards = [p for group in local.param_groups for p in group["params"]]
        losses, grads, kept = [], [], []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            grads.append(grad_bytes(list(model.parameters()) + shards))
            kept.append(kept_beyond(made, optimizer_tensors(local),
                                    exclude=[*model.parameters(), loss]))
            optimizer.step()
            losses.append(loss.item())
    return {"losses": losses, "params": block_flats(model), "grad_bytes": grads, "kept": kept,
            "shard_numel": sum(s.numel() for s in shards), "warnings": seen}


class FreedParameters(RuntimeError):
    """Backward reached a block whose gathered parameters had been freed and not gathered again."""


class _Probes:
    """Timestamps and gathered-parameter bytes around each block's hooks (see the module doc)."""

    def __init__(self, model):
        self.model = model
        self.times: dict[str, list] = {k: [None] * len(model) for k in
                                       ("fwd_start", "fwd_compute", "fwd_end", "bwd_start",
                                        "bwd_compute")}
        self.gathered: list[int] = []
        for i, block in enumerate(model):
            block.register_forward_pre_hook(lambda m, a, i=i: self._stamp("fwd_start", i),
                                            prepend=True)
            block.register_forward_hook(lambda m, a, out, i=i: self._after(i, out), prepend=True)

    def after_student(self):
        """Probes that must run after the student's hooks: registered once those exist."""
        for i, block in enumerate(self.model):
            block.register_forward_pre_hook(lambda m, a, i=i: self._stamp("fwd_compute", i))
            block.register_forward_hook(lambda m, a, out, i=i: self._late(i, out))

    def _stamp(self, kind: str, i: int) -> None:
        self.times[kind][i] = time.perf_counter()

    def _measure(self) -> None:
        self.gathered.append(storage_bytes(p for p in self.model.parameters()))

    def _after(self, i: int, out) -> None:
        self._stamp("fwd_end", i)
        self._measure()
        if out.requires_grad:
            out.register_hook(lambda g, i=i: (self._stamp("bwd_start", i), self._measure())[0])

    def _late(self, i: int, out) -> None:
        if out.requires_grad:
            out.register_hook(lambda g, i=i: self._stamp("bwd_compute", i))


def zero3_training(rank: int, world_size: int, wrap, setup: ShardSetup, steps: int) -> dict:
    """Train with ZeRO-3: ``wrap(model)`` returns the rank's shards (a list of 1-D tensors, one per
    block, each s = ceil(P_i / W) elements of block i's flat parameters); AdamW steps on them.
    Returns losses, final shards, last step's shard gradients, gathered bytes at every probe and
    per step the probes' timestamps and the step's window (to cut ``out.comms`` by step)."""
    model, x, y = _rank_problem(setup, rank, world_size)
    probes = _Probes(model)
    with quiet_warnings() as seen:
        shards = wrap(model)
        probes.after_student()
        optimizer = setup.optimizer(shards)
        losses, steps_seen = [], []
        for _ in range(steps):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            _backward(loss, probes, start)
            grads = [s.grad.detach().clone() if s.grad is not None else None for s in shards]
            optimizer.step()
            losses.append(loss.item())
            steps_seen.append({"window": (start, time.perf_counter()),
                               **{k: list(v) for k, v in probes.times.items()}})
    return {"losses": losses, "shards": [s.detach().clone() for s in shards], "grads": grads,
            "gathered": probes.gathered, "steps": steps_seen, "warnings": seen,
            "block_bytes": [world_size * s.numel() * s.element_size() for s in shards]}


def _backward(loss, probes: _Probes, start: float) -> None:
    """``loss.backward()``; a block's parameters found freed in backward (PyTorch's ``setStorage
    ... storage of size 0``) become a ``FreedParameters`` that names the block and the fix."""
    try:
        loss.backward()
    except RuntimeError as err:
        if "setStorage" not in str(err) and "storage of size 0" not in str(err):
            raise
        reached = [(t, i) for i, t in enumerate(probes.times["bwd_start"]) if t and t >= start]
        block = f"block {max(reached)[1]}" if reached else "a block"
        raise FreedParameters(
            f"the backward of {block} needed its parameters, but their storage had been freed "
            f"after its forward (0 bytes) and nothing gathered them again. In forward, register "
            f"a hook on the block's output (output.register_hook) that gathers the block again "
            f"(alloc_storage, then the all-gather) when backward reaches it.") from None


def wrap_blocks(cls):
    """``wrap`` for ``zero3_training`` from a per-block class (exercise 2): ``cls(block).shard``."""
    return lambda model: [cls(block).shard for block in model]


def wrap_model(cls):
    """``wrap`` for ``zero3_training`` from a whole-model class (exercise 3): ``cls(blocks).shards``."""
    return lambda model: list(cls(list(model)).shards)
