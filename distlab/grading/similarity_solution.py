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
the handed-out cell (the measure of the report's ``tokens`` column). The labs' solution cells
measure 30 to 486 such tokens; every cell under 100 is a formula or a fill-in a line or two long
that honest students write alike (the ``predict_*`` byte counts, Lab 3's shard slices and
conjugate operators' one-line bodies, Lab 6's dict of answers, at 30 to 94), and every cell from
102 on is an algorithm (Lab 1's reduce-scatter + all-gather at 103, Lab 6's classifier at 102, the
ring all-reduce at 174). Only Lab 2's overlapped all-reduce (91, a class with a hook) is long
enough to tell and left under the floor.
"""
from __future__ import annotations

import functools

from distlab.grading.similarity_code import code_keys, definitions
from distlab.grading.similarity_text import K, definition_fingerprints, fingerprints, normalise

KIND = "course solution"
SOLUTION = "course: solution"          # the ``other`` of a match with the solution cell itself
SOLUTION_FLOOR = 100                   # tokens beyond the handed-out cell (see above)


@functools.lru_cache(maxsize=4096)
def _tokens(source: str) -> tuple[str, ...]:
    return tuple(normalise(source))


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
        handed_keys = code_keys(handed_out)
        # a function of the solution long enough to tell, by what it compiles to
        self.code = {key: sizes[qualname] for key, (_, qualname, _) in code_keys(solution).items()
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
        for key, (line, qualname, _) in code_keys(code).items():
            if key in self.code and qualname not in matched \
                    and qualname.split(".")[0] not in matched:
                found.append((SOLUTION, self.code[key], f"line {line}: {qualname} (bytecode)"))
        return found
