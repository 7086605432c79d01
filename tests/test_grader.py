"""The grader end to end: `distlab grade` on sample submissions made from the lab sources.

The suite's shared grading run (``--jobs 2``, tests/conftest.py's ``graded_samples``) covers, for
every lab in solutions/, its solution (full marks: this is also the test that every lab executes
end to end) and its untouched student version (zero on every test, the run completes), plus the
special cases: a partly correct answer (its exact partial score), a hang in a collective, a rank
that dies, an edited locked test cell, Lab 2's two mistakes, Lab 5's deadlocked schedule. The time
bound is the grader's own limits (rank, cell and notebook timeouts there) and pytest's timeout.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pytest

import submissions  # tests/submissions: the sample submissions, made by code
from distlab.checks import ranks
from distlab.grading import intake, nbgrader_plugins
from distlab.grading import progress as grading_progress
from distlab.course.notebooks import BEGIN_HIDDEN, END_HIDDEN, _regions, labs, source_notebook

LAB1 = "01_collectives"
SPECIAL = list(submissions.special_samples())
SAMPLE_KINDS = ("labs", "special")     # of the shared grading run's samples (tests/conftest.py)


def _points(lab: str) -> dict[str, float]:
    """The autograded tests' points: {grade_id: points}."""
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in source_notebook(lab).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")}


def _manual_points(lab: str) -> dict[str, float]:
    """The answer cells an instructor grades by hand: {grade_id: points}."""
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in source_notebook(lab).cells
            if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")}


def _max_score(lab: str) -> float:
    return sum(_points(lab).values()) + sum(_manual_points(lab).values())


@pytest.fixture(scope="module")
def graded(graded_samples):
    """This module's samples, graded in the suite's shared grading run (tests/conftest.py):
    {"rows": {(student, lab): CSV row}, "expected": {(student, lab): {test: status}}, "work":
    the run's work folder, "autograded": (student, lab) -> the autograded notebook}."""
    expected = {("solution", lab): dict.fromkeys(_points(lab), "pass") for lab in labs()}
    expected.update({key: graded_samples["expected"][key] for key in SPECIAL})
    keys = [*((s, lab) for lab in labs() for s in ("solution", "untouched")), *SPECIAL]
    return {"rows": {key: graded_samples["rows"][key] for key in keys}, "expected": expected,
            "work": graded_samples["work"], "autograded": graded_samples["autograded"]}


