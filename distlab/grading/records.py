"""Durable grading results: what a killed ``distlab grade`` leaves behind, what the next run skips,
and the outputs rebuilt from them.

The main grading process keeps, in the work directory and outside ``students/`` (which the
students' code can write):

    results/<student>.json   one entry per lab: the fingerprint of what was graded, the row, the
                             points per test; written atomically (temp file, fsync, rename) when
                             the student is done, so a kill leaves the old record or the new one
    run.json                 the run's scope (students, labs, shard) and whether it finished
    feedback/<student>/<lab>/<lab>.html
    gradebook.db             an nbgrader gradebook with every recorded (student, lab) of the scope

``--out`` (scores.csv) and gradebook.db are rebuilt from the records after every student and at
the start of a run, so whatever moment a run is killed at, the next one starts from complete,
agreeing outputs. A lab is graded again only when its fingerprint changed (sha256 over the
grading settings, the lab's nbgrader source with its tests, and every file of the submission) or
``--regrade`` names its student.

Sharding (``--shard K/N``) picks the students whose sha256(name) mod N is K; ``distlab merge``
(``distlab.grading.merge``) joins the shards' work directories.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from distlab.grading.files import atomic_write
from distlab.grading.folders import claim, contents
from distlab.grading.gradebook import (ensure_structure, gradebook_tests, manual_cells,
                                       manual_scores, sync_gradebook)

MANIFEST = "run.json"


def load_records(workdir: Path) -> dict[str, dict]:
    """{student: record} of ``workdir/results``. A record that does not parse (edited by hand)
    counts as absent: its student is graded again."""
    records = {}
    for path in sorted((workdir / "results").glob("*.json")):
        try:
            record = json.loads(path.read_text())
            records[record["student"]] = record
        except (ValueError, KeyError, TypeError):
            print(f"warning: {path} is not a grading record; its student will be graded again")
    return records


def save_record(workdir: Path, record: dict) -> None:
    atomic_write(workdir / "results" / f"{record['student']}.json", json.dumps(record, indent=1))


def points_per_test(row: dict, tests: dict[str, float]) -> dict[str, float]:
    """Points per test of ``row`` (``tests``: {test: max points}). nbgrader gives a code test its
    full points or none, and the row's status says which; a row's own ``points`` wins."""
    given = row.get("points") or {}
    points = {t: float(given.get(t, top if row["tests"].get(t) == "pass" else 0.0))
              for t, top in tests.items()}
    if row["tests"] and abs(sum(points.values()) - row["score"]) > 1e-6:
        # The gradebook would disagree with the CSV: say so rather than hide it.
        print(f"warning: {row['student']}/{row['lab']}: the tests' points add up to "
              f"{sum(points.values()):g}, the score is {row['score']:g}; gradebook.db keeps the "
              f"tests' points", file=sys.stderr)
    return points


def read_manifest(workdir: Path) -> dict | None:
    path = workdir / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


# What nbgrader's own tools keep in a course's grading folder (grader/nbgrader_config.py maps the
# repository's grading/ so; `distlab build` makes it for the formgrader's gradebook.db), which a
# grading run adds to and never deletes.
NBGRADER_NAMES = {"gradebook.db", "submitted", "autograded", "feedback", "exchange"}


def is_workdir(folder: Path) -> bool:
    """A grading work directory written before work directories carried their marker, or
    nbgrader's grading folder."""
    return ((folder / MANIFEST).is_file() or (folder / "results").is_dir()
            or set(contents(folder)) <= NBGRADER_NAMES)


def claim_workdir(workdir: Path) -> None:
    """Refuse a work directory that holds anything but a grading run's (or a merge's) files: a
    run replaces its ``students/``, ``template/`` and ``views/`` folders. A previous run's work
    directory (its ``.distlab-grade`` or its records) is resumed as always."""
    claim(workdir, "grade", legacy=is_workdir,
          what="write course folders, records and feedback into it and replace its students/, "
               "template/ and views/", remedy=None)


def write_manifest(workdir: Path, scope: dict[str, list[str]], shard, complete: bool,
                   **extra) -> None:
    manifest = {"shard": list(shard) if shard else None, "students": scope,
                "complete": complete, **extra}
    atomic_write(workdir / MANIFEST, json.dumps(manifest, indent=1))


