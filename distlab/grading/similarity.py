"""Which answers look copied: each solution cell against the course's shipped implementations and
against the same cell of every other student, for an instructor to review. It never changes a
score.

How two pieces of code are compared (the idea of MOSS's winnowing, written small):
1. *Normalise*: parse the code, drop docstrings and comments, rename every name the code binds
   (variables, arguments, functions, classes) to ``v0, v1, ...`` in order of first use, and print
   it back in one canonical layout. Names it only uses (``torch``, ``dist.all_reduce``) stay:
   they are the substance. Renaming, reformatting and re-commenting change nothing.
2. *Fingerprint*: the hashes of every run of ``K`` consecutive tokens, of the whole cell and of
   each of its definitions normalised on its own (similarity_code.py): a copied function then
   matches wherever it sits in the cell, whatever the cell binds before it.
3. *Compare*: the share of the shorter side's fingerprints found in the other (containment).

What is compared: every solution cell of every submitted notebook, with the same cell of every
other student and with every function, class and method of the shipped package's lab and check
modules (``distlab/labs``, ``distlab/checks``: the implementations later labs build on, and the
checks' references). A cell left as handed out is not compared. Beside the text, the report
compiles (never runs) each answer and compares its functions' code objects with the course's
(kind ``bytecode``: equal bytecode and constants, names and line numbers aside), and it lists the
answers that use dynamic code or introspection (kind ``dynamic``, similarity_dynamic.py), which an
honest answer to these labs never needs. The ``detail`` column says where: the line and function
of the answer, or each use with its line.

Fingerprints of the handed-out cell and of the course's own solution (``solutions/``) are common
ground, as MOSS's base files are: the labs walk students towards that solution, so sharing parts of
it is what honest work looks like, and only what two answers share *beyond* it counts, against
another student or against a shipped implementation (its code objects and dynamic uses likewise).
Handing in that solution itself is another matter (a solution leaked from last year arrives so):
an answer, or a definition in it, that is after normalisation the course's solution cell, one of
its definitions or a shipped implementation the solution contains, or that compiles to one of its
functions, is flagged as ``course solution`` (similarity_solution.py), above a floor that leaves
out the formulas honest students write alike.

Short answers that honest students write alike (a one-line formula) are not compared at all
(fewer than ``MIN_TOKENS`` tokens beyond the common ground, or ``MIN_INSTRUCTIONS`` for a code
object), and a shorter comparison needs a higher share to be flagged (``threshold``).

Why not copydetect (MOSS's winnowing on files, with boilerplate sets and an HTML report): it
fingerprints characters after pygments has written every name and attribute as one letter, so
``dist.send`` and ``dist.recv`` read alike and a layout change breaks its 25-character runs.
Measured with copydetect 0.5.0 at its defaults (flagged from 0.33, the handed-out cell as
boilerplate) on the suite's samples: of the 37 solution cells above the floor, disguised as a
copier would (names changed, comments dropped, layout redone), it scores 7 under 0.33 (the class
cells: Lab 2's sharded AdamW, Lab 3's parallel layers, Lab 4's attention and block (0.0), Lab 8's
ZeRO-2, ZeRO-3 and prefetching), which this report flags all; a copy with a no-op line between
each two scores 0.0 (flagged here by bytecode); with the solution as boilerplate, as here, the copy
of ``AllToAll`` that the solution contains scores 0.0. It finds nothing that this report misses
(the other student's ring and the three copies of shipped implementations are found by both). It
flags what this report does not: two honest rings written differently (0.72), 11 of 1653 pairs of
different exercises' solutions (up to 0.99), and copies of 19 of the 21 solution cells under the
floor (formulas that honest students write alike). So it is not a dependency: its files, numpy and
HTML would buy less than the few hundred lines here, which keep the called names, the common
ground, the code objects and a CSV. (Dolos, not measured, would bring Node into grading for
tree-sitter token fingerprints of the same kind as these.)

``distlab grade`` writes the report to ``<workdir>/similarity.csv`` after grading and prints a
summary; ``python -m distlab.grading.similarity SUBMISSIONS_DIR`` writes it on its own (after a
``distlab merge`` of shards, for example).
"""
from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import functools
import sys
import threading
from pathlib import Path

