"""The copy report's finer views of an answer (see similarity.py): its definitions one by one, and
its code objects.

*Definitions*: every top-level function and class of a piece of code, and every method of such a
class, as text of its own, so that each is normalised with its own numbering of names: a copy
then matches wherever it sits in a cell, whatever the cell binds before it.

*Code objects*: the functions a cell defines, compiled (never run) and keyed by what the
interpreter would execute: the instructions with their constants (nested code objects by their
own key), the argument counts and flags, but not the names, the line numbers or the docstring.
A copy with every name changed, every line moved and no-op statements put between keeps its key.
"""
from __future__ import annotations

import ast
import dis
import hashlib
import inspect
import re
import textwrap
import types
import warnings
from collections.abc import Iterator

# A function with fewer instructions than this is not compared: short ones (a formula, a
# delegating call) come out alike from honest hands, as short token runs do.
MIN_INSTRUCTIONS = 24
# An IPython line (a magic, a shell escape): not Python, so compiled as a no-op.
MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)
# What a submitted text can make the parser or the compiler raise: such a text is not compared.
UNPARSABLE = (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError, SystemError)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_UNCOUNTED = {"RESUME", "NOP", "CACHE", "EXTENDED_ARG"}   # no-ops, or part of the next one
_SAME_OPS = {"LOAD_METHOD": "LOAD_ATTR"}
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)
# The flags that say how a function runs; the others say where it sits (CO_NESTED) or which
# ``from __future__`` its file imports.
_KIND_FLAGS = (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS | inspect.CO_GENERATOR
               | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def definitions(source: str) -> list[tuple[int, str, str]]:
    """(line, qualname, dedented text) of each top-level function and class of ``source`` and of
    each method of such a class (from the ``def`` line: decorators are not part of it); empty
    when it does not parse."""
    try:
        tree = ast.parse(source)
    except UNPARSABLE:
        return []
    lines = source.splitlines()
    found = []
    for node in tree.body:
        if not isinstance(node, _DEFS):
            continue
        items = [(node, node.name)]
        if isinstance(node, ast.ClassDef):
            items += [(m, f"{node.name}.{m.name}") for m in node.body if isinstance(m, _DEFS)]
        for item, qualname in items:
            # dedented, so that a method parses (and is normalised) on its own
            text = textwrap.dedent("\n".join(lines[item.lineno - 1:item.end_lineno]))
            found.append((item.lineno, qualname, text))
    return found


def without_magics(source: str) -> tuple[str, list[int]]:
    """``source`` with its IPython lines (magics, shell escapes) made ``pass``, and their line
    numbers; unchanged where it parses as it is (a line inside a string may start with % too)."""
    try:
        ast.parse(source)
        return source, []
    except UNPARSABLE:
        lines = [source[:m.start()].count("\n") + 1 for m in MAGIC.finditer(source)]
        return MAGIC.sub(r"\1pass", source), lines


def compile_cell(source: str, filename: str = "<cell>") -> types.CodeType | None:
    """``source`` compiled, never run (IPython lines blanked); None when it does not compile."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # invalid escapes and the like: not ours
            return compile(without_magics(source)[0], filename, "exec", dont_inherit=True)
    except UNPARSABLE:
        return None             # not Python, or too deep to compile: nothing to compare


def _const(value, qualname: str) -> tuple:
    if isinstance(value, types.CodeType):
        return ("code", code_key(value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_const(v, qualname) for v in value))
    if isinstance(value, frozenset):
        return ("frozenset", tuple(sorted(repr(_const(v, qualname)) for v in value)))
    if value == qualname and isinstance(value, str):
        return ("qualname",)        # a class body stores its own qualified name: a name
    return (type(value).__name__, repr(value))


def code_key(code: types.CodeType) -> str:
    """What ``code`` executes, with names, line numbers and docstring left out, as a digest: its
    instructions, each constant by value (a function without a docstring numbers its constants
    from another start), each name by its place among the function's names, each jump by the
    instruction it goes to."""
    instructions = list(dis.get_instructions(code))
    kept = [i for i in instructions if i.opname not in _UNCOUNTED]
    # a jump to a no-op goes on to the next instruction kept
    place, n = {}, len(kept)
    for i in reversed(instructions):
        n -= i.opname not in _UNCOUNTED
        place[i.offset] = n
    names = {name: k for k, name in enumerate(code.co_names)}
    ops = tuple(_instruction(i, code.co_qualname, names, place) for i in kept)
    key = (ops, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
           code.co_flags & _KIND_FLAGS)
    return hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest()


def _instruction(i: dis.Instruction, qualname: str, names: dict[str, int],
                 place: dict[int, int]) -> tuple:
    if i.opcode in dis.hasconst:
        return i.opname, _const(i.argval, qualname)
    if i.opcode in dis.hasname:
        # A method call compiles to LOAD_ATTR rather than LOAD_METHOD on a module the file
        # imports itself, and the argument carries a flag besides the name: the name's place and
        # the operation are what the code does.
        return _SAME_OPS.get(i.opname, i.opname), names.get(i.argval, i.argval)
    if i.opcode in _JUMPS:
        return i.opname, place.get(i.argval, i.argval)
    return i.opname, i.arg          # a local's or a cell's index, a count


def function_codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """Every named function compiled into ``code``, methods and nested functions included
    (comprehensions and lambdas only as part of the function holding them)."""
    for const in code.co_consts:
        if not isinstance(const, types.CodeType):
            continue
        if const.co_flags & inspect.CO_OPTIMIZED and not const.co_name.startswith("<"):
            yield const
        yield from function_codes(const)      # a class body's methods, a function's inner ones


def instruction_count(code: types.CodeType) -> int:
    """Instructions in ``code`` (its nested code objects not counted)."""
    return sum(i.opname not in _UNCOUNTED for i in dis.get_instructions(code))


def code_keys(source: str, filename: str = "<cell>") -> dict[str, tuple[int, str, int]]:
    """{key: (line, qualname, instructions)} of each function in ``source`` long enough to compare
    (``MIN_INSTRUCTIONS``); empty when it does not compile."""
    module = compile_cell(source, filename)
    found = {}
    for code in function_codes(module) if module else ():
        n = instruction_count(code)
        if n >= MIN_INSTRUCTIONS:
            found.setdefault(code_key(code), (code.co_firstlineno, code.co_qualname, n))
    return found
