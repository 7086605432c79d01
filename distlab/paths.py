"""Where the course's files are, decided in one place: the lab sources (``solutions/``), the
student labs (``notebooks/``), the reference data (``data/``), the grader's nbgrader config
(``grader/``) and the build folder.

The course root is, in order:
1. the folder named by ``DISTLAB_COURSE`` (to grade with an installed package against another
   copy of the course: ``DISTLAB_COURSE=DIR distlab grade ...``);
2. the source checkout this package was imported from (``pip install -e .``, or run in place);
3. the copy of the course installed with the package (``pip install .``; ``setup.py`` copies the
   course's folders into the wheel), under ``distlab/course_files/``.

A course is the instructor's (``solutions/``, ``data/``, ``grader/``: it can build and grade) or a
student handout (``notebooks/`` and ``data/``, made by ``distlab release``: the labs and their
visible tests run; asking it for solutions or the grader's config is an error that says so).

It sits below every floor of the package (it imports only the standard library): the checks read
reference data and the labs read sample traces, so neither may depend on the course tools above.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "DISTLAB_COURSE"
PACKAGE = Path(__file__).resolve().parent
INSTALLED = PACKAGE / "course_files"
MARKERS = ("solutions", "data", "grader")  # a folder holding these is the instructor's course
HANDOUT = ("notebooks", "data")            # ... and these, a student handout (distlab release)


def _is_course(folder: Path) -> bool:
    return any(all((folder / marker).is_dir() for marker in kind) for kind in (MARKERS, HANDOUT))


def root() -> Path:
    """The course root (see the module's docstring); an error that says what to do if none."""
    named = os.environ.get(ENV)
    if named:
        folder = Path(named).expanduser().resolve()
        if not _is_course(folder):
            raise FileNotFoundError(
                f"{ENV}={named} is not a distlab course: it needs the folders "
                f"{', '.join(MARKERS)} (or, a handout, {', '.join(HANDOUT)}). Point it at a "
                f"checkout of the course, or unset it.")
        return folder
    for folder in (PACKAGE.parent, INSTALLED):
        if _is_course(folder):
            return folder
    raise FileNotFoundError(
        f"distlab cannot find its course files (folders {', '.join(MARKERS)}) beside the package "
        f"({PACKAGE.parent}) or installed with it ({INSTALLED}). Install the course with "
        f"`pip install .` from its checkout, or name a checkout with {ENV}=DIR.")


def _instructors(name: str) -> Path:
    folder = root() / name
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{root()} is a student handout: it has no {name}/ (the instructor keeps it). Build "
            f"and grade from the course's checkout, or name it with {ENV}=DIR.")
    return folder


def solutions() -> Path:
    return _instructors("solutions")


def notebooks() -> Path:
    return root() / "notebooks"


def data() -> Path:
    return root() / "data"


def grader() -> Path:
    return _instructors("grader")


def build() -> Path:
    """Where generated files go (site, nbgrader's course source): inside a checkout, its
    ``build/``; for an installed course, ``./build`` of the folder the command runs in."""
    base = root()
    return base / "build" if os.access(base, os.W_OK) and base != INSTALLED else Path("build").resolve()


def labs() -> list[str]:
    """Every lab with a source: the folders ``solutions/NN_name/`` holding ``NN_name.py`` (in a
    handout, the student labs ``notebooks/NN_name/NN_name.ipynb``)."""
    if (root() / "solutions").is_dir():
        found = solutions().glob("*/*.py")
    else:
        found = notebooks().glob("*/*.ipynb")
    return sorted(p.parent.name for p in found if p.stem == p.parent.name)


def lab_source(lab: str) -> Path:
    """The single source of ``lab``: ``solutions/<lab>/<lab>.py``."""
    return solutions() / lab / f"{lab}.py"
