"""Noticing a graded answer that is, or runs, an implementation the course ships.

The course's package holds working implementations of many exercises (Lab 3's layers, Lab 4's
attention, Lab 7's memory model, the checks' references): later labs build on them. A submission
that hands one of them in as its own answer must earn nothing, whatever the route:

- *is*: an alias (``copy_to_tp = tp.copy_to_tp``), ``functools.partial`` of one, a bound method;
- *subclasses*: ``class ColumnParallelLinear(tp.ColumnParallelLinear): pass``;
- *calls*: a wrapper, a closure, a default argument, ``importlib``/``getattr`` inside the body, a
  helper that calls one... anything that runs guarded code on behalf of the student's code.

The first two are seen on the student's objects themselves (``load_submitted`` inspects each as
a rank unpickles it). The third shows only at run time: while the rank runs, each guarded
function's own code calls in as it starts (``entry_hooks``: the rank's other code runs at full
speed, where a profile hook on every thread cost ~45% of its Python-heavy torch work); a call
into guarded code counts when the nearest caller that is not a library's (torch, the standard
library) is the student's code rather than the course's own (a check calling a reference is fine).
Being the code itself, the check holds on every thread, however started, and whatever the
student's code does to ``sys.setprofile``.

A ``Guard`` names the guarded objects as ``"module:qualname"``; a class guards all its methods.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib
import io
import os
import pickle
import sys
import threading
import types

from distlab.runtime import entry_hooks

from distlab.runtime.callers import PACKAGE_DIR, _caller, _importable, _kind  # noqa: F401


MARK = "your answer uses the course's own implementation of this exercise"


def used_course_code(message: str) -> str | None:
    """The part of an error message (a rank's, as a check passed it on) that reports course code
    handed in as an answer; None when there is none."""
    at = message.find(MARK)
    if at < 0:
        return None
    end = message.find("\n\n", at)
    return message[at:end if end >= 0 else None].split("\nTraceback")[0].rstrip()


class CourseCodeUsed(Exception):
    """A graded answer is, or runs, an implementation of an exercise that the course ships."""


@dataclasses.dataclass(frozen=True)
class Guard:
    guarded: frozenset[str]            # "module:qualname" of the course's shipped answers
    exercise: str = ""                 # what is graded, for the message ("check_copy_to_tp")
    allowed: frozenset[str] = frozenset()   # names the exercise may use even where guarded

    def objects(self) -> dict[object, str]:
        """{object: its name} for every guarded name that resolves and is not allowed."""
        found = {}
        for name in sorted(self.guarded - self.allowed):
            obj = resolve(name)
            if obj is not None:
                found[obj] = name
        return found


def resolve(name: str):
    """The object named ``"module:qualname"``; None when it does not exist (any more)."""
    module_name, _, qualname = name.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _functions_of(obj) -> list:
    """The plain functions behind a guarded object: a function itself, or every method, static
    method, class method and property a class defines (an autograd Function's forward and
    backward among them)."""
    if isinstance(obj, type):
        found = []
        for value in vars(obj).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                found += [f for f in (value.fget, value.fset, value.fdel) if f is not None]
            elif isinstance(value, type) and value is not obj and \
                    value.__qualname__.startswith(obj.__qualname__ + "."):   # nested, not a
                found += _functions_of(value)                                # reference to a class
            elif hasattr(value, "__code__"):
                found.append(_undecorated(value))
        return found
    obj = _undecorated(getattr(obj, "__func__", obj))
    return [obj] if hasattr(obj, "__code__") else []


def _undecorated(f):
    """The function a decorator wraps (``functools.wraps``' ``__wrapped__``): its code is the
    object's own. A decorator's wrapper code is shared by everything it decorates (every
    ``@torch.no_grad()`` method runs torch's one ``decorate_context``), so guarding it would flag
    library calls that merely share the decorator."""
    while getattr(f, "__wrapped__", None) is not None:
        f = f.__wrapped__
    return f


def guarded_functions(guard: Guard) -> dict:
    """{function: "module:qualname" of the guarded object it belongs to}."""
    return {f: name for obj, name in guard.objects().items() for f in _functions_of(obj)}


def guarded_codes(guard: Guard) -> dict:
    """{code object: "module:qualname" of the guarded object it belongs to}: a function's own
    code and, while a watch holds it, the code that calls in (either may be copied: a copy is
    equal to its code)."""
    codes = {}
    for f, name in guarded_functions(guard).items():
        codes[f.__code__] = name
        if f in _carried:
            codes[_carried[f][0]] = name
    return codes


def static_use(obj, guard: Guard) -> str | None:
    """The name of the guarded object that ``obj`` is, subclasses, directly wraps (a partial, a
    bound method, a decorator's ``__wrapped__``, a method) or its own class holds (for checks)."""
    objects, codes = guard.objects(), guarded_codes(guard)
    seen, todo = set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        try:
            if item in objects:
                return objects[item]
        except TypeError:     # unhashable: not a function or class
            pass
        if getattr(item, "__code__", None) in codes:
            return codes[item.__code__]
        if isinstance(item, type):
            todo += [base for base in item.__mro__[1:] if base is not object]
            if not _importable(item):   # the student's own class: what it borrows, the check calls
                todo += [getattr(v, "fget", v) for v in vars(item).values()]
            continue
        if type(item).__module__ != "builtins":     # an instance: its class
            todo.append(type(item))
        for attr in ("func", "__func__", "__wrapped__"):   # partial, bound method, decorator
            inner = getattr(item, attr, None)
            if inner is not None:
                todo.append(inner)
    return None


# The guarded functions that carry the entry call now, in this process (a rank's, or a test's):
# {function: [its own code, the code that calls in, how many open watches hold it]}; the watches
# open now, each told of the calls into what it guards; {what an own code runs (_runs): its name},
# for a copy of a guarded function's code that a rank unpickles (``load_submitted``).
_carried: dict = {}
_open: list = []
_running_as: dict = {}
_lock = threading.Lock()


def _entered(name: str) -> None:
    """Run by a guarded function's code as it starts (the frame below is that function's)."""
    frame = sys._getframe(1)
    for watch in tuple(_open):
        if name in watch.names:
            watch.called(frame, name)


# {(a guarded function's own code, its name): that code calling in}: rewriting a function's
# bytecode costs ~0.1 ms, ~3 ms for a lab's guarded functions, so a zygote makes them once before
# it forks (``prepare``) and each rank's watch only installs them.
_with_entry: dict = {}


def _calling_in(own: types.CodeType, name: str) -> types.CodeType:
    key = (own, name)
    if key not in _with_entry:
        _with_entry[key] = entry_hooks.with_entry_call(own, functools.partial(_entered, name))
    return _with_entry[key]


def prepare(guarded) -> None:
    """Make the codes that call in for the ``guarded`` names ("module:qualname") now, in a
    process that forks the ranks that will watch them (the judge's zygote)."""
    if not entry_hooks.SUPPORTED:
        return
    try:   # nothing here may stop the zygote: whatever fails, each rank's watch meets it again
        for f, name in guarded_functions(Guard(frozenset(guarded))).items():
            _calling_in(f.__code__, name)
    except Exception:   # noqa: BLE001
        pass


def _carry(functions: dict) -> bool:
    """Give each function the code that calls in (or count one more watch on it); False, and
    nothing changed, when one of them cannot take it (not a plain Python function)."""
    with _lock:
        done = []
        try:
            for f, name in functions.items():
                if f not in _carried:
                    own = f.__code__
                    f.__code__ = _calling_in(own, name)
                    _carried[f] = [own, f.__code__, 0]
                    _running_as[_runs(own)] = name
                _carried[f][2] += 1
                done.append(f)
        except Exception:   # noqa: BLE001 - any failure: the watch falls back to the profile
            _drop(done)
            return False
        return True


def _drop(functions) -> None:
    """One watch fewer on each function; the last gives the function its own code back."""
    for f in functions:
        entry = _carried[f]
        entry[2] -= 1
        if entry[2] == 0:
            f.__code__ = entry[0]
            del _carried[f], _running_as[_runs(entry[0])]


class Watch:
    """While open, notes every call into guarded code made by the student's code."""

    def __init__(self, guard: Guard):
        self.guard = guard
        self.functions = guarded_functions(guard)
        self.names = frozenset(self.functions.values())
        self.uses: list[str] = []
        self._profiled = self._carrying = False

    def called(self, frame, name: str) -> None:
        """``frame`` runs guarded ``name``: a use when its caller is the student's code."""
        caller, kind = _caller(frame)
        if caller is not None and caller.f_code is load_submitted.__code__:
            self.note(f"unpickling your answer calls {name}")   # what a __reduce__ names
        elif kind == "student":
            where = (f"{caller.f_code.co_name} (line {caller.f_lineno})" if caller is not None
                     else "thread")
            self.note(f"your {where} calls {name}")

    def _profile(self, frame, event, arg):
        # Where the code cannot call in (another Python's bytecode): every call is looked at.
        if event == "call" and frame.f_code in self._codes:
            self.called(frame, self._codes[frame.f_code])

    def note(self, use: str) -> None:
        if use not in self.uses:
            self.uses.append(use)

    def __enter__(self) -> "Watch":
        if not self.functions:
            return self
        if entry_hooks.SUPPORTED and _carry(self.functions):
            self._carrying = True
            _open.append(self)
        else:
            self._profiled, self._codes = True, guarded_codes(self.guard)
            threading.setprofile(self._profile)
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        if self._profiled:
            sys.setprofile(None)
            threading.setprofile(None)
        elif self._carrying:   # not `self in _open`: the answer may have emptied that list
            self._carrying = False
            if self in _open:
                _open.remove(self)
            with _lock:
                _drop(self.functions)

    def verdict(self) -> CourseCodeUsed | None:
        if not self.uses:
            return None
        listed = "\n".join(f"  - {u}, the course's own implementation: write your own"
                            for u in self.uses[:5])
        return CourseCodeUsed(
            f"{MARK}:\n{listed}\n"
            f"The distlab package ships working versions of many exercises (later labs build on "
            f"them), but a graded answer must be your own code: importing, aliasing, subclassing "
            f"or calling one earns nothing, so this test scores zero. You may still use what the "
            f"lab's text tells you to use.")


# The guard of the check this thread runs, in the judge: the launcher puts it into every rank's
# task (a context variable: each judge thread sees its own).
_active_guard: contextvars.ContextVar[Guard | None] = contextvars.ContextVar("distlab_guard",
                                                                             default=None)


def active_guard() -> Guard | None:
    return _active_guard.get()


@contextlib.contextmanager
def guarding(guard: Guard | None):
    """Ranks started within the block (``distlab.run``) run under ``guard``."""
    token = _active_guard.set(guard)
    try:
        yield guard
    finally:
        _active_guard.reset(token)


# The watch of the rank this process runs (set by the rank before it unpickles the task, so that
# the student's objects are inspected as they arrive).
_current: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("distlab_watch",
                                                                         default=None)


@contextlib.contextmanager
def watching(guard: Guard | None):
    """Run the body under ``guard`` (nothing when None); yields the Watch (or None)."""
    if guard is None:
        yield None
        return
    watch = Watch(guard)
    token = _current.set(watch)
    try:
        with watch:
            yield watch
    finally:
        _current.reset(token)


class _Unpickler(pickle.Unpickler):
    """cloudpickle's loads, but a code object that runs a guarded function's own code (a copy the
    student's objects carry by value: ``types.FunctionType(f.__code__, ...)``, renamed or not, a
    module pickled by value) calls in as it starts, as the function itself now does."""

    def find_class(self, module, name):
        import cloudpickle
        found = super().find_class(module, name)
        if found is types.CodeType:
            return _code_as_carried
        if found is cloudpickle.cloudpickle._builtin_type:
            return lambda type_name: (_code_as_carried if type_name == "CodeType"
                                      else found(type_name))
        return found


def _runs(code: types.CodeType) -> tuple:
    """What a code runs, without the name, file and lines that a copy may change."""
    return (code.co_code, code.co_consts, code.co_names, code.co_varnames, code.co_freevars,
            code.co_cellvars, code.co_argcount, code.co_kwonlyargcount, code.co_flags)


def _code_as_carried(*args):
    code = types.CodeType(*args)
    name = _running_as.get(_runs(code))     # an exact or a renamed copy: it calls in as well
    return code if name is None else entry_hooks.with_entry_call(
        code, functools.partial(_entered, name))


def load_submitted(data: bytes, name: str):
    """Unpickle a student's object (``Submitted.__reduce__`` calls this on the rank) and note it
    if it is, subclasses or wraps guarded course code."""
    obj = _Unpickler(io.BytesIO(data)).load()
    watch = _current.get()
    if watch is not None:
        used = static_use(obj, watch.guard)
        if used is not None:
            kin = "is" if obj is resolve(used) else "subclasses or carries"
            watch.note(f"your {name} {kin} {used}")
    return obj
