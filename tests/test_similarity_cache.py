"""distlab.grading.similarity_cache: the copy report's course side is computed once per version of
the course's lab and check modules, kept in the user's cache folder (never beside a user's files),
and never read stale: a changed, added or removed source, another interpreter or a changed
algorithm is computed afresh; an unreadable file is replaced, an unwritable folder skipped."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from distlab.grading import similarity_cache
from distlab.grading.similarity import References
from distlab.grading.similarity_course import course_code, course_implementations, course_side
from distlab.grading.similarity_text import fingerprints

ALL_REDUCE = '''
def ring(tensor, world_size):
    chunks = list(tensor.chunk(world_size))
    for step in range(world_size - 1):
        chunks[step % world_size] = chunks[step % world_size] + chunks[(step + 1) % world_size]
        total = sum(float(c.sum()) for c in chunks)
        if total > 1e9:
            raise ValueError("too large: " + str(total))
    return chunks
'''
CHECK = '''
def check_ring(fn, seed=0):
    values = [seed + i * 3 for i in range(16)]
    got = fn(values, 4)
    if sorted(got) != sorted(values) or len(got) != len(values) or got[0] is None:
        raise AssertionError("ring: " + repr(got) + " instead of " + repr(values))
    return got
'''


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    """A package of one lab module and one check module; the cache in a folder of the test's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "distlab"
    for floor, text in (("labs", ALL_REDUCE), ("checks", CHECK)):
        (root / floor).mkdir(parents=True)
        (root / floor / "ring.py").write_text(textwrap.dedent(text))
    return root


def _computed(package: Path) -> dict:
    """The course side computed here and now, without the cache."""
    sources = course_implementations(package)
    return {"sources": sources,
            "prints": {name: sorted(fingerprints(src)[1]) for name, src in sources.items()},
            "code": course_code(package)}


def _kept(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "distlab").glob("similarity-*.json"))


def test_the_course_side_is_kept_in_the_cache_folder_and_read_back(package, tmp_path):
    first = course_side(package)
    assert first == _computed(package)
    assert set(first["sources"]) == {"distlab.labs.ring:ring", "distlab.checks.ring:check_ring"}
    assert first["code"]                          # both functions are long enough to compare
    (kept,) = _kept(tmp_path)
    assert json.loads(kept.read_text()) == first
    # read back, not computed: a doctored file under the same key is what comes back
    doctored = dict(first, code={"doctored": ["x"]})
    kept.write_text(json.dumps(doctored))
    assert course_side(package) == doctored
    # nothing written beside the course's files
    assert sorted(p.name for p in package.rglob("*") if p.is_file()) == ["ring.py", "ring.py"]


def test_a_changed_added_or_removed_source_is_computed_afresh(package, tmp_path):
    before = course_side(package)
    lab = package / "labs" / "ring.py"
    lab.write_text(lab.read_text().replace("step + 1", "step + 2"))          # a changed source
    changed = course_side(package)
    assert changed == _computed(package) and changed["prints"] != before["prints"]
    assert "step + 2" in changed["sources"]["distlab.labs.ring:ring"]
    (package / "labs" / "more.py").write_text(lab.read_text().replace("def ring", "def ring2"))
    added = course_side(package)                                              # an added one
    assert added == _computed(package) and "distlab.labs.more:ring2" in added["sources"]
    (package / "labs" / "more.py").unlink()                                   # removed again
    assert course_side(package) == changed
    assert len(_kept(tmp_path)) == 3             # one file per version of the sources


def test_another_interpreter_or_algorithm_is_another_key(package, monkeypatch, tmp_path):
    files = [("m", package / "labs" / "ring.py")]
    key = similarity_cache.key("course", files)
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    assert similarity_cache.key("course", files) != key
    monkeypatch.undo()
    algorithm = tmp_path / "similarity_text.py"
    algorithm.write_text("K = 5\n")
    monkeypatch.setattr(similarity_cache, "ALGORITHM",
                        (*similarity_cache.ALGORITHM, algorithm))
    other = similarity_cache.key("course", files)
    assert other != key
    algorithm.write_text("K = 6\n")
    assert similarity_cache.key("course", files) != other
    # the real algorithm: the modules that tokenise, fingerprint and compile
    names = {p.name for p in similarity_cache.ALGORITHM}
    assert {"similarity_text.py", "similarity_code.py", "similarity_course.py"} <= names


def test_an_unreadable_file_is_replaced_and_an_unwritable_folder_skipped(package, tmp_path,
                                                                          monkeypatch):
    first = course_side(package)
    (kept,) = _kept(tmp_path)
    kept.write_text('{"sources": {')                      # half a file (a disk that filled)
    assert course_side(package) == first
    assert json.loads(kept.read_text()) == first
    kept.write_text('{"sources": {}}')                    # JSON, but not all of it
    assert course_side(package) == first
    assert json.loads(kept.read_text()) == first
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert course_side(package) == first
    assert blocked.read_text() == "a file where the cache folder would be"


def test_only_the_most_recently_used_files_are_kept(package, tmp_path, monkeypatch):
    monkeypatch.setattr(similarity_cache, "KEEP", 2)
    where = tmp_path / "cache" / "distlab"
    where.mkdir(parents=True)
    mine = where / "notes.txt"
    mine.write_text("not the cache's")
    for n in range(3):
        similarity_cache.cached(f"v{n}", [], lambda n=n: {"n": n})
    assert [p.name.split("-")[1] for p in _kept(tmp_path)] == ["v1", "v2"]
    assert mine.read_text() == "not the cache's"


def test_references_from_the_kept_side_equal_those_computed(package):
    course_side(package)
    side = course_side(package)                         # read back from the file
    kept = References(side["sources"], side["code"], side["prints"])
    fresh = References(course_implementations(package), course_code(package))
    assert kept.prints == fresh.prints and kept.code == fresh.code
    assert kept.sources == fresh.sources
