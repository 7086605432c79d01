"""The course's own answers, executed from the lab sources (``solutions/``) for the tests and
benchmarks that compare against them: only the imports cell and the solution cells run."""
from __future__ import annotations

from distlab import paths
from distlab.grading.course_dir import source_notebook


def solution_functions(lab: str, names: tuple[str, ...], setup: tuple[str, ...] = ("imports",)
                       ) -> dict:
    """``names`` as the solution cells of ``lab`` define them (after its ``setup`` cells)."""
    namespace = solution_namespace(lab, setup=setup,
                                   filename=lambda grade_id: f"<{lab}:{grade_id}>")
    return {k: namespace[k] for k in names}


def solution_namespace(lab: str, edits=(), setup: tuple[str, ...] = ("imports",),
                       filename=None) -> dict:
    """What the solution cells of ``lab`` and its ``setup`` cells (by grade_id: the imports)
    define, run in order, with each (grade_id, old, new) of ``edits`` applied once to its cell
    first: a planted mistake. Code is compiled under the source's path (``filename(grade_id)``
    if given), so a traceback shows the cell's lines as a student's notebook would."""
    path = str(paths.lab_source(lab))
    # A module name nobody can import makes cloudpickle ship these functions to ranks by value.
    namespace = {"__name__": f"lab{lab[:2]}_solution"}
    pending = list(edits)
    for cell in source_notebook(lab).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not (meta.get("solution") or meta.get("grade_id") in setup):
            continue
        code = cell.source
        for edit in [e for e in pending if e[0] == meta["grade_id"] and e[1] in code]:
            code = code.replace(edit[1], edit[2], 1)
            pending.remove(edit)
        exec(compile(code, filename(meta["grade_id"]) if filename else path, "exec"), namespace)
    if pending:
        raise ValueError(f"{lab}: edits that did not apply (the solution changed): {pending}")
    return namespace
