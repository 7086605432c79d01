"""The kernel's side of grading: while ``distlab grade`` runs a notebook, every ``check_*`` of
``distlab.checks`` is a messenger that sends the objects the test cell passes to the grader's judge
(``distlab.grading.judge``) and shows its verdict. Outside grading a check is a plain call.

The way to the judge is a file descriptor, not an address: one end of a socketpair the grading
worker made for this kernel alone and handed to it when the kernel started (its number is in
``DISTLAB_JUDGE``; the number is no secret, the descriptor is). No other process can connect to
it: there is no path or name to connect to, and a descriptor cannot be opened through
``/proc/PID/fd``. For each check the messenger makes a fresh socketpair, passes one end to the
judge over the kernel's channel (SCM_RIGHTS) and asks on the other: one connection per check, as
with a listening socket, so a check interrupted halfway (the grader's interrupt, a timeout)
abandons its own connection and never leaves half a message in the way of the next one.

A checks module ends with ``judge_module(globals())``, which wraps its checks.
"""
from __future__ import annotations

import functools
import os
import pickle
import socket
import struct

ENV = "DISTLAB_JUDGE"         # the number of the kernel's descriptor of its judge channel
MAX_REQUEST = 1 << 28         # bytes: a request carries the student's code and data
DOORBELL = b"c"               # what goes with each connection passed over the channel


# ---------------------------------------------------------------------------------------------
# Framing: length-prefixed messages on a check's connection

def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv(sock: socket.socket, limit: int = MAX_REQUEST) -> bytes:
    def exactly(n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = sock.recv(min(1 << 20, n - len(chunks)))
            if not chunk:
                raise ConnectionError("the judge's peer closed the connection")
            chunks += chunk
        return bytes(chunks)
    (size,) = struct.unpack("!Q", exactly(8))
    if size > limit:
        raise ConnectionError(f"a {size}-byte message is larger than the judge accepts ({limit})")
    return exactly(size)


# ---------------------------------------------------------------------------------------------
# Checks become messages to the judge while grading

def judged(check):
    """Wrap a check: a plain call normally; a request to the judge when ``DISTLAB_JUDGE`` is set."""
    @functools.wraps(check)
    def messenger(*args, **kwargs):
        __tracebackhide__ = True  # noqa: F841 (IPython and pytest leave this frame out)
        channel = os.environ.get(ENV)
        if not channel:
            return run_check(check, *args, **kwargs)[0]
        return _ask(channel, f"{check.__module__}:{check.__name__}", args, kwargs)
    messenger.__judged__ = check
    return messenger


def run_check(check, *args, **kwargs):
    """Call ``check``; on a pass, (what the notebook gets, its verdict line). A check that returns
    a line (or nothing) gives the notebook its verdict line, so a cell that ends in it or prints it
    shows what was verified and the figures, never a bare ``None``; one that returns an object
    (a run the lab goes on to show) gives that object."""
    from distlab.checks.assertions import recording, verdict_line
    with recording() as notes:
        returned = check(*args, **kwargs)
    line = verdict_line(returned, notes)
    return (line if returned is None or isinstance(returned, str) else returned), line


def judge_module(namespace: dict) -> None:
    """Wrap every ``check_*`` function a checks module defines (call at the end of the module)."""
    for name, value in list(namespace.items()):
        if name.startswith("check_") and callable(value) and \
                getattr(value, "__module__", None) == namespace["__name__"]:
            namespace[name] = judged(value)


def _pack(value) -> tuple[str, bytes, str]:
    from distlab.runtime.safe_pickle import dumps_value, is_plain
    name = str(getattr(value, "__name__", type(value).__name__))
    if is_plain(value):
        return ("data", dumps_value(value), name)
    import cloudpickle
    return ("stub" if is_stub(value) else "code", cloudpickle.dumps(value), name)


# What a function's body compiles to besides its own instructions (3.11: RESUME, PRECALL, ...).
_FILLER = {"RESUME", "NOP", "CACHE", "PRECALL", "PUSH_NULL", "KW_NAMES"}


def is_stub(value) -> bool:
    """Whether ``value`` is a function whose body only raises a bare NotImplementedError: the
    handout's stub (``# YOUR CODE HERE`` then ``raise NotImplementedError()``), with or without
    its docstring. Calling it can only raise, so a check given nothing else of the student's
    fails without starting ranks (``Judge._handle``). The kernel says so, and the judge believes
    it: the word can only cost the student's own points. One raised with a message (a course
    function withheld from the student package: "... is yours to write") runs as ever, so
    that its message reaches the student."""
    import dis
    import types
    if not isinstance(value, types.FunctionType) or "NotImplementedError" in value.__globals__:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(value) if i.opname not in _FILLER]
    return ops in ([("LOAD_GLOBAL", "NotImplementedError"), ("RAISE_VARARGS", 1)],
                   [("LOAD_GLOBAL", "NotImplementedError"), ("CALL", 0), ("RAISE_VARARGS", 1)])


