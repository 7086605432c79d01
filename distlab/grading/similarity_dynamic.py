"""Dynamic code and introspection in an answer, for the copy report (similarity.py) to list.

A copy need not be typed into the cell: an answer can fetch a course function's source and exec
it, rebuild a function from a course code object, reach the grader's own objects through the
interpreter, or walk up the stack to the values of the code that called it. An honest answer to
these labs needs none of the means to do so, so every use of one is listed, with its line, for an
instructor to look at:

- the builtins that run or compile text (``exec``, ``eval``, ``compile``, ``__import__``), however
  reached: by name, through the builtins module (``builtins``, ``__builtins__``, any builtin
  function's ``__self__``, ``vars(...)`` or ``.__dict__`` of one, ``getattr`` or ``[...]`` on one),
  or through a name bound to one (``e = exec``: listed where it is bound and where it is used). A
  name the cell binds is its own only where it binds it with ``def`` or ``class`` (or as a
  parameter, where it is not called): an assignment to ``exec`` keeps ``exec(...)`` listed;
- reading source (``inspect``, ``linecache``, a module's ``__file__``, a ``.py`` path);
- code and function objects made by hand (``__code__``, ``types.FunctionType``/``CodeType``,
  ``type(f)`` or ``f.__class__`` of a function or lambda), and unpickling (``pickle``, ``marshal``,
  ``dill``, ``cloudpickle``);
- a module's or tensor's private tables of hooks (``_backward_hooks``, ...), where a check's
  counting hooks sit;
- the interpreter's hooks and tables (``sys.setprofile``/``settrace``, ``sys.modules``,
  ``gc.get_objects``, ``__subclasses__``, ``object.__getattribute__``/``__setattr__``), and frame
  walking (``sys._getframe``, ``tb_frame``, ``f_back``, ``f_locals``, ``f_globals``, ``gi_frame``,
  ``cr_frame``, ``__traceback__``, ``traceback.walk_tb``);
- other processes and channels (``subprocess``, ``os.system``/``popen``/``exec*``/``spawn*``/
  ``fork``, ``multiprocessing``, ``socket``, ``ctypes``), ``runpy``, ``importlib``, IPython's
  ``get_ipython`` and magics.

The source is only parsed, never run.
"""
from __future__ import annotations

import ast
import builtins
import types

from distlab.grading.similarity_code import UNPARSABLE, without_magics

# Builtins that run, compile or import what a string names.
BUILTINS = {"exec", "eval", "compile", "__import__", "get_ipython"}
# Attributes and names that lead to a module's file, a function's code, a module's globals, the
# builtins, the class table or a frame.
DUNDERS = {"__code__", "__file__", "__globals__", "__closure__", "__builtins__", "__loader__",
           "__spec__", "__wrapped__", "__self__", "__subclasses__", "__getattribute__",
           "__traceback__"}
# Attributes of frames, tracebacks, generators and coroutines that lead to a frame or its values.
# The private tables of hooks a module or tensor holds: a check's counting hooks sit there (Lab
# 11's split backward counts the gradients each call computes), and an honest answer registers
# and removes hooks through their handles.
HOOK_TABLES = {"_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_pre_hooks",
               "_post_accumulate_grad_hooks"}
FRAMES = {"tb_frame", "tb_next", "f_back", "f_locals", "f_globals", "f_builtins", "f_code",
          "gi_frame", "cr_frame", "ag_frame"}
# Modules any use of which is listed (dotted: a submodule of another package).
MODULES = {"importlib", "inspect", "linecache", "marshal", "dis", "builtins", "runpy", "code",
           "codeop", "pickle", "_pickle", "dill", "cloudpickle", "shelve", "subprocess",
           "_posixsubprocess", "ctypes", "_ctypes", "multiprocessing", "torch.multiprocessing",
           "socket", "_socket", "pty"}