from distlab import paths
from distlab.grading.similarity_code import MIN_INSTRUCTIONS, code_keys, definitions  # noqa: F401
# the course's side lived here before: its names stay importable from here
from distlab.grading.similarity_course import (REFERENCE_FLOORS, course_cells,  # noqa: F401
                                               course_code, course_implementations, course_side,
                                               sources_code)
from distlab.grading.similarity_dynamic import describe_uses, dynamic_uses
from distlab.grading.similarity_solution import SOLUTION_FLOOR, SolutionCopies  # noqa: F401
from distlab.grading.similarity_solution import KIND as SOLUTION_KIND
from distlab.grading.similarity_text import (K, MIN_TOKENS, code_fingerprints,  # noqa: F401
                                             containment, definition_fingerprints, fingerprints,
                                             normalise, threshold)

# ``detail`` came last, so that readers of the first seven columns read on unchanged.
FIELDS = ["lab", "cell", "student", "other", "kind", "similarity", "tokens", "detail"]
COPY_KINDS = ("another student", "course implementation", "bytecode")   # and "dynamic"


# ---------------------------------------------------------------------------------------------
# Comparing one solution cell

_code_keys = functools.lru_cache(maxsize=4096)(code_keys)       # read only: shared is safe
_dynamic_uses = functools.lru_cache(maxsize=4096)(dynamic_uses)


@dataclasses.dataclass(frozen=True)
class Flag:
    lab: str
    cell: str
    student: str
    other: str          # another student, "course: <module:qualname>", "course: solution",
    #                     or "" (dynamic)
    kind: str           # one of COPY_KINDS, "course solution" or "dynamic"
    similarity: float   # 1.0 for bytecode and the course solution, 0.0 for dynamic
    tokens: int         # length of the compared part (beyond the common ground), in tokens;
    #                     instructions for bytecode, 0 for dynamic
    detail: str = ""    # where: "line 3: fit_alpha_beta", "line 3: exec(...); line 5: ..."


class References:
    """The shipped implementations, fingerprinted once, with an index from fingerprint to the
    implementations holding it (so an answer meets only those it shares something with), and
    their code objects by key (``code``; compiled from ``sources`` when not given)."""

    def __init__(self, sources: dict[str, str], code: dict[str, list[str]] | None = None,
                 prints: dict[str, list[int]] | None = None):
        """``prints``: each source's fingerprints, already computed (``course()``)."""
        self.sources = sources
        self.prints = {name: fingerprints(src)[1] for name, src in sources.items()} \
            if prints is None else {name: frozenset(fps) for name, fps in prints.items()}
        self.index = collections.defaultdict(list)
        for name, prints in self.prints.items():
            for fp in prints:
                self.index[fp].append(name)
        self.code = sources_code(sources) if code is None else code

    @classmethod
    def course(cls) -> "References":
        """The shipped lab and check modules' implementations (similarity_course.course_side:
        computed once per version of those files)."""
        side = course_side()
        return cls(side["sources"], side["code"], side["prints"])

    def copied(self, own: frozenset[int], common: frozenset[int]) -> list[tuple[str, float, int]]:
        """(name, containment, tokens) of each implementation that ``own`` (an answer's
        fingerprints beyond the common ground) copies, compared beyond the common ground too."""
        hits = collections.Counter(name for fp in own for name in self.index.get(fp, ()))
        found = []
        for name, shared in hits.items():
            score, size = containment(own, self.prints[name] - common, shared)
            if size >= MIN_TOKENS and score >= threshold(size):
                found.append((name, score, size))
        return sorted(found, key=lambda f: -f[1])

    def contained(self, solution: str, handed_out: str) -> dict[str, str]:
        """{name: source} of the implementations that ``solution`` contains, beyond
        ``handed_out``: those that the comparison above takes for common ground."""
        ground = fingerprints(handed_out)[1] | definition_fingerprints(handed_out)
        own = (fingerprints(solution)[1] | definition_fingerprints(solution)) - ground
        return {name: self.sources[name] for name, *_ in self.copied(own, ground)
                if name in self.sources}


