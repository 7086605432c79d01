"""distlab.runtime.call_guard: a graded answer that is, subclasses, wraps or calls a shipped
implementation is noticed, by every route; the course's own calls and unrelated code are not."""
from __future__ import annotations

import functools
import importlib
import threading

import cloudpickle
import pytest
import torch

from distlab.labs.activation_memory import ActivationMeter
from distlab.labs.timelines import intervals
from distlab.runtime import call_guard, entry_hooks
from distlab.runtime.call_guard import Guard, load_submitted, static_use, watching

UNION = "distlab.labs.timelines.intervals:union"
METER = "distlab.labs.activation_memory:ActivationMeter"
GUARD = Guard(frozenset({UNION, METER, "distlab.no_such_module:thing"}))
SPANS = [(0.0, 1.0), (0.5, 2.0)]
# Where the guarded code cannot call in itself (not CPython 3.11), a profile hook watches instead,
# which the answer's own code can switch off or run around.
ENTRY_CALLS = pytest.mark.skipif(not entry_hooks.SUPPORTED, reason="CPython 3.11's bytecode only")


def uses(fn, *args) -> list[str]:
    with watching(GUARD) as watch:
        fn(*args)
    return watch.uses


def test_an_alias_a_partial_and_a_subclass_are_the_shipped_object():
    assert static_use(intervals.union, GUARD) == UNION
    assert static_use(functools.partial(intervals.union), GUARD) == UNION

    class Meter(ActivationMeter):
        pass
    assert static_use(Meter, GUARD) == METER
    assert static_use(ActivationMeter(None).hooks, GUARD) == METER     # a bound method
    assert static_use(ActivationMeter.hooks, GUARD) == METER           # a method's function


def test_own_code_is_not_flagged():
    def mine(spans):
        return sorted(spans)
    assert static_use(mine, GUARD) is None
    assert uses(mine, SPANS) == []


def test_calls_by_every_route_are_noticed():
    def wrapper(spans):
        return intervals.union(spans)

    def by_import(spans):
        module = importlib.import_module("distlab.labs.timelines.intervals")
        return getattr(module, "union")(spans)

    def by_default(spans, impl=intervals.union):
        return impl(spans)

    def closure():
        impl = intervals.union
        return lambda spans: impl(spans)

    def helper(spans):
        return wrapper(spans)

    def in_a_thread(spans):
        t = threading.Thread(target=intervals.union, args=(spans,))
        t.start()
        t.join()

    def a_subclass_at_run_time(spans):
        class Meter(ActivationMeter):
            pass
        return Meter(None)

    for fn in (wrapper, by_import, by_default, closure(), helper, in_a_thread,
               a_subclass_at_run_time):
        found = uses(fn, SPANS)
        assert found and (UNION in found[0] or METER in found[0]), (fn, found)


@ENTRY_CALLS
def test_calls_that_switch_hooks_off_or_skip_them_are_noticed():
    """The guarded code calls in itself: no profile switched off, no thread however started and
    no copy of its code escapes it."""
    import _thread
    import gc
    import sys
    import types

    def profile_off(spans):
        sys.setprofile(None)
        threading.setprofile(None)
        return intervals.union(spans)

    def raw_thread(spans):
        done = threading.Event()
        _thread.start_new_thread(lambda: (intervals.union(spans), done.set()), ())
        done.wait()

    def code_copy(spans):
        code = intervals.union.__code__.replace(co_name="mine")
        return types.FunctionType(code, {"sorted": sorted, "max": max})(spans)

    def found_by_gc(spans):
        union = next(o for o in gc.get_objects()   # not getattr on every object: torch's
                     if isinstance(o, types.FunctionType) and o.__qualname__ == "union")
        return union(spans)

    for fn in (profile_off, raw_thread, code_copy, found_by_gc):
        found = uses(fn, SPANS)
        assert found and UNION in found[0], (fn, found)


