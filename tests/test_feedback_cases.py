"""What the feedback and the records show beyond a status: the cases each test cell ran (hidden
ones named with their world size, sizes, seed and what is special), and the teaching cells the
grader skips, shown with the outputs of the student's own submitted notebook."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from distlab.grading.cases import cases_output, cell_cases, describe_case
from distlab.grading.nbgrader_plugins import TeachingOutputsFromSubmission

LAB9 = Path(__file__).resolve().parents[1] / "solutions/09_expert_parallel/09_expert_parallel.py"


@dataclasses.dataclass
class Verdict:   # the judge's record of one check call (distlab.grading.judge.Verdict)
    check: str
    status: str
    message: str
    seed: int | None


def _test_cell(path: Path, grade_id: str) -> str:
    import jupytext
    nb = jupytext.read(path, fmt="py:percent")
    return next(c.source for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_a_cells_cases_name_the_hidden_ones_with_their_sizes_seed_and_what_is_special():
    source = _test_cell(LAB9, "test_moe_layer")
    verdicts = [Verdict("check_moe_layer", "pass", "", None),
                Verdict("check_moe_layer", "pass", "", 1234),
                Verdict("check_moe_layer", "hang", "moe_forward on fresh inputs (seed 99, ...): "
                                                   "the ranks failed.", 99)]
    cases = cell_cases(source, verdicts)
    assert [(c["hidden"], c["status"], c["seed"]) for c in cases] == [
        (False, "pass", None), (True, "pass", 1234), (True, "hang", 99)]
    starved = cases[2]
    assert starved["arguments"] == {"world_size": 4, "seed": 99, "tokens": 7, "hidden": 6,
                                    "ffn": 12, "experts": 4, "k": 1, "starve": True}
    assert "rank 3's experts get no token" in starved["special"]
    assert starved["message"].startswith("moe_forward on fresh inputs")
    assert describe_case(starved).startswith("check_moe_layer with world_size 4, seed 99, tokens 7")
    assert "[hidden test — top-1; rank 3's experts get no token" in describe_case(starved)
    json.dumps(cases)   # the worker sends rows as JSON lines; the records keep them


def test_the_design_exercise_s_hidden_cases_say_what_is_special():
    cases = cell_cases(_test_cell(LAB9, "test_padded_moe"),
                       [Verdict("check_padded_moe", "pass", "", None),
                        Verdict("check_padded_moe", "fail", "keep differs", 5)])
    assert [(c["hidden"], c["status"]) for c in cases] == [(False, "pass"), (True, "fail"),
                                                          (True, "not run")]
    assert cases[1]["arguments"]["capacity_factor"] == 1.25 and "C rounds up" in cases[1]["special"]
    assert cases[2]["special"] == "top-1"


def test_a_case_the_cell_never_reached_says_so_and_why_with_no_seed():
    source = ("check_x(f)\n### BEGIN HIDDEN TESTS\n"
              "check_x(f, world_size=4, seed=fresh_seed())   # uneven shards\n"
              "### END HIDDEN TESTS\n")
    cases = cell_cases(source, [Verdict("check_x", "fail", "wrong on rank 1", None)])
    assert [c["status"] for c in cases] == ["fail", "not run"]
    assert cases[1]["arguments"] == {"world_size": 4}   # no seed was drawn: none is shown
    assert cases[1]["special"] == "uneven shards" and cases[1]["hidden"]
    assert cases[1]["message"].startswith("the cell stopped at the visible case "
                                          "of check_x above (fail)")
    out = cases_output(cases)["data"]
    assert "fresh_seed" not in out["text/plain"] and "fresh_seed" not in out["text/html"]
    # A cell that stopped before any check answered (its time limit, a dead kernel) says so.
    (alone,) = cell_cases("check_x(f, seed=fresh_seed())\n", [])
    assert alone["arguments"] == {} and "stopped before this call" in alone["message"]


def test_the_feedback_lists_the_cases_under_their_cell_escaped():
    cases = cell_cases("check_x(f, world_size=2)  # <b>bold</b>\n",
                       [Verdict("check_x", "fail", "got <script>1</script>", None)])
    out = cases_output(cases)
    assert out["output_type"] == "display_data"
    assert "check_x with world_size 2 [visible test — <b>bold</b>]: fail: got" in out["data"]["text/plain"]
    assert "<script>" not in out["data"]["text/html"] and "&lt;script&gt;" in out["data"]["text/html"]


def test_a_passing_check_s_line_shows_what_its_comparisons_verified_with_the_figures():
    import torch
    from distlab.checks.assertions import VerdictLine, assert_close, recording, verdict_line
    from distlab.checks.messenger import run_check

    def check(got):
        assert_close(got, torch.ones(3), what="y", rank=1)
        assert_close(len(got), 3, what="rows")
    got = torch.ones(3) + 2e-6
    shown, line = run_check(check, got)
    assert shown == line and isinstance(line, VerdictLine) and repr(line) == str(line)
    err = (got.double() - 1).abs().max().item()
    share = 100 * err / (1e-5 + 1e-5 * 1.0)   # atol + rtol·|expected| at the worst element
    assert line.startswith(f"2 checks passed, the largest error at {share:.2g}% of its tolerance: "
                           f"y on rank 1: max abs error {err:.2g} (allowed 1e-05"), line
    assert "rows = 3 as expected" in line
    with recording() as notes:   # a check's own line wins; nothing compared says so
        assert verdict_line("bubble 0.529 <= budget 0.652", notes) == "bubble 0.529 <= budget 0.652"
    assert verdict_line(None, []).startswith("passed (this check compared nothing")
    assert run_check(lambda: {"run": 1})[0] == {"run": 1}   # an object the lab shows stays one


def _lab(cells, tags=False):
    nb = new_notebook()
    for gid, outputs in cells:
        cell = new_code_cell(f"show_{gid}()", outputs=outputs, execution_count=7 if outputs else None)
        cell.metadata["nbgrader"] = {"grade_id": gid, "locked": True, "grade": False,
                                     "solution": False, "schema_version": 3}
        if tags and gid.startswith("figure"):
            cell.metadata["tags"] = ["teaching"]
        nb.cells.append(cell)
    return nb


def test_teaching_cells_show_the_students_own_outputs_marked_and_only_text_and_images(tmp_path):
    png = "iVBORw0KGgo="
    submitted_outputs = [
        new_output("stream", name="stdout", text="measured 12 ms\n"),
        new_output("display_data", data={"text/plain": "<Figure>", "image/png": png,
                                         "text/html": "<script>alert(1)</script>"}),
        new_output("error", ename="ValueError", evalue="bad", traceback=["\x1b[31m..."]),
    ]
    root, student, lab = tmp_path, "ada", "08_x"
    for kind, nb in (("source", _lab([("figure", []), ("setup", [])], tags=True)),
                     ("submitted", _lab([("figure", submitted_outputs), ("setup", [])]))):
        folder = root / kind / (student if kind == "submitted" else "") / lab
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{lab}.ipynb")
    autograded = _lab([("figure", []), ("setup", [])])   # the grader skipped the figure
    folder = root / "autograded" / student / lab
    folder.mkdir(parents=True)
    resources = {"nbgrader": {"student": student, "assignment": lab, "notebook": lab},
                 "metadata": {"path": str(folder)}}
    nb, _ = TeachingOutputsFromSubmission().preprocess(autograded, resources)
    figure, setup = nb.cells
    note, text, image, error = figure.outputs
    assert "does not run this teaching cell" in note["text"] and "your" in note["text"]
    assert text["text"] == "measured 12 ms\n"
    assert image["data"] == {"text/plain": "<Figure>", "image/png": png}   # no HTML, no script
    assert error["text"] == "ValueError: bad\n"
    assert figure.execution_count == 7
    assert setup.outputs == [] and setup.execution_count is None   # not a teaching cell


def test_the_cases_shown_quote_no_hidden_test_code_of_any_lab():
    """The feedback names every case but never a hidden test's source line (as
    tests/test_grader.py's test_feedback_hides_hidden_test_code reads a whole feedback page)."""
    import html
    import re
    from distlab.course import notebooks
    from distlab.course.notebooks import source_notebook
    for lab in notebooks.labs():
        for cell in source_notebook(lab).cells:
            if "### BEGIN HIDDEN TESTS" not in cell.source:
                continue
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            visible = set(cell.source.splitlines()) - set(hidden.splitlines())
            for verdicts in ([], [Verdict(n, "fail", "", 7) for n in re.findall(r"(check_\w+)\(",
                                                                               cell.source)]):
                out = cases_output(cell_cases(cell.source, verdicts))["data"]
                text = out["text/plain"] + html.unescape(re.sub(r"<[^>]+>", "", out["text/html"]))
                for line in hidden.splitlines():
                    line = line.strip()
                    if line and line not in visible:
                        assert line not in text, (lab, line)


