"""Sample submissions, made from the lab sources by code so they never go stale.

A submission is what a student hands in: the released student notebook (``notebooks/<lab>/``)
with some solution cells filled in. ``solved`` fills them from the lab's source; the Lab 1
samples then break it in the ways the grader must survive (a hang in a collective, a rank that
dies, an edited locked test cell).
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from distlab import notebooks
from distlab.notebooks import source_notebook

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# Where the released student notebooks are read from: the committed ones by default; the grading
# test points this at a fresh build so that it grades what the sources give today.
RELEASED = {"root": notebooks.NOTEBOOKS}


def _unmarked(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if line.strip() not in (BEGIN, END))


def student(lab: str) -> nbformat.NotebookNode:
    """The untouched student notebook of ``lab``."""
    return nbformat.read(RELEASED["root"] / lab / f"{lab}.ipynb", as_version=4)


def solved(lab: str, only: set[str] | None = None) -> nbformat.NotebookNode:
    """The student notebook with the solution cells in ``only`` (all if None) answered as the
    lab's source answers them."""
    answers = {c.metadata["nbgrader"]["grade_id"]: _unmarked(c.source)
               for c in source_notebook(lab).cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = student(lab)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers and (only is None or gid in only):
            cell.source = answers[gid]
    return nb


def replace_cell(nb: nbformat.NotebookNode, grade_id: str, source: str) -> nbformat.NotebookNode:
    """``nb`` with cell ``grade_id``'s source replaced (as a student editing it would)."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source
            return nb
    raise KeyError(grade_id)


# Lab 1's broken answers -------------------------------------------------------------------

HANGS = '''\
def all_reduce_rs_ag(tensor):
    """Forgets the all-gather on rank 0: the other ranks wait for it forever."""
    n = dist.get_world_size()
    flat = tensor.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    shard = padded.new_empty(padded.numel() // n)
    dist.reduce_scatter_single(shard, padded)
    if dist.get_rank() == 0:
        return tensor
    full = torch.empty_like(padded)
    dist.all_gather_single(full, shard)
    return full[:flat.numel()].reshape(tensor.shape)
'''

CRASHES = '''\
def ring_all_reduce(tensor):
    """Rank 1 dies in the middle of the ring."""
    import os
    if dist.get_rank() == 1:
        os._exit(3)
    out = tensor.clone()
    dist.all_reduce(out)
    return out
'''


def lab01_samples() -> dict[str, tuple[nbformat.NotebookNode, dict]]:
    """{student: (notebook, expected {test: status})} for Lab 1's special cases."""
    lab = "01_collectives"
    tests = ["test_all_reduce_rs_ag", "test_ring_all_reduce", "test_bandwidths", "test_alpha_beta"]
    ok = dict.fromkeys(tests, "pass")
    return {
        "partial": (solved(lab, {"all_reduce_rs_ag", "bandwidths"}),
                    {**ok, "test_ring_all_reduce": "not-done", "test_alpha_beta": "not-done"}),
        "hang": (replace_cell(solved(lab), "all_reduce_rs_ag", HANGS),
                 {**ok, "test_all_reduce_rs_ag": "hang"}),
        "crash": (replace_cell(solved(lab), "ring_all_reduce", CRASHES),
                  {**ok, "test_ring_all_reduce": "crash"}),
        "edited_test": (replace_cell(student(lab), "test_bandwidths", "print('all good')"),
                        {**dict.fromkeys(tests, "not-done")}),
    }


def write(nb: nbformat.NotebookNode, folder: Path, student_id: str, lab: str) -> Path:
    path = folder / student_id / lab / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
