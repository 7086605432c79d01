"""A student's ``distlab``: the package without the answers to the labs handed out.

The course's package holds working implementations of many exercises: later labs build on them
(Lab 4 on Lab 3's layers), and the checks compute references with them. A process that runs a
student's code must not hold them, nor be able to read them: Python lets code reach anything its
process holds, so a guard inside that process is a lock whose key hangs beside it. Hence the
principle (CONTRIBUTING.md, "Answers out of reach"): *student code never runs in a process that
holds, or can read, an answer to its lab*.

Which objects are answers is declared once, by the checks modules: each ``COURSE_CODE`` table
names, per graded check, the course code its exercise may not use (``distlab.checks.course_code``).
An object belongs to the first lab whose table names it. The student package for a set of labs
withholds the answers of the first of them and of every later lab; earlier labs' answers stay,
since later labs build on them.

A withheld function or method keeps its signature and docstring (the contract), and its body
becomes one ``raise NotImplementedError`` saying whose it is to write, in which lab; a withheld
class keeps its bases and fields, and each of its methods is stubbed so. Everything else is copied
byte for byte, so a student reads the same helpers, comments and line numbers as the instructor.

    write_package(dest, labs) -> Path  # dest/distlab: the package for a handout of ``labs``
    withheld(labs) -> {module: {qualname: lab}}
    view(workdir, lab) -> Path       # a cached view for grading ``lab`` (dest = the folder holding
                                     # distlab/, data/ and notebooks/, a course root of its own)
"""
from __future__ import annotations

import ast
import hashlib
import os
import shutil
from pathlib import Path

from distlab import paths
from distlab.grading.files import made_whole, stamp_of

SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "course_files",
                              "*.egg-info")
STUB = ("{module}:{qualname} is yours to write in Lab {number} ({lab}): the course's "
        "implementation is not in your handout for that lab. Write your own in the notebook.")


def lab_number(lab: str) -> int:
    return int(lab.split("_", 1)[0])


def answers_by_lab(labs: list[str] | None = None) -> dict[str, dict[str, str]]:
    """{"module:qualname": lab} for every answer the checks modules declare, each under the
    first lab (in course order) whose ``COURSE_CODE`` forbids it."""
    from distlab.checks import checks_module
    owner: dict[str, str] = {}
    for lab in sorted(labs if labs is not None else paths.labs()):
        table = getattr(checks_module(lab), "COURSE_CODE", {})
        for entry in table.values():
            for name in entry.forbidden:
                owner.setdefault(name, lab)
    return owner


def withheld(labs: list[str]) -> dict[str, dict[str, str]]:
    """{module: {qualname: lab}} of the answers a handout of ``labs`` leaves out: those of its
    first lab and of every later lab of the course."""
    first = min(lab_number(lab) for lab in labs)
    out: dict[str, dict[str, str]] = {}
    for name, lab in answers_by_lab().items():
        if lab_number(lab) >= first:
            module, _, qualname = name.partition(":")
            out.setdefault(module, {})[qualname] = lab
    return out


def write_package(dest: Path, labs: list[str]) -> Path:
    """Write the student package for ``labs`` to ``dest/distlab`` (replaced); return it."""
    package = Path(dest) / "distlab"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(paths.PACKAGE, package, ignore=SKIP)
    for module, names in withheld(labs).items():
        path = _module_file(package, module)
        path.write_text(stub_source(path.read_text(), module, names))
    return package


def _module_file(package: Path, module: str) -> Path:
    parts = module.split(".")[1:]
    path = package.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


# ---------------------------------------------------------------------------------------------
# Stubbing, on the text: what is not withheld stays as written

def stub_source(source: str, module: str, names: dict[str, str]) -> str:
    """``source`` with the functions, methods and classes ``names`` ({qualname: lab}) stubbed.
    Raises LookupError naming any qualname the module does not define (a stale table)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []   # (first line, last line, new lines), 1-based
    found = set()
    for qualname, node in _definitions(tree):
        lab = names.get(qualname) or next((names[q] for q in names if qualname.startswith(q + ".")),
                                          None)
        if lab is None or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.update(q for q in names if q == qualname)
            continue
        found.update(q for q in names if q == qualname or qualname.startswith(q + "."))
        edits.append(_stub_body(node, lines, STUB.format(module=module, qualname=qualname,
                                                         number=lab_number(lab), lab=lab)))
    missing = sorted(set(names) - found)
    if missing:
        raise LookupError(f"{module} defines no {', '.join(missing)}, which a checks module's "
                          f"COURSE_CODE table names as an answer: correct the table")
    for first, last, new in sorted(edits, reverse=True):
        lines[first - 1:last] = new
    return "".join(lines)


def _definitions(tree: ast.Module, prefix: str = ""):
    """(qualname, node) of every function and class defined at module level or in a class,
    outer before inner."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            qualname = prefix + node.name
            yield qualname, node
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node, qualname + ".")


