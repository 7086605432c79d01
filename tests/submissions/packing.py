"""Planted mistakes packed into fewer graded notebooks, each still the one reason its test fails.

A lab's planted mistakes (a module's ``own_graded_samples``) were one notebook each: a whole lab
graded per mistake (Lab 8's eight were a fifth of the shared grading run's CPU). Mistakes share a
notebook here only when nothing in it can make one mistake's test see another's edit:

- their tests differ, and so do the cells they edit;
- no test of one can reach another's edited cells: a test reaches the cells that define the
  names its cell uses (hidden tests included: the instructor's source is read), then those that
  define the names those cells use, and so on (``reach``). A class built on another exercise's
  class, or a design that calls an earlier answer, keeps its mistake apart. A cell that does not
  parse may define anything, so every test that uses a name before it reaches it.

So in a shared notebook each mistake's test fails because of that mistake alone, and every other
test passes though the notebook holds the other mistakes too: each still loses exactly its test.
"""
from __future__ import annotations

import ast
import functools


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names the cell's top level defines, every name it uses) of a code cell's source; a
    cell that does not parse (IPython magics) may define and use anything: "*"."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {"*"}, {"*"}
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return defined, used


@functools.lru_cache(maxsize=None)
def _cells(lab: str) -> list[tuple[str, set[str], set[str]]]:
    """[(grade id, defined, used)] of the code cells of the lab's source notebook, in order."""
    from distlab.course.notebooks import source_notebook
    return [(c.metadata["nbgrader"]["grade_id"], *_names(c.source))
            for c in source_notebook(lab).cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade_id")]


def reach(lab: str, test: str) -> set[str]:
    """The grade ids of the cells whose code test cell ``test`` of ``lab`` can run: for each name
    a reached cell uses, the last cell up to the test that defines it (a function's names are
    looked up when the test calls it) and the last one up to the cell itself (a top-level
    statement ran then), and so on from those cells. A cell that does not parse may define any
    name: it is reached, and the search goes on past it."""
    cells = _cells(lab)
    end = next(i for i, (gid, _, _) in enumerate(cells) if gid == test)
    reached, todo = {end}, [end]
    while todo:
        at = todo.pop()
        for name in cells[at][2]:
            for start in {end, at}:
                for j in range(start, -1, -1):
                    defined = cells[j][1]
                    if (name in defined or "*" in defined) and j not in reached:
                        reached.add(j)
                        todo.append(j)
                    if name in defined:
                        break
    return {cells[i][0] for i in reached}


def independent(lab: str, a: tuple[str, set[str]], b: tuple[str, set[str]]) -> bool:
    """Whether mistakes ``a`` and ``b`` ((the test it loses, the cells it edits)) may share a
    notebook: other tests, other cells, and neither test reaches what the other's cells define."""
    (tests_a, cells_a), (tests_b, cells_b) = (tests(a[0]), a[1]), (tests(b[0]), b[1])
    if tests_a & tests_b or cells_a & cells_b:
        return False
    return not (any(reach(lab, t) & cells_b for t in tests_a)
                or any(reach(lab, t) & cells_a for t in tests_b))


def tests(loses) -> set[str]:
    """The tests a mistake loses: one (a str) or several (a tuple: a design that misses the
    first step of a scale misses the bar beyond it too)."""
    return {loses} if isinstance(loses, str) else set(loses)


def pack(lab: str, mistakes: dict[str, tuple[str, set[str]]], alone=()) -> list[list[str]]:
    """``mistakes`` ({name: (the test it loses, the cells it edits)}) in as few notebooks as
    hold only independent ones (first fit, in the given order); ``alone``: mistakes graded in a
    notebook of their own whatever this finds (those only the grader tells apart)."""
    groups: list[list[str]] = []
    for name, mistake in mistakes.items():
        home = None if name in alone else next(
            (g for g in groups if g[0] not in alone
             and all(independent(lab, mistakes[other], mistake) for other in g)), None)
        if home is None:
            groups.append([name])
        else:
            home.append(name)
    return groups


def grouped(lab: str, mistakes: dict[str, tuple[str, list]], alone=()) -> dict[str, list[str]]:
    """{sample: its mistakes' names} for ``mistakes`` ({name: (the test it loses, its edits
    [(grade id, old, new)])}) packed as ``pack`` does: a sample is named after its mistakes,
    joined by "+"."""
    groups = pack(lab, {name: (test, {cell for cell, _, _ in edits})
                        for name, (test, edits) in mistakes.items()}, alone)
    return {"+".join(group): group for group in groups}


def packed_samples(lab: str, mistakes: dict[str, tuple[str, list]], alone=()) -> dict:
    """{(sample, lab): notebook}: each sample of ``grouped`` with all its mistakes' edits."""
    from . import edited_cells
    return {(sample, lab): edited_cells(lab, [e for name in group for e in mistakes[name][1]])
            for sample, group in grouped(lab, mistakes, alone).items()}


def lost(samples: dict[str, list[str]], mistakes: dict[str, tuple[str, list]],
         mistake: str) -> tuple[str, set[str]]:
    """(the sample of ``grouped`` that holds ``mistake``, the tests its mistakes lose)."""
    sample = next(name for name, group in samples.items() if mistake in group)
    return sample, {t for name in samples[sample] for t in tests(mistakes[name][0])}
