"""Planted mistakes packed into fewer graded notebooks, each still the one reason its test fails.

A lab's planted mistakes (a module's ``own_graded_samples``) were one notebook each: a whole lab
graded per mistake (Lab 8's eight were a fifth of the shared grading run's CPU). Mistakes share a
notebook here only when nothing in it can make one mistake's test see another's edit:

- their tests differ, and so do the cells they edit;
- no test of one can reach another's edited cells: a test reaches the cells that define the
  names its cell uses (hidden tests included: the instructor's source is read), then those that
  define the names those cells use, and so on (``reach``; a function's parameters and locals
  are its own, not a cell's globals). A class built on another exercise's class, or a design
  that calls an earlier answer, keeps its mistake apart. A cell that does not parse may define
  anything, so every test that uses a name before it reaches it;
- except the cells a lab's test module declares, for a test, graded against the student's own
  code (``against_own``, with the reason in a comment: a check that compares the student's
  loop with a run made of the student's own earlier functions, which a mistake there changes
  alike). Verified, not trusted: the first mistake in each declared cell is graded in a
  notebook without the test's own mistakes (``witnesses``), which must keep that test.

So in a shared notebook each mistake's test fails because of that mistake alone, and every other
test passes though the notebook holds the other mistakes too: each still loses exactly its test.
"""
from __future__ import annotations

import functools
import symtable


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names the cell defines at top level, the global names it uses) of a code cell's source.
    Python's own scopes decide (``symtable``): a function's parameters and locals (a ``restart``
    argument) are not the global a later cell defines under that name. A cell that does not
    parse (IPython magics) may define and use anything: "*"."""
    try:
        top = symtable.symtable(source, "<cell>", "exec")
    except SyntaxError:
        return {"*"}, {"*"}
    defined = {s.get_name() for s in top.get_symbols()
               if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used, todo = set(), [top]
    while todo:
        table = todo.pop()
        todo.extend(table.get_children())
        for s in table.get_symbols():
            if s.is_global() and s.is_referenced():
                used.add(s.get_name())
            if table is not top and s.is_declared_global() and s.is_assigned():
                defined.add(s.get_name())     # `global x; x = ...` in a function
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


def independent(lab: str, a: tuple[str, set[str]], b: tuple[str, set[str]],
                against_own=None) -> bool:
    """Whether mistakes ``a`` and ``b`` ((the test it loses, the cells it edits)) may share a
    notebook: other tests, other cells, and neither test reaches what the other's cells define
    (``graded_reach``: less the cells ``against_own`` declares for it)."""
    (tests_a, cells_a), (tests_b, cells_b) = (tests(a[0]), a[1]), (tests(b[0]), b[1])
    if tests_a & tests_b or cells_a & cells_b:
        return False
    return not (any(graded_reach(lab, t, against_own) & cells_b for t in tests_a)
                or any(graded_reach(lab, t, against_own) & cells_a for t in tests_b))


def graded_reach(lab: str, test: str, against_own=None) -> set[str]:
    """``reach``, less the cells whose mistakes ``test``'s check is declared to grade against
    the student's own code (``against_own``: {test: cells}; a check that compares the student's
    loop with a run of the student's own earlier functions: a mistake there changes both alike).
    The search still goes through those cells: what they use, if edited, counts. A declared
    cell the test does not reach is an error (a declaration left behind by a change)."""
    declared = set((against_own or {}).get(test, ()))
    reached = reach(lab, test)
    if declared - reached:
        raise ValueError(f"{lab}: {test} is declared graded against the student's own "
                         f"{sorted(declared - reached)}, which it does not reach: remove them")
    return reached - declared


def witnesses(mistakes: dict[str, tuple[str, set[str]]], against_own=None) -> dict[str, set]:
    """{mistake: the declared tests it must be graded without}: for each cell a test is
    declared graded against (``against_own``), the first mistake that edits it shares no
    notebook with a mistake of that test. That notebook must keep the test (the grading
    assertion says so), which a wrong declaration loses: the declaration is verified, not
    trusted."""
    found: dict[str, set] = {}
    for test, cells in (against_own or {}).items():
        for cell in sorted(cells):
            first = next((name for name, (_, edits) in mistakes.items() if cell in edits), None)
            if first is not None:
                found.setdefault(first, set()).add(test)
    return found


def tests(loses) -> set[str]:
    """The tests a mistake loses: one (a str) or several (a tuple: a design that misses the
    first step of a scale misses the bar beyond it too)."""
    return {loses} if isinstance(loses, str) else set(loses)


def pack(lab: str, mistakes: dict[str, tuple[str, set[str]]], alone=(),
         against_own=None) -> list[list[str]]:
    """``mistakes`` ({name: (the test it loses, the cells it edits)}) in as few notebooks as
    hold only independent ones (first fit, in the given order); ``alone``: mistakes graded in a
    notebook of their own whatever this finds (those only the grader tells apart);
    ``against_own``: {test: cells its check grades against the student's own code}, each
    verified by a ``witnesses`` notebook."""
    groups: list[list[str]] = []
    witness = witnesses(mistakes, against_own)

    def fits(a: str, b: str) -> bool:
        return (independent(lab, mistakes[a], mistakes[b], against_own)
                and not witness.get(a, set()) & tests(mistakes[b][0])
                and not witness.get(b, set()) & tests(mistakes[a][0]))

    for name in mistakes:
        home = None if name in alone else next(
            (g for g in groups if g[0] not in alone
             and all(fits(other, name) for other in g)), None)
        if home is None:
            groups.append([name])
        else:
            home.append(name)
    return groups


def grouped(lab: str, mistakes: dict[str, tuple[str, list]], alone=(),
            against_own=None) -> dict[str, list[str]]:
    """{sample: its mistakes' names} for ``mistakes`` ({name: (the test it loses, its edits
    [(grade id, old, new)])}) packed as ``pack`` does: a sample is named after its mistakes,
    joined by "+"."""
    groups = pack(lab, {name: (test, {cell for cell, _, _ in edits})
                        for name, (test, edits) in mistakes.items()}, alone, against_own)
    return {"+".join(group): group for group in groups}


def packed_samples(lab: str, mistakes: dict[str, tuple[str, list]], alone=(),
                   against_own=None) -> dict:
    """{(sample, lab): notebook}: each sample of ``grouped`` with all its mistakes' edits."""
    from . import edited_cells
    return {(sample, lab): edited_cells(lab, [e for name in group for e in mistakes[name][1]])
            for sample, group in grouped(lab, mistakes, alone, against_own).items()}


def lost(samples: dict[str, list[str]], mistakes: dict[str, tuple[str, list]],
         mistake: str) -> tuple[str, set[str]]:
    """(the sample of ``grouped`` that holds ``mistake``, the tests its mistakes lose)."""
    sample = next(name for name, group in samples.items() if mistake in group)
    return sample, {t for name in samples[sample] for t in tests(mistakes[name][0])}
