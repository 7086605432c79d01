"""Which answers look copied: each solution cell against the course's shipped implementations and
against the same cell of every other student, for an instructor to review. It never changes a
score.

How two pieces of code are compared (the idea of MOSS's winnowing, written small):
1. *Normalise*: parse the code, drop docstrings and comments, rename every name the code binds
   (variables, arguments, functions, classes) to ``v0, v1, ...`` in order of first use, and print
   it back in one canonical layout. Names it only uses (``torch``, ``dist.all_reduce``) stay:
   they are the substance. Renaming, reformatting and re-commenting change nothing.
2. *Fingerprint*: the hashes of every run of ``K`` consecutive tokens.
3. *Compare*: the share of the shorter side's fingerprints found in the other (containment).

Short answers that honest students write alike (a one-line formula) are not compared at all
(fewer than ``MIN_TOKENS`` tokens), and shorter cells need a higher share to be flagged
(``threshold``). Fingerprints of the handed-out cell and of the course's own solution are common
ground, as MOSS's base files are: two students are not flagged for both writing what the lab's
text walks them through, nor for both matching the course's solution line for line; only what
they share beyond it counts between students.
"""
from __future__ import annotations

import ast
import builtins
import csv
import dataclasses
import hashlib
import io
import tokenize
from pathlib import Path

K = 6                  # tokens per fingerprint
MIN_TOKENS = 30        # cells shorter than this are not compared
FIELDS = ["lab", "cell", "student", "other", "kind", "similarity", "tokens"]


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
    except SyntaxError:
        text = source           # not Python (yet): compare its raw tokens
    else:
        tree = _Renamer(_bound_names(tree)).visit(tree)
        text = ast.unparse(tree)
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


def fingerprints(tokens: list[str]) -> set[int]:
    return {int.from_bytes(hashlib.blake2b("\x00".join(tokens[i:i + K]).encode(),
                                           digest_size=8).digest(), "little")
            for i in range(max(0, len(tokens) - K + 1))}


def threshold(tokens: int) -> float:
    """The containment above which a pair is flagged: 0.8 for long cells, rising to 0.95 for the
    shortest ones compared (a short cell shares a large part with anything similar by chance)."""
    if tokens >= 150:
        return 0.8
    return 0.95 - 0.15 * (tokens - MIN_TOKENS) / (150 - MIN_TOKENS)


def containment(a: set[int], b: set[int]) -> float:
    small = min(len(a), len(b))
    return len(a & b) / small if small else 0.0


# ---------------------------------------------------------------------------------------------
# A grading run's report

@dataclasses.dataclass
class Answer:
    student: str
    tokens: int
    prints: set[int]


@dataclasses.dataclass(frozen=True)
class Flag:
    lab: str
    cell: str
    student: str
    other: str          # another student, or "course: <module:qualname>"
    kind: str           # "another student" or "course implementation"
    similarity: float
    tokens: int


def compare_cell(lab: str, cell: str, answers: dict[str, str], base: list[str],
                 references: dict[str, str]) -> list[Flag]:
    """Flags for one solution cell: ``answers`` {student: their code}, ``base`` the code every
    student may share (the handed-out cell, the course's solution), ``references`` {name: source
    of a shipped implementation}."""
    handed_out = set().union(*(fingerprints(normalise(b)) for b in base[:1])) if base else set()
    common = set().union(*(fingerprints(normalise(b)) for b in base)) if base else set()
    refs = {name: fingerprints(normalise(src)) for name, src in references.items()}
    kept = {}
    for student, code in answers.items():
        tokens = normalise(code)
        prints = fingerprints(tokens)
        if len(tokens) < MIN_TOKENS or prints <= handed_out:
            continue      # a short answer, or the cell as handed out
        kept[student] = Answer(student, len(tokens), prints)
    flags = []
    for student, answer in sorted(kept.items()):
        for name, ref in refs.items():
            score = containment(answer.prints, ref)
            if score >= threshold(answer.tokens):
                flags.append(Flag(lab, cell, student, f"course: {name}", "course implementation",
                                  round(score, 3), answer.tokens))
    students = sorted(kept)
    for i, a in enumerate(students):
        for b in students[i + 1:]:
            own_a, own_b = kept[a].prints - common, kept[b].prints - common
            tokens = min(kept[a].tokens, kept[b].tokens)
            if min(len(own_a), len(own_b)) < MIN_TOKENS - K + 1:
                continue  # all they share is common ground
            score = containment(own_a, own_b)
            if score >= threshold(tokens):
                flags.append(Flag(lab, cell, a, b, "another student", round(score, 3), tokens))
    return flags


def write_report(flags: list[Flag], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for flag in sorted(flags, key=lambda f: (f.lab, f.cell, -f.similarity, f.student)):
            writer.writerow(dataclasses.asdict(flag))


def summary(flags: list[Flag], path: Path) -> str:
    if not flags:
        return f"similarity: no answers flagged (report: {path})"
    students = sorted({f.student for f in flags} | {f.other for f in flags
                                                    if f.kind == "another student"})
    return (f"similarity: {len(flags)} pairs of answers look copied "
            f"({sum(f.kind == 'course implementation' for f in flags)} from the course's "
            f"implementations), involving {len(students)} students: review {path} (scores are "
            f"unchanged)")
