"""Student labs from their single source: ``distlab build [LAB...]``.

A lab's source is ``solutions/<lab>/<lab>.py``, a jupytext percent script whose cell headers carry
nbgrader metadata. ``build`` turns it into nbgrader's source notebook and runs
``nbgrader generate_assignment`` on it in a course directory of the checkout's ``build/`` (the
grader's template, made once per version of the sources: ``intake.course_template``; elsewhere a
throw-away one); the release version
(solutions replaced by stubs, hidden tests removed, outputs cleared) is copied to
``notebooks/<lab>/``. Everything is deterministic (cell ids, metadata), so a test can rebuild and
compare byte for byte: ``distlab build --check`` fails when ``notebooks/`` is stale.

``distlab build`` also writes nbgrader's source folder for instructors (``build/source/<lab>/``,
as ``grader/nbgrader_config.py`` maps it), so nbgrader's formgrader lists the labs
(``make formgrader``).

Both folders are the build's own, file by file: a file in ``notebooks/<lab>/`` or
``build/source/<lab>/`` that the build does not write (a trace a lab run there left, an
instructor's notes) stops the build of that lab, naming it, unless ``--force`` deletes it.

``lint`` states the rules a source lab must follow for the grader to treat it fairly: unique
grade ids, balanced solution and hidden-test markers, locked test cells with points, at least one
autograded cell, and no unlocked code cell that is not a solution.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from distlab import paths
from distlab.grading.folders import FolderInUse
from distlab.grading.intake import course_template
from distlab.grading.course_dir import (KERNELSPEC, generate, nbgrader_api,  # noqa: F401
                                        source_notebook, write_source)

REPO = paths.root()
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"
# nbgrader's source folder and gradebook as grader/nbgrader_config.py maps them (a test checks).
COURSE_SOURCE = REPO / "build" / "source"
GRADEBOOK = REPO / "grading" / "gradebook.db"

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


labs = paths.labs


def lab_summary(lab: str) -> str:
    """The one-line summary in the header of ``lab``'s source (``distlab: summary:``), for the
    site's index; the student notebooks do not carry it (``source_notebook`` resets metadata)."""
    import jupytext

    meta = jupytext.read(SOLUTIONS / lab / f"{lab}.py", fmt="py:percent").metadata
    return meta.get("distlab", {}).get("summary", "")


def reader_notebook(lab: str) -> nbformat.NotebookNode:
    """``lab`` as a self-learner reads it: the solutions in place without their markers, and no
    hidden tests (they are the grader's, and would only repeat the visible ones)."""
    nb = source_notebook(lab)
    for cell in nb.cells:
        cell.source = _strip_regions(cell.source, keep_solutions=True)
    return nb


def student_notebook_text(path: Path) -> str:
    """A released notebook as committed: nbformat's canonical JSON, one trailing newline."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    return nbformat.writes(nb) + "\n"


def build_student_notebooks(labs_: list[str], out: Path = NOTEBOOKS) -> dict[str, dict[str, str]]:
    """Build the student version of ``labs_``: {lab: {relative file name: text}} (not written)."""
    if _in_checkout():
        # nbgrader's release as the grader makes it, made once per version of the labs' sources
        # and of nbgrader in the checkout's build folder (intake.course_template)
        return _student_files(labs_, course_template(sorted(labs_)) / "release")
    with tempfile.TemporaryDirectory(prefix="distlab-build-") as tmp:   # nothing left in ./build
        return _student_files(labs_, generate(labs_, Path(tmp)))


def _in_checkout() -> bool:
    """Whether the build folder is the course's own (a checkout's ``build/``), not ``./build`` of
    the folder an installed course's command runs in."""
    return paths.build().is_relative_to(paths.root())


