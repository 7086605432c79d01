"""The judge without notebooks: a process serving checks, and kernels as plain subprocesses."""
from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import pytest

from distlab.grading import judge

from distlab.runtime import safe_pickle
from distlab.grading.judge import Verdict, review

KERNEL = textwrap.dedent('''
    import sys, torch, torch.distributed as dist
    from distlab.checks.lab01 import check_all_reduce_rs_ag, check_bandwidths
    def right(tensor):
        out = tensor.clone(); dist.all_reduce(out); return out
    def wrong(tensor):
        return tensor
    def bandwidths(nbytes, seconds, factor):
        return 0.0, 0.0
    for fn in (right, wrong):
        try:
            check_all_reduce_rs_ag(fn, world_size=2, seed=5)
            print("kernel saw: pass")
        except Exception as exc:
            print("kernel saw:", type(exc).__name__)
    try:
        check_bandwidths(bandwidths)
    except Exception as exc:
        print("kernel saw:", type(exc).__name__)
''')

JUDGE = textwrap.dedent('''
    import os, subprocess, sys, tempfile
    from distlab.grading.judge import ENV, Judge
    from distlab.runtime.launch import LaunchSettings
    folder = tempfile.mkdtemp()
    j = Judge(LaunchSettings(distrust=True, cwd=folder))
    channel = j.channel()   # the kernel's way to the judge: a descriptor it inherits
    j.enter("test_cell", sys.argv[2])
    kernel = subprocess.run([sys.executable, "-c", sys.argv[1]], pass_fds=[channel.fileno()],
                            env=dict(os.environ, **{ENV: str(channel.fileno())}),
                            capture_output=True, text=True, timeout=240)
    print(kernel.stdout, kernel.stderr[-2000:])
    for v in j.verdicts["test_cell"]:
        print("verdict:", v.check, v.status, v.seed, v.message.splitlines()[0] if v.message else "")
''')


CELL = "; ".join(["check_all_reduce_rs_ag(right, world_size=2, seed=fresh_seed())",
                  "check_all_reduce_rs_ag(wrong, world_size=2, seed=fresh_seed())",
                  "check_bandwidths(bandwidths)"])


