"""Whose code a frame runs, and which frame made a call: the course-code guard's question
(``call_guard``: a call into guarded code counts when the student's code made it)."""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(sorted({os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib",
                                                                       "purelib", "platlib")
                              if (p := sysconfig.get_paths().get(key))}))


def _importable(cls: type) -> bool:
    obj = sys.modules.get(cls.__module__)   # not one a pickle made by value (the student's)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


@functools.lru_cache(maxsize=None)
def _kind(filename: str) -> str:
    """Whose code a frame runs: "course" (this package), "library" (the standard library,
    installed packages, generated code such as a dataclass's __init__) or "student"."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(PACKAGE_DIR + os.sep):
        return "course"
    if filename.startswith("<ipython-input"):
        return "student"
    if filename.startswith("<") or path.startswith(_LIBRARY_DIRS):
        return "library"
    return "student"


def _nearest(caller):
    """``caller`` or the nearest frame above it that is not a library's, with its kind. A stack
    of library frames only is a thread's (the rank's own thread starts in the course's code): a
    thread that runs guarded code was started by the student's code, or for it."""
    while caller is not None:
        kind = _kind(caller.f_code.co_filename)
        if kind != "library":
            return caller, kind
        caller = caller.f_back
    return None, "student"


def _caller(frame):
    """The frame that made the call ``frame`` runs, with its kind: the nearest that is not a
    library's, or, when that is the course's and was handed the function (``peak_bytes(fn)``),
    the student's code that handed it."""
    caller, kind = _nearest(frame.f_back)
    if kind == "course" and _handed(caller, frame.f_code):
        above, above_kind = _nearest(caller.f_back)
        if above is not None and above_kind == "student":
            return above, above_kind
    return caller, kind


def _handed(frame, code) -> bool:
    """Whether an argument of ``frame`` (or an item of its ``*args``/``**kwargs``) is a function
    that runs ``code``: plain, partial or bound. Only this frame's arguments: what the course's
    code takes from its own globals or makes itself is its own business."""
    co = frame.f_code
    count = co.co_argcount + co.co_kwonlyargcount + bool(co.co_flags & 4) + bool(co.co_flags & 8)
    local = frame.f_locals
    values = [local.get(name) for name in co.co_varnames[:count]]
    for value in list(values):
        if type(value) in (tuple, list):
            values += value
        elif type(value) is dict:
            values += value.values()
    for value in values:
        if isinstance(value, functools.partial):
            value = value.func
        if isinstance(value, types.MethodType):
            value = value.__func__
        if isinstance(value, types.FunctionType) and value.__code__ is code:
            return True
    return False
