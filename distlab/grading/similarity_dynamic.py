"""Dynamic code and introspection in an answer, for the copy report (similarity.py) to list.

A copy need not be typed into the cell: an answer can fetch a course function's source and exec
it, rebuild a function from a course code object, or reach the grader's own objects through the
interpreter. An honest answer to these labs needs none of the means to do so, so every use of one
is listed, with its line, for an instructor to look at: the builtins that run or compile text
(``exec``, ``eval``, ``compile``, ``__import__``), reading source (``inspect``, ``linecache``,
a module's ``__file__``, a ``.py`` path), code and function objects made by hand (``__code__``,
``types.FunctionType``/``CodeType``), the interpreter's hooks and tables (``sys.setprofile``/
``settrace``, ``sys.modules``, ``gc.get_objects``), ``importlib``, IPython's ``get_ipython`` and
magics. The source is only parsed, never run; a name the cell binds itself is its own.
"""
from __future__ import annotations

import ast

from distlab.grading.similarity_code import UNPARSABLE, without_magics

# Builtins that run, compile or import what a string names.
BUILTINS = {"exec", "eval", "compile", "__import__", "get_ipython"}
# Attributes and names that lead to a module's file, a function's code or a module's globals.
DUNDERS = {"__code__", "__file__", "__globals__", "__closure__", "__builtins__", "__loader__",
           "__spec__", "__wrapped__"}
# Modules any use of which is listed.
MODULES = {"importlib", "inspect", "linecache", "marshal", "dis", "builtins"}
# Module attributes that are listed.
ATTRIBUTES = {
    "sys": {"setprofile", "settrace", "getprofile", "gettrace", "modules", "_getframe",
            "meta_path", "path_hooks"},
    "threading": {"setprofile", "settrace"},
    "types": {"FunctionType", "CodeType", "LambdaType", "MethodType"},
    "gc": {"get_objects", "get_referrers", "get_referents"},
}
_NAMED = BUILTINS.union(*ATTRIBUTES.values())     # listed where a string names them in a lookup
_LOOKUPS = {"getattr", "setattr", "hasattr", "delattr"}


def _import_uses(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """What an import statement brings in that is listed; records its aliases."""
    found = []
    if isinstance(node, ast.Import):
        for a in node.names:
            aliases[a.asname or a.name.split(".")[0]] = a.name.split(".")[0]
            if a.name.split(".")[0] in MODULES:
                found.append(f"import {a.name}")
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        top = node.module.split(".")[0]
        names = [a.name for a in node.names]
        listed = ATTRIBUTES.get(node.module, set()) | DUNDERS
        if node.module in ATTRIBUTES:
            listed = listed | {"*"}         # `from sys import *` brings setprofile in by name
        if top in MODULES or set(names) & listed:
            found.append(f"from {node.module} import {', '.join(names)}")
    return found


def _use(node: ast.AST, aliases: dict[str, str], calls: set[int], keys: set[int],
         bound: set[str]) -> str | None:
    """The listed thing ``node`` is, if any: a name, an attribute, or a string that names one
    (``getattr(f, "__code__")``; a builtin's name only as a lookup's key) or a ``.py`` file."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        if node.id in BUILTINS and node.id not in bound:
            return f"{node.id}(...)" if id(node) in calls else node.id
        if node.id in DUNDERS:
            return node.id
    elif isinstance(node, ast.Attribute):
        if node.attr in DUNDERS:
            return f".{node.attr}"
        if isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id, node.value.id)
            if module in MODULES or node.attr in ATTRIBUTES.get(module, ()):
                return f"{module}.{node.attr}"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value.strip()
        if text in DUNDERS or (text in _NAMED and id(node) in keys):
            return repr(text)
        if text.endswith((".py", ".pyc")):
            return "a .py path"
    return None


def _lookup_keys(tree: ast.AST) -> set[int]:
    """The ids of the nodes used as keys: ``getattr(x, KEY)`` and the like, ``x[KEY]``."""
    keys = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _LOOKUPS:
            keys.update(id(a) for a in n.args)
        elif isinstance(n, ast.Subscript):
            keys.add(id(n.slice))
    return keys


def dynamic_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of each use of dynamic code or introspection in ``source``, by line; an
    IPython magic or shell line counts as one (the only ones listed where the rest of the code
    does not parse)."""
    python, magics = without_magics(source)
    lines = source.splitlines()
    found = [(n, f"magic {lines[n - 1].strip().split()[0]}") for n in magics]
    try:
        tree = ast.parse(python)
    except UNPARSABLE:
        return found
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):         # first: an alias is used before the walk meets it
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, what) for what in _import_uses(node, aliases)]
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    keys = _lookup_keys(tree)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and not isinstance(n.ctx, ast.Load)} | {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        what = _use(node, aliases, calls, keys, bound)
        if what:
            found.append((node.lineno, what))
    return sorted(set(found))


def describe_uses(uses: list[tuple[int, str]]) -> str:
    """The report's detail for a cell's uses: "line 3: exec(...); line 5: sys.setprofile"."""
    return "; ".join(f"line {line}: {what}" for line, what in uses)