# Module attributes that are listed.
ATTRIBUTES = {
    "sys": {"setprofile", "settrace", "getprofile", "gettrace", "modules", "_getframe",
            "_current_frames", "exc_info", "exception", "last_traceback", "meta_path",
            "path_hooks"},
    "threading": {"setprofile", "settrace"},
    "types": {"FunctionType", "CodeType", "LambdaType", "MethodType"},
    "gc": {"get_objects", "get_referrers", "get_referents"},
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"},
    "traceback": {"walk_tb", "walk_stack"},
    "object": {"__setattr__", "__delattr__"},       # a module's attributes set past its own
    "type": {"__setattr__", "__delattr__"},
}
_PREFIXES = {"os": ("exec", "spawn")}               # os.execv, os.spawnlp, ...
_NAMED = BUILTINS | FRAMES | HOOK_TABLES | set().union(*ATTRIBUTES.values())   # listed as getattr's key
# listed as a subscript's key: not the words a dict of one's own may use ("system", "exception")
_INDEXED = (BUILTINS | FRAMES | set().union(*(ATTRIBUTES[m] for m in ("sys", "threading",
                                                                      "types", "gc")))) \
    - {"exception"}
_LOOKUPS = {"getattr", "setattr", "hasattr", "delattr"}
_BUILTIN_FUNCTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, types.BuiltinFunctionType)}


def _listed(dotted: str) -> bool:
    """Whether the module or module attribute ``dotted`` (``os.system``) is listed."""
    parts = dotted.split(".")
    if any(".".join(parts[:n]) in MODULES for n in range(1, len(parts) + 1)):
        return True
    module, attr = ".".join(parts[:-1]), parts[-1]
    return attr in ATTRIBUTES.get(module, ()) or attr.startswith(_PREFIXES.get(module, ("\0",)))