def test_a_copy_of_the_code_pickled_by_value_is_noticed_when_called():
    # Made where nothing watches (the student's kernel): the function's own code, by value.
    import types
    copy = types.FunctionType(intervals.union.__code__, {"sorted": sorted, "max": max}, "mine")

    def answer(spans):
        return copy(spans)
    data = cloudpickle.dumps(answer)
    with watching(GUARD) as watch:
        load_submitted(data, "answer")(SPANS)
    assert watch.uses and UNION in watch.uses[0]


@ENTRY_CALLS
def test_a_watch_leaves_the_functions_as_they_were():
    own = intervals.union.__code__
    with watching(GUARD):
        with watching(GUARD) as inner:
            assert intervals.union.__code__ is not own
        assert intervals.union.__code__ is not own   # the outer watch still holds it
        intervals.length(SPANS)
        assert inner.uses == []
    assert intervals.union.__code__ is own
    assert call_guard._carried == {} and call_guard._open == []


@ENTRY_CALLS
def test_a_prepared_guard_installs_the_codes_made_before_and_notices_calls_as_ever():
    # A zygote prepares before it forks: its ranks' watches install the codes, not rewrite them.
    call_guard.prepare(GUARD.guarded)
    made = call_guard._with_entry[(intervals.union.__code__, UNION)]

    def wrapper(spans):
        return intervals.union(spans)
    with watching(GUARD) as watch:
        assert intervals.union.__code__ is made
        wrapper(SPANS)
    assert watch.uses and UNION in watch.uses[0]
    assert intervals.union.__code__ is not made


def test_the_course_calling_its_own_code_is_not_the_students_use():
    # intervals.length calls union itself: the caller of union is the course, not the student.
    assert uses(intervals.length, SPANS) == []


@torch.no_grad()
def shipped_step(spans):
    return sorted(spans)


@torch.no_grad()
def library_step(spans):
    return list(spans)


def test_a_decorated_object_is_guarded_by_its_own_code_not_its_decorators():
    # Every @torch.no_grad() function runs torch's one wrapper: guarding that would flag every
    # library call made under the decorator (FSDP2's), as it once flagged Lab 8's design.
    guard = Guard(frozenset({f"{__name__}:shipped_step"}))
    for fn, flagged in ((library_step, []), (shipped_step, [f"{__name__}:shipped_step"])):
        with watching(guard) as watch:
            (lambda spans: fn(spans))(SPANS)
        assert [use.rsplit(" calls ", 1)[1] for use in watch.uses] == flagged


def test_the_verdict_names_the_object_and_the_caller():
    def wrapper(spans):
        return intervals.union(spans)
    with watching(GUARD) as watch:
        wrapper(SPANS)
    message = str(watch.verdict())
    assert f"your wrapper (line" in message and f"calls {UNION}" in message
    assert "the course's own implementation: write your own" in message
    assert call_guard.used_course_code(f"RankError: on rank 1\n{message}\n\nmore") == message


def test_objects_handed_in_are_inspected_as_they_are_unpickled():
    with watching(GUARD) as watch:
        obj = load_submitted(cloudpickle.dumps(intervals.union), "union")
    assert obj is intervals.union
    assert watch.uses == [f"your union is {UNION}"]

    class Meter(ActivationMeter):
        pass
    with watching(GUARD) as watch:
        load_submitted(cloudpickle.dumps(Meter), "Meter")
    assert watch.uses == [f"your Meter subclasses or carries {METER}"]


def test_no_guard_watches_nothing():
    with watching(None) as watch:
        intervals.union(SPANS)
    assert watch is None
    assert call_guard._current.get() is None


def test_every_judged_check_declares_its_course_code():
    """A check the judge serves names the course code its exercise may not use (COURSE_CODE), or
    says it grades values handed in (GRADED_ON_VALUES); a new check that does neither fails here."""
    import importlib
    from distlab.course.notebooks import labs
    for lab in labs():
        module = importlib.import_module(f"distlab.checks.lab{lab[:2]}")
        served = {name for name, value in vars(module).items() if hasattr(value, "__judged__")}
        declared = set(getattr(module, "COURSE_CODE", {})) | set(getattr(module, "GRADED_ON_VALUES", ()))
        assert served - declared == set(), (lab, sorted(served - declared))
        assert declared - served == set(), (lab, "declared but not served", sorted(declared - served))
