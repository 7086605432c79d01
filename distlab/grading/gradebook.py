"""The combined nbgrader gradebook (``<workdir>/gradebook.db``) kept in line with the records, for
nbgrader's own tools and its formgrader.

The autograded tests' scores come from the records and are rewritten when those change. What an
instructor enters by hand in the formgrader (a manually graded answer cell's score, a comment, an
override) is theirs: it survives every later grading run, the same student's regrade included,
and reaches scores.csv (``manual_scores``)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from distlab.grading.files import atomic_copy

COURSE = "distlab"  # the course id of every gradebook the grader writes


def _gradebook(db: Path):
    from nbgrader.api import Gradebook
    from distlab.grading.schema_version import read_not_run
    read_not_run()   # a new gradebook: its schema version without a subprocess
    return Gradebook(f"sqlite:///{db}", COURSE)


def is_manual(notebook, cell_name: str) -> bool:
    """A manually graded answer: a grade cell that is also a solution cell (nbgrader's "manually
    graded answer", markdown or code); the instructor scores it in the formgrader."""
    return cell_name in {c.name for c in notebook.solution_cells}


def autograded_tests(notebook) -> list:
    """The grade cells of a gradebook notebook that the autograder scores: code test cells."""
    return [g for g in notebook.grade_cells
            if g.cell_type == "code" and not is_manual(notebook, g.name)]


def gradebook_tests(db: Path) -> dict[str, dict[str, float]]:
    """{lab: {test: max points}} of the autograded tests in ``db``."""
    with _gradebook(db) as gb:
        return {a.name: {g.name: float(g.max_score) for nb in a.notebooks
                         for g in autograded_tests(nb)} for a in gb.assignments}


def manual_cells(db: Path) -> dict[str, dict[str, float]]:
    """{lab: {cell: max points}} of the manually graded answer cells in ``db``."""
    with _gradebook(db) as gb:
        return {a.name: {g.name: float(g.max_score) for nb in a.notebooks for g in nb.grade_cells
                         if is_manual(nb, g.name)} for a in gb.assignments}


def manual_scores(db: Path) -> dict[tuple[str, str], dict[str, float | None]]:
    """{(student, lab): {cell: score or None}} of every manually graded answer cell of the
    submissions in ``db`` (None: not graded yet)."""
    found = {}
    with _gradebook(db) as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                found[(sub.student.id, assignment.name)] = {
                    g.name: g.manual_score for nb in sub.notebooks for g in nb.grades
                    if is_manual(nb.notebook, g.name)}
    return found


def _entered_by_hand(submission) -> dict:
    """What an instructor entered for one submission: {(notebook, cell): (manual score, extra
    credit)} and {(notebook, cell): comment}, to be put back after the submission is redone."""
    grades = {(nb.name, g.name): (g.manual_score, g.extra_credit) for nb in submission.notebooks
              for g in nb.grades if g.manual_score is not None or g.extra_credit}
    comments = {(nb.name, c.name): c.manual_comment for nb in submission.notebooks
                for c in nb.comments if c.manual_comment}
    return {"grades": grades, "comments": comments}


def _restore_by_hand(submission, entered: dict) -> None:
    for nb in submission.notebooks:
        for grade in nb.grades:
            if (nb.name, grade.name) in entered["grades"]:
                grade.manual_score, grade.extra_credit = entered["grades"][(nb.name, grade.name)]
        for comment in nb.comments:
            if (nb.name, comment.name) in entered["comments"]:
                comment.manual_comment = entered["comments"][(nb.name, comment.name)]


def ensure_structure(db: Path, template: Path) -> None:
    """Give gradebook ``db`` the assignments of the template course ``template`` as they are
    now: copied when ``db`` is new, regenerated for a lab whose tests changed (that lab's old
    entries go; its students' fingerprints changed too, so they are graded again)."""
    if not db.exists():
        atomic_copy(template / "gradebook.db", db)
        return
    mine, theirs = gradebook_tests(db), gradebook_tests(template / "gradebook.db")
    changed = [lab for lab in theirs if mine.get(lab) != theirs[lab]]
    if not changed:
        return
    from distlab.grading.course_dir import nbgrader_api
    with _gradebook(db) as gb:
        for lab in changed:
            if lab in mine:
                gb.remove_assignment(lab)
    with tempfile.TemporaryDirectory(prefix="distlab-gradebook-") as tmp:
        api = nbgrader_api(Path(tmp), db=db)
        for lab in changed:
            shutil.copytree(template / "source" / lab, Path(tmp) / "source" / lab)
            result = api.generate_assignment(lab, force=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader could not add {lab} to {db}:\n{result['error']}")


def _gradebook_points(gb, students: set[str] | None) -> dict:
    """{(student, lab): {test: auto score}} of the submissions in ``gb`` (of ``students``)."""
    have = {}
    for assignment in gb.assignments:
        for sub in assignment.submissions:
            if students is None or sub.student.id in students:
                tests = {t.name for nb in assignment.notebooks for t in autograded_tests(nb)}
                have[(sub.student.id, assignment.name)] = {
                    g.name: g.auto_score for nb in sub.notebooks for g in nb.grades
                    if g.name in tests}
    return have


def _add_submission(gb, student: str, lab: str, points: dict[str, float],
                    entered: dict | None = None) -> None:
    import warnings
    from sqlalchemy.exc import SAWarning
    gb.update_or_create_student(student)
    with warnings.catch_warnings():  # nbgrader's own add_submission trips SQLAlchemy's autoflush
        warnings.simplefilter("ignore", SAWarning)
        submission = gb.add_submission(lab, student)
    for nb in submission.notebooks:
        for grade in nb.grades:
            if grade.name in points:
                grade.auto_score, grade.needs_manual_grade = points[grade.name], False
    if entered:
        _restore_by_hand(submission, entered)
    gb.db.commit()


def sync_gradebook(db: Path, wanted: dict, students: set[str] | None = None) -> None:
    """Make gradebook ``db`` hold exactly ``wanted`` ({(student, lab): {test: points}}), for
    ``students`` only if given. Each student's entries are redone whole where they differ, so a
    kill between nbgrader's commits is repaired by the next sync."""
    if students is not None:
        wanted = {key: points for key, points in wanted.items() if key[0] in students}
    with _gradebook(db) as gb:
        have = _gradebook_points(gb, students)
        entered = {}
        for student, lab in have:
            if have[(student, lab)] != wanted.get((student, lab)):
                entered[(student, lab)] = _entered_by_hand(gb.find_submission(lab, student))
                gb.remove_submission(lab, student)
        for (student, lab), points in wanted.items():
            if have.get((student, lab)) != points:
                _add_submission(gb, student, lab, points, entered.get((student, lab)))
        if students is None:
            keep = {student for student, _ in wanted}
            for extra in [s.id for s in gb.students if s.id not in keep]:
                gb.remove_student(extra)