# ---------------------------------------------------------------------------------------------
# A real graded feedback: every case, pass or fail, shows what was verified and the figures

SAMPLE_KINDS = ()   # of the shared grading run's samples (tests/conftest.py): only our own
LAB2, LAB5 = "02_data_parallel", "05_pipeline_parallel"


def own_graded_samples() -> dict:
    """Lab 5 solved (its design check prints its verdict lines: once four bare ``None``) and
    Lab 2 with the gradient average left out (a visible case fails, so the hidden ones don't run)."""
    import submissions
    return {("feedback_solved", LAB5): submissions.solved(LAB5),
            ("feedback_unaveraged", LAB2): submissions.edited(LAB2, "data_parallel_step",
                                                              "p.grad.div_(world_size)", "pass")}


def _feedback_cases(graded_samples, key) -> tuple[nbformat.NotebookNode, dict]:
    """The autograded notebook and {test: the case lines listed under it}."""
    nb = nbformat.read(graded_samples["autograded"](*key), as_version=4)
    listed = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/plain", "")
            if text.startswith("The grader ran these cases:"):   # "- check_x ...: outcome"
                cases = re.split(r"\n(?=- check_)", text.split("\n", 1)[1])
                listed[cell.metadata["nbgrader"]["grade_id"]] = cases
    return nb, listed


