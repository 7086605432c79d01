"""The per-rank record of collectives: which ``torch.distributed`` calls a rank made, on what.

Inside a rank started by ``distlab.run``, the public functions of ``torch.distributed``
(``all_reduce``, ``send``, ``isend``, ...) are wrapped so that every call is reported as it
starts and as it ends. The launcher uses the stream to say where a hung rank is stuck and to catch
ranks that disagree about the next collective; labs and checks read it afterwards as
``out.comms[rank]`` to see *how* a result was computed (which ops, how many, how many bytes).

Only calls made through the Python API are seen. Collectives that PyTorch issues from C++ (DDP's
reducer) or through functional collectives (DTensor) are not: use
``torch.distributed.tensor.debug.CommDebugMode`` or ``torch.profiler`` for those.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# Collectives that every rank of the group must call in the same order with the same shapes.
SAME_SHAPE_OPS = {"all_reduce", "broadcast", "reduce", "all_gather_into_tensor",
                  "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single", "barrier"}
POINT_TO_POINT = {"send", "recv", "isend", "irecv"}
# torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to *_single (the old names
# still work and call the new ones; a nested call is recorded once, under the name called).
COLLECTIVES = ["broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_to_all", "all_to_all_single",
               "gather", "scatter", "barrier", "monitored_barrier", "all_gather_object",
               "broadcast_object_list", "gather_object", "scatter_object_list"]
RECORDED = COLLECTIVES + sorted(POINT_TO_POINT)


@functools.lru_cache(maxsize=None)
def _signature(function: Callable) -> inspect.Signature:
    return inspect.signature(function)


# Read once at import, in the zygote before it forks (~1.5 ms of each rank's CPU otherwise).
for _name in RECORDED:
    if getattr(c10d, _name, None) is not None:
        _signature(getattr(c10d, _name))


@dataclasses.dataclass
class Comm:
    """One ``torch.distributed`` call made by one rank.

    ``bytes`` is the message size as nccl-tests counts it: the tensor for all_reduce, broadcast,
    reduce and point-to-point; the whole gathered (or to-be-scattered) buffer for all_gather,
    reduce_scatter, gather, scatter and all_to_all. ``start``/``end`` are ``time.perf_counter()``
    seconds (one clock for all ranks of a machine); ``end`` is None while the call has not returned
    (for async ops: until its ``wait()`` returned).
    """
    rank: int
    seq: int
    op: str
    group: tuple
    shapes: list
    dtype: str
    bytes: int
    peer: int | None = None
    async_op: bool = False
    start: float = 0.0
    end: float | None = None
    # which process group (c10d's name, the same on every rank): two groups of the same ranks,
    # e.g. a checkpoint's own gloo group beside the training's, number their calls apart
    group_name: str = ""
    # made from a thread other than the rank's main one (an async checkpoint's writer): such a
    # rank may move on while one of its calls waits, so no deadlock is ever concluded on it
    threaded: bool = False

    @property
    def duration(self) -> float | None:
        return None if self.end is None else self.end - self.start

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        peer = f" {'to' if self.op in ('send', 'isend') else 'from'} rank {self.peer}" \
            if self.peer is not None else ""
        on = f" on {shapes} {self.dtype}" if shapes else ""
        return f"{self.op} #{self.seq}{peer}{on}".rstrip()


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _message(op: str, bound: inspect.BoundArguments) -> tuple[list, int]:
    """(tensors shown in the record, message bytes) for one call."""
    a = bound.arguments
    if op in ("all_gather", "gather"):
        shown = _tensors(a.get("tensor"))
        return shown, _nbytes(_tensors(a.get("tensor_list") or a.get("gather_list"))) or _nbytes(shown)
    if op in ("all_gather_into_tensor", "all_gather_single"):
        return _tensors(a.get("input_tensor")), _nbytes(_tensors(a.get("output_tensor")))
    if op in ("reduce_scatter", "scatter"):
        shown = _tensors(a.get("output") if op == "reduce_scatter" else a.get("tensor"))
        return shown, _nbytes(_tensors(a.get("input_list") or a.get("scatter_list"))) or _nbytes(shown)
    if op in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return _tensors(a.get("input")), _nbytes(_tensors(a.get("input")))
    if op in ("all_to_all", "all_to_all_single"):
        shown = _tensors(a.get("input_tensor_list") or a.get("input"))
        return shown, _nbytes(shown)
    shown = [t for v in a.values() for t in _tensors(v)]
    return shown, _nbytes(shown)


def _group_ranks(group) -> tuple:
    if group is None or group is c10d.GroupMember.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def _group_name(group) -> str:
    try:
        return c10d._get_process_group_name(group or c10d._get_default_group())
    except Exception:   # a group this torch cannot name: numbered with the others of its ranks
        return ""


def _peer(op: str, bound: inspect.BoundArguments, group) -> int | None:
    a = bound.arguments
    global_peer = a.get("dst") if op in ("send", "isend") else a.get("src")
    if global_peer is None:
        group_peer = a.get("group_dst") if op in ("send", "isend") else a.get("group_src")
        if group_peer is not None:
            global_peer = _group_ranks(group)[group_peer]
    return global_peer


class _WaitRecorder:
    """Stands in for an async op's Work so that ``wait()`` stamps the record's end time."""

    def __init__(self, work, on_done: Callable[[], None]):
        self._work, self._on_done = work, on_done

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        self._on_done()
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)


class Recorder:
    """Wraps ``torch.distributed``'s public functions in this process and reports each call.

    ``sink(kind, comm, index)`` is called with kind "enter" when a call starts and "exit" when it has
    returned (for async ops, when its ``wait()`` returned). Nested calls (``all_gather_object``
    calling ``all_gather``) are reported once, as the outer call.
    """

    def __init__(self, rank: int, sink: Callable[[str, Comm, int], None]):
        self.rank, self.sink = rank, sink
        self.comms: list[Comm] = []
        self._seq: dict[tuple, int] = {}
        self._local = threading.local()
        # A call's index and its "enter" report go together: two threads (training and an
        # asynchronous save) must not report in another order than they took their indexes.
        self._order = threading.Lock()
        self._originals: dict[str, Callable] = {}

    def install(self) -> "Recorder":
        for name in RECORDED:
            original = getattr(c10d, name, None)
            if original is None:
                continue
            self._originals[name] = original
            wrapped = self._wrap(name, original)
            setattr(c10d, name, wrapped)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapped)
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            if getattr(dist, name, None) is getattr(c10d, name):
                setattr(dist, name, original)
            setattr(c10d, name, original)
        self._originals.clear()

    def _next_seq(self, key: tuple) -> int:
        self._seq[key] = self._seq.get(key, 0) + 1
        return self._seq[key]

    def _wrap(self, op: str, original: Callable) -> Callable:
        signature = _signature(original)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if getattr(self._local, "busy", False):
                return original(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs)
            group = bound.arguments.get("group")
            ranks = _group_ranks(group)
            peer = _peer(op, bound, group) if op in POINT_TO_POINT else None
            shown, nbytes = _message(op, bound)
            # Collectives are numbered per group, point-to-point per (direction, peer): those are
            # the sequences that must line up between ranks.
            name = _group_name(group) if op not in POINT_TO_POINT else ""
            key = (ranks, name) if op not in POINT_TO_POINT else (op.lstrip("i"), peer)
            comm = Comm(rank=self.rank, seq=0, op=op, group=ranks,
                        group_name=name,
                        threaded=threading.current_thread() is not threading.main_thread(),
                        shapes=[tuple(t.shape) for t in shown],
                        dtype=str(shown[0].dtype).removeprefix("torch.") if shown else "",
                        bytes=nbytes, peer=peer,
                        async_op=bool(bound.arguments.get("async_op")) or op in ("isend", "irecv"))
            with self._order:
                comm.seq = self._next_seq(key)
                index = len(self.comms)
                self.comms.append(comm)
                comm.start = time.perf_counter()
                self.sink("enter", comm, index)
            self._local.busy = True
            try:
                result = original(*args, **kwargs)
            finally:
                self._local.busy = False
            if comm.async_op and result is not None:
                return _WaitRecorder(result, functools.partial(self._done, comm, index))
            self._done(comm, index)
            return result

        return wrapper

    def _done(self, comm: Comm, index: int) -> None:
        if comm.end is None:
            comm.end = time.perf_counter()
            self.sink("exit", comm, index)
