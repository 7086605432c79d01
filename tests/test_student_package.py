"""The student package of each lab (``distlab.grading.student_package``): it holds no answer to
the lab or a later one, and the lab runs with it alone.

- Every function and class of a lab's student package is compared, by normalised AST (names,
  docstrings and line numbers left out), with the functions and classes of that lab's and every
  later lab's solution cells and with the course implementations it withholds: none may be
  equal.
- The lab, solutions in place, runs top to bottom in a kernel that imports distlab from the lab's
  student package and cannot read the instructor's package, ``solutions/`` or ``tests/``
  (Landlock, as the grader confines students; the kernel forked by the grader's kernel server,
  as graded kernels are): its visible tests pass, and its teaching cells need nothing the
  handout leaves out.
- The student version of the lab (stubs) fails every visible test.
"""
from __future__ import annotations

import ast
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from distlab import paths
from distlab.course import notebooks
from distlab.grading import student_package
from distlab.runtime.landlock import landlock_abi

REPO = Path(__file__).resolve().parents[1]
LABS = notebooks.labs()
MIN_NODES = 25   # smaller definitions (a one-line formula) say nothing about who wrote them


# ---------------------------------------------------------------------------------------------
# Stubbing

SOURCE = '''\
"""A module."""
import torch


def kept(x):
    """Stays."""
    return x + 1


def answer(x, y=2):
    """The contract."""
    z = x * y
    return z


class Layer(torch.nn.Module):
    """A layer."""
    size = 3

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        return x * self.n
'''


def test_stubs_keep_signatures_docstrings_and_everything_else():
    out = student_package.stub_source(SOURCE, "distlab.labs.demo",
                                      {"answer": "03_tensor_parallel_mlp", "Layer": "04_x"})
    namespace = {}
    exec(compile(out, "demo", "exec"), namespace)
    assert namespace["kept"](1) == 2
    assert namespace["answer"].__doc__ == "The contract."
    with pytest.raises(NotImplementedError, match=r"distlab.labs.demo:answer is yours to write "
                                                  r"in Lab 3 \(03_tensor_parallel_mlp\)"):
        namespace["answer"](1)
    with pytest.raises(NotImplementedError, match="Layer.__init__ is yours to write in Lab 4"):
        namespace["Layer"](2)
    assert namespace["Layer"].size == 3 and "x * self.n" not in out and "z = x * y" not in out
    assert out.splitlines()[:8] == SOURCE.splitlines()[:8]


def test_a_stale_table_is_named():
    with pytest.raises(LookupError, match="defines no gone, which a checks module"):
        student_package.stub_source(SOURCE, "distlab.labs.demo", {"gone": "01_collectives"})


def test_a_lab_keeps_earlier_labs_answers_and_withholds_its_own_and_later_ones():
    owner = student_package.answers_by_lab()
    withheld = student_package.withheld(["04_tensor_parallel_attention"])
    names = {f"{m}:{q}" for m, qs in withheld.items() for q in qs}
    assert names == {n for n, lab in owner.items() if lab >= "04"}
    assert "distlab.labs.tensor_parallel.layers:ColumnParallelLinear" not in names
    assert "distlab.labs.attention.parallel:TensorParallelAttention" in names


# ---------------------------------------------------------------------------------------------
# No answer in a student package, by normalised AST

