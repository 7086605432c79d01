"""Scoring rows: each test cell of an autograded notebook gets a status, a message and its points
(from nbgrader's score and the judge's record), what the grader decided is written into the
notebook for the feedback, and the rows become scores.csv and the feedback folder."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from distlab.grading.statuses import status_of_cell


def score_tests(root: Path, student: str, lab: str, cells: dict, judge, row: dict) -> dict:
    """Fill the row's per-test status, message, score and cases (``row["cases"][test]``: every
    check the cell called, hidden or not, with its arguments, seed, what is special and its
    outcome; also listed under the cell for the feedback). A test cell with checks passes only if
    the judge passed every check the cell calls; where the kernel showed otherwise, the test is
    set to zero in the gradebook. Returns {test: message} for the tests the judge overrode."""
    from nbgrader.api import Gradebook
    from distlab.grading.cases import cases_output, cell_cases
    from distlab.grading.gradebook import autograded_tests
    # Here, not at the top: the grading command writes scores too and never needs the judge's
    # imports (torch, a second and a half of CPU for every grading run).
    from distlab.grading.judge import review
    overrides = {}
    row.setdefault("cases", {})
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "distlab") as gb:
        notebook = next(n for n in gb.find_assignment(lab).notebooks if n.name == lab)
        tests = autograded_tests(notebook)  # manually graded answers are the instructor's
        row["max_score"] = float(sum(g.max_score for g in tests))
        try:
            grades = {g.name: g for g in gb.find_submission_notebook(lab, lab, student).grades}
        except Exception:
            grades = {}
        for test in tests:
            grade = grades.get(test.name)
            score = float(grade.score or 0) if grade is not None else 0.0
            cell = cells.get(test.name)
            if cell is None:
                status, message = "missing", "not graded"
            else:
                status, message = status_of_cell(cell, score, float(test.max_score))
                verdict = review(cell.source, judge.verdicts.get(test.name, []))
                # Missing checks matter only where the kernel claimed success; a cell that never
                # got to its checks (a dead kernel, a timeout) keeps the status it has.
                if verdict is not None and verdict[0] != "pass" and \
                        (verdict[0] != "tampered" or score > 0):
                    status, message = verdict
                    if score > 0:
                        overrides[test.name] = message
                        grade.manual_score = 0.0
                    score = 0.0
            if cell is not None:
                cases = cell_cases(cell.source, judge.verdicts.get(test.name, []))
                row["cases"][test.name] = cases
                if cases:
                    cell.outputs.append(cases_output(cases))
            row["tests"][test.name] = status
            row["messages"][test.name] = message[:2000]
            row["points"][test.name] = score
            row["score"] += score
        gb.db.commit()
    return overrides


def read_flags(root: Path, lab: str) -> list[str]:
    path = root / f"flags-{lab}.json"
    return json.loads(path.read_text()) if path.exists() else []


def annotate(nb, cells: dict, overrides: dict, flags: list[str]) -> None:
    """What the grader decided that the kernel's outputs don't show, written into the autograded
    notebook so the feedback carries it."""
    from nbformat.v4 import new_markdown_cell, new_output
    for test, message in overrides.items():
        cells[test].outputs.append(new_output("error", ename="GraderVerdict", evalue=message,
                                              traceback=[f"GraderVerdict: {message}"]))
    if flags:
        lines = "\n".join(f"- {flag}: nbgrader restored the original cell before grading."
                           for flag in flags)
        nb.cells.insert(0, new_markdown_cell(f"**The grader noticed:**\n\n{lines}"))


def write_scores(rows: list[dict], out: Path) -> None:
    """``student, lab, score, max_score``, one status column per test (in lab order), flags, feedback.
    Written atomically: a run killed at any moment leaves the previous complete CSV."""
    from distlab.grading.files import atomic_write
    tests: list[str] = []
    for row in rows:
        tests += [t for t in row["tests"] if t not in tests]
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["student", "lab", "score", "max_score", *tests, "flags", "feedback"])
    for row in sorted(rows, key=lambda r: (r["student"], r["lab"])):
        writer.writerow([row["student"], row["lab"], f"{row['score']:g}",
                         "" if row["max_score"] is None else f"{row['max_score']:g}",
                         *[row["tests"].get(t, "") for t in tests],
                         "; ".join(row["flags"]), row["feedback"]])
    atomic_write(out, text.getvalue())


def collect_feedback(rows: list[dict], workdir: Path) -> None:
    """Copy each feedback HTML to ``<workdir>/feedback/<student>/<lab>/<lab>.html`` (nbgrader's
    layout, ready to hand back) and point the rows at the copies, relative to ``workdir`` (so a
    work directory can move, e.g. from a cluster's shard to the merged one)."""
    from distlab.grading.files import atomic_copy
    for row in rows:
        rel = Path("feedback") / row["student"] / row["lab"] / f"{row['lab']}.html"
        if row["feedback"]:
            atomic_copy(Path(row["feedback"]), workdir / rel)
            row["feedback"] = str(rel)
        else:  # no feedback this time: an older one would contradict the new scores
            (workdir / rel).unlink(missing_ok=True)