def _stub_body(node, lines: list[str], message: str) -> tuple[int, int, list[str]]:
    """The edit that replaces a function's body (its docstring kept) with one raise."""
    body = node.body
    keep = 1 if body and isinstance(body[0], ast.Expr) and isinstance(
        getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str) else 0
    raise_line = f"raise NotImplementedError({message!r})"
    if body[0].lineno == node.lineno or (keep and len(body) == 1):
        # A one-line def, or a docstring alone: rewrite the whole definition.
        stub = ast.parse(raise_line).body
        node.body = body[:keep] + stub
        indent = lines[node.lineno - 1][:len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())]
        text = "".join(indent + line + "\n" for line in ast.unparse(node).splitlines())
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        return first, node.end_lineno, [text]
    start = body[keep].lineno
    # The comments above the first statement go with the body: they tell the answer's method.
    above = body[0].end_lineno if keep else node.lineno
    while start - 1 > above and lines[start - 2].strip().startswith("#"):
        start -= 1
    indent = " " * body[keep].col_offset
    return start, node.end_lineno, [indent + raise_line + "\n"]


# ---------------------------------------------------------------------------------------------
# Views for grading: one per lab, made once and reused while the course does not change

STAMP = ".fingerprint"   # a view's file holding the package's fingerprint it was made for
RANK_IMPORTS = ".rank-imports"   # a view's file naming what its lab's ranks import of PyTorch

def view(workdir: Path, lab: str) -> Path:
    """A folder holding the student package for grading ``lab`` (``distlab/``, its modules
    compiled), the course's data (``data/``, linked) and an empty ``notebooks/``: a student
    handout's course root, which the package finds by itself. Rebuilt when the course's package
    changes; copied from the course's build folder, where it is made once per version of the
    package (``built_view``), not once per grading run."""
    folder = Path(workdir) / "views" / lab
    fingerprint = _package_fingerprint()
    if stamp_of(folder, STAMP) == fingerprint:
        return folder
    made = built_view(lab, fingerprint)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # copy2 keeps the modules' times, with which their compiled files were stamped
    shutil.copytree(made, folder, symlinks=True)
    return folder


def built_view(lab: str, fingerprint: str | None = None) -> Path:
    """The view of ``lab`` in ``build/grading-views``, made there if it is not: writing it costs
    seconds (the checks modules imported, torch with them, to know what to withhold), and its
    modules are compiled there once, since the processes that import them (the judge's zygote,
    the graded kernel) may write nowhere beside them. Read it, or copy it: never write into it.
    Views of other versions of the package are removed."""
    fingerprint = fingerprint or _package_fingerprint()
    cache = paths.build() / "grading-views"
    made = cache / f"{lab}-{fingerprint[:16]}"
    if stamp_of(made, STAMP) == fingerprint:
        return made
    # Made beside it and moved in whole: two grading runs at once each make one, the first kept.
    made_whole(made, STAMP, fingerprint, lambda folder: _write_view(folder, lab))
    for old in cache.iterdir():
        if not old.name.startswith(".") and not old.name.endswith(fingerprint[:16]):
            shutil.rmtree(old, ignore_errors=True)
    return made


def _write_view(folder: Path, lab: str) -> None:
    import compileall
    from distlab.grading.settings import rank_torch_modules
    write_package(folder, [lab])
    compileall.compile_dir(str(folder / "distlab"), quiet=2)
    (folder / RANK_IMPORTS).write_text("\n".join(rank_torch_modules((lab,))))
    (folder / "notebooks").mkdir()
    os.symlink(paths.data().resolve(), folder / "data")


def rank_imports(folder: Path) -> list[str]:
    """What the ranks of a view's lab import of PyTorch (``settings.rank_torch_modules``), as
    written when the view was made: known without importing the lab's checks (its answers)."""
    try:
        return (Path(folder) / RANK_IMPORTS).read_text().split()
    except OSError:
        return []


def _package_fingerprint() -> str:
    """The package's modules, and where the course's data is: a view links to that folder by
    its absolute path, so a checkout moved or copied with its build folder makes its views
    again instead of reading the data of the one that made them (or none, once confined)."""
    digest = hashlib.sha256(str(paths.data().resolve()).encode())
    for path in sorted(paths.PACKAGE.rglob("*.py")):
        if "course_files" in path.parts:
            continue
        digest.update(str(path.relative_to(paths.PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
