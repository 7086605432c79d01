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

What is compared: every solution cell of every submitted notebook, with the same cell of every
other student and with every function, class and method of the shipped package's lab and check
modules (``distlab/labs``, ``distlab/checks``: the implementations later labs build on, and the
checks' references). A cell left as handed out is not compared.

Fingerprints of the handed-out cell and of the course's own solution (``solutions/``) are common
ground, as MOSS's base files are: the labs walk students towards that solution, so matching it is
what honest work looks like, and only what two answers share *beyond* it counts, against another
student or against a shipped implementation. (An exercise whose solution is also shipped, line for
line, cannot tell a copy from honest work: the report stays silent there rather than accuse.)

Short answers that honest students write alike (a one-line formula) are not compared at all
(fewer than ``MIN_TOKENS`` tokens beyond the common ground), and a shorter comparison needs a
higher share to be flagged (``threshold``).

``distlab grade`` writes the report to ``<workdir>/similarity.csv`` after grading and prints a
summary; ``python -m distlab.grading.similarity SUBMISSIONS_DIR`` writes it on its own (after a
``distlab merge`` of shards, for example).
"""
from __future__ import annotations

import argparse
import ast
import builtins
import collections
import csv
import dataclasses
import functools
import hashlib
import io
import sys
import textwrap
import tokenize
from pathlib import Path

from distlab import paths

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
# Comparing one solution cell

@functools.lru_cache(maxsize=4096)
def _print(source: str) -> tuple[int, frozenset[int]]:
    """(tokens, fingerprints) of ``source``; cached: the references recur for every cell."""
    tokens = normalise(source)
    return len(tokens), frozenset(code_fingerprints(tokens))


def _share(a: set[int], b: set[int], hits: int | None = None) -> tuple[float, int]:
    """(containment, tokens compared): the share of the smaller side found in the other, and the
    smaller side's length in tokens, which sets the threshold."""
    small = min(len(a), len(b))
    shared = len(a & b) if hits is None else hits
    return (shared / small if small else 0.0), small + K - 1


@dataclasses.dataclass(frozen=True)
class Flag:
    lab: str
    cell: str
    student: str
    other: str          # another student, or "course: <module:qualname>"
    kind: str           # "another student" or "course implementation"
    similarity: float
    tokens: int         # length of the compared part (beyond the common ground), in tokens


class References:
    """The shipped implementations, fingerprinted once, with an index from fingerprint to the
    implementations holding it (so an answer meets only those it shares something with)."""

    def __init__(self, sources: dict[str, str]):
        self.prints = {name: _print(src)[1] for name, src in sources.items()}
        self.index = collections.defaultdict(list)
        for name, prints in self.prints.items():
            for fp in prints:
                self.index[fp].append(name)

    def copied(self, own: frozenset[int], common: frozenset[int]) -> list[tuple[str, float, int]]:
        """(name, containment, tokens) of each implementation that ``own`` (an answer's
        fingerprints beyond the common ground) copies, compared beyond the common ground too."""
        hits = collections.Counter(name for fp in own for name in self.index.get(fp, ()))
        found = []
        for name, shared in hits.items():
            score, size = _share(own, self.prints[name] - common, shared)
            if size >= MIN_TOKENS and score >= threshold(size):
                found.append((name, score, size))
        return sorted(found, key=lambda f: -f[1])


def compare_cell(lab: str, cell: str, answers: dict[str, str], base: list[str],
                 references: dict[str, str] | References) -> list[Flag]:
    """Flags for one solution cell: ``answers`` {student: their code}; ``base`` the code every
    student may share, the handed-out cell first (then the course's solution); ``references``
    the shipped implementations ({"module:qualname": source}, or indexed)."""
    if not isinstance(references, References):
        references = References(references)
    handed_out = _print(base[0])[1] if base else frozenset()
    common = frozenset().union(*(_print(b)[1] for b in base))
    own = {}
    for student, code in answers.items():
        tokens, prints = _print(code)
        if tokens >= MIN_TOKENS and not prints <= handed_out:
            own[student] = prints - common
    flags = [_flag(lab, cell, student, f"course: {name}", "course implementation", score, size)
             for student, prints in sorted(own.items())
             for name, score, size in references.copied(prints, common)]
    students = sorted(own)
    for i, a in enumerate(students):
        for b in students[i + 1:]:
            score, size = _share(own[a], own[b])
            if size >= MIN_TOKENS and score >= threshold(size):
                flags.append(_flag(lab, cell, a, b, "another student", score, size))
    return flags


def _flag(lab, cell, student, other, kind, score, size) -> Flag:
    return Flag(lab, cell, student, other, kind, round(score, 3), size)


# ---------------------------------------------------------------------------------------------
# The course's side: shipped implementations, handed-out cells, solutions

REFERENCE_FLOORS = ("labs", "checks")   # the package's floors whose code could be an answer
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def course_implementations(package: Path = paths.PACKAGE) -> dict[str, str]:
    """{"module:qualname": source} of every function, class and method in the shipped lab and
    check modules, read from their files (nothing imported)."""
    found = {}
    for floor in REFERENCE_FLOORS:
        for path in sorted((package / floor).rglob("*.py")):
            lines = path.read_text().splitlines()
            module = ".".join(path.relative_to(package.parent).with_suffix("").parts)
            for node in ast.parse("\n".join(lines)).body:
                if not isinstance(node, _DEFS):
                    continue
                items = [(node, node.name)]
                if isinstance(node, ast.ClassDef):
                    items += [(m, f"{node.name}.{m.name}") for m in node.body
                              if isinstance(m, _DEFS)]
                for item, qualname in items:
                    # dedented, so that a method parses (and is normalised) on its own
                    text = "\n".join(lines[item.lineno - 1:item.end_lineno])
                    found[f"{module}:{qualname}"] = textwrap.dedent(text)
    return found


def _solution_cells(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}


def course_cells(lab: str, released: Path | None = None) -> dict[str, list[str]]:
    """{grade_id: [handed-out code, the course's solution]} for ``lab``'s solution cells; the
    handed-out cells from ``released/<lab>/`` (the grading run's own nbgrader release) where it
    has the lab, else from the student labs in ``notebooks/``."""
    import nbformat
    from distlab.grading.course_dir import source_notebook

    handout = released / lab / f"{lab}.ipynb" if released else None
    if handout is None or not handout.is_file():
        handout = paths.notebooks() / lab / f"{lab}.ipynb"
    handed = _solution_cells(nbformat.read(handout, as_version=4))
    solved = _solution_cells(source_notebook(lab))
    marks = ("### BEGIN SOLUTION", "### END SOLUTION")
    return {gid: [code, "\n".join(line for line in solved.get(gid, "").splitlines()
                                  if line.strip() not in marks)]
            for gid, code in handed.items()}


# ---------------------------------------------------------------------------------------------
# A grading run's report

def read_answers(submissions: Path, found: dict[str, list[str]], lab: str,
                 cells: list[str]) -> dict[str, dict[str, str]]:
    """{grade_id: {student: code}} of ``lab``'s solution cells in each student's notebook; a
    notebook that does not parse is left out (grading reports it)."""
    import nbformat

    answers: dict[str, dict[str, str]] = {gid: {} for gid in cells}
    for student, labs in sorted(found.items()):
        if lab not in labs:
            continue
        try:
            nb = nbformat.read(submissions / student / lab / f"{lab}.ipynb", as_version=4)
        except Exception:  # noqa: BLE001 - any unreadable notebook: nothing to compare
            continue
        for cell in nb.cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in answers and cell.get("cell_type") == "code":
                answers[gid][student] = cell.source
    return answers


def report(submissions: Path, found: dict[str, list[str]],
           released: Path | None = None) -> list[Flag]:
    """Every flag for the submissions ``found`` ({student: [lab, ...]}); ``released``: the
    release folder of the grading run's template, if there is one (see ``course_cells``)."""
    references = References(course_implementations())
    flags = []
    for lab in sorted({lab for labs in found.values() for lab in labs}):
        cells = course_cells(lab, released)
        for gid, answers in read_answers(submissions, found, lab, list(cells)).items():
            flags += compare_cell(lab, gid, answers, cells[gid], references)
    return flags


def write_report(flags: list[Flag], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for flag in sorted(flags, key=lambda f: (f.lab, f.cell, -f.similarity, f.student)):
            writer.writerow(dataclasses.asdict(flag))


def summary(flags: list[Flag], path: Path, shown: int = 5) -> str:
    if not flags:
        return f"similarity: no answers flagged (report: {path})"
    students = sorted({f.student for f in flags} | {f.other for f in flags
                                                    if f.kind == "another student"})
    lines = [f"similarity: {len(flags)} answers look copied "
             f"({sum(f.kind == 'course implementation' for f in flags)} from the course's "
             f"implementations), involving {len(students)} students: review {path} (scores are "
             f"unchanged)"]
    for f in sorted(flags, key=lambda f: -f.similarity)[:shown]:
        lines.append(f"  {f.lab}/{f.cell}: {f.student} ~ {f.other} ({f.similarity:.0%} of "
                     f"{f.tokens} tokens)")
    if len(flags) > shown:
        lines.append(f"  ... and {len(flags) - shown} more in {path}")
    return "\n".join(lines)


def after_grading(submissions: Path, found: dict[str, list[str]], workdir: Path,
                  code: int) -> int:
    """The report at the end of ``distlab grade``: written to ``<workdir>/similarity.csv``, its
    summary printed. Returns the grading's exit code unchanged: the report never changes a score,
    and a failure in it is a warning, not a failed grading run. Skipped after an interrupt."""
    if code == 130:
        return code
    path = workdir / "similarity.csv"
    try:
        flags = report(submissions.resolve(), found, workdir / "template" / "release")
        write_report(flags, path)
    except Exception as exc:  # noqa: BLE001 - the scores are written; say so and go on
        print(f"warning: the similarity report failed ({type(exc).__name__}: {exc}); the scores "
              f"are not affected. Run `python -m distlab.grading.similarity "
              f"{submissions}` to retry it.", file=sys.stderr)
        return code
    print(summary(flags, path))
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m distlab.grading.similarity",
        description="Flag solution cells that look copied (from another student or from the "
                    "course's shipped implementations) into WORKDIR/similarity.csv.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--workdir", type=Path, default=Path("grading"),
                   help="where similarity.csv goes (default ./grading)")
    args = p.parse_args(argv)
    found: dict[str, list[str]] = {}
    for nb in sorted(args.submissions.glob("*/*/*.ipynb")):
        if nb.stem == nb.parent.name and nb.stem in paths.labs():
            found.setdefault(nb.parent.parent.name, []).append(nb.stem)
    workdir = args.workdir.resolve()
    flags = report(args.submissions.resolve(), found, workdir / "template" / "release")
    path = workdir / "similarity.csv"
    write_report(flags, path)
    print(summary(flags, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
