"""``checks.common.DesignRuns``: the one run a design exercise's two tests grade (Labs 6, 8, 9).
The first test runs afresh and keeps its run; the second takes it once; a judge keeps few."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from distlab.checks.common import DesignRuns
from distlab.grading.judge import Submitted


class Counted:
    """A measure that counts its runs and returns what the design's helper gives now."""

    def __init__(self, value="first version"):
        self.runs, self.value = 0, value

    def __call__(self):
        self.runs += 1
        return self.value


def test_the_second_test_takes_the_first_test_s_run_once():
    runs, measure = DesignRuns(), Counted()
    design = lambda: None  # noqa: E731 (the submission: any object)
    assert runs.run(design, (2, True), measure, first=True) == "first version"
    assert runs.run(design, (2, True), measure, first=False) == "first version"
    assert measure.runs == 1
    # taken: the second cell run again runs the design again, and keeps nothing
    runs.run(design, (2, True), measure, first=False)
    assert measure.runs == 2 and len(runs) == 0


def test_a_first_test_run_again_grades_the_design_anew():
    """A student's kernel: the same function object, a helper it calls fixed in between. The
    first test's cell run again must grade the fix, not return the stale run."""
    runs, measure = DesignRuns(), Counted()
    design = lambda: None  # noqa: E731
    assert runs.run(design, (2, True), measure, first=True) == "first version"
    measure.value = "fixed helper"
    assert runs.run(design, (2, True), measure, first=True) == "fixed helper"
    assert runs.run(design, (2, True), measure, first=False) == "fixed helper"
    assert measure.runs == 2


def test_cases_of_one_submission_are_kept_apart():
    runs, visible, hidden = DesignRuns(), Counted("visible"), Counted("hidden")
    design = lambda: None  # noqa: E731
    runs.run(design, (2, True), visible, first=True)
    runs.run(design, (4, False), hidden, first=True)
    assert runs.run(design, (2, True), visible, first=False) == "visible"
    assert runs.run(design, (4, False), hidden, first=False) == "hidden"
    assert (visible.runs, hidden.runs) == (1, 1)


def test_in_the_judge_a_submission_is_its_source_not_the_object():
    """Each request unpacks a new ``Submitted``: the same bytes are one submission, other bytes
    (a classmate's design, a redefined function) another."""
    runs, measure = DesignRuns(), Counted()
    runs.run(Submitted(b"design v1", "design"), (2, True), measure, first=True)
    runs.run(Submitted(b"design v1", "design"), (2, True), measure, first=False)
    assert measure.runs == 1
    runs.run(Submitted(b"design v1", "design"), (2, True), measure, first=True)
    runs.run(Submitted(b"design v2", "design"), (2, True), measure, first=False)
    assert measure.runs == 3


def test_a_judge_keeps_at_most_its_bound_the_oldest_going_first():
    """Notebooks whose second test never ran leave entries: a worker's judge keeps ``keep``."""
    runs, measure = DesignRuns(keep=3), Counted()
    designs = [Submitted(bytes([n]), "design") for n in range(5)]
    for design in designs:
        runs.run(design, (2, True), measure, first=True)
    assert len(runs) == 3 and measure.runs == 5
    runs.run(designs[-1], (2, True), measure, first=False)     # kept: taken
    assert measure.runs == 5
    runs.run(designs[0], (2, True), measure, first=False)      # the oldest went: runs again
    assert measure.runs == 6 and len(runs) == 2


def test_an_object_that_cannot_be_a_key_is_run_by_every_test():
    class Unhashable:
        __hash__ = None
    runs, measure = DesignRuns(), Counted()
    runs.run(Unhashable(), (2, True), measure, first=True)
    runs.run(Unhashable(), (2, True), measure, first=False)
    assert measure.runs == 2 and len(runs) == 0


# Graded: a kernel asks the judge for both of Lab 6's design tests; the judge counts the runs.
JUDGE = textwrap.dedent('''
    import os, subprocess, sys, tempfile
    from distlab.checks import common
    from distlab.grading.judge import ENV, Judge
    from distlab.runtime.launch import LaunchSettings
    measured = []
    first_of = common.DesignRuns.run
    def counted(self, fn, case, measure, *, first):
        def counting():
            measured.append(case)
            return measure()
        return first_of(self, fn, case, counting, first=first)
    common.DesignRuns.run = counted
    j = Judge(LaunchSettings(distrust=True, cwd=tempfile.mkdtemp()))
    channel = j.channel()
    for cell, source in (("test_plan_buckets", "check_bucket_plan(plan_buckets)"),
                         ("test_plan_buckets_bar", "check_bucket_plan_bar(plan_buckets)")):
        j.enter(cell, source)
        kernel = subprocess.run([sys.executable, "-c", sys.argv[1], cell],
                                pass_fds=[channel.fileno()], capture_output=True, text=True,
                                env=dict(os.environ, **{ENV: str(channel.fileno())}), timeout=240)
        print(kernel.stdout, kernel.stderr[-2000:])
        for v in j.verdicts[cell]:
            print("verdict:", cell, v.status)
    print("runs:", len(measured))
''')

KERNEL = textwrap.dedent('''
    import itertools, sys
    from distlab.checks.lab06 import check_bucket_plan, check_bucket_plan_bar
    from distlab.labs.timelines.buckets import BucketProblem, exposed
    def plan_buckets(sizes, ready, alpha, bandwidth):
        problem, plans = BucketProblem(tuple(sizes), tuple(ready), alpha, bandwidth), []
        for cuts in itertools.product((0, 1), repeat=len(sizes) - 1):
            plan = [1]
            for cut in cuts:
                plan = plan + [1] if cut else plan[:-1] + [plan[-1] + 1]
            plans.append(plan)
        return min(plans, key=lambda plan: exposed(problem, plan))
    check = check_bucket_plan if sys.argv[1] == "test_plan_buckets" else check_bucket_plan_bar
    print("kernel saw:", check(plan_buckets))
''')


def test_graded_the_two_tests_share_one_run():
    """Each test is its own request, its function a new ``Submitted`` of the kernel's bytes: the
    judge runs the design once, for the first test, and the bar's test grades that run."""
    done = subprocess.run([sys.executable, "-c", JUDGE, KERNEL], capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "verdict: test_plan_buckets pass" in out, out
    assert "verdict: test_plan_buckets_bar pass" in out, out
    assert "within the bar" in out, out
    assert "runs: 1" in out.splitlines(), out
