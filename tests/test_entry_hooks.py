"""distlab.runtime.entry_hooks: a function's code that calls a hook as it starts does everything
else exactly as before (values, exceptions, generators, closures, the lines a traceback shows),
and calls the hook once per call."""
from __future__ import annotations

import dis
import traceback

import pytest

from distlab.runtime import entry_hooks

pytestmark = pytest.mark.skipif(not entry_hooks.SUPPORTED, reason="CPython 3.11's bytecode only")


def loops_and_handlers(n):
    total = 0
    for i in range(n):
        try:
            if i % 3 == 0:
                raise ValueError(i)
            total += i
        except ValueError as exc:
            total -= exc.args[0]
        finally:
            total += 1
    while total > 100:
        total //= 2
    with open(__file__) as f:
        total += len(f.readline()) > 0
    return total


def generator(n):
    for i in range(n):
        got = yield i * i
        if got:
            return got


def closure(k):
    def inner(x):
        return x * k + sum(j for j in range(x))
    return inner


class Base:
    def value(self):
        return 1


class Derived(Base):
    def value(self):        # zero-argument super(): the __class__ cell
        return super().value() + 1


def raises(x):
    y = x + 1
    raise KeyError(y)


# more than 256 constants: the hook's index needs an EXTENDED_ARG
_SOURCE = "def many_constants():\n    return [" + ", ".join(f"{i}.5" for i in range(300)) + "]\n"
exec(compile(_SOURCE, "<many_constants>", "exec"))   # noqa: S102


FUNCTIONS = (loops_and_handlers, generator, closure, Derived.value, raises,
             many_constants)  # noqa: F821  (defined by the exec above)


def results():
    gen = generator(5)
    stepped = [next(gen), next(gen), gen.send(None)]
    try:
        gen.send("stop")
    except StopIteration as stop:
        stepped.append(stop.value)
    try:
        raises(4)
    except KeyError as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raised = (exc.args, frame.name, frame.lineno, frame.line)
    return (loops_and_handlers(20), list(generator(4)), stepped, closure(3)(4),
            Derived().value(), raised, many_constants())  # noqa: F821


@pytest.fixture
def hooked():
    """Each function above with the calling code; the list of the hook's calls."""
    calls = []
    own = {f: f.__code__ for f in FUNCTIONS}
    for f in FUNCTIONS:
        f.__code__ = entry_hooks.with_entry_call(f.__code__, lambda f=f: calls.append(f))
    yield calls
    for f, code in own.items():
        f.__code__ = code


def test_a_hooked_function_does_what_it_did():
    expected = results()            # the functions' own code
    with_hook = []
    own = {f: f.__code__ for f in FUNCTIONS}
    try:
        for f in FUNCTIONS:
            f.__code__ = entry_hooks.with_entry_call(f.__code__, lambda f=f: with_hook.append(f))
        assert results() == expected
    finally:
        for f, code in own.items():
            f.__code__ = code
    assert set(with_hook) == set(FUNCTIONS)


def test_the_hook_runs_once_per_call_and_a_generator_once_per_run(hooked):
    loops_and_handlers(5)
    assert hooked == [loops_and_handlers]
    hooked.clear()
    gen = generator(3)
    assert hooked == []                # made, not started
    assert list(gen) == [0, 1, 4]
    assert hooked == [generator]       # once, though it resumed three times
    hooked.clear()
    Derived().value()
    assert hooked == [Derived.value]


def test_a_traceback_shows_the_lines_it_showed(hooked):
    with pytest.raises(KeyError) as raised:
        raises(1)
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert (frame.name, frame.line) == ("raises", "raise KeyError(y)")
    assert frame.lineno == raises.__code__.co_firstlineno + 2


def test_every_instruction_keeps_its_place_and_location():
    """Every guarded function of the course (and a 20,000-line function of torch's, whose jumps
    take EXTENDED_ARG): after the call, the same instructions with the same locations; jump
    targets and the exception table moved by the call's size."""
    import importlib

    from torch.overrides import get_testing_overrides

    from distlab.checks.course_code import guard_of
    from distlab.course.notebooks import labs
    from distlab.runtime.call_guard import guarded_codes
    codes = {get_testing_overrides.__wrapped__.__code__,
             many_constants.__code__}  # noqa: F821
    for lab in labs():
        module = importlib.import_module(f"distlab.checks.lab{lab[:2]}")
        for check in getattr(module, "COURSE_CODE", {}):
            codes |= set(guarded_codes(guard_of(getattr(module, check))))
    assert len(codes) > 100
    for code in codes:
        new = entry_hooks.with_entry_call(code, print)
        size, head = len(new.co_code) - len(code.co_code), entry_hooks._head(code)
        moved = lambda offset: offset + size if offset >= head else offset   # noqa: E731
        before = [(moved(i.offset), i.opname, i.positions,
                   moved(i.argval) if i.opcode in dis.hasjrel else i.argval)
                  for i in dis.get_instructions(code)]
        after = [(i.offset, i.opname, i.positions, i.argval) for i in dis.get_instructions(new)
                 if not head <= i.offset < head + size]
        assert after == before, code.co_qualname
        table = [(moved(e.start), e.end + size if e.end > head else e.end, moved(e.target),
                  e.depth, e.lasti) for e in dis._parse_exception_table(code)]
        assert [tuple(e) for e in dis._parse_exception_table(new)] == table, code.co_qualname