def compare_cell(lab: str, cell: str, answers: dict[str, str], base: list[str],
                 references: dict[str, str] | References) -> list[Flag]:
    """Flags for one solution cell: ``answers`` {student: their code}; ``base`` the code every
    student may share, the handed-out cell first (then the course's solution); ``references``
    the shipped implementations ({"module:qualname": source}, or indexed)."""
    if not isinstance(references, References):
        references = References(references)
    handed_out = fingerprints(base[0])[1] if base else frozenset()
    texts = {student: code for student, code in answers.items()
             if fingerprints(code)[0] >= MIN_TOKENS and not fingerprints(code)[1] <= handed_out}
    flags = _text_flags(lab, cell, texts, base, references)
    if len(base) > 1:           # the course's solution is known: a copy of it is flagged
        solution = SolutionCopies(base[0], base[1], references.contained(base[1], base[0]))
        flags += [_flag(lab, cell, student, other, SOLUTION_KIND, 1.0, size, detail)
                  for student, code in sorted(texts.items())
                  for other, size, detail in solution.found(code)]
    # what the common ground compiles to or uses is everyone's (an untouched cell, for one)
    keys = set().union(*(_code_keys(b) for b in base))
    uses = {what for b in base for _, what in _dynamic_uses(b)}
    for student, code in sorted(answers.items()):
        flags += [_flag(lab, cell, student, f"course: {name}", "bytecode", 1.0, n,
                        f"line {line}: {qualname}")
                  for key, (line, qualname, n) in _code_keys(code).items() if key not in keys
                  for name in references.code.get(key, ())]
        found = [(line, what) for line, what in _dynamic_uses(code) if what not in uses]
        if found:
            flags.append(_flag(lab, cell, student, "", "dynamic", 0.0, 0, describe_uses(found)))
    return flags


def _text_flags(lab: str, cell: str, answers: dict[str, str], base: list[str],
                references: References) -> list[Flag]:
    """The normalised-text comparisons of ``answers`` (long enough, not left as handed out):
    whole cells, and every definition on its own (so that a copy is found wherever it sits)."""
    common = frozenset().union(*(fingerprints(b)[1] | definition_fingerprints(b) for b in base))
    own = {student: (fingerprints(code)[1] - common, definition_fingerprints(code) - common)
           for student, code in answers.items()}
    flags = []
    for student, views in sorted(own.items()):
        best: dict[str, tuple[float, int]] = {}
        for prints in views:
            for name, score, size in references.copied(prints, common):
                best[name] = max(best.get(name, (0.0, 0)), (score, size))
        flags += [_flag(lab, cell, student, f"course: {name}", "course implementation", score,
                        size, _where(answers[student], references.prints[name]))
                  for name, (score, size) in sorted(best.items(), key=lambda b: -b[1][0])]
    students = sorted(own)
    for i, a in enumerate(students):
        for b in students[i + 1:]:
            # whole cells, then their definitions: the closer of the views that count
            views = [containment(own[a][v], own[b][v]) for v in (0, 1)]
            found = [(score, size) for score, size in views
                     if size >= MIN_TOKENS and score >= threshold(size)]
            if found:
                flags.append(_flag(lab, cell, a, b, "another student", *max(found)))
    return flags


def _where(code: str, prints: frozenset[int]) -> str:
    """The definition of ``code`` that holds most of ``prints``: "line 3: fit_alpha_beta"."""
    shared, line, name = max(((len(fingerprints(text)[1] & prints), line, name)
                              for line, name, text in definitions(code)), default=(0, 0, ""))
    return f"line {line}: {name}" if shared else ""


def _flag(lab, cell, student, other, kind, score, size, detail="") -> Flag:
    return Flag(lab, cell, student, other, kind, round(score, 3), size, detail)


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
    references = References.course()
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
        for flag in sorted(flags, key=lambda f: (f.lab, f.cell, -f.similarity, f.student,
                                                 f.kind, f.other)):
            writer.writerow(dataclasses.asdict(flag))


