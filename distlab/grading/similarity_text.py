"""The copy report's text engine (see similarity.py for the method): code normalised so that
renaming, reformatting and re-commenting change nothing, its fingerprints, and how much two sets of
fingerprints share.
"""
from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import io
import tokenize

from distlab.grading.similarity_code import UNPARSABLE, definitions

K = 6                  # tokens per fingerprint
MIN_TOKENS = 30        # cells shorter than this are not compared


# ---------------------------------------------------------------------------------------------
# Normalising and fingerprinting

class _Renamer(ast.NodeTransformer):
    """Rename what the code binds, in order of first appearance; keep what it only uses."""

    def __init__(self, bound: set[str]):
        self.bound, self.names = bound, {}

    def _name(self, name: str) -> str:
        if name not in self.bound:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = self._name(node.arg), None
        return node

    def _visit_def(self, node):
        node.name = self._name(node.name)
        if hasattr(node, "returns"):
            node.returns = None
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        node.body = body
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_def


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the code binds: assignment targets, arguments, definitions, loop and with targets."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound - set(dir(builtins))


def normalise(source: str) -> list[str]:
    """The code's tokens after renaming, without comments, docstrings or layout."""
    try:
        tree = ast.parse(source)
        text = ast.unparse(_Renamer(_bound_names(tree)).visit(tree))
    except UNPARSABLE:
        text = source           # not Python (yet), or too deep: compare its raw tokens
    tokens = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            tokens.append(tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        tokens = text.split()
    return tokens


def code_fingerprints(tokens: list[str]) -> set[int]:
    return {int.from_bytes(hashlib.blake2b("\x00".join(tokens[i:i + K]).encode(),
                                           digest_size=8).digest(), "little")
            for i in range(max(0, len(tokens) - K + 1))}


def threshold(tokens: int) -> float:
    """The containment above which a pair is flagged: 0.8 for long cells, rising to 0.95 for the
    shortest ones compared (a short cell shares a large part with anything similar by chance)."""
    if tokens >= 150:
        return 0.8
    return 0.95 - 0.15 * (tokens - MIN_TOKENS) / (150 - MIN_TOKENS)


# ---------------------------------------------------------------------------------------------
# Fingerprints of an answer, and their overlap

@functools.lru_cache(maxsize=4096)
def fingerprints(source: str) -> tuple[int, frozenset[int]]:
    """(tokens, fingerprints) of ``source``; cached: the references recur for every cell."""
    tokens = normalise(source)
    return len(tokens), frozenset(code_fingerprints(tokens))


@functools.lru_cache(maxsize=4096)
def definition_fingerprints(source: str) -> frozenset[int]:
    """The fingerprints of every definition in ``source``, each normalised on its own."""
    return frozenset().union(*(fingerprints(text)[1] for _, _, text in definitions(source)))


def containment(a: set[int], b: set[int], hits: int | None = None) -> tuple[float, int]:
    """(containment, tokens compared): the share of the smaller side found in the other, and the
    smaller side's length in tokens, which sets the threshold."""
    small = min(len(a), len(b))
    shared = len(a & b) if hits is None else hits
    return (shared / small if small else 0.0), small + K - 1