def _import_uses(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """What an import statement brings in that is listed; records its aliases (name: dotted)."""
    found = []
    if isinstance(node, ast.Import):
        for a in node.names:
            aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                a.name.split(".")[0]
            if _listed(a.name):
                found.append(f"import {a.name}")
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [a.name for a in node.names]
        for a in node.names:
            aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        listed = DUNDERS | ({"*"} if node.module in ATTRIBUTES else set())
        if _listed(node.module) or set(names) & listed or \
                any(_listed(f"{node.module}.{name}") for name in names):
            found.append(f"from {node.module} import {', '.join(names)}")
    return found


class _Scan:
    """One parsed cell: what it imports, binds and calls, for ``use`` to tell what is listed."""

    def __init__(self, tree: ast.AST):
        nodes = list(ast.walk(tree))
        self.aliases: dict[str, str] = {}
        self.imports = [(n.lineno, what) for n in nodes
                        if isinstance(n, (ast.Import, ast.ImportFrom))
                        for what in _import_uses(n, self.aliases)]
        self.calls = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
        self.keys, self.indices = set(), set()    # the nodes of getattr(x, KEY) and x[KEY]
        for n in nodes:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _LOOKUPS:
                self.keys.update(id(a) for a in n.args)
            elif isinstance(n, ast.Subscript):
                self.indices.add(id(n.slice))
        defined = {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                           ast.ClassDef))}
        self.bound = {n.id for n in nodes if isinstance(n, ast.Name)
                      and not isinstance(n.ctx, ast.Load)} | {
            n.arg for n in nodes if isinstance(n, ast.arg)} | set(self.aliases)
        # a function of the student's own, made with def or class and bound no other way
        self.own = defined - self.bound
        # a parameter (``def train(model, eval=False)``): its own as a value, not when called
        self.parameters = {n.arg for n in nodes if isinstance(n, ast.arg)}
        self.functions = defined - {n.name for n in nodes if isinstance(n, ast.ClassDef)}
        self.tainted: dict[str, str] = {}      # a name bound to something listed: what it is

    def module(self, node: ast.AST) -> str | None:
        """The dotted module path ``node`` names (an imported name, or a module's name that the
        cell does not bind to anything else), else None."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            return None if node.id in self.bound else node.id
        if isinstance(node, ast.Attribute):
            inner = self.module(node.value)
            return f"{inner}.{node.attr}" if inner else None
        return None

    def builtins_ref(self, node: ast.AST) -> str | None:
        """How ``node`` reaches the builtins module or its dict, if it does."""
        if isinstance(node, ast.Name):
            if node.id == "__builtins__" or self.aliases.get(node.id) == "builtins":
                return node.id
            if node.id in self.tainted and self.tainted[node.id].startswith("the builtins"):
                return node.id
        elif isinstance(node, ast.Attribute):
            if node.attr == "__self__" and isinstance(node.value, ast.Name) \
                    and node.value.id in _BUILTIN_FUNCTIONS and node.value.id not in self.bound:
                return f"{node.value.id}.__self__"
            inner = self.builtins_ref(node.value)
            if node.attr == "__dict__" and inner:
                return f"{inner}.__dict__"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            inner = self.builtins_ref(node.args[0])
            if node.func.id == "vars" and inner:
                return f"vars({inner})"
            if node.func.id == "__import__" and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value == "builtins":
                return "__import__('builtins')"
        return None

    def _via(self, node: ast.AST) -> str | None:
        """A builtin reached through the builtins module: ``print.__self__.exec``,
        ``getattr(__builtins__, "eval")``, ``vars(builtins)["exec"]``, or any other lookup."""
        ref, key = None, None
        if isinstance(node, ast.Attribute):
            ref, key = self.builtins_ref(node.value), ast.Constant(node.attr)
        elif isinstance(node, ast.Subscript):
            ref, key = self.builtins_ref(node.value), node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _LOOKUPS and len(node.args) > 1:
            ref, key = self.builtins_ref(node.args[0]), node.args[1]
        if not ref:
            return None
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            if key.value not in BUILTINS:
                return None
            return f"{key.value}{'(...)' * (id(node) in self.calls)} via {ref}"
        return f"a name looked up in {ref}"

    def _function(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Lambda) or (isinstance(node, ast.Name)
                                                and node.id in self.functions)

    def use(self, node: ast.AST) -> str | None:
        """The listed thing ``node`` is, if any: a name, an attribute, a builtin reached another
        way, a function's type, or a string that names one (``getattr(f, "__code__")``; a
        builtin's or a frame attribute's name only as a lookup's key) or a ``.py`` file."""
        via = self._via(node)
        if via:
            return via
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            called = id(node) in self.calls
            if node.id in BUILTINS and node.id not in self.own \
                    and (called or node.id not in self.parameters):
                return f"{node.id}(...)" if called else node.id
            if node.id in DUNDERS:
                return node.id
            if node.id in self.tainted:
                return f"{node.id} (bound to {self.tainted[node.id]})"
            dotted = self.aliases.get(node.id, "")
            if "." in dotted and _listed(dotted):
                return dotted               # from os import system; system(...)
        elif isinstance(node, ast.Attribute):
            if node.attr in DUNDERS | FRAMES | HOOK_TABLES:
                return f".{node.attr}"
            if node.attr == "__class__" and self._function(node.value):
                return "a function's __class__"
            dotted = self.module(node)
            if dotted and _listed(dotted) and isinstance(node.value, ast.Name):
                return dotted
            if dotted and _listed(dotted) and not _listed(dotted.rsplit(".", 1)[0]):
                return dotted               # torch.multiprocessing, once
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "type" and len(node.args) == 1 \
                and self._function(node.args[0]) and "type" not in self.bound:
            return "type(a function)"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text in DUNDERS or (text in _NAMED and id(node) in self.keys) \
                    or (text in _INDEXED and id(node) in self.indices):
                return repr(text)
            if text.endswith((".py", ".pyc")):
                return "a .py path"
        return None

    def taint(self, tree: ast.AST) -> None:
        """Names bound (by assignment) to a listed thing, or to such a name, until no more."""
        assigns = [n for n in ast.walk(tree)
                   if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.AugAssign))
                   and n.value is not None]
        changed = True
        while changed:
            changed = False
            for node in assigns:
                origin = next((self._origin(n) for n in ast.walk(node.value)
                               if self._origin(n)), None)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for name in _target_names(targets):
                    if origin and name not in self.tainted:
                        self.tainted[name], changed = origin, True

    def _origin(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.tainted:
            return self.tainted[node.id]            # what it was bound to, not its name
        ref = self.builtins_ref(node)
        if ref:
            return f"the builtins, via {ref}"
        what = self.use(node)
        return what.removesuffix("(...)") if what else None


def _target_names(targets: list[ast.AST]) -> list[str]:
    """The names an assignment binds (``a, *b = ...``), not those it only reads (``f.x = ...``)."""
    names = []
    for t in targets:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            names += _target_names(t.elts)
        elif isinstance(t, ast.Starred):
            names += _target_names([t.value])
    return names


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
    scan = _Scan(tree)
    scan.taint(tree)
    found += scan.imports
    for node in ast.walk(tree):
        what = scan.use(node)
        if what:
            found.append((node.lineno, what))
    return sorted(set(found))


def describe_uses(uses: list[tuple[int, str]]) -> str:
    """The report's detail for a cell's uses: "line 3: exec(...); line 5: sys.setprofile"."""
    return "; ".join(f"line {line}: {what}" for line, what in uses)