@pytest.mark.slow
def test_kernels_talk_over_unix_sockets_not_tcp_ports(graded):
    """A TCP port jupyter_client picked free can be taken before the kernel binds it, and the
    whole notebook is lost (distlab/grading/worker.py); ipykernel warns on every TCP start."""
    log = (graded["work"] / "students" / "solution" / "grading.log").read_text()
    assert "Kernel is running over TCP" not in log, log[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("lab", labs())
def test_solution_gets_full_marks(graded, lab):
    row = graded["rows"][("solution", lab)]
    failing = {t: row[t] for t in _points(lab) if row[t] != "pass"}
    # Every autograded point; a manually graded answer counts in max_score and waits for an instructor.
    assert not failing and float(row["score"]) == sum(_points(lab).values()) \
        and float(row["max_score"]) == _max_score(lab), \
        f"{lab}: the solution failed {failing}; see {graded['work'] / 'students' / 'solution'}"
    assert all(row[cell] == "ungraded" for cell in _manual_points(lab)), row
    assert row["flags"] == ""


@pytest.mark.slow
@pytest.mark.parametrize("lab", labs())
def test_teaching_cells_are_not_run_when_grading(graded, lab):
    """The cells tagged teaching were skipped (no output) and the others ran; full marks above
    prove no check needed a skipped cell."""
    from distlab.grading.execution import teaching_ids
    nb = nbformat.read(graded["autograded"]("solution", lab), as_version=4)
    skipped = teaching_ids(source_notebook(lab))
    ran = {c.metadata["nbgrader"]["grade_id"]: bool(c.get("execution_count"))
           for c in nb.cells if c.cell_type == "code" and "nbgrader" in c.metadata
           and c.source.strip()}
    assert skipped and all(not ran[i] for i in skipped)
    assert all(ran[i] for i in set(ran) - skipped), {i for i in set(ran) - skipped if not ran[i]}


@pytest.mark.slow
@pytest.mark.parametrize("lab", labs())
def test_untouched_student_notebook_gets_zero(graded, lab):
    row = graded["rows"][("untouched", lab)]
    assert float(row["score"]) == 0 and float(row["max_score"]) == _max_score(lab)
    assert all(row[t] not in ("pass", "missing", "") for t in _points(lab)), row
    assert row["flags"] == ""


@pytest.mark.slow
@pytest.mark.parametrize("student,lab", SPECIAL)
def test_special_samples(graded, student, lab):
    row = graded["rows"][(student, lab)]
    expected = graded["expected"][(student, lab)]
    assert {t: row[t] for t in expected} == expected
    points = _points(lab)
    assert float(row["score"]) == sum(points[t] for t, s in expected.items() if s == "pass")
    if student == "edited_test":
        assert "edited locked cell test_bandwidths" in row["flags"]
        assert "edited locked cell test_bandwidths" in Path(row["feedback"]).read_text()
    else:
        assert row["flags"] == ""


@pytest.mark.slow
def test_lab02_mistakes_get_their_exact_partial_scores(graded):
    # Each mistake costs the points of its own exercise and nothing else.
    from distlab.course.notebooks import source_notebook
    points = {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
              for c in source_notebook("02_data_parallel").cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    total = sum(points.values())
    for student, lost in (("missing_average", "test_data_parallel_step"),
                          ("wrong_bucket", "test_bucketed_all_reduce")):
        row = graded["rows"][(student, "02_data_parallel")]
        assert (float(row["score"]), float(row["max_score"])) == \
            (total - points[lost], total), student


@pytest.mark.slow
def test_deadlocked_1f1b_feedback_has_the_hang_diagnosis(graded):
    row = graded["rows"][("deadlock", "05_pipeline_parallel")]
    text = html.unescape(Path(row["feedback"]).read_text())
    assert "deadlocked" in text and "rank 0: in recv" in text and "rank 1: in recv" in text


@pytest.mark.slow
def test_partial_score_is_exact(graded):
    # all_reduce_rs_ag (2 points) and bandwidths (2 points) answered, the rest not: 4 of 10.
    row = graded["rows"][("partial", LAB1)]
    assert (float(row["score"]), float(row["max_score"])) == (4.0, 10.0)


@pytest.mark.slow
def test_hang_and_crash_messages_reach_the_feedback(graded):
    hang = Path(graded["rows"][("hang", LAB1)]["feedback"]).read_text()
    crash = Path(graded["rows"][("crash", LAB1)]["feedback"]).read_text()
    assert "HangError" in hang and "all_gather" in html.unescape(hang)
    assert "RankCrashed" in crash and "rank 1" in html.unescape(crash)


@pytest.mark.slow
def test_feedback_hides_hidden_test_code(graded):
    for (student, lab), row in graded["rows"].items():
        text = html.unescape(re.sub(r"<[^>]+>", "", Path(row["feedback"]).read_text()))
        assert "BEGIN HIDDEN TESTS" not in text
        for cell in source_notebook(lab).cells:
            hidden, _ = _regions(cell.source, BEGIN_HIDDEN, END_HIDDEN)
            visible = set(cell.source.splitlines()) - set(hidden)
            for line in hidden:
                if line and line not in visible:
                    assert line not in text, f"{student}/{lab}: hidden test line in feedback: {line}"


# ---------------------------------------------------------------------------------------------
# Pieces of the grader, without running notebooks

def test_notebook_budget_shrinks_cell_timeouts():
    budget = nbgrader_plugins.NotebookBudget(per_cell=100, per_notebook=250)
    assert budget(None) == 100
    budget.started -= 200  # as if 200 s of the notebook had passed
    assert 49 <= budget(None) <= 50
    budget.started -= 100
    assert budget(None) == 1  # 0 would mean "no limit" to nbclient
    budget.reset()
    assert budget(None) == 100


def test_feedback_preprocessor_drops_hidden_code_and_tracebacks():
    cell = nbformat.v4.new_code_cell(
        "check(f)\n### BEGIN HIDDEN TESTS\ncheck(f, seed=fresh_seed())\n### END HIDDEN TESTS")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "t", "points": 1, "solution": False,
                                 "locked": True}
    cell.outputs = [nbformat.v4.new_output("error", ename="CheckFailed", evalue="rank 1 was wrong",
                                           traceback=["check(f, seed=fresh_seed())", "..."])]
    nbgrader_plugins.FeedbackWithoutHiddenTests().preprocess_cell(cell, {}, 0)
    assert "fresh_seed" not in cell.source and cell.source.startswith("check(f)")
    assert cell.outputs[0]["traceback"] == ["CheckFailed: rank 1 was wrong"]


def test_stderr_becomes_stdout():
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="FutureWarning: ...")]
    nbgrader_plugins.StderrAsStdout().preprocess_cell(cell, {}, 0)
    assert cell.outputs[0]["name"] == "stdout"


