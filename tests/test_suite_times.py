"""The workers' queue (tests/suite_times.py): units longest first, groups whole, times kept."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import suite_times


class Item:
    """What longest_first reads of a pytest item: its node id and its marks."""

    def __init__(self, nodeid: str, slow: bool = False):
        self.nodeid, self.slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None

    def __repr__(self):
        return self.nodeid


def test_units_go_longest_first_and_a_group_stays_whole_in_its_order():
    a1, a2, b, c, d = (Item(f"t.py::{n}") for n in ("a1", "a2", "b", "c", "d"))
    seconds = {"t.py::a1": 3.0, "t.py::a2": 4.0, "t.py::b": 5.0, "t.py::c": 10.0, "t.py::d": 0.1}
    # the group a (7 s) before b (5 s), after c (10 s); a1 stays before a2
    assert suite_times.longest_first([a1, b, c, a2, d], {a1: "g", a2: "g"}, seconds) == \
        [c, a1, a2, b, d]


def test_a_test_never_timed_is_estimated_by_its_slow_mark_and_ties_keep_their_order():
    quick, slow, other = Item("t.py::q"), Item("t.py::s", slow=True), Item("t.py::o")
    assert suite_times.longest_first([quick, other, slow], {}, {}) == [slow, quick, other]
    # a slow mark is only an estimate: a time of its own wins
    assert suite_times.longest_first([slow, quick], {}, {"t.py::s": 0.01}) == [quick, slow]


@pytest.mark.parametrize("nodeid,plain", [
    ("tests/test_a.py::test_x[1]@tests::graded_samples", "tests/test_a.py::test_x[1]"),
    ("tests/test_a.py::test_x@tests/test_a.py::sol", "tests/test_a.py::test_x"),
    ("tests/test_a.py::test_x[a@b]", "tests/test_a.py::test_x[a@b]"),
    ("tests/test_a.py::test_x[a@tests::b]", "tests/test_a.py::test_x[a@tests::b]"),
])
def test_times_are_kept_under_the_id_without_its_group(nodeid, plain):
    assert suite_times.plain_id(nodeid) == plain


@pytest.mark.slow   # two pytest runs with a worker each
def test_a_run_keeps_every_tests_seconds_and_next_time_hands_out_the_longest_first(tmp_path):
    """A small suite under this conftest's scheduling, run twice on one xdist worker (which runs
    the queue in its order): a group of three quick tests, then a group that takes 1.5 s. The
    first run, with nothing timed, estimates the three first; it stores every test's seconds,
    and the second run hands out the group that took longest first. Each run ends with the
    shared fixture's cost."""
    conftest = Path(__file__).resolve().parent / "conftest.py"
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, sys
        sys.path.insert(0, {str(conftest.parent)!r})
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(conftest)!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_collection_modifyitems = suite.pytest_collection_modifyitems
        pytest_configure = suite.pytest_configure
    """))
    (tmp_path / "test_a_quick.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture(scope="module")
        def shared():
            pass

        @pytest.mark.parametrize("n", [1, 2, 3])
        def test_quick(shared, n):
            pass
    """))
    (tmp_path / "test_b_long.py").write_text(textwrap.dedent("""
        import time
        import pytest

        import suite_times

        @pytest.fixture(scope="module")
        def shared(request):
            with suite_times.note_cost(request, "shared: slept"):
                time.sleep(1.5)

        def test_one(shared):
            pass

        def test_two(shared):
            pass
    """))
    command = [sys.executable, "-m", "pytest", "-n", "1", "--dist", "loadgroup",
               "--no-loadscope-reorder", "-v", "-o", "addopts=", "-o", "cache_dir=.cache",
               "--rootdir", str(tmp_path), "-p", "no:timeout"]

    def order() -> list[str]:
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        # the fixture's cost, noted in a worker, printed by the controller at the end (once)
        assert len(re.findall(r"^shared: slept: \d+ s, \d+ CPU-s \(in the set-up of "
                              r"test_b_long.py::test_one\)$", run.stdout, re.M)) == 1, run.stdout
        return [re.search(r"PASSED (\S+?)(@|$| )", line).group(1)
                for line in run.stdout.splitlines() if " PASSED " in line]

    assert order()[0].startswith("test_a_quick.py")
    stored = json.loads((tmp_path / ".cache" / "v" / "distlab" / "durations").read_text())
    assert set(stored) == {*(f"test_a_quick.py::test_quick[{n}]" for n in (1, 2, 3)),
                           "test_b_long.py::test_one", "test_b_long.py::test_two"}
    assert stored["test_b_long.py::test_one"] >= 1.5
    assert order()[:2] == ["test_b_long.py::test_one", "test_b_long.py::test_two"]
