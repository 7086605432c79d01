"""What comes in: the submissions found in SUBMISSIONS_DIR, the course template they are graded
against, and the locked cells a student edited or deleted."""
from __future__ import annotations

import shutil
from pathlib import Path


def discover(folder: Path, known: list[str], selected: list[str] | None = None
             ) -> tuple[dict[str, list[str]], list[str]]:
    """{student: [lab, ...]} for every ``<student>/<lab>/<lab>.ipynb`` of a lab in ``selected``
    (default: every lab ``known`` to the course); and warnings. Labs of the course that were not
    selected (``--lab``) are skipped with one warning that counts them."""
    selected = known if selected is None else selected
    found, warnings, unselected = {}, [], 0
    for student_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for lab_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if not (lab_dir / f"{lab_dir.name}.ipynb").is_file():
                warnings.append(f"{lab_dir}: no {lab_dir.name}.ipynb inside; skipped")
            elif lab_dir.name not in known:
                warnings.append(f"{lab_dir}: {lab_dir.name!r} is not a lab of this course; skipped")
            elif lab_dir.name not in selected:
                unselected += 1
            else:
                found.setdefault(student_dir.name, []).append(lab_dir.name)
    if unselected:
        warnings.append(f"{unselected} notebook{'s' if unselected > 1 else ''} of labs not "
                        f"selected (--lab {' --lab '.join(selected)}) skipped")
    return found, warnings


def prepare_template(workdir: Path, labs: list[str]) -> Path:
    """A course directory with every lab's source, release and gradebook entries."""
    from distlab.grading.course_dir import generate
    template = workdir / "template"
    shutil.rmtree(template, ignore_errors=True)
    template.mkdir(parents=True)
    generate(labs, template)
    return template


def locked_cell_flags(release_nb: Path, submitted_nb: Path) -> list[str]:
    """Locked cells of the released notebook that the submission edited or deleted."""
    import nbformat
    from nbgrader.utils import compute_checksum, is_locked
    release = nbformat.read(release_nb, as_version=4)
    try:
        submitted = nbformat.read(submitted_nb, as_version=4)
    except Exception as exc:  # not a notebook at all: nbgrader will fail it too
        return [f"unreadable notebook ({type(exc).__name__})"]
    theirs = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in submitted.cells}
    flags = []
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade_id") or not is_locked(cell):
            continue
        mine = theirs.get(meta["grade_id"])
        if mine is None:
            flags.append(f"deleted locked cell {meta['grade_id']}")
        elif compute_checksum(mine) != meta.get("checksum"):
            flags.append(f"edited locked cell {meta['grade_id']}")
    return flags
