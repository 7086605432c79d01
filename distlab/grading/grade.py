"""Autograde a folder of submissions: ``distlab grade SUBMISSIONS_DIR``.

SUBMISSIONS_DIR is laid out as nbgrader's ``submitted`` folder: ``<student>/<lab>/<lab>.ipynb``
(any subset of labs per student). For each student, in a course directory of their own under the
work directory (default ``./grading``), the grader

1. copies the course's gradebook template (``nbgrader generate_assignment`` of every lab, made once
   per run from ``solutions/``) and the student's submission;
2. notes locked cells the student edited or deleted (nbgrader restores them before grading; the
   scores CSV names them in its ``flags`` column);
3. runs ``nbgrader autograde`` in a worker process with a per-cell time limit (``--timeout``) and a
   per-notebook budget (``--notebook-timeout``: later cells get only what is left), and kills the
   worker and everything it started if even that fails (``--notebook-timeout`` + a margin);
4. scores each test cell from the judge's record (below), not from what the kernel showed;
5. runs ``nbgrader generate_feedback``: the HTML shows each test's result and message but not the
   code of hidden tests, nor tracebacks into them.

Students are graded ``--jobs`` at a time. The scores go to ``scores.csv`` (``--out``): ``student,
lab, score, max_score``, one column per test with its status (pass, fail, error, hang, crash,
timeout, not-done, not-run, tampered, missing), then ``flags`` and the feedback file.
Each student's rows are recorded in the work directory the moment they are graded, and the CSV and
the combined nbgrader gradebook (``<workdir>/gradebook.db``) are rebuilt from the records, so a
killed run leaves complete outputs and the next run grades only what is not recorded or changed
(``--regrade`` to grade again); ``--shard K/N`` and ``distlab merge`` split a course across
machines (``distlab.grading.records``, ``distlab.grading.merge``, grader/slurm/).

A student's code is not trusted (the threat model, each part tested in tests/test_grader_attacks.py):

- Checks run in the judge (``distlab.grading.judge``), in the worker process, never in the kernel: the
  kernel only sends the student's objects. The judge draws hidden tests' seeds itself, runs the
  student's code on ranks of its own zygote and reads what they return without unpickling code.
  A test cell passes only if the judge passed every check the cell calls; one whose checks never
  arrived scores zero as ``tampered``. A kernel reaches its own judge only, through one end of a
  socketpair handed to it as it starts: there is no path or name another student's process
  could connect to (tests/test_judge.py grades a classmate trying, side by side).
- The kernel and the judge's ranks are confined with Landlock (``distlab.runtime.landlock``): they
  may write only the lab's own folder and a scratch folder, read only those, their lab's student
  package, the Python installation and what the system needs (``GradingSettings.system_reads``),
  and cannot signal or trace the grader.
  The worker reads the result rows back on a pipe that no kernel holds.
- Limits: ``--memory-limit`` on the sum of the student's processes (the largest is killed);
  ``--disk-limit`` on their folders (``distlab.grading.disk``: the processes are stopped, no file
  grows past it, and the feedback copies a lab folder's files up to ``feedback_files`` MB);
  output per cell (``distlab.grading.execution``: the rest is dropped and the cell interrupted); the
  worker's own log is kept to its tail. A kernel that dies (``os._exit``, a segfault, the memory
  limit) ends that notebook: its later tests score zero as ``not-run``, the run goes on.
- The worker is a child subreaper: whatever the student's code starts is reparented to it and
  killed after each lab, and the worker's whole tree is killed when the student is done.

Checks in test cells read two settings from the environment, which this command sets for the
kernels it starts: ``DISTLAB_BACKEND`` (``--backend``: gloo, nccl, auto, or both = gloo and, where
there are enough GPUs, NCCL too, each compared with the same references) and
``DISTLAB_RANK_TIMEOUT`` (``--rank-timeout``: the ``distlab.run`` timeout after which hung ranks are
killed and the test fails with the launcher's diagnosis). ``DISTLAB_STUCK_AFTER``, set to the same,
stops ranks that are stuck (no progress) that soon in every run of the notebook, also where a lab
helper asks for a longer timeout; ranks that progress still get the helper's whole timeout.

Two nbgrader rules are softened for distributed code: rank output and library warnings go to
stderr, and nbgrader scores a test cell zero when it wrote to stderr, so stderr is turned into
stdout before scoring (a check fails by raising, never by printing).

Where each part lives: this module is the command (arguments, then ``orchestrate.grade_run``);
``settings`` the run's settings (one frozen object); ``intake`` finding submissions and the
template; ``orchestrate`` the jobs, shards and resume; ``worker`` the nbgrader process per
student; ``scoring`` a test cell's status and points, feedback and scores.csv (``statuses`` the
one outcome-to-status mapping); ``records``, ``files``, ``selection``, ``gradebook`` what survives
a kill; ``progress`` what a long run shows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from distlab import paths
from distlab.grading import selection, similarity
from distlab.grading.files import Busy, locked
from distlab.grading.folders import FolderInUse, mark
from distlab.grading.records import claim_workdir
from distlab.grading.intake import discover
from distlab.grading.orchestrate import grade_run
from distlab.grading.settings import DEFAULT_DISK_MB, DEFAULT_MEMORY_GB, GradingSettings


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="distlab grade",
        description="Autograde SUBMISSIONS_DIR/<student>/<lab>/<lab>.ipynb with nbgrader, on real "
                    "torch.distributed ranks; write scores and per-student feedback.")
    p.add_argument("submissions", type=Path, metavar="SUBMISSIONS_DIR")
    p.add_argument("--out", type=Path,
                   help="scores CSV (default ./scores.csv; with --shard, inside its --workdir)")
    p.add_argument("--jobs", type=_at_least_one, default=1, help="students graded at once (default 1)")
    p.add_argument("--backend", choices=["gloo", "nccl", "auto", "both"], default="auto",
                   help="backend of the checks' ranks; both = gloo and NCCL where GPUs allow")
    p.add_argument("--timeout", type=float, default=300, help="seconds per cell (default 300)")
    p.add_argument("--notebook-timeout", type=float, default=900,
                   help="seconds for all cells of one notebook (default 900)")
    p.add_argument("--memory-limit", type=float, default=DEFAULT_MEMORY_GB, metavar="GB",
                   help=f"memory of one student's processes before the largest is killed "
                        f"(default {DEFAULT_MEMORY_GB:g})")
    p.add_argument("--disk-limit", type=float, default=DEFAULT_DISK_MB, metavar="MB",
                   help=f"what one student's folders may hold while graded (and the largest "
                        f"file they may write) before their processes are stopped "
                        f"(default {DEFAULT_DISK_MB:g})")
    p.add_argument("--rank-timeout", type=float, default=60,
                   help="seconds before a check's ranks count as hung, and before ranks that make "
                        "no progress in any run of the notebook are stopped (default 60)")
    p.add_argument("--workdir", type=Path,
                   help="nbgrader course folders, results of each student, feedback, gradebook.db "
                        "(default ./grading; with --shard K/N, ./grading-shard-K-of-N); a run "
                        "resumes in a previous run's work directory and refuses any other folder "
                        "that is not empty")
    p.add_argument("--lab", action="append", dest="labs", help="grade only this lab (repeatable)")
    p.add_argument("--regrade", action="append", nargs="?", const=selection.ALL, metavar="STUDENT",
                   help="grade STUDENT again although the work directory has their results for "
                        "this submission (repeatable); without a name (put it after "
                        "SUBMISSIONS_DIR): everyone")
    p.add_argument("--shard", type=selection.shard_arg, metavar="K/N",
                   help="grade only the students with sha256(name) mod N == K (K from 0); "
                        "join the shards' work directories with `distlab merge`, then make the "
                        "similarity report once with `python -m distlab.grading.similarity` "
                        "(a shard makes none)")
    return p.parse_args(argv)


def _at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of students, 1 or more")
    return int(text)


def settings_of(args) -> GradingSettings:
    return GradingSettings(backend=args.backend, rank_timeout=args.rank_timeout,
                           timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                           memory_limit=args.memory_limit, disk_limit=args.disk_limit)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.submissions.is_dir():
        print(f"distlab grade: {args.submissions} is not a folder. Expected SUBMISSIONS_DIR/"
              f"<student>/<lab>/<lab>.ipynb.", file=sys.stderr)
        return 2
    if args.backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            print("distlab grade: --backend nccl needs GPUs and this machine has none; "
                  "use --backend gloo, auto or both.", file=sys.stderr)
            return 2
    course = paths.labs()
    selected = [lab for lab in course if not args.labs or lab in args.labs]
    found, warnings = discover(args.submissions, course, selected)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not found:
        print(f"distlab grade: no submissions in {args.submissions} (labs: {', '.join(selected)}).",
              file=sys.stderr)
        return 1
    unknown = sorted(set(args.regrade or ()) - {selection.ALL} - set(found))
    if unknown:
        print(f"distlab grade: --regrade {unknown[0]}: no submissions from {unknown[0]!r} in "
              f"{args.submissions} (a student is a folder name there; --regrade without a name "
              f"goes after SUBMISSIONS_DIR).", file=sys.stderr)
        return 2
    k, n = args.shard or (0, 1)
    default = Path(f"grading-shard-{k}-of-{n}" if args.shard else "grading")
    workdir = (args.workdir or default).resolve()
    out = args.out or (workdir / "scores.csv" if args.shard else Path("scores.csv"))
    try:
        claim_workdir(workdir)   # a user's folder is never written into, a run's is resumed
        with locked(workdir):
            mark(workdir, "grade")
            # The report is made while the last students are graded (a core is free then).
            making = None if args.shard else similarity.Making(args.submissions, found, workdir)
            status = grade_run(settings_of(args), args.submissions, found, workdir, out,
                               jobs=args.jobs, shard=args.shard, regrade=args.regrade,
                               tail=making and making.start)
            if args.shard:
                # A shard reads every student's answers, so its report would be the whole
                # class's, made again by each of the N tasks and merged by none: it is made once,
                # after the merge, by the command README.md gives.
                print(similarity.after_shard(args.submissions))
                return status
            # A report on the graded work that never changes a score: <workdir>/similarity.csv
            return similarity.after_grading(args.submissions, found, workdir, status, making)
    except (Busy, FolderInUse) as exc:
        print(f"distlab grade: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