class _Anonymous(ast.NodeTransformer):
    """Every name the code binds or uses becomes ``_``, docstrings go: what is left is shape."""

    def visit_Name(self, node):
        return ast.copy_location(ast.Name("_", node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = "_", None
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        node.attr = "_"
        return node

    def _definition(self, node):
        node.name, node.decorator_list = "_", []
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(
                getattr(node.body[0], "value", None), ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
        if hasattr(node, "returns"):
            node.returns = None
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition


def shapes(tree: ast.AST, nested: bool = True) -> dict[str, str]:
    """{normalised dump: where} of every function and class in ``tree`` big enough to count
    (``nested=False``: its top-level ones, or ``tree`` itself when it is one: a method of an
    answer, e.g. a block's forward, may equal the dense model's, which is no answer)."""
    found = {}
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nodes = ast.walk(tree) if nested else [tree] if isinstance(tree, definitions) else tree.body
    for node in nodes:
        if isinstance(node, definitions) and sum(1 for _ in ast.walk(node)) >= MIN_NODES:
            copy = _Anonymous().visit(ast.parse(ast.unparse(node)))
            found[ast.dump(copy, annotate_fields=False)] = f"{node.name} (line {node.lineno})"
    return found


@functools.lru_cache(maxsize=None)
def source_shapes(source: str) -> dict[str, str]:
    """``shapes`` of a module's text, made once per text: the student packages of the labs are
    the same files but for the stubbed ones (about 2 CPU-s a package otherwise). Not to be
    changed by the caller."""
    return shapes(ast.parse(source))


@functools.lru_cache(maxsize=None)
def solution_shapes(lab: str) -> dict[str, str]:
    """The shapes of ``lab``'s solution cells, made once per lab (every earlier lab's test reads
    them too). Not to be changed by the caller."""
    found = {}
    for cell in notebooks.reader_notebook(lab).cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:   # IPython magics: not an answer's code
                continue
            found.update({k: f"{lab} cell {cell.metadata.nbgrader['grade_id']}: {v}"
                          for k, v in shapes(tree, nested=False).items()})
    return found


def answer_shapes(lab: str) -> dict[str, str]:
    """The shapes of the answers a student package of ``lab`` must not hold: the solution cells
    of it and every later lab, and the instructor's implementations it withholds."""
    found = {}
    for later in (x for x in LABS if x >= lab):
        found.update(solution_shapes(later))
    for module, names in student_package.withheld([lab]).items():
        path = student_package._module_file(paths.PACKAGE, module)
        for qualname, node in student_package._definitions(ast.parse(path.read_text())):
            if qualname in names:
                found.update({k: f"{module}:{qualname}" for k in shapes(node, nested=False)})
    return found


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("views")
    return {lab: student_package.view(base, lab) for lab in LABS}


def test_a_view_is_copied_from_the_build_folders_with_its_modules_compiled(packages, tmp_path):
    """Writing a view imports every checks module (torch with them): it is made once per version
    of the package in the build folder and copied into each grading run's workdir, its modules
    compiled there (the zygote and the kernel that import them may not write beside them)."""
    import importlib.util
    lab = LABS[0]
    again, made = student_package.view(tmp_path, lab), student_package.built_view(lab)

    def files(root: Path) -> list[str]:
        return sorted(p.relative_to(root).as_posix() for p in (root / "distlab").rglob("*")
                      if p.is_file())
    assert files(again) == files(packages[lab]) == files(made)
    assert (again / "data").resolve() == paths.data().resolve()
    # What its ranks import of PyTorch, for the worker server's preload (no checks imported)
    from distlab.grading.settings import rank_torch_modules
    assert student_package.rank_imports(again) == list(rank_torch_modules((lab,)))
    for module in sorted((again / "distlab").rglob("*.py")):
        # what a timestamped .pyc records of its source: its mtime, which the copy kept
        header = Path(importlib.util.cache_from_source(str(module))).read_bytes()[:16]
        assert int.from_bytes(header[4:8], "little") == 0, module   # checked by timestamp
        assert int.from_bytes(header[8:12], "little") == int(module.stat().st_mtime), module


def test_a_view_made_where_the_data_was_elsewhere_is_made_again(monkeypatch, tmp_path):
    """A view links to the course's data by its absolute path: a checkout copied or moved with
    its build folder would otherwise grade with the old checkout's data, or with none once the
    kernel is confined (a copy graded Lab 6's solution 13/17)."""
    here = student_package._package_fingerprint()
    monkeypatch.setattr(paths, "data", lambda: tmp_path)
    assert student_package._package_fingerprint() != here


@pytest.mark.parametrize("lab", LABS)
def test_no_answer_in_the_student_package(packages, lab):
    answers = answer_shapes(lab)
    assert answers, f"{lab} declares no answers and has no solution cells"
    leaks = []
    for path in sorted((packages[lab] / "distlab").rglob("*.py")):
        for shape, where in source_shapes(path.read_text()).items():
            if shape in answers:
                leaks.append(f"{path.relative_to(packages[lab])}: {where} equals {answers[shape]}")
    assert not leaks, "the student package holds answers:\n  " + "\n  ".join(leaks)


# ---------------------------------------------------------------------------------------------
# The lab runs with its student package alone

def kernel_spec(folder: Path, package: Path, writable: Path) -> None:
    """A kernel confined as the grader confines students': it imports distlab from ``package``
    and cannot read the instructor's package, ``solutions/`` or ``tests/``."""
    from distlab.grading.settings import SYSTEM_READS, python_installation
    reads = [*SYSTEM_READS, *python_installation(), package, paths.data().resolve()]
    argv = [sys.executable, "-m", "distlab.runtime.landlock", "--write", str(writable),
            *[a for r in reads for a in ("--read", str(r))],
            "--", sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": "student", "language": "python",
        # TMPDIR: the one folder it may write (a kernel forked warm keeps the temporary folder it
        # chose before its confinement otherwise). DISTLAB_WARM_UP=0, as the grader's kernels:
        # a kernel forked warm imports distlab before it is confined, and its rank launcher,
        # started then, would be outside the kernel's Landlock domain (its ranks unconfined, and
        # out of reach of the kernel's signals); started at the first run, it is inside.
        "env": {"PYTHONPATH": str(package), "DISTLAB_PACKAGE": str(package),
                "TMPDIR": str(writable), "DISTLAB_WARM_UP": "0"}}))


def errors_in(nb: nbformat.NotebookNode) -> dict[str, str]:
    """{cell's grade_id: its error} of every cell that raised."""
    found = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found[cell.metadata.get("nbgrader", {}).get("grade_id", "?")] = \
                    f"{out['ename']}: {out['evalue'][:400]}"
    return found


@pytest.fixture(scope="module")
def warm_kernels(tmp_path_factory):
    """The grader's kernel server (``distlab.grading.warm_kernels``), which forks each lab's
    kernel from a process that imported torch, matplotlib and ipykernel once, confined by the
    same Landlock options as the kernel spec's command: the labs run in kernels started as the
    grader starts students' (about 2 CPU-s of imports a lab saved). This process is a child
    subreaper for the module, as the grader's worker is, so that the forked kernels are its
    children; None where it cannot be (the kernels then start cold)."""
    from distlab.grading import sandbox
    from distlab.grading.warm_kernels import WarmKernels
    if not sandbox.become_subreaper():
        yield None
        return
    kernels = WarmKernels(dict(os.environ), cwd=str(tmp_path_factory.mktemp("kernel-server")))
    try:
        yield kernels
    finally:
        kernels.close()
        _no_longer_subreaper()


def _no_longer_subreaper() -> None:
    """Orphans go to init again, and those that came here and exited (a lab's zygote that
    outlived its kernel) are reaped: nothing of this module's stays a zombie of pytest's worker."""
    import ctypes
    from distlab.runtime.landlock import libc
    libc().prctl(ctypes.c_int(36), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                 ctypes.c_ulong(0))   # PR_SET_CHILD_SUBREAPER, off
    for entry in os.scandir("/proc"):
        try:
            state, ppid = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        if int(ppid) == os.getpid() and state == "Z":
            os.waitpid(int(entry.name), os.WNOHANG)


def run_in_view(nb: nbformat.NotebookNode, package: Path, folder: Path,
                monkeypatch, kernels=None) -> nbformat.NotebookNode:
    from nbclient import NotebookClient
    from distlab.grading.warm_kernels import WarmKernelManager
    jupyter, work = folder / "jupyter", folder / "work"
    work.mkdir(parents=True)
    kernel_spec(jupyter, package, folder)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))
    # jupyter_client writes the connection file to the temporary folder: one the kernel may read
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    km = WarmKernelManager(kernel_name="python3", kernels=kernels)
    # cleanup_kc: the kernel shut down at the end, as when the client makes its own manager
    NotebookClient(nb, km=km, timeout=300, startup_timeout=120, kernel_name="python3",
                   allow_errors=True, resources={"metadata": {"path": str(work)}}
                   ).execute(cleanup_kc=True)
    return nb


needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="needs Landlock (Linux 5.13+) "
                                    "to keep the instructor's package out of the kernel's reach")


def reach_probe(package: Path) -> nbformat.NotebookNode:
    """A cell that prints whether the kernel imported distlab from ``package`` and whether it
    could read the instructor's package: "True refused" where the view is all it has."""
    return nbformat.v4.new_code_cell(
        "import distlab, os\n"
        f"print(distlab.__file__.startswith({str(package)!r}))\n"
        f"try:\n    open({str(paths.PACKAGE / '__init__.py')!r}).read(); print('read')\n"
        "except OSError:\n    print('refused')\n")


@needs_landlock
@pytest.mark.parametrize("lab", LABS)
def test_the_lab_runs_with_its_student_package_alone(packages, warm_kernels, lab, tmp_path,
                                                     monkeypatch):
    """The lab runs without an error in its view; and after it, in the same kernel, the
    instructor's package is out of reach (the probe, once a kernel of its own: about 5 CPU-s of
    kernel and zygote start for one cell, now checked in every lab's kernel for nothing)."""
    nb = notebooks.reader_notebook(lab)
    nb.cells.append(reach_probe(packages[lab]))
    nb = run_in_view(nb, packages[lab], tmp_path, monkeypatch, warm_kernels)
    assert not errors_in(nb), f"{lab}, solutions in place, in its student package:\n  " + \
        "\n  ".join(f"{k}: {v}" for k, v in errors_in(nb).items())
    probe = [out.get("text", "") for out in nb.cells[-1].outputs if out.get("name") == "stdout"]
    assert "".join(probe).split() == ["True", "refused"], nb.cells[-1].outputs
