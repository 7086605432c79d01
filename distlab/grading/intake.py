"""What comes in: the submissions found in SUBMISSIONS_DIR, the course template they are graded
against, and the locked cells a student edited or deleted."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from distlab import paths
from distlab.grading.files import made_whole, stamp_of


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


STAMP = ".distlab-template"   # a template's file holding the key it was made for
KEEP_TEMPLATES = 3            # templates kept in the build folder (other versions of the labs)


def prepare_template(workdir: Path, labs: list[str]) -> Path:
    """A course directory with every lab's source, release and gradebook entries.

    ``nbgrader generate_assignment`` costs seconds per lab, so a template is made once for what
    it is made from (``template_key``) and then copied: from the workdir's own (a resumed run, a
    regrade) or from the course's build folder (another workdir), which holds the same source
    notebooks as ``build/source``."""
    key = template_key(labs)
    template = workdir / "template"
    if _stamp(template) == key:
        return template
    made = course_template(labs, key)
    shutil.rmtree(template, ignore_errors=True)
    shutil.copytree(made, template)
    return template


def course_template(labs: list[str], key: str | None = None) -> Path:
    """The template for ``labs`` in the course's build folder, made there if it is not (``key``:
    ``template_key(labs)``, when the caller has it). Read it, or copy it: never write into it.
    ``distlab build`` reads its student notebooks from its release too (the same
    ``generate_assignment`` of the same sources)."""
    key = key or template_key(labs)
    cache = paths.build() / "grading-templates"
    made = cache / key
    if _stamp(made) != key:
        _generate(made, labs, key)
    _prune(cache, keep=made)
    return made


def template_key(labs: list[str]) -> str:
    """What a template is made from: the labs' source folders, nbgrader's, jupytext's and
    nbformat's versions, and the code that makes it."""
    import jupytext
    import nbformat
    import nbgrader
    from distlab.grading import course_dir
    digest = hashlib.sha256()
    for part in (nbgrader.__version__, jupytext.__version__, nbformat.__version__):
        digest.update(f"{part}\0".encode())
    for code in (course_dir.__file__, __file__):
        digest.update(Path(code).read_bytes())
    for lab in labs:
        folder = paths.lab_source(lab).parent
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not {"__pycache__", ".ipynb_checkpoints"} & set(path.parts):
                digest.update(f"{lab}/{path.relative_to(folder).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def _stamp(template: Path) -> str | None:
    return stamp_of(template, STAMP)


def _generate(dest: Path, labs: list[str], key: str) -> None:
    """Make the template beside ``dest`` and move it in whole (``made_whole``)."""
    from distlab.grading.course_dir import generate
    made_whole(dest, STAMP, key, lambda folder: generate(labs, folder))


def _prune(cache: Path, keep: Path) -> None:
    """Keep the KEEP_TEMPLATES most recently used templates (``keep`` among them)."""
    keep.touch()
    made = sorted((p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for old in made[KEEP_TEMPLATES:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


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