def summary(flags: list[Flag], path: Path, shown: int = 5) -> str:
    """The lines the run ends with: how many answers look copied (an answer flagged as a copy of
    one source by several kinds counts once), how many are the course's own solution, how many
    use dynamic code, the first few."""
    if not flags:
        return f"similarity: no answers flagged (report: {path})"
    copies = {}                 # (lab, cell, student, other): its most similar flag
    for f in sorted(flags, key=lambda f: -f.similarity):
        if f.kind in COPY_KINDS:
            copies.setdefault((f.lab, f.cell, f.student, f.other), f)
    solution = {(f.lab, f.cell, f.student): f for f in flags if f.kind == SOLUTION_KIND}
    dynamic = [f for f in flags if f.kind == "dynamic"]
    parts = []
    if copies:
        students = {f.student for f in copies.values()} | {
            f.other for f in copies.values() if f.kind == "another student"}
        course = sum(other.startswith("course: ") for *_, other in copies)
        parts.append(f"{len(copies)} answers look copied ({course} from the course's "
                     f"implementations), involving {len(students)} students")
    if solution:
        n, students = len(solution), len({f.student for f in solution.values()})
        parts.append(f"{n} answer{'s' * (n != 1)} {'are' if n != 1 else 'is'} the course's own "
                     f"solution ({students} student{'s' * (students != 1)})")
    if dynamic:
        n, students = len(dynamic), len({f.student for f in dynamic})
        parts.append(f"dynamic code or introspection in {n} answer{'s' * (n != 1)} "
                     f"({students} student{'s' * (students != 1)})")
    lines = [f"similarity: {'; '.join(parts)}: review {path} (scores are unchanged)"]
    listed = list(copies.values()) + dynamic + list(solution.values())   # the rare first
    lines += [f"  {f.lab}/{f.cell}: {_line(f)}" for f in listed[:shown]]
    if len(listed) > shown:
        lines.append(f"  ... and {len(listed) - shown} more in {path}")
    return "\n".join(lines)


def _line(f: Flag) -> str:
    if f.kind == "dynamic":
        return f"{f.student} uses {f.detail if len(f.detail) < 80 else f.detail[:77] + '...'}"
    if f.kind == SOLUTION_KIND:
        return f"{f.student} hands in {f.other.removeprefix('course: ')} ({f.detail}, " \
               f"{f.tokens} tokens)"
    if f.kind == "bytecode":
        return f"{f.student} ~ {f.other} (the same bytecode, {f.detail})"
    return f"{f.student} ~ {f.other} ({f.similarity:.0%} of {f.tokens} tokens)"


class Making:
    """The report of a ``distlab grade`` run, made on a thread of its own once ``start`` is
    called (when the run's last students are graded, a core is free: ``grade_run``'s ``tail``)
    or else by ``flags``. Its inputs are the submissions and the template's release, which
    grading never changes."""

    def __init__(self, submissions: Path, found: dict[str, list[str]], workdir: Path):
        self.args = (submissions.resolve(), found, workdir / "template" / "release")
        self.thread: threading.Thread | None = None
        self.made: list[Flag] | BaseException = []

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._make, name="similarity", daemon=True)
            self.thread.start()

    def _make(self) -> None:
        try:
            self.made = report(*self.args)
        except Exception as exc:  # noqa: BLE001 - raised where the flags are asked for
            self.made = exc

    def flags(self) -> list[Flag]:
        if self.thread is None:
            return report(*self.args)
        self.thread.join()
        if isinstance(self.made, BaseException):
            raise self.made
        return self.made


def after_grading(submissions: Path, found: dict[str, list[str]], workdir: Path,
                  code: int, making: Making | None = None) -> int:
    """The report at the end of ``distlab grade``: written to ``<workdir>/similarity.csv``, its
    summary printed. Returns the grading's exit code unchanged: the report never changes a score,
    and a failure in it is a warning, not a failed grading run. Skipped after an interrupt.
    ``making``: the report, started during grading."""
    if code == 130:
        return code
    path = workdir / "similarity.csv"
    try:
        flags = (making or Making(submissions, found, workdir)).flags()
        write_report(flags, path)
    except Exception as exc:  # noqa: BLE001 - the scores are written; say so and go on
        print(f"warning: the similarity report failed ({type(exc).__name__}: {exc}); the scores "
              f"are not affected. Run `python -m distlab.grading.similarity "
              f"{submissions}` to retry it.", file=sys.stderr)
        return code
    print(summary(flags, path))
    return code


def after_shard(submissions: Path) -> str:
    """What a ``--shard K/N`` run prints instead of a report (each shard would compare the whole
    class again): the command that makes the one report, after ``distlab merge``."""
    return (f"similarity: not made by a shard; after `distlab merge`, run `python -m "
            f"distlab.grading.similarity {submissions} --workdir MERGED_WORKDIR` once")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m distlab.grading.similarity",
        description="Flag solution cells that look copied (from another student or from the "
                    "course's shipped implementations) or use dynamic code or introspection, "
                    "into WORKDIR/similarity.csv.")
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