def scope_rows(records: dict[str, dict], scope: dict[str, list[str]], workdir: Path) -> list[dict]:
    """The recorded rows of ``scope`` ({student: labs}), feedback paths made absolute."""
    rows = []
    for student, labs in scope.items():
        entries = records.get(student, {}).get("labs", {})
        for lab in labs:
            if lab in entries:
                row = dict(entries[lab]["row"])
                row["feedback"] = str(workdir / row["feedback"]) if row["feedback"] else ""
                rows.append(row)
    return rows


def with_manual_scores(rows: list[dict], db: Path) -> list[dict]:
    """``rows`` with the manually graded answer cells of gradebook ``db``: a column per cell
    ("manual 3/5", or "ungraded" until the instructor scores it in the formgrader), its points
    in the score and its maximum in the maximum."""
    cells, scores = manual_cells(db), manual_scores(db)
    out = []
    for row in rows:
        mine = cells.get(row["lab"], {})
        if mine and row["max_score"] is not None:
            given = scores.get((row["student"], row["lab"]), {})
            row = dict(row, tests=dict(row["tests"]))
            for cell, top in mine.items():
                score = given.get(cell)
                row["tests"][cell] = "ungraded" if score is None else f"manual {score:g}/{top:g}"
                row["score"] += score or 0.0
                row["max_score"] += top
        out.append(row)
    return out


def scope_points(records: dict[str, dict], scope: dict[str, list[str]]) -> dict:
    """{(student, lab): {test: points}} of every recorded lab in ``scope``."""
    return {(s, lab): records[s]["labs"][lab]["points"] for s, labs in scope.items()
            for lab in labs if lab in records.get(s, {}).get("labs", {})}


class Run:
    """One grading run's durable state: records, then scores CSV and gradebook rebuilt from them."""

    def __init__(self, workdir: Path, out: Path, scope: dict[str, list[str]], shard,
                 current: dict[str, dict[str, str]], write_csv):
        self.workdir, self.out, self.scope, self.shard = workdir, out, scope, shard
        self.current, self.write_csv = current, write_csv
        self.records = load_records(workdir)
        self.tests = gradebook_tests(workdir / "template" / "gradebook.db")

    def start(self) -> None:
        """Mark the run unfinished and make the outputs whole (a killed run may have left its last
        record without its CSV line or gradebook entry)."""
        write_manifest(self.workdir, self.scope, self.shard, complete=False)
        ensure_structure(self.workdir / "gradebook.db", self.workdir / "template")
        self.publish(None)

    def record(self, student: str, rows: list[dict], seconds: float) -> None:
        """Make ``student``'s rows durable, then rewrite the CSV and their gradebook entries."""
        record = self.records.get(student) or {"student": student, "labs": {}}
        for row in rows:
            record["labs"][row["lab"]] = {
                "fingerprint": self.current[student][row["lab"]], "row": row,
                "points": points_per_test(row, self.tests.get(row["lab"], {})),
                # what grading this notebook cost (the worker measures it; else its share)
                "seconds": row.get("cost", {}).get("seconds", round(seconds / len(rows), 2)),
                "cpu_seconds": row.get("cost", {}).get("cpu_seconds"),
                # each test cell's share of it, and the worker's start (in its first lab's)
                "test_costs": row.get("cost", {}).get("tests", {}),
                **({"worker_start": row["cost"]["worker_start"]}
                   if "worker_start" in row.get("cost", {}) else {}),
                "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        save_record(self.workdir, record)
        self.records[student] = record
        self.publish({student})

    def publish(self, students: set[str] | None) -> None:
        """Bring the gradebook in line for ``students`` (None: everyone), then rewrite the CSV
        with the scores an instructor entered there by hand."""
        db = self.workdir / "gradebook.db"
        sync_gradebook(db, scope_points(self.records, self.scope), students)
        rows = with_manual_scores(scope_rows(self.records, self.scope, self.workdir), db)
        self.write_csv(rows, self.out)

    def finish(self, complete: bool) -> None:
        write_manifest(self.workdir, self.scope, self.shard, complete=complete)

    def missing(self) -> list[str]:
        """Students of the scope with a lab not recorded."""
        return [s for s, labs in self.scope.items()
                if set(labs) - set(self.records.get(s, {}).get("labs", {}))]
