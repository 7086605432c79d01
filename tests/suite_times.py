"""Where the suite's time goes, and the order in which pytest-xdist's two workers get the work.

The order: longest first. Under ``--dist loadgroup`` a unit of work is a group of tests that
share a fixture (conftest.py makes them) or a single test. The scheduler hands a worker the next
unit in the queue whenever it is nearly out of work, so the run ends evenly only if the queue
ends with short units: a long test handed out last keeps one worker busy while the other has
nothing left to do. The queue is the collection order (``--no-loadscope-reorder`` in
pyproject.toml; xdist's own reorder sorts by the number of tests, which says nothing of their
time), and this module sorts it by what each unit took last time: every test's seconds (set-up,
call and tear-down) are kept in pytest's cache (``.pytest_cache``) at the end of each run, and
read once by xdist's controller, which hands them to both workers. A test never run here (a fresh clone, a new test) is estimated from its ``slow`` mark. Within a unit the
tests keep their order.

The shared fixtures: the test that first asks for one (the shared grading run, the site) makes
it in its set-up, where pytest's table of the slowest tests shows that test, not the fixture.
The fixture notes its wall and CPU seconds (``note_cost``) and the run ends with a line for
each, under xdist too (the note travels in the test's report).
"""
from __future__ import annotations

import re
import resource
import time
from contextlib import contextmanager

import pytest

CACHE_KEY = "distlab/durations"
WORKER_INPUT = "distlab_seconds"   # what the controller hands each worker at its start
COST = "distlab_fixture_cost"
# "@" and a group's name, "<folder or module>::<fixture>", at the end of a node id: a test's own
# id ends with its name or, parametrized, with "]"
GROUP_SUFFIX = r"@[^@\[\]]+::\w+$"   # the user property a shared fixture's cost travels in
# Estimates for a test with no time of its own in the cache: a test marked slow executes notebooks
# or grading runs (tens of seconds to minutes); the others mostly take well under a second.
SLOW_ESTIMATE, QUICK_ESTIMATE = 60.0, 0.5


def plain_id(nodeid: str) -> str:
    """The node id without the ``@group`` xdist's loadgroup appends (conftest._join_group): the
    key a test's seconds are kept under, grouped or not."""
    return re.sub(GROUP_SUFFIX, "", nodeid)


def estimate(item, seconds: dict[str, float]) -> float:
    known = seconds.get(plain_id(item.nodeid))
    if known is not None:
        return known
    return SLOW_ESTIMATE if item.get_closest_marker("slow") else QUICK_ESTIMATE


def longest_first(items: list, group_of: dict, seconds: dict[str, float]) -> list:
    """``items`` as units (``group_of[item]``: its group, or None for a test of its own) in
    decreasing order of their estimated seconds; ties keep the collection order."""
    units: dict[object, list] = {}
    for item in items:
        group = group_of.get(item)
        units.setdefault(group if group is not None else id(item), []).append(item)
    cost = {key: sum(estimate(item, seconds) for item in unit) for key, unit in units.items()}
    order = sorted(units, key=lambda key: -cost[key])   # sorted() is stable: ties stay in order
    return [item for key in order for item in units[key]]


def stored_seconds(config) -> dict[str, float]:
    cache = getattr(config, "cache", None)   # None under `-p no:cacheprovider`
    return dict(cache.get(CACHE_KEY, {})) if cache is not None else {}


def workers_seconds(config) -> dict[str, float]:
    """In an xdist worker: the seconds the controller read for every worker (Recorder). Both
    workers must order their collection alike (xdist stops a run whose workers collected
    differently), and another run in the same checkout may rewrite the cache in between."""
    return config.workerinput.get(WORKER_INPUT, {})


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have been waited for
    (a grading run's workers, `make site`'s kernels: every process it started is waited for)."""
    return sum(getattr(resource.getrusage(who), field) for who in
               (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for field in ("ru_utime", "ru_stime"))


@contextmanager
def note_cost(request, what: str):
    """Time the ``with`` block, a shared fixture's work, and note it on the test that asked for
    the fixture: "what: N s, M CPU-s (test)" at the end of the run."""
    start, cpu = time.perf_counter(), cpu_seconds()
    yield
    item = suite_item(request)
    item.user_properties.append((COST, f"{what}: {time.perf_counter() - start:.0f} s, "
                                       f"{cpu_seconds() - cpu:.0f} CPU-s (in the set-up of "
                                       f"{plain_id(item.nodeid)})"))


def suite_item(request):
    """The test whose set-up is making a session-scoped fixture."""
    return request._pyfuncitem


class Recorder:
    """Sums each test's seconds over its phases as the reports come in (under xdist, in the
    controller, which receives every worker's reports) and merges them into the cache at the
    end: a run of some tests updates theirs and keeps the others'. Prints the shared fixtures'
    costs after pytest's table of the slowest tests."""

    def __init__(self, config):
        self.config, self.seconds, self.costs = config, {}, []
        self.stored = stored_seconds(config)   # read once, for both workers

    @pytest.hookimpl(optionalhook=True)   # xdist's hook: each worker's input, before it starts
    def pytest_configure_node(self, node) -> None:
        node.workerinput[WORKER_INPUT] = self.stored

    def pytest_runtest_logreport(self, report) -> None:
        key = plain_id(report.nodeid)
        self.seconds[key] = self.seconds.get(key, 0.0) + report.duration
        if report.when == "setup":   # the later phases' reports carry the same properties
            self.costs += [value for name, value in report.user_properties if name == COST]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.costs:
            terminalreporter.write_sep("=", "shared fixtures, made once")
            for line in self.costs:
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.seconds:
            return
        cache.set(CACHE_KEY, {**stored_seconds(self.config),   # another run's, since the start
                              **{k: round(v, 2) for k, v in self.seconds.items()}})
