"""What a rank may receive: its own inputs, and never an expected result.

A graded check runs a student's function on ranks and compares what comes back in the judge
(``../shared/DESIGN.md``, "The shape of a check"). Two marks make that hold by construction:

- ``PerRank(values)``: an argument of ``distlab.run`` that differs by rank. Rank r's task holds
  ``values[r]`` and nothing of the other ranks' (in a collective exercise the other ranks' inputs
  are the answer)::

      distlab.run(_on_rank, 4, PerRank(shards), fn)     # rank r calls _on_rank(r, 4, shards[r], fn)

- ``reference(value)``: marks an expected result. A tensor becomes a ``ReferenceTensor``, and what
  is computed from it stays one (torch keeps a subclass through its operations); numbers become
  ``float``/``int`` subclasses. Pickling any of them raises ``ReferenceLeak``, so a reference
  headed for a rank (an argument, a closure's cell, a default) stops the launch and names what
  it was, before any rank starts. The judge compares with the marked values directly; ``plain``
  drops the mark where a value must leave the judge as data (a stored file, a message).
"""
from __future__ import annotations

import torch


class ReferenceLeak(RuntimeError):
    """A value marked as an expected result was about to be pickled, i.e. sent to a process."""


def _leak(kind: str) -> ReferenceLeak:
    return ReferenceLeak(
        f"a {kind} marked as an expected result (distlab.runtime.per_rank.reference) was about to "
        f"be pickled: a check sends ranks their inputs only and compares their results in the "
        f"judge. Pass the inputs (PerRank for what differs by rank) and keep the reference here.")


class ReferenceTensor(torch.Tensor):
    """A tensor holding an expected result: it computes like any tensor and cannot be pickled."""

    def __reduce_ex__(self, protocol):
        raise _leak(f"tensor of shape {tuple(self.shape)}")


class ReferenceFloat(float):
    def __reduce_ex__(self, protocol):
        raise _leak("number")


class ReferenceInt(int):
    def __reduce_ex__(self, protocol):
        raise _leak("number")


def reference(value):
    """``value`` marked as an expected result, recursively through dicts, lists and tuples.
    Booleans and strings stay as they are (Python cannot subclass ``bool``; strings are labels)."""
    if isinstance(value, torch.Tensor):
        return value if isinstance(value, ReferenceTensor) else value.as_subclass(ReferenceTensor)
    if isinstance(value, dict):
        return {k: reference(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(reference(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return ReferenceInt(value) if isinstance(value, int) else ReferenceFloat(value)


def plain(value):
    """``value`` without the reference mark (the one place that drops it: values leaving the
    judge as data, e.g. into a stored file or a verdict's message)."""
    if isinstance(value, ReferenceTensor):
        return value.as_subclass(torch.Tensor)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(plain(v) for v in value)
    if isinstance(value, ReferenceFloat):
        return float(value)
    if isinstance(value, ReferenceInt):
        return int(value)
    return value


class PerRank:
    """An argument of ``distlab.run`` whose value differs by rank: rank r receives ``values[r]``
    alone. The list must hold one value per rank."""

    def __init__(self, values):
        self.values = list(values)

    def __repr__(self) -> str:
        return f"PerRank({len(self.values)} values)"

    def __reduce__(self):
        # Whole, it would carry every rank's inputs to each rank: only ``for_rank`` may ship.
        raise TypeError("a PerRank argument is split by distlab.run, one value per rank; it is "
                        "never sent whole (pass it directly as an argument of distlab.run)")


def for_rank(args: tuple, kwargs: dict, rank: int, world_size: int) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` as rank ``rank`` receives them: each ``PerRank`` replaced by its
    ``rank``-th value."""
    def pick(value):
        if not isinstance(value, PerRank):
            return value
        if len(value.values) != world_size:
            raise ValueError(f"a PerRank argument holds {len(value.values)} values for "
                             f"{world_size} ranks: give exactly one value per rank")
        return _own(value.values[rank])
    return tuple(pick(a) for a in args), {k: pick(v) for k, v in kwargs.items()}


def _own(value):
    """``value`` with every tensor that is a view of a larger storage copied: a pickled tensor
    carries its whole storage, so rank r's rows sliced from the full batch would carry every
    rank's rows with them."""
    if isinstance(value, torch.Tensor):
        whole = value.untyped_storage().nbytes()
        return value.clone() if whole > value.numel() * value.element_size() else value
    if isinstance(value, dict):
        return {k: _own(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_own(v) for v in value)
    return value


def nan_outside(tensor: torch.Tensor, keep) -> torch.Tensor:
    """A copy of ``tensor`` that is NaN except at index ``keep`` (a slice, or a tuple of them):
    for an exercise whose interface hands a rank a full-shape object (the dense layer to shard,
    the whole batch), the parts its shard must not read. Code that reads only its shard gets
    numbers; a shortcut through the whole object gets NaN."""
    blind = torch.full_like(tensor, float("nan"))
    blind[keep] = tensor[keep]
    return blind


def nan_module_outside(module: torch.nn.Module, keep: dict) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers named in ``keep`` (name -> index)
    are NaN outside their index; the others are left whole (replicated on every rank)."""
    import copy
    blind = copy.deepcopy(module)
    tensors = dict(blind.named_parameters()) | dict(blind.named_buffers())
    unknown = set(keep) - set(tensors)
    if unknown:
        raise KeyError(f"nan_module_outside: {type(module).__name__} has no tensor named "
                       f"{sorted(unknown)}; it has {sorted(tensors)}")
    with torch.no_grad():
        for name, index in keep.items():
            tensors[name].copy_(nan_outside(tensors[name], index))
    return blind
