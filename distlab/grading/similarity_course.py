"""The course's side of the copy report (similarity.py): the package's implementations, as text
and as code objects, and each lab's handed-out cells and solution. All read from files: nothing
of the course is imported or run here.
"""
from __future__ import annotations

import collections
from pathlib import Path

from distlab import paths
from distlab.grading import similarity_cache
from distlab.grading.similarity_code import code_keys, definitions
from distlab.grading.similarity_text import fingerprints

REFERENCE_FLOORS = ("labs", "checks")   # the package's floors whose code could be an answer


def _files(package: Path) -> list[tuple[str, Path]]:
    """(module name, path) of each lab and check module."""
    return [(".".join(path.relative_to(package.parent).with_suffix("").parts), path)
            for floor in REFERENCE_FLOORS for path in sorted((package / floor).rglob("*.py"))]


def _modules(package: Path):
    """(module name, source) of each lab and check module."""
    for module, path in _files(package):
        yield module, path.read_text()


def course_implementations(package: Path = paths.PACKAGE) -> dict[str, str]:
    """{"module:qualname": source} of every function, class and method in the shipped lab and
    check modules."""
    return {f"{module}:{qualname}": text for module, source in _modules(package)
            for _, qualname, text in definitions(source)}


def course_code(package: Path = paths.PACKAGE) -> dict[str, list[str]]:
    """{code key: ["module:qualname", ...]} of every function compiled from the shipped lab and
    check modules (methods and nested functions included)."""
    found = collections.defaultdict(list)
    for module, source in _modules(package):
        for key, (_, qualname, _) in code_keys(source, f"{module}.py").items():
            found[key].append(f"{module}:{qualname}")
    return dict(found)


def course_side(package: Path = paths.PACKAGE) -> dict:
    """What the report compares answers with, computed once per version of the course's lab and
    check modules (kept by similarity_cache.py in the user's cache folder, keyed by those files'
    bytes, the interpreter and the report's own code): ``{"sources": course_implementations(),
    "prints": {name: the fingerprints of its source, sorted}, "code": course_code()}``."""
    def compute() -> dict:
        sources = course_implementations(package)
        return {"sources": sources,
                "prints": {name: sorted(fingerprints(src)[1]) for name, src in sources.items()},
                "code": course_code(package)}
    return similarity_cache.cached("course", _files(package), compute,
                                   fields=("sources", "prints", "code"))


def sources_code(sources: dict[str, str]) -> dict[str, list[str]]:
    """{code key: [name, ...]} of the functions in ``sources`` ({name: source}), for a report on
    implementations given as text."""
    found = collections.defaultdict(list)
    for name, source in sources.items():
        for key in code_keys(source):
            found[key].append(name)
    return dict(found)


def _solution_cells(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}


def course_cells(lab: str, released: Path | None = None) -> dict[str, list[str]]:
    """{grade_id: [handed-out code, the course's solution]} for ``lab``'s solution cells; the
    handed-out cells from ``released/<lab>/`` (the grading run's own nbgrader release) where it
    has the lab, else from the student labs in ``notebooks/``."""
    import nbformat
    from distlab.grading.course_dir import source_notebook

    handout = released / lab / f"{lab}.ipynb" if released else None
    if handout is None or not handout.is_file():
        handout = paths.notebooks() / lab / f"{lab}.ipynb"
    handed = _solution_cells(nbformat.read(handout, as_version=4))
    solved = _solution_cells(source_notebook(lab))
    marks = ("### BEGIN SOLUTION", "### END SOLUTION")
    return {gid: [code, "\n".join(line for line in solved.get(gid, "").splitlines()
                                  if line.strip() not in marks)]
            for gid, code in handed.items()}

