"""Sample submissions, made from the lab sources by code so they never go stale.

A submission is what a student hands in: the released student notebook (``notebooks/<lab>/``)
with some solution cells filled in. ``solved`` fills them from the lab's source; the special
samples then break it in the ways the grader must survive or score exactly (a hang in a
collective, a rank that dies, an edited locked test cell, a missing gradient average, a bucket
sized in elements, a deadlocking 1F1B schedule).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import nbformat

from distlab.course import notebooks
from distlab.course.notebooks import source_notebook

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# Where the released student notebooks are read from: the committed ones by default; the grading
# test points this at a fresh build so that it grades what the sources give today.
RELEASED = {"root": notebooks.NOTEBOOKS}


@contextlib.contextmanager
def released_from(folder):
    """Read the released notebooks from ``folder`` (a fresh build holding some labs) while
    samples are made, then from where they were read before: a test module that builds only its
    own labs must not leave later modules reading a folder without theirs."""
    before = RELEASED["root"]
    RELEASED["root"] = folder
    try:
        yield
    finally:
        RELEASED["root"] = before


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


def edited(lab: str, grade_id: str, old: str, new: str) -> nbformat.NotebookNode:
    """The solved notebook with one mistake made in solution cell ``grade_id``."""
    return edited_cells(lab, [(grade_id, old, new)])


def edited_cells(lab: str, edits) -> nbformat.NotebookNode:
    """The solved notebook with each (grade_id, old, new) edit made: one mistake that may span
    several cells."""
    nb = solved(lab)
    for grade_id, old, new in edits:
        cell = next((c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                     == grade_id), None)
        if cell is None:
            raise KeyError(grade_id)
        if old not in cell.source:
            raise ValueError(f"{lab}/{grade_id} no longer contains {old!r}: update the sample")
        cell.source = cell.source.replace(old, new, 1)
    return nb


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


# Lab 5's: a stage waits for a gradient before sending the activation that produces it.
DEADLOCKED_1F1B = '''\
def one_f_one_b_step(rank, world_size, stage, x, target, num_microbatches):
    """One forward then the backward of the same microbatch, receiving the gradient *before*
    sending the activation the next stage needs to make it: stage 0 waits on stage 1, and
    stage 1 on stage 0."""
    first, last, m = rank == 0, rank == world_size - 1, num_microbatches
    losses = []
    for xi, ti in zip(x.chunk(m), target.chunk(m)):
        a = xi if first else torch.empty_like(xi)
        if not first:
            dist.recv(a, src=rank - 1)
            a.requires_grad_()
        y = stage(a)
        if last:
            y = loss_fn(y, ti) / m
            losses.append(y.item())
            y.backward()
        else:
            g = torch.empty_like(y)
            dist.recv(g, src=rank + 1)                  # waits for a gradient ...
            dist.send(y.detach(), dst=rank + 1)         # ... that needs this activation first
            y.backward(g)
        if not first:
            dist.send(a.grad, dst=rank - 1)
    return sum(losses) if last else None
'''


def _tests(lab: str) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in source_notebook(lab).cells
            if c.metadata.get("nbgrader", {}).get("grade")]


def special_samples() -> dict[tuple[str, str], tuple[nbformat.NotebookNode, dict]]:
    """{(student, lab): (notebook, expected {test: status})} beyond solution and untouched."""
    lab1, lab2, lab5 = "01_collectives", "02_data_parallel", "05_pipeline_parallel"
    ok1, ok2, ok5 = (dict.fromkeys(_tests(lab), "pass") for lab in (lab1, lab2, lab5))
    return {
        ("partial", lab1): (solved(lab1, {"all_reduce_rs_ag", "bandwidths"}),
                            {**ok1, "test_ring_all_reduce": "not-done",
                             "test_alpha_beta": "not-done"}),
        ("hang", lab1): (replace_cell(solved(lab1), "all_reduce_rs_ag", HANGS),
                         {**ok1, "test_all_reduce_rs_ag": "hang"}),
        ("crash", lab1): (replace_cell(solved(lab1), "ring_all_reduce", CRASHES),
                          {**ok1, "test_ring_all_reduce": "crash"}),
        ("edited_test", lab1): (replace_cell(student(lab1), "test_bandwidths", "print('all good')"),
                                dict.fromkeys(ok1, "not-done")),
        ("missing_average", lab2): (edited(lab2, "data_parallel_step", "p.grad.div_(world_size)",
                                           "pass"),
                                    {**ok2, "test_data_parallel_step": "fail"}),
        ("wrong_bucket", lab2): (edited(lab2, "bucketed_all_reduce",
                                        "per_bucket = bucket_bytes // buffer.element_size()",
                                        "per_bucket = bucket_bytes"),
                                 {**ok2, "test_bucketed_all_reduce": "fail"}),
        ("deadlock", lab5): (replace_cell(solved(lab5), "one_f_one_b_step", DEADLOCKED_1F1B),
                             {**ok5, "test_one_f_one_b_step": "fail"}),
    }


def write(nb: nbformat.NotebookNode, folder: Path, student_id: str, lab: str) -> Path:
    path = folder / student_id / lab / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path