def test_a_graded_feedback_shows_the_figures_of_every_case_and_why_one_did_not_run(graded_samples):
    nb, listed = _feedback_cases(graded_samples, ("feedback_solved", LAB5))
    assert listed and all(line.split("]: ", 1)[1].startswith("pass: ")
                          for lines in listed.values() for line in lines), listed
    for cell in nb.cells:   # a graded cell that prints a check shows its line, never None
        printed = "".join(o.get("text", "") for o in cell.get("outputs", []))
        assert "None" not in printed.splitlines(), (cell.metadata.get("nbgrader"), printed)
    budget = [line for lines in listed.values() for line in lines
              if line.startswith("- check_memory_budget")]
    assert budget and all("bubble" in line for line in budget), budget
    compared = [line for lines in listed.values() for line in lines
                if line.startswith(("- check_naive", "- check_gpipe", "- check_1f1b"))]
    assert compared and all("max abs error" in line for line in compared), compared

    _, listed = _feedback_cases(graded_samples, ("feedback_unaveraged", LAB2))
    first, *rest = listed["test_data_parallel_step"]
    assert ": fail: " in first and rest, listed["test_data_parallel_step"]
    for line in rest:
        assert ": not run: the cell stopped at the visible case of " \
               "check_data_parallel_step above (fail)" in line and "fresh_seed" not in line, line
    assert all(": pass: " in line and "max abs error" in line
               for line in listed["test_bucketed_all_reduce"]), listed["test_bucketed_all_reduce"]


def test_every_passing_case_of_every_lab_shows_what_it_verified(graded_samples):
    """Issue 42, item 5: graded with the reference answers, no case of any lab says only "passed
    (this check compared nothing it can show)": each shows the figures it verified."""
    from distlab.course import notebooks
    silent = {}
    for lab in notebooks.labs():
        _, listed = _feedback_cases(graded_samples, ("solution", lab))
        assert listed, f"{lab}: the solution's feedback lists no cases"
        quiet = [line for lines in listed.values() for line in lines
                 if "compared nothing it can show" in line]
        if quiet:
            silent[lab] = quiet
    assert not silent, silent
