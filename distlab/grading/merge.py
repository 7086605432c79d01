"""Join the work directories of sharded grading runs: ``distlab merge SHARD_WORKDIR... [--workdir
grading] [--out scores.csv]``.

Each shard (``distlab grade SUBMISSIONS --shard K/N --workdir W_K``, e.g. one Slurm array task,
see grader/slurm/) records its students in ``W_K/results`` and its scope in ``W_K/run.json``. The
merge checks that every shard 0..N-1 is there and finished, and that a student graded by two
work directories got the same scores there; then it writes one work directory as a single run
would have: ``results/``, ``feedback/<student>/<lab>/<lab>.html``, ``gradebook.db`` (nbgrader) and
the scores CSV. That directory can serve as ``--workdir`` of a later ``distlab grade``, which then
grades only what changed.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from distlab.grading import records as results
from distlab.grading.files import Busy, atomic_copy, locked
from distlab.grading.folders import FolderInUse, mark
from distlab.grading.gradebook import ensure_structure, gradebook_tests, sync_gradebook


class MergeError(RuntimeError):
    """The shards cannot be merged as given; the message says what to do."""


def read_shards(dirs: list[Path]) -> dict[Path, dict]:
    """{work directory: its run.json}, checked to be finished runs that cut the students one way."""
    manifests = {}
    for d in dirs:
        if d in manifests:
            raise MergeError(f"{d} is given twice: pass each shard's work directory once.")
        manifest = results.read_manifest(d)
        if manifest is None:
            raise MergeError(f"{d} is not the work directory of a `distlab grade` run (no "
                             f"{results.MANIFEST}); pass each shard's --workdir.")
        if not manifest["complete"]:
            raise MergeError(f"{d} ({_name(manifest)}) is incomplete: its run was stopped or some "
                             f"students failed. Run its `distlab grade` command again (it resumes "
                             f"where it stopped), then merge.")
        manifests[d] = manifest
    _check_cuts([m["shard"] for m in manifests.values() if m["shard"]])
    _check_same_tests(dirs)
    return manifests


def _check_same_tests(dirs: list[Path]) -> None:
    """The shards graded the same tests (one checkout of the course)."""
    first = gradebook_tests(dirs[0] / "template" / "gradebook.db")
    for d in dirs[1:]:
        other = gradebook_tests(d / "template" / "gradebook.db")
        for lab in sorted(set(first) & set(other)):
            if first[lab] != other[lab]:
                raise MergeError(f"{dirs[0]} and {d} graded different versions of {lab}'s tests "
                                 f"({first[lab]} vs {other[lab]}): grade every shard from the "
                                 f"same checkout of the course.")


def _name(manifest: dict) -> str:
    return "shard {}/{}".format(*manifest["shard"]) if manifest["shard"] else "an unsharded run"


def _check_cuts(shards: list[list[int]]) -> None:
    """Every shard K/N of one N exactly once."""
    counts = {n for _, n in shards}
    if len(counts) > 1:
        raise MergeError(f"the shards were cut {' and '.join(f'N={n}' for n in sorted(counts))}: "
                         f"merge the shards of one cut (all --shard K/N with the same N).")
    if not shards:
        return
    n = shards[0][1]
    twice = sorted(k for k, c in Counter(k for k, _ in shards).items() if c > 1)
    missing = sorted(set(range(n)) - {k for k, _ in shards})
    if twice:
        raise MergeError(f"shard {twice[0]}/{n} is given twice: pass each shard's work "
                         f"directory once.")
    if missing:
        raise MergeError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: pass every "
                         f"shard's work directory (or grade the missing ones first).")


def _verdict(entry: dict) -> tuple:
    """What two gradings of one lab must agree on (not messages: hidden tests draw fresh seeds)."""
    row = entry["row"]
    return row["score"], row["max_score"], row["tests"], entry["points"]


def collect(manifests: dict[Path, dict]) -> tuple[dict[str, dict], dict[tuple[str, str], Path]]:
    """({student: record restricted to their scope}, {(student, lab): work directory it came
    from})."""
    merged, origin = {}, {}
    for d, manifest in manifests.items():
        records = results.load_records(d)
        for student, labs in manifest["students"].items():
            entries = records.get(student, {}).get("labs", {})
            if set(labs) - set(entries):
                raise MergeError(f"{d} ({_name(manifest)}) is incomplete: {student} has no results "
                                 f"for {', '.join(sorted(set(labs) - set(entries)))}. Run its "
                                 f"`distlab grade` command again, then merge.")
            record = merged.setdefault(student, {"student": student, "labs": {}})
            for lab in labs:
                if lab in record["labs"]:
                    _check_same(student, lab, record["labs"][lab], entries[lab],
                                origin[(student, lab)], d)
                else:
                    record["labs"][lab], origin[(student, lab)] = entries[lab], d
    return merged, origin


def _check_same(student: str, lab: str, mine: dict, theirs: dict, a: Path, b: Path) -> None:
    if _verdict(mine) != _verdict(theirs):
        raise MergeError(f"{student} was graded in {a} and in {b} with different results for "
                         f"{lab} ({_differences(mine['row'], theirs['row'])}). Keep one: drop "
                         f"that work directory from the merge or grade {student} again there "
                         f"with --regrade {student}.")


def _differences(x: dict, y: dict) -> str:
    tests = {**x["tests"], **y["tests"]}
    return "; ".join([f"{x['score']:g} vs {y['score']:g} points"] +
                     [f"{t} {x['tests'].get(t)} vs {y['tests'].get(t)}" for t in tests
                      if x["tests"].get(t) != y["tests"].get(t)])


def write_merged(dest: Path, manifests: dict[Path, dict], merged: dict[str, dict],
                 origin: dict[tuple[str, str], Path], out: Path) -> None:
    """``dest`` as one run over all shards would have left it."""
    from distlab.grading.scoring import write_scores
    for student, record in merged.items():
        for lab, entry in record["labs"].items():
            if entry["row"]["feedback"]:
                rel = entry["row"]["feedback"]
                atomic_copy(origin[(student, lab)] / rel, dest / rel)
        results.save_record(dest, record)
    for d in manifests:  # every shard's template has every lab (made from all students' labs)
        ensure_structure(dest / "gradebook.db", d / "template")
    scope = {s: list(record["labs"]) for s, record in merged.items()}
    sync_gradebook(dest / "gradebook.db", results.scope_points(merged, scope))
    # With the scores an instructor entered in the merged gradebook (manually graded answers).
    write_scores(results.with_manual_scores(results.scope_rows(merged, scope, dest),
                                            dest / "gradebook.db"), out)
    results.write_manifest(dest, scope, None, complete=True,
                           merged_from=[str(d) for d in manifests])


def merge(dirs: list[Path], dest: Path, out: Path) -> dict[str, dict]:
    dirs = [d.resolve() for d in dirs]
    if dest.resolve() in dirs:
        raise MergeError(f"--workdir {dest} is one of the shards: merge into a folder of its own.")
    results.claim_workdir(dest.resolve())   # a grading work directory, or a new folder
    manifests = read_shards(dirs)
    merged, origin = collect(manifests)
    with locked(dest.resolve()):
        mark(dest.resolve(), "grade")
        write_merged(dest.resolve(), manifests, merged, origin, out)
    return merged


def _parse_args(argv):
    p = argparse.ArgumentParser(
        prog="distlab merge",
        description="Merge the work directories of `distlab grade --shard K/N` runs into one "
                    "scores CSV, nbgrader gradebook and feedback folder.")
    p.add_argument("shards", type=Path, nargs="+", metavar="SHARD_WORKDIR")
    p.add_argument("--workdir", type=Path, default=Path("grading"),
                   help="where the merged results, feedback and gradebook.db go "
                        "(default ./grading): a new or empty folder or a grading work "
                        "directory; any other folder is refused")
    p.add_argument("--out", type=Path, default=Path("scores.csv"),
                   help="merged scores CSV (default ./scores.csv)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        merged = merge(args.shards, args.workdir, args.out)
    except (MergeError, Busy, FolderInUse) as exc:
        print(f"distlab merge: {exc}", file=sys.stderr)
        return 1
    notebooks = sum(len(r["labs"]) for r in merged.values())
    print(f"merged {len(args.shards)} work directories: {len(merged)} students, {notebooks} "
          f"notebooks -> {args.out}, {args.workdir / 'gradebook.db'}, {args.workdir / 'feedback'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
