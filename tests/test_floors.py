"""The package's floors: each imports only those below it, and no module imports itself back.

    cli -> course -> grading -> cluster -> checks -> labs -> runtime -> paths

(``cluster``, the programs a student takes to a cluster, imports checks, labs and runtime;
nothing imports it.)

A failure names the file, the line and the import to move.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "distlab"
FLOORS = ["paths", "runtime", "labs", "checks", "cluster", "grading", "course", "cli"]
MAX_LINES = 400


def floor_of(module: str) -> int:
    """The floor of a distlab module name; ``distlab`` itself is the runtime's public surface."""
    parts = module.split(".")
    if parts == ["distlab"]:
        return FLOORS.index("runtime")
    return FLOORS.index(parts[1])


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def distlab_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a distlab module in a file, at any depth (imports
    inside functions count: they run too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "distlab"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "distlab":
            found.append((node.lineno, node.module))
            # `from distlab.labs import tensor_parallel`: the submodule is what is imported
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                        (PACKAGE.parent / candidate.replace(".", "/")).is_dir():
                    found.append((node.lineno, candidate))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_is_on_a_floor():
    loose = [module_name(p) for p in MODULES
             if module_name(p) != "distlab" and module_name(p).split(".")[1] not in FLOORS]
    assert not loose, f"modules on no floor (put them in one of {FLOORS}): {loose}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_go_down_only(path):
    me = module_name(path)
    mine = floor_of(me)
    upward = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target} "
              f"({FLOORS[floor_of(target)]} is above {FLOORS[mine]})"
              for line, target in distlab_imports(path) if floor_of(target) > mine]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = {module_name(p): {t for _, t in distlab_imports(p)} for p in MODULES}
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [node])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for start in graph:
        if start not in state:
            cycle = visit(start, [])
            if cycle:
                first = cycle.index(cycle[-1])
                pytest.fail("import cycle: " + " -> ".join(cycle[first:]))


def test_no_module_is_over_the_size_limit():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in MODULES
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they do): {long}"


# --------------------------------------------------------------------------------------------
# Names that say what they are: a public class name is one class, a public function name is one
# operation, wherever in the package it is defined.

# A module's entry point and each lab's reference builder share their name on purpose.
SHARED_FUNCTIONS = {"main", "make_references"}


def public_definitions(kind) -> dict[str, list[str]]:
    """{name: [modules]} of the public top-level classes or functions (``kind``) of every module."""
    found: dict[str, list[str]] = {}
    for path in MODULES:
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, kind) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(module_name(path))
    return found


def test_no_two_public_classes_share_a_name():
    shared = {name: where for name, where in public_definitions(ast.ClassDef).items()
              if len(where) > 1}
    assert not shared, ("public classes defined in more than one module (name each for what it "
                        f"is, e.g. TinyBlock beside TinyConfig): {shared}")


def test_a_public_function_name_is_defined_once():
    shared = {name: where for name, where in public_definitions(
        (ast.FunctionDef, ast.AsyncFunctionDef)).items()
        if len(where) > 1 and name not in SHARED_FUNCTIONS}
    assert not shared, ("public functions of the same name in several modules: one name, one "
                        "operation (rename what differs, import what is the same): "
                        f"{shared}")