def connect(channel: socket.socket) -> socket.socket:
    """A fresh connection to the judge at the other end of ``channel``: one end of a new
    socketpair, whose other end went to the judge over ``channel``."""
    mine, theirs = socket.socketpair()
    with theirs:
        socket.send_fds(channel, [DOORBELL], [theirs.fileno()])
    return mine


_CHANNELS: dict[int, socket.socket] = {}


def _channel(number: str) -> socket.socket:
    """The kernel's channel to its judge, descriptor ``number`` (``DISTLAB_JUDGE``)."""
    try:
        fd = int(number)
    except ValueError:
        raise ConnectionError(f"{ENV}={number!r} is not the descriptor of a judge channel: "
                              f"the grader sets it, do not change it") from None
    if fd not in _CHANNELS:
        # Not inherited by what the kernel starts (ranks, shells): the channel is the kernel's.
        os.set_inheritable(fd, False)
        _CHANNELS[fd] = socket.socket(fileno=fd)
    return _CHANNELS[fd]


def _ask(channel: str, check: str, args: tuple, kwargs: dict):
    request = pickle.dumps((check, [_pack(a) for a in args],
                            {k: _pack(v) for k, v in kwargs.items()}))
    with connect(_channel(channel)) as sock:
        _send(sock, request)
        reply = pickle.loads(_recv(sock))  # from the grader: trusted
    if reply.get("output"):
        print(reply["output"], end="" if reply["output"].endswith("\n") else "\n")
    if reply["status"] == "pass":
        from distlab.checks.assertions import VerdictLine
        return VerdictLine(reply.get("message") or "passed")
    if reply["status"] == "skipped":
        return None
    raise _exception(reply["ename"], reply["message"])


def _exception(ename: str, message: str) -> BaseException:
    """The judge's failure as the exception class a student knows (the grader reads the status
    from the judge's record, not from this)."""
    from distlab.checks.assertions import CheckFailed
    from distlab.runtime import outcome
    known = {"CheckFailed": CheckFailed, "HangError": outcome.HangError,
             "RankCrashed": outcome.RankCrashed, "DistributedError": outcome.DistributedError}
    cls = known.get(ename) or type(ename, (AssertionError,), {})
    exc = cls(message)
    exc._render_traceback_ = functools.partial(_plain_traceback, exc)
    return exc


def _plain_traceback(exc: BaseException) -> list[str]:
    """How the graded kernel shows the judge's failure (IPython calls ``_render_traceback_``):
    Python's plain traceback, every frame with its line, not IPython's, which formats each frame
    with source context and colours (25 ms of the kernel's CPU a failing test cell, and an
    untouched notebook fails every one). The judge answers with a failure in test cells only,
    and the feedback shows a test cell's error as its name and message alone
    (``FeedbackWithoutHiddenTests``): what a student reads is the same."""
    import traceback
    tb = exc.__traceback__   # from the cell's frame on, as IPython's own (its runner's left out)
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("IPython."):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).splitlines()
