"""Reading what untrusted processes send, without running their code.

``pickle.loads`` calls whatever the data names, so a process that can write to a pipe the grader
reads can run code in the grader. When the grader's judge (``distlab.grading.judge``) runs a student's
function on ranks, everything that comes back from those ranks is read with these instead:

- ``loads_message``: the launcher's control messages (tuples of strings and numbers, and
  ``distlab.Comm`` records); no other class or function may be named.
- ``dumps_value`` / ``loads_value``: return values, written with ``torch.save`` and read with
  ``torch.load(weights_only=True)``: tensors, numbers, strings and lists, tuples and dicts of them,
  and distlab's own plain records (``RECORDS``).
"""
from __future__ import annotations

import io
import pickle

ALLOWED = {("distlab.runtime.comms", "Comm")}
PLAIN = (type(None), bool, int, float, complex, str, bytes)
# distlab's own records (dataclasses of plain fields, no code of their own) that results and
# answers may contain: a pipeline's events, a parallel layout, a timeline's spans.
RECORDS = {"distlab.runtime.comms": ("Comm",), "distlab.labs.pipeline.stages": ("Event",),
           "distlab.labs.pipeline.model": ("PipeSpec",),
           "distlab.labs.planning.shapes": ("Model", "Cluster", "Job", "ParallelConfig"),
           "distlab.labs.timelines.trace": ("Span", "Timeline"), "distlab.labs.mesh": ("MeshShape",)}


def _records() -> list[type]:
    import importlib
    return [getattr(importlib.import_module(module), name)
            for module, names in RECORDS.items() for name in names]


def _is_record(value) -> bool:
    import dataclasses
    kind = type(value)
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)
            and kind.__qualname__ in RECORDS.get(kind.__module__, ())
            and all(is_plain(getattr(value, f.name)) for f in dataclasses.fields(value)))


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name} from an untrusted process")


def loads_message(data: bytes):
    """A control message from an untrusted process: plain containers and Comm records only."""
    return _Unpickler(io.BytesIO(data)).load()


def is_plain(value, depth: int = 0) -> bool:
    """True for data that ``dumps_value`` can carry: tensors, numbers, strings, and lists, tuples
    and dicts of them (a function, class or module instance is code, not data)."""
    import torch
    if depth > 20:
        return False
    if isinstance(value, PLAIN) or isinstance(value, (torch.Tensor, torch.dtype, torch.Size)):
        return True
    if type(value) in (list, tuple):
        return all(is_plain(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(isinstance(k, (str, int)) and is_plain(v, depth + 1) for k, v in value.items())
    return _is_record(value)


def dumps_value(value) -> bytes:
    import torch
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def loads_value(data: bytes):
    import torch
    with torch.serialization.safe_globals(_records()):
        return torch.load(io.BytesIO(data), weights_only=True)