def _in_judge(kernel_code: str, cell: str = CELL) -> str:
    done = subprocess.run([sys.executable, "-c", JUDGE, kernel_code, cell], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_checks_run_in_the_judge_with_its_own_seed():
    out = _in_judge(KERNEL)
    verdicts = [line.split() for line in out.splitlines() if line.startswith("verdict:")]
    # right: the function uses all_reduce, which the check refuses (it wants reduce-scatter +
    # all-gather); wrong: a wrong value. Both fail in the judge, and the kernel shows it.
    assert [v[1:3] for v in verdicts] == [["check_all_reduce_rs_ag", "fail"],
                                          ["check_all_reduce_rs_ag", "fail"],
                                          ["check_bandwidths", "fail"]], out
    assert all(v[3] != "5" for v in verdicts[:2]), "the judge must draw its own seed"
    assert out.count("kernel saw: CheckFailed") == 3, out


PLAIN_KERNEL = textwrap.dedent('''
    import torch, torch.distributed as dist
    from distlab.checks.lab01 import check_all_reduce_rs_ag
    def right(tensor):
        n = dist.get_world_size()
        flat = tensor.reshape(-1)
        padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
        shard = padded.new_empty(padded.numel() // n)
        dist.reduce_scatter_single(shard, padded)
        full = torch.empty_like(padded)
        dist.all_gather_single(full, shard)
        return full[:flat.numel()].reshape(tensor.shape)
    def wrong(tensor):   # the right collectives, but the mean instead of the sum
        return right(tensor) / dist.get_world_size()
    for fn in (right, wrong):
        try:
            check_all_reduce_rs_ag(fn, world_size=2, seed=3)
            print(fn.__name__, "pass")
        except Exception as exc:
            print(fn.__name__, type(exc).__name__)
''')


def test_a_passing_check_gives_the_kernel_its_verdict_line_with_the_figures():
    """A test cell that prints a check (Lab 5's design cell) shows what the judge verified and
    the figures (the largest error beside its tolerance, the bytes reduce-scattered), never None."""
    kernel = PLAIN_KERNEL.split("for fn in")[0] + textwrap.dedent('''
        line = check_all_reduce_rs_ag(right, world_size=2, seed=3)
        print("kernel got:", repr(line))
        print(check_all_reduce_rs_ag(right, world_size=4))
    ''')
    out = _in_judge(kernel, "check_all_reduce_rs_ag(right, world_size=2, seed=fresh_seed())\n"
                            "print(check_all_reduce_rs_ag(right, world_size=4))")
    verdicts = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert len(verdicts) == 2 and all(v.split()[2] == "pass" for v in verdicts), out
    kernel_lines = out.split("verdict:")[0].split()
    assert "None" not in kernel_lines, out
    got = next(line for line in out.splitlines() if line.startswith("kernel got:"))
    assert "max abs error" in got and "allowed" in got, got
    assert not got.startswith("kernel got: '"), got   # a notebook shows it as text, unquoted
    assert all("max abs error" in v for v in verdicts), verdicts   # the record keeps the line
    printed = out.split("kernel got:")[1].splitlines()[1]   # the cell's print(check(...))
    assert "every rank's result is the sum" in printed and "one reduce-scatter (" in printed, out


def test_kernel_without_judge_runs_checks_itself():
    # A student's own kernel (no DISTLAB_JUDGE): the check runs right there, passing the right
    # answer and failing the wrong one.
    import os
    from distlab.checks.messenger import ENV
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", PLAIN_KERNEL], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["right pass", "wrong CheckFailed"], \
        done.stdout + done.stderr[-2000:]


def test_request_naming_a_function_outside_the_checks_is_refused():
    bad = pickle.dumps(("os:system", [], {}))
    try:
        judge.Judge._unpack(None, bad)
    except ValueError as exc:
        assert "not a graded check" in str(exc)
    else:
        raise AssertionError("the judge accepted os:system")


def test_requests_and_results_never_run_code_named_in_the_data(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for load in (safe_pickle.loads_message, ):
        try:
            load(pickle.dumps(("enter", Payload())))
        except pickle.UnpicklingError:
            pass
    assert not marker.exists()
    # A student's object reaches the judge as bytes and is not loaded there.
    import cloudpickle
    submitted = judge.Submitted(cloudpickle.dumps(Payload()), "payload")
    assert repr(submitted) == "<submitted payload>" and not marker.exists()


def test_review_scores_from_the_record():
    source = "check_a(f)\ncheck_a(f, seed=fresh_seed())\ncheck_b(g)"
    passing = [Verdict("check_a", "pass", "", None), Verdict("check_a", "pass", "", 7),
               Verdict("check_b", "pass", "", None)]
    assert review(source, passing) == ("pass", "")
    status, message = review(source, passing[:2])
    assert status == "tampered" and "check_b" in message
    status, message = review(source, [Verdict("check_a", "hang", "stuck", 7)])
    assert status == "hang" and "seed 7" in message
    assert review("x = 1", []) is None


def test_every_test_cell_calls_only_checks_the_judge_runs():
    import importlib
    from distlab.course.notebooks import labs, source_notebook
    for lab in labs():
        module = importlib.import_module(f"distlab.checks.lab{lab[:2]}")
        served = {name for name, value in vars(module).items() if hasattr(value, "__judged__")}
        for cell in source_notebook(lab).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution"):  # a manual answer cell has none
                called = set(judge.expected_checks(cell.source))
                assert called and called <= served, (lab, meta["grade_id"], called - served)


def test_keyword_arguments_come_from_the_instructors_source():
    import ast
    from distlab.checks import lab07
    call = ast.parse("check_tp_plan(tp_plan, shape=HIDDEN_MESH, seed=fresh_seed())").body[0].value
    kwargs = judge._keywords(call, lab07.check_tp_plan.__judged__, {"shape": "rebound", "seed": 5})
    assert kwargs["shape"] == lab07.HIDDEN_MESH and kwargs["seed"] != 5
    local = ast.parse("check_library_matches(runs, spec=my_spec)").body[0].value
    assert judge._keywords(local, lab07.check_tp_plan.__judged__, {"spec": 3}) == {"spec": 3}


def test_a_check_named_in_a_comment_is_not_expected():
    source = "# check_b(g) is the next exercise's test\ncheck_a(f)\nprint('check_c(x)')"
    assert judge.expected_checks(source) == {"check_a": 1}
    assert review(source, [Verdict("check_a", "pass", "", None)]) == ("pass", "")


def test_the_judge_and_the_scoring_give_an_outcome_one_status():
    import nbformat
    from distlab.checks.assertions import CheckFailed
    from distlab.grading.statuses import status_of_cell, status_of_exception
    from distlab.runtime.outcome import HangError, RankCrashed, RankError
    stub = RankError("rank 0 raised NotImplementedError", 0, "NotImplementedError", "")
    raised = {"fail": CheckFailed("wrong"), "hang": HangError("stuck"),
              "crash": RankCrashed("died"), "not-done": stub,
              "error": RankError("rank 1 raised ValueError", 1, "ValueError", "")}
    for status, exc in raised.items():
        cell = nbformat.v4.new_code_cell("check_x(f)")
        cell.execution_count = 1
        cell.outputs = [nbformat.v4.new_output("error", ename=type(exc).__name__,
                                               evalue=str(exc), traceback=[])]
        assert status_of_exception(exc) == status == status_of_cell(cell, 0, 1)[0], exc
    passed = nbformat.v4.new_code_cell("check_x(f)")
    assert status_of_cell(passed, 1, 1) == ("pass", "")


def _double(rank, world_size, x):
    return 2 * x


class _Recorder:
    """A launcher that records the runs it gets."""

    def __init__(self):
        self.runs = []

    def run(self, fn, world_size, *args, **kwargs):
        self.runs.append(args)
        return ["ran"]

    def close(self):
        pass


def test_runs_that_carry_student_code_go_to_the_student_s_ranks_and_the_rest_to_references():
    submitted = judge.Submitted(b"not unpickled here", "fn")
    assert judge.carries_submitted((_double, (submitted,), {}))
    assert judge.carries_submitted((_double, ([{"deep": submitted}],), {}))
    assert not judge.carries_submitted((_double, (3,), {}))
    # a per-rank argument (never pickled whole) is looked into, value by value
    from distlab.runtime.per_rank import PerRank
    assert judge.carries_submitted((_double, (PerRank([3, submitted]),), {}))
    assert not judge.carries_submitted((_double, (), {"x": PerRank([3, 4])}))
    student, reference = _Recorder(), _Recorder()
    ranks = judge.Ranks(student, reference_settings=None)
    ranks.reference = reference
    import distlab
    with ranks.active():
        distlab.run(_double, 1, submitted)
        distlab.run(_double, 1, 3)
    assert [len(student.runs), len(reference.runs)] == [1, 1]
    assert reference.runs == [(3,)] and student.runs[0][0] is submitted


# ---------------------------------------------------------------------------------------------
# A student's judge answers that student's processes alone

# Short limits: the attacker's cell tries for as long as a classmate is being graded (at most
# 200 s, tests/submissions/classmate.py), within the cell's --timeout.
CLASSMATE_LIMITS = ["--backend", "gloo", "--rank-timeout", "10", "--timeout", "450",
                    "--notebook-timeout", "700"]


def _grade(samples: dict, students: list[str], jobs: int, folder) -> dict:
    """``distlab grade --jobs JOBS`` of ``students``' Lab 1: their scores.csv rows."""
    import csv
    from distlab.grading import grade
    from submissions import write
    from submissions.classmate import LAB
    for name in students:
        write(samples[name], folder / "submitted", name, LAB)
    out = folder / "scores.csv"
    assert grade.main([str(folder / "submitted"), "--out", str(out), "--jobs", str(jobs),
                       "--workdir", str(folder / "work"), *CLASSMATE_LIMITS]) == 0
    with open(out) as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _printed(row: dict, label: str) -> str:
    """What the graded notebook printed after ``label`` (its feedback page)."""
    import html
    import re
    from pathlib import Path
    text = html.unescape(re.sub(r"<[^>]+>", "", Path(row["feedback"]).read_text()))
    found = re.search(re.escape(label) + r" (.*)", text)
    assert found, f"{label!r} not in the attacker's feedback"
    return found.group(1).strip()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_classmate_graded_alongside_cannot_reach_a_student_s_judge(tmp_path):
    # Graded side by side (--jobs 2), the attacker looks for the victim's judge every way a
    # kernel and its ranks can (paths, abstract names, inherited and stolen descriptors) and
    # asks what it reaches to fail the victim's checks; the victim's grade must be the one it
    # gets graded alone. With judges on path sockets this failed: a check of the victim's
    # scored the attacker's request.
    import submissions
    from distlab.course import notebooks
    from submissions.attacks import TESTS
    from submissions.classmate import LAB, classmate_samples
    released = tmp_path / "released"   # what the sources give today, as the shared run grades
    for lab, files in notebooks.build_student_notebooks([LAB]).items():
        notebooks.write_student_notebooks(lab, files, out=released)
    with submissions.released_from(released):
        samples = classmate_samples()
    together = _grade(samples, ["attacker", "victim"], 2, tmp_path / "together")
    alone = _grade(samples, ["victim"], 1, tmp_path / "alone")["victim"]
    attacker = together["attacker"]
    assert _printed(attacker, "classmates seen:") == "['victim']", "the runs did not overlap"
    assert _printed(attacker, "my worker found:") == "True"
    reached = (_printed(attacker, "classmate judges reached:"),
               _printed(attacker, "verdicts filed:"), _printed(attacker, "ways tried:"))
    victim = together["victim"]
    assert {t: victim[t] for t in TESTS} == {t: alone[t] for t in TESTS}, reached
    assert victim["score"] == alone["score"], reached
    assert reached[:2] == ("[]", "[]"), reached
    # Not the kernel's own channel either: the ranks it starts hold no socket of the worker's.
    assert _printed(attacker, "ranks hold a judge channel:") == "[[], []]"


STUB_KERNEL = textwrap.dedent('''
    import torch, torch.distributed as dist
    from distlab.checks.lab01 import check_all_reduce_rs_ag
    def stub(tensor):
        """The handout's stub, as nbgrader leaves it."""
        # YOUR CODE HERE
        raise NotImplementedError()
    try:
        check_all_reduce_rs_ag(stub, world_size=2, seed=1)
    except Exception as exc:
        print("kernel saw:", type(exc).__name__, str(exc).splitlines()[0])
''')

# The judge counts its launches (every check's ranks start through Ranks.run).
COUNTING_JUDGE = JUDGE.replace("channel = j.channel()", textwrap.dedent('''\
    launches, real_run = [], j.launcher.run
    j.launcher.run = lambda fn, world, *a, **k: (launches.append(world), real_run(fn, world, *a, **k))[1]
    channel = j.channel()''')) + 'print("launches:", len(launches))\n'


def test_a_check_given_only_the_handout_s_stub_fails_as_not_done_without_ranks():
    cell = "check_all_reduce_rs_ag(stub, world_size=2, seed=fresh_seed())"
    done = subprocess.run([sys.executable, "-c", COUNTING_JUDGE, STUB_KERNEL, cell],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = [line.split(None, 3) for line in done.stdout.splitlines()
                if line.startswith("verdict:")]
    assert [v[1:3] for v in verdicts] == [["check_all_reduce_rs_ag", "not-done"]], done.stdout
    assert "stub raised NotImplementedError: it is still the handout's stub" in verdicts[0][3]
    assert "kernel saw: SubmittedError stub raised NotImplementedError" in done.stdout
    assert "launches: 0" in done.stdout   # the same check with a written function starts ranks
    done = subprocess.run([sys.executable, "-c", COUNTING_JUDGE, STUB_KERNEL.replace(
        "raise NotImplementedError()", "return tensor"), cell], capture_output=True, text=True,
        timeout=300)
    assert "launches: 0" not in done.stdout and "launches:" in done.stdout, done.stdout


def test_only_a_body_that_just_raises_a_bare_not_implemented_error_is_a_stub():
    from distlab.checks.messenger import is_stub

    def bare():
        raise NotImplementedError

    def nbgrader_stub(x, y=1, *rest, **named):
        """Its docstring stays."""
        # YOUR CODE HERE
        raise NotImplementedError()

    def withheld():   # the student package's: its message must reach the student
        raise NotImplementedError("all_reduce is yours to write in Lab 1")

    def begun(x):
        if x:
            raise NotImplementedError()
        return x

    def other():
        raise ValueError()

    class Answer:
        def method(self):
            raise NotImplementedError()
    assert is_stub(bare) and is_stub(nbgrader_stub) and is_stub(Answer.method)
    for value in (withheld, begun, other, Answer, Answer().method, lambda: None, 3):
        assert not is_stub(value), value
