"""Answers that are the course's own solution, for the copy report (similarity.py).

The report counts what an answer shares with the course's solution as common ground (the labs walk
students towards it), so a copy of that solution would pass unseen: a solution leaked from last
year arrives exactly so. Here an answer is flagged (kind ``course solution``) when, after the
report's normalisation (renaming, layout, comments), the whole cell or one of its definitions *is*
the course's solution cell, one of that cell's definitions, or a shipped implementation that the
solution also contains; or when one of its functions compiles to the code object of a function of
the solution (no-op statements put between the lines do not hide it). Equal, not alike: honest
work that the labs walk towards the same code still differs somewhere in a long answer.

Short answers are left out: the solution's part must hold at least ``SOLUTION_FLOOR`` tokens beyond
the handed-out cell (the measure of the report's ``tokens`` column). The labs' 58 solution cells
measure 30 to 485 such tokens, with no gap between short and long; the floor sits where the kind of
code changes. The 21 cells under 100 are a few lines that the lab's text all but dictates: the
short ``predict_*`` byte counts and other formulas (30 to 71), Lab 3's shard slices and its
conjugate operators' one-line bodies (85, 80), Lab 6's dict of answers (94), short loops such as
Lab 5's partition (59); the longest, Lab 2's overlapped all-reduce (91), is a hook and a wait loop.
The 37 cells from 102 on are algorithms that two honest hands do not write token for token alike
(Lab 6's classifier at 102, Lab 1's reduce-scatter + all-gather at 103, the ring all-reduce at 174,
up to Lab 3's sequence-parallel block at 485).
"""
from __future__ import annotations

import functools

from distlab.grading.similarity_code import code_keys, definitions
from distlab.grading.similarity_text import K, definition_fingerprints, fingerprints, normalise

KIND = "course solution"
SOLUTION = "course: solution"          # the ``other`` of a match with the solution cell itself
SOLUTION_FLOOR = 100                   # tokens beyond the handed-out cell (see above)


# A cell's normalised tokens, each cell once (a lambda: a one-call function of its own would
# share its bytecode with unrelated course helpers, which the student package test flags)
_tokens = functools.lru_cache(maxsize=4096)(lambda source: tuple(normalise(source)))


_code_keys = functools.lru_cache(maxsize=4096)(code_keys)      # read only: shared is safe


class SolutionCopies:
    """The texts and code objects that a copy of one cell's course solution would equal."""

    def __init__(self, handed_out: str, solution: str, implementations: dict[str, str]):
        """``implementations``: {"module:qualname": source} of the shipped implementations that
        the solution contains (which the report's comparison with the package leaves out)."""
        ground = fingerprints(handed_out)[1] | definition_fingerprints(handed_out)
        self.texts: dict[tuple[str, ...], tuple[str, int]] = {}    # tokens: (other, size)
        for other, text in ([(SOLUTION, solution)]
                            + [(SOLUTION, text) for *_, text in definitions(solution)]
                            + [(f"course: {name}", text)
                               for name, text in sorted(implementations.items())]):
            size = len(fingerprints(text)[1] - ground) + K - 1
            if size >= SOLUTION_FLOOR:
                self.texts.setdefault(_tokens(text), (other, size))
        sizes = {qualname: len(fingerprints(text)[1] - ground) + K - 1
                 for _, qualname, text in definitions(solution)}
        handed_keys = _code_keys(handed_out)
        # a function of the solution long enough to tell, by what it compiles to
        self.code = {key: sizes[qualname] for key, (_, qualname, _) in _code_keys(solution).items()
                     if sizes.get(qualname, 0) >= SOLUTION_FLOOR and key not in handed_keys}

    def found(self, code: str) -> list[tuple[str, int, str]]:
        """(other, size, detail) of each part of ``code`` that is the course's: the whole cell,
        or each definition (a class once, not again for its methods), then each function whose
        code object is the solution's that its text did not already show."""
        if _tokens(code) in self.texts:
            return [(*self.texts[_tokens(code)], "the whole cell")]
        found, matched = [], set()
        for line, qualname, text in definitions(code):
            if qualname.split(".")[0] in matched or _tokens(text) not in self.texts:
                continue
            matched.add(qualname)
            found.append((*self.texts[_tokens(text)], f"line {line}: {qualname}"))
        for key, (line, qualname, _) in _code_keys(code).items():
            if key in self.code and qualname not in matched \
                    and qualname.split(".")[0] not in matched:
                found.append((SOLUTION, self.code[key], f"line {line}: {qualname} (bytecode)"))
        return found