def test_discover_skips_what_is_not_a_submission(tmp_path):
    submissions.write(submissions.student(LAB1), tmp_path, "ann", LAB1)
    submissions.write(submissions.student(LAB1), tmp_path, "ben", "99_nope")
    (tmp_path / "cat" / LAB1).mkdir(parents=True)
    found, warnings = intake.discover(tmp_path, labs())
    assert found == {"ann": [LAB1]}
    assert len(warnings) == 2


def test_locked_cell_flags(tmp_path):
    release = tmp_path / "release.ipynb"
    nbformat.write(submissions.student(LAB1), release)
    edited = submissions.write(submissions.replace_cell(submissions.student(LAB1), "test_alpha_beta", "pass"),
                               tmp_path, "s", LAB1)
    assert intake.locked_cell_flags(release, edited) == ["edited locked cell test_alpha_beta"]
    nb = submissions.student(LAB1)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "imports"]
    deleted = submissions.write(nb, tmp_path, "t", LAB1)
    assert intake.locked_cell_flags(release, deleted) == ["deleted locked cell imports"]
    untouched = submissions.write(submissions.solved(LAB1), tmp_path, "u", LAB1)
    assert intake.locked_cell_flags(release, untouched) == []


def test_backends_setting(monkeypatch):
    monkeypatch.setenv(ranks.ENV_BACKEND, "both")
    assert ranks.backends(2)[0] == "gloo"
    monkeypatch.setenv(ranks.ENV_BACKEND, "gloo")
    assert ranks.backends(4) == ["gloo"]


def test_labs_not_selected_are_counted_once(tmp_path):
    for student in ("ann", "ben"):
        for lab in labs()[:3]:
            submissions.write(submissions.student(lab), tmp_path, student, lab)
    found, warnings = intake.discover(tmp_path, labs(), [LAB1])
    assert found == {"ann": [LAB1], "ben": [LAB1]}
    assert warnings == [f"4 notebooks of labs not selected (--lab {LAB1}) skipped"]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_in_a_log_is_a_line_about_every_minute():
    import io
    out, clock = io.StringIO(), _Clock()
    progress = grading_progress.Progress(100, stream=out, tty=False, every=60, clock=clock)
    for _ in range(10):          # 10 notebooks in 50 s: no line yet
        clock.now += 5
        progress.done()
    assert out.getvalue() == ""
    clock.now += 10              # a minute since the start: 11 of 100 at 11/min
    progress.done()
    assert out.getvalue() == "progress: 11/100 notebooks, 11.0/min, ETA 8m05s, 1m00s elapsed\n"
    clock.now += 1
    progress.done(89)            # the last one always gets its line
    assert out.getvalue().splitlines()[-1] == "progress: 100/100 notebooks, 98.4/min, 1m01s elapsed"


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place():
    import io
    out, clock = io.StringIO(), _Clock()
    progress = grading_progress.Progress(4, stream=out, tty=True, clock=clock)
    clock.now += 30
    progress.done()
    assert out.getvalue() == "\r[#######-----------------------] 1/4 notebooks, 2.0/min, ETA 1m30s, " \
                             "30s elapsed\x1b[K"
    progress.clear()             # a student's line is printed on a clean line
    clock.now += 30
    progress.done(3)
    assert out.getvalue().endswith("\r[" + "#" * 30 + "] 4/4 notebooks, 4.0/min, 1m00s elapsed\x1b[K\n")


