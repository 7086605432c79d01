"""nbgrader's course directories, as the grader builds them: a lab's source notebook (solutions
and hidden tests included, made from ``solutions/<lab>/<lab>.py``), the release and gradebook
``nbgrader generate_assignment`` makes of it, and an in-process nbgrader API on such a folder."""
from __future__ import annotations

import copy
import functools
import logging
import os
import re
import shutil
import sys
from pathlib import Path

import nbformat

from distlab import paths

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def source_notebook(lab: str) -> nbformat.NotebookNode:
    """nbgrader's source notebook (solutions and hidden tests included) for ``lab``: a new
    notebook on every call (callers edit it)."""
    nb = copy.deepcopy(_parsed(paths.lab_source(lab).read_text(encoding="utf-8")))
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    seen: dict[str, int] = {}
    for i, cell in enumerate(nb.cells):
        # Stable ids keep rebuilt notebooks byte-identical (nbformat would draw random ones).
        base = cell.metadata.get("nbgrader", {}).get("grade_id") or f"{cell.cell_type}-{i}"
        base = re.sub(r"[^A-Za-z0-9_-]", "-", base)[:60]
        seen[base] = seen.get(base, 0) + 1
        cell.id = base if seen[base] == 1 else f"{base}-{seen[base]}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


@functools.lru_cache(maxsize=32)
def _parsed(source: str) -> nbformat.NotebookNode:
    """A lab's source parsed by jupytext, once per text (keyed by the text: an edited source is
    parsed again). Parsing costs 0.05-0.2 CPU-s a lab, and making the test suite's samples asks
    for the same labs' notebooks hundreds of times; a deep copy costs milliseconds."""
    import jupytext
    return jupytext.reads(source, fmt="py:percent")


def write_source(lab: str, dest: Path) -> Path:
    """Write ``lab``'s source notebook and its companion files into ``dest/<lab>/``."""
    folder = dest / lab
    folder.mkdir(parents=True, exist_ok=True)
    for extra in paths.lab_source(lab).parent.iterdir():
        # Companion files (images, small data) travel with the lab; the .py source does not.
        if extra.name in (f"{lab}.py", "__pycache__", ".ipynb_checkpoints") or extra.suffix == ".ipynb":
            continue
        copy = shutil.copytree if extra.is_dir() else shutil.copy2
        copy(extra, folder / extra.name)
    path = folder / f"{lab}.ipynb"
    nbformat.write(source_notebook(lab), path)
    return path


def scripts_on_path(path: str) -> str:
    """``path`` (a PATH) with this interpreter's scripts folder on it: nbgrader runs the
    `alembic` command to open a gradebook, found even when the virtual environment is not
    activated."""
    bindir = str(Path(sys.executable).parent)
    return path if bindir in path.split(os.pathsep) else bindir + os.pathsep + path


def nbgrader_api(root: Path, db: Path | None = None, config=None):
    """An in-process nbgrader API on the course directory ``root`` (its gradebook in ``db``)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    os.environ["PATH"] = scripts_on_path(os.environ.get("PATH", ""))
    from distlab.grading.schema_version import read_not_run
    read_not_run()   # a new gradebook's schema version read, not asked of a fresh interpreter
    cfg = Config(config or {})
    (root / "exchange").mkdir(parents=True, exist_ok=True)  # unused, but nbgrader wants one
    cfg.Exchange.root = str(root / "exchange")
    cfg.CourseDirectory.root = str(root)
    # A private course folder in nbgrader's default layout (the course config maps the repo's).
    for kind in ("source", "release", "submitted", "autograded", "feedback"):
        setattr(cfg.CourseDirectory, f"{kind}_directory", kind)
    cfg.CourseDirectory.db_url = f"sqlite:///{db or root / 'gradebook.db'}"
    cfg.CourseDirectory.course_id = "distlab"
    log = logging.getLogger("distlab.nbgrader")
    log.setLevel(logging.ERROR)
    coursedir = CourseDirectory(config=cfg, log=log)
    return NbGraderAPI(coursedir=coursedir, config=cfg, log=log)


def generate(labs_: list[str], root: Path) -> Path:
    """Run ``nbgrader generate_assignment`` for ``labs_`` in course directory ``root``."""
    for lab in labs_:
        write_source(lab, root / "source")
    api = nbgrader_api(root)
    for lab in labs_:
        result = api.generate_assignment(lab, force=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment failed for {lab}:\n{result['error']}"
                               f"\n{result.get('log', '')}")
    return root / "release"