def _student_files(labs_: list[str], release: Path) -> dict[str, dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    for lab in labs_:
        files[lab] = {}
        for f in sorted((release / lab).rglob("*")):
            if f.is_file():
                rel = str(f.relative_to(release / lab))
                files[lab][rel] = (student_notebook_text(f) if f.suffix == ".ipynb"
                                   else f.read_text())
    return files


def stale(lab: str, built: dict[str, str], out: Path = NOTEBOOKS) -> list[str]:
    """The files of ``notebooks/<lab>/`` that differ from (or are missing in) a fresh build."""
    have = {str(f.relative_to(out / lab)) for f in (out / lab).rglob("*") if f.is_file()
            and ".ipynb_checkpoints" not in f.parts} if (out / lab).exists() else set()
    problems = [name for name, text in built.items()
                if not (out / lab / name).exists() or (out / lab / name).read_text() != text]
    return problems + sorted(have - set(built))


def _files(folder: Path) -> set[str]:
    """The files under ``folder``, relative to it (JupyterLab's checkpoints aside)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")
            if p.is_file() and ".ipynb_checkpoints" not in p.parts} if folder.is_dir() else set()


def _replaceable(folder: Path, written: set[str], force: bool) -> None:
    """Raise ``FolderInUse`` when ``folder`` holds files the build would not write again."""
    others = sorted(_files(folder) - written)
    if others and not force:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise FolderInUse(f"{folder} holds files that `distlab build` does not write ({shown}); "
                          f"replacing the folder would delete them, so nothing was changed there. "
                          f"Move them elsewhere, or run `distlab build --force {folder.name}` to "
                          f"delete them.")


def write_student_notebooks(lab: str, built: dict[str, str], out: Path = NOTEBOOKS,
                            force: bool = False) -> None:
    _replaceable(out / lab, set(built), force)
    shutil.rmtree(out / lab, ignore_errors=True)
    for name, text in built.items():
        (out / lab / name).parent.mkdir(parents=True, exist_ok=True)
        (out / lab / name).write_text(text)


def write_course_source(lab: str, source: Path = COURSE_SOURCE, force: bool = False) -> Path:
    """Refresh nbgrader's source folder for ``lab`` (what the formgrader lists and grades from)."""
    with tempfile.TemporaryDirectory(prefix="distlab-source-") as tmp:
        _replaceable(source / lab, _files(write_source(lab, Path(tmp)).parent), force)
    shutil.rmtree(source / lab, ignore_errors=True)  # no stale companion files
    return write_source(lab, source)


# ---------------------------------------------------------------------------------------------
# The rules a source lab follows (checked by tests/test_notebooks.py and before every build).

def _regions(source: str, begin: str, end: str) -> tuple[list[str], str | None]:
    """Lines inside begin/end markers, or an error when the markers do not pair up."""
    inside, lines = False, []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == begin:
            if inside:
                return [], f"nested '{begin}'"
            inside = True
        elif stripped == end:
            if not inside:
                return [], f"'{end}' without '{begin}'"
            inside = False
        elif inside:
            lines.append(stripped)
    return lines, (f"'{begin}' without '{end}'" if inside else None)


def lint(lab: str) -> list[str]:
    """Problems with ``lab``'s nbgrader metadata; empty when the lab is fit to grade."""
    nb = source_notebook(lab)
    problems, ids, autograded = [], set(), 0
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        where = f"{lab} cell {i} ({(meta or {}).get('grade_id', cell.source[:40]).strip()!r})"
        for begin, end in ((BEGIN_SOLUTION, END_SOLUTION), (BEGIN_HIDDEN, END_HIDDEN)):
            _, error = _regions(cell.source, begin, end)
            if error:
                problems.append(f"{where}: {error}")
        if cell.cell_type != "code" and meta is None:
            continue
        if meta is None:
            problems.append(f"{where}: code cell without nbgrader metadata (lock it or make it a solution)")
            continue
        gid = meta.get("grade_id")
        if not gid:
            problems.append(f"{where}: no grade_id")
        elif gid in ids:
            problems.append(f"{where}: grade_id {gid!r} used twice")
        ids.add(gid)
        solution, grade, locked = meta.get("solution"), meta.get("grade"), meta.get("locked")
        has_solution = BEGIN_SOLUTION in cell.source
        has_hidden = BEGIN_HIDDEN in cell.source
        if cell.cell_type == "code" and not solution and not locked:
            problems.append(f"{where}: code cell neither locked nor a solution")
        if has_solution and not solution:
            problems.append(f"{where}: solution markers in a cell not marked solution")
        if solution and cell.cell_type == "code" and not has_solution:
            problems.append(f"{where}: solution cell without '{BEGIN_SOLUTION}' region")
        if has_hidden and not grade:
            problems.append(f"{where}: hidden tests in a cell that is not graded")
        if grade:
            if not isinstance(meta.get("points"), (int, float)) or meta["points"] <= 0:
                problems.append(f"{where}: graded cell without positive points")
            if cell.cell_type == "code" and not solution:
                autograded += 1
                if not locked:
                    problems.append(f"{where}: test cell not locked")
    if autograded == 0:
        problems.append(f"{lab}: no autograded test cell")
    return problems


def leaks(lab: str, student_text: str) -> list[str]:
    """Solution or hidden-test lines of ``lab`` that appear in its student notebook's text."""
    nb = source_notebook(lab)
    secret, public = set(), set()
    for cell in nb.cells:
        sol, _ = _regions(cell.source, BEGIN_SOLUTION, END_SOLUTION)
        hidden, _ = _regions(cell.source, BEGIN_HIDDEN, END_HIDDEN)
        secret |= set(sol) | set(hidden)
        public |= {line.strip() for line in _strip_regions(cell.source).splitlines()}
    student = nbformat.reads(student_text, as_version=4)
    shown = {line.strip() for cell in student.cells for line in cell.source.splitlines()}
    # Lines that also appear outside the secret regions (a blank, `return out`) are not secrets.
    found = sorted(line for line in secret - public if len(line) > 3 and line in shown)
    markers = [m for m in (BEGIN_SOLUTION, BEGIN_HIDDEN, END_HIDDEN) if m in student_text]
    return markers + found


def _strip_regions(source: str, keep_solutions: bool = False) -> str:
    """``source`` without its markers, its hidden tests and, unless ``keep_solutions``, its
    solutions."""
    out, skip = [], False
    for line in source.splitlines():
        marker = line.strip()
        if marker in (BEGIN_SOLUTION, BEGIN_HIDDEN):
            skip = marker == BEGIN_HIDDEN or not keep_solutions
        elif marker in (END_SOLUTION, END_HIDDEN):
            skip = False
        elif not skip:
            out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distlab build",
        description="Regenerate notebooks/<lab>/ from solutions/<lab>/<lab>.py with nbgrader, and "
                    "nbgrader's source folder for instructors (build/source/<lab>/).")
    parser.add_argument("labs", nargs="*", metavar="LAB", help="labs to build (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if notebooks/ differs from a fresh build")
    parser.add_argument("--force", action="store_true",
                        help="delete files in notebooks/<lab>/ and build/source/<lab>/ that the "
                             "build does not write (without it, such a file stops that lab's "
                             "build)")
    args = parser.parse_args(argv)
    chosen = args.labs or labs()
    unknown = sorted(set(chosen) - set(labs()))
    if unknown:
        print(f"no such lab: {', '.join(unknown)} (labs: {', '.join(labs())})", file=sys.stderr)
        return 2
    problems = [p for lab in chosen for p in lint(lab)]
    if problems:
        print("nbgrader metadata problems:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    status = 0
    for lab, files in build_student_notebooks(chosen).items():
        changed = stale(lab, files)
        leaked = leaks(lab, files.get(f"{lab}.ipynb", "{}"))
        if leaked:
            print(f"{lab}: solution or hidden-test text in the student version: {leaked}", file=sys.stderr)
            status = 1
        if args.check:
            if changed:
                print(f"{lab}: notebooks/{lab}/ is stale ({', '.join(changed)}); run `distlab build {lab}`",
                      file=sys.stderr)
                status = 1
            continue
        try:
            if changed:
                write_student_notebooks(lab, files, force=args.force)
                print(f"{lab}: wrote notebooks/{lab}/ ({', '.join(sorted(files))})")
            else:
                print(f"{lab}: up to date")
            write_course_source(lab, force=args.force)
        except FolderInUse as exc:
            print(f"{lab}: {exc}", file=sys.stderr)
            status = 1
    if not args.check:
        # the formgrader creates its gradebook there (distlab grade fills it) but not the folder
        GRADEBOOK.parent.mkdir(parents=True, exist_ok=True)
        print(f"nbgrader's source folder: {COURSE_SOURCE.relative_to(REPO)}/ "
              "(`make formgrader` lists its labs)")
    return status


if __name__ == "__main__":
    sys.exit(main())