def test_feedback_exporter_compiles_its_templates_once_and_writes_the_same_page(monkeypatch):
    """The worker's feedback exporter (nbgrader makes one per notebook) reuses the templates it
    compiled for the notebooks before; its page is HTMLExporter's, byte for byte."""
    import jinja2
    from nbconvert.exporters import HTMLExporter
    nb = nbformat.read(Path(__file__).parents[1] / "notebooks" / LAB1 / f"{LAB1}.ipynb", 4)
    plain, _ = HTMLExporter().from_notebook_node(nb)
    first, _ = nbgrader_plugins.FeedbackExporter().from_notebook_node(nb)
    compiled = []
    real = jinja2.Environment.compile
    monkeypatch.setattr(jinja2.Environment, "compile",
                        lambda self, *a, **k: compiled.append(a) or real(self, *a, **k))
    again, _ = nbgrader_plugins.FeedbackExporter().from_notebook_node(nb)
    assert plain == first == again
    assert compiled == []   # every template came from the first exporter's compilation


def test_a_failed_autograde_is_flagged_with_its_cause_not_nbgraders_last_line():
    """nbgrader's autograde result ("log": its log records, "error": the traceback of its own
    closing exception) ends with "Please see the the above traceback"; the flag an instructor
    reads names the exception in the log (on an H100 the flag said nothing more)."""
    from distlab.grading.worker import nbgrader_cause
    generic = ("nbgrader.converters.base.NbGraderException: Please see the the above traceback "
               "for details on the specific errors on the above failures.")
    log = "\n".join([
        "[INFO] Sanitizing /work/submitted/alice/01_collectives/01_collectives.ipynb",
        "[ERROR] There was an error processing assignment: /work/submitted/alice/01_collectives",
        "[ERROR] Traceback (most recent call last):",
        '  File "/site/nbclient/client.py", line 600, in start_new_kernel',
        "RuntimeError: Kernel died before replying to kernel_info",
        "[ERROR] Please see the the above traceback for details on the specific errors on the "
        "above failures."])
    error = "Traceback (most recent call last):\n  File \"api.py\", line 1, in capture_log\n" + generic
    assert nbgrader_cause({"log": log, "error": error}) == \
        "RuntimeError: Kernel died before replying to kernel_info"
    records = "[INFO] Converting\n[ERROR] Kernel does not exist: python3"
    assert nbgrader_cause({"log": records, "error": generic}) == "[ERROR] Kernel does not exist: python3"
    assert nbgrader_cause({"error": generic}) == generic   # nothing better: that line, not nothing
    assert nbgrader_cause({}) == "no log"


def test_a_kernel_that_dies_at_its_start_is_flagged_with_its_own_error(tmp_path, monkeypatch):
    """On an H100 whose packages sat on PYTHONPATH outside the Python installation, the graded
    kernel could not read them and died: the flag repeats the kernel's own last line."""
    import sys
    from distlab.grading.worker import kernel_start_error
    broken = tmp_path / "path"
    broken.mkdir()
    (broken / "ipykernel_launcher.py").write_text("import ipykernel_is_unreadable_here\n")
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "env": {"PYTHONPATH": str(broken)}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    said = kernel_start_error()
    assert "No module named 'ipykernel_is_unreadable_here'" in said and "PYTHONPATH" in said
    (broken / "ipykernel_launcher.py").write_text("")
    assert kernel_start_error() == ""   # a kernel that starts: nothing to add
