"""What a grading run grades: the shard's students (``--shard K/N``), and of those the labs whose
fingerprint (settings, the lab's tests, the submission's files) differs from their record, or
that ``--regrade`` names."""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

ALL = "*"          # --regrade given without a name: every student


def shard_arg(text: str) -> tuple[int, int]:
    """argparse type of ``--shard K/N``."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected K/N, two whole numbers, e.g. --shard 0/4 for the first of 4 shards"
        ) from None
    if n < 1 or not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"{text}: K must be in 0..N-1 and N at least 1 "
                                         f"(shards are numbered from 0)")
    return k, n


def shard_of(student: str, n: int) -> int:
    """The shard of ``student`` among ``n``: stable across machines and Python runs (unlike
    ``hash``), so every array task agrees on who is whose."""
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n


def in_shard(found: dict[str, list[str]], shard: tuple[int, int] | None) -> dict[str, list[str]]:
    if shard is None:
        return dict(found)
    k, n = shard
    return {s: labs for s, labs in found.items() if shard_of(s, n) == k}


def _digest_tree(h, folder: Path) -> None:
    """Feed every file under ``folder`` to ``h``: its relative name, then its bytes."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        h.update(f"{path.relative_to(folder).as_posix()}\0{len(data)}\0".encode())
        h.update(data)


def lab_fingerprints(submissions: Path, found: dict[str, list[str]], template: Path,
                 settings: dict) -> dict[str, dict[str, str]]:
    """{student: {lab: sha256}} over the grading settings, the lab's nbgrader source (its tests)
    and the submission's files: equal fingerprints would be graded the same way again."""
    course = {}
    for lab in sorted({lab for labs in found.values() for lab in labs}):
        course[lab] = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
        _digest_tree(course[lab], template / "source" / lab)
    result = {}
    for student, labs in found.items():
        result[student] = {}
        for lab in labs:
            h = course[lab].copy()
            _digest_tree(h, submissions / student / lab)
            result[student][lab] = h.hexdigest()
    return result


def plan(current: dict[str, dict[str, str]], records: dict[str, dict],
         regrade: list[str] | None) -> tuple[dict[str, list[str]], list[str]]:
    """({student: labs to grade}, [students skipped]): a lab is graded when its record's
    fingerprint is not ``current``'s, or ``regrade`` names its student (``ALL``: everyone)."""
    regrade = set(regrade or ())
    todo, skipped = {}, []
    for student, labs in current.items():
        done = records.get(student, {}).get("labs", {})
        stale = [lab for lab, fp in labs.items() if done.get(lab, {}).get("fingerprint") != fp]
        if ALL in regrade or student in regrade:
            todo[student] = list(labs)
        elif stale:
            todo[student] = stale
        else:
            skipped.append(student)
    return todo, skipped
