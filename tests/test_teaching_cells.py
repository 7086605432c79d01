"""Cells tagged ``teaching`` are not run at grading time (distlab.grading.execution): no check may
depend on one. Statically, for every lab source: a teaching cell is locked, neither a test nor an
answer, and no later cell that is run reads a name that only teaching cells define. (Dynamically,
tests/test_grader.py grades the reference answers to full marks with those cells skipped.)"""
from __future__ import annotations

import ast

import jupytext
import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from distlab import paths
from distlab.grading.execution import TEACHING_TAG, teaching_ids


def _tree(source: str) -> ast.AST:
    return ast.parse(TransformerManager().transform_cell(source))  # %magics become plain calls


def _defined(tree: ast.AST) -> set[str]:
    """Names a cell binds at its top level (assignments, defs, imports, loop and with targets)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _stored(nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _read(tree: ast.AST) -> set[str]:
    """Names a cell reads from the notebook's namespace: its free names (a function's parameters
    and locals, a comprehension's variables are its own)."""
    reads = set()

    def visit(node, local: frozenset):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for outer in [*a.defaults, *filter(None, a.kw_defaults),
                          *getattr(node, "decorator_list", [])]:
                visit(outer, local)
            params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                      if x is not None}
            body = node.body if isinstance(node.body, list) else [node.body]
            inner = local | params | _stored(body)
            for child in body:
                visit(child, frozenset(inner))
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            local = local | _stored(g.target for g in node.generators)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
            reads.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, local)
    visit(tree, frozenset())
    return reads


def reads_of_skipped(nb) -> list[str]:
    """``cell X reads NAME, defined only by the skipped cell Y`` for each such read in ``nb``."""
    skipped = teaching_ids(nb)
    only_taught: dict[str, str] = {}   # name -> the teaching cell that last bound it
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
        tree = _tree(cell.source)
        if grade_id in skipped:
            only_taught.update(dict.fromkeys(_defined(tree), grade_id))
            continue
        problems += [f"cell {grade_id} reads {name!r}, defined only by the skipped cell "
                     f"{only_taught[name]}" for name in sorted(_read(tree) & set(only_taught))]
        for name in _defined(tree):
            only_taught.pop(name, None)
    return problems


def _lab(lab: str):
    return jupytext.read(paths.lab_source(lab), fmt="py:percent")


@pytest.mark.parametrize("lab", paths.labs())
def test_no_graded_cell_reads_a_teaching_cell(lab):
    nb = _lab(lab)
    tagged = [c for c in nb.cells if TEACHING_TAG in c.metadata.get("tags", [])]
    assert len(tagged) == len(teaching_ids(nb)), \
        f"{lab}: a cell tagged {TEACHING_TAG!r} is a test, an answer or not locked: it would run"
    assert reads_of_skipped(nb) == []


def _cell(source: str, grade_id: str, teaching: bool = False):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True,
                                 "grade_id": grade_id}
    if teaching:
        cell.metadata["tags"] = [TEACHING_TAG]
    return cell


def test_the_check_finds_a_read_of_a_skipped_name():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("import torch\nrows = sweep()", "sweep", teaching=True),
        _cell("plot(rows)", "plot", teaching=True),
        _cell("check(rows, torch.ones(1))", "test_rows")])
    assert reads_of_skipped(nb) == ["cell test_rows reads 'rows', defined only by the skipped "
                                    "cell sweep", "cell test_rows reads 'torch', defined only by "
                                    "the skipped cell sweep"]
    nb.cells.insert(2, _cell("rows = measure()\nimport torch", "measure"))
    assert reads_of_skipped(nb) == []


def test_a_function_s_own_names_are_not_reads():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("for model in models:\n    print(model)", "models", teaching=True),
        _cell("def size(model, k=2):\n    return [model * i for i in range(k)]", "size"),
        _cell("def size2(m, k=model):\n    return m", "size2")])
    assert reads_of_skipped(nb) == ["cell size2 reads 'model', defined only by the skipped "
                                    "cell models"]


def test_a_tagged_test_cell_is_never_skipped():
    cell = _cell("check()", "test_x", teaching=True)
    cell.metadata["nbgrader"]["grade"] = True
    assert teaching_ids(nbformat.v4.new_notebook(cells=[cell])) == set()


@pytest.mark.parametrize("lab", paths.labs())
def test_the_grader_s_source_notebook_keeps_the_tags(lab):
    """The worker reads the teaching cells from nbgrader's source notebook: the tags must reach it."""
    from distlab.grading.course_dir import source_notebook
    tagged = teaching_ids(_lab(lab))
    assert tagged and teaching_ids(source_notebook(lab)) == tagged
