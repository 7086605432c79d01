"""Grading at scale: a run killed at a random point resumes without grading anyone twice, the
outputs (scores.csv, the combined nbgrader gradebook) stay complete and agree, and sharded runs
(the Slurm array of grader/slurm/, run here as local processes) merge into what one run gives.

Grading is the expensive part (about 8 s per Lab 1 notebook on 2 cores, more under load), so the
samples are Lab 1's solution, untouched and partial notebooks, graded one at a time: the resumed
run is the baseline the merged shards are compared with, and the regrade test reuses its work
directory.
"""
from __future__ import annotations

import contextlib
import csv
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import submissions  # tests/submissions: the sample submissions, made by code
from distlab.grading import files, gradebook, grade, intake, records, selection, similarity
from distlab.grading.merge import MergeError, merge

REPO = Path(__file__).resolve().parents[1]
LAB1 = "01_collectives"
STUDENTS = ("partial", "solution", "untouched")
SHARDED = ("untouched", "partial")  # in shards 0/2 and 1/2: sha256 of the names
LIMITS = ["--backend", "gloo", "--rank-timeout", "10", "--timeout", "120",
          "--notebook-timeout", "300", "--lab", LAB1]
# Copying a work directory: the students' course folders (sockets, autograded notebooks) are
# scratch; what a run keeps is outside them.
NOT_RESULTS = shutil.ignore_patterns("students")


def _grade_command(subs: Path, work: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "distlab.cli", "grade", str(subs), "--workdir", str(work),
            "--out", str(work / "scores.csv"), "--jobs", "1", *LIMITS, *extra]


def _scores(path: Path) -> dict[tuple[str, str], dict]:
    """{(student, lab): score, max_score and test statuses} of a scores CSV (no paths, no flags)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len({(r["student"], r["lab"]) for r in rows}), "a student/lab twice"
    return {(r["student"], r["lab"]): {k: v for k, v in r.items() if k not in ("flags", "feedback")}
            for r in rows}


def _gradebook(work: Path) -> dict[tuple[str, str], dict]:
    """{(student, lab): score and per-test statuses} as nbgrader's gradebook.db holds them."""
    from nbgrader.api import Gradebook
    out = {}
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", gradebook.COURSE) as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                grades = [g for nb in sub.notebooks for g in nb.grades if g.cell_type == "code"]
                out[(sub.student.id, assignment.name)] = {
                    "score": sub.score, "max_score": sub.max_score,
                    "tests": {g.name: g.score == g.max_score for g in grades}}
    return out


def assert_gradebook_agrees(work: Path, csv_path: Path) -> None:
    scores, book = _scores(csv_path), _gradebook(work)
    assert set(book) == set(scores), "gradebook.db and scores.csv list different students/labs"
    for key, row in scores.items():
        assert book[key]["score"] == float(row["score"]), key
        assert book[key]["max_score"] == float(row["max_score"]), key
        assert book[key]["tests"] == {t: row[t] == "pass" for t in book[key]["tests"]}, key


def _recorded(work: Path) -> dict[str, int]:
    """{student: mtime_ns} of the records in ``work/results``."""
    return {p.stem: p.stat().st_mtime_ns for p in (work / "results").glob("*.json")}


def _sigkill_everything(pid: int) -> None:
    """SIGKILL the grader and every process it started, as a power cut would. Each process is
    stopped before its children are listed, so none can start another in between (the workers
    run in sessions of their own: a process-group kill would miss them)."""
    frozen, todo = [], [psutil.Process(pid)]
    while todo:
        proc = todo.pop()
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.suspend()
            frozen.append(proc)
            todo += proc.children()
    for proc in frozen:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(frozen, timeout=10)


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    subs = tmp_path_factory.mktemp("resume") / "submitted"
    notebooks = {"partial": submissions.special_samples()[("partial", LAB1)][0],
                 "solution": submissions.solved(LAB1), "untouched": submissions.student(LAB1)}
    for student in STUDENTS:
        submissions.write(notebooks[student], subs, student, LAB1)
    return subs


@pytest.fixture(scope="module")
def resumed(samples):
    """Grade, SIGKILL everything at a random moment after the first or second record (of three),
    grade again; the folders and what each run printed."""
    work = samples.parent / "work"
    wait_for = random.choice([1, 2])
    with open(samples.parent / "killed.log", "w") as log:
        started = time.monotonic()
        first = subprocess.Popen(_grade_command(samples, work), stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        deadline = started + 400
        while len(_recorded(work)) < wait_for and first.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert first.poll() is None, f"the first run ended before it could be killed: " \
                                     f"{(samples.parent / 'killed.log').read_text()[-3000:]}"
        # A random moment into the next student's grading, early enough that it cannot have
        # ended: a quarter of the time a student took so far at most (a fixed delay would pass
        # the end of the last student's grading once grading gets fast).
        delay = random.uniform(0, min(4.0, (time.monotonic() - started) / wait_for / 4))
        time.sleep(delay)
        _sigkill_everything(first.pid)
        first.wait()
    before = _recorded(work)
    contents = {s: (work / "results" / f"{s}.json").read_text() for s in before}
    killed_csv = _scores(work / "scores.csv") if (work / "scores.csv").exists() else {}
    second = subprocess.run(_grade_command(samples, work), capture_output=True, text=True,
                            timeout=900)
    return {"work": work, "before": before, "contents": contents, "killed_csv": killed_csv,
            "second": second, "when": f"{delay:.1f} s after record {wait_for}"}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_killed_run_resumes_without_grading_anyone_twice(resumed):
    work, before, second = resumed["work"], resumed["before"], resumed["second"]
    context = f"killed {resumed['when']}; second run:\n" \
              f"{second.stdout[-3000:]}\n{second.stderr[-3000:]}"
    assert 1 <= len(before) < len(STUDENTS), context
    # The CSV a kill leaves behind lists only recorded students, each once.
    assert {s for s, _ in resumed["killed_csv"]} <= set(before), context
    assert second.returncode == 0, context
    skipped = set(re.findall(r"^\s+(\S+)\s+skipped: graded before", second.stdout, re.M))
    assert skipped == set(before), context
    after = _recorded(work)
    assert set(after) == set(STUDENTS), context
    for student in before:  # not graded again: the record was not even rewritten
        assert after[student] == before[student], student
        assert (work / "results" / f"{student}.json").read_text() == resumed["contents"][student]
    assert records.read_manifest(work)["complete"] is True


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resumed_outputs_are_complete_and_agree(resumed):
    work = resumed["work"]
    scores = _scores(work / "scores.csv")
    assert set(scores) == {(s, LAB1) for s in STUDENTS}
    assert_gradebook_agrees(work, work / "scores.csv")
    for student in STUDENTS:
        assert (work / "feedback" / student / LAB1 / f"{LAB1}.html").is_file()


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_slurm_shards_merge_into_what_one_run_gives(resumed, samples, tmp_path_factory):
    """grader/slurm's array script as two local processes (one per task, one student each: sha256
    puts untouched in shard 0/2 and partial in 1/2), then its merge script."""
    tmp_path = tmp_path_factory.mktemp("sh")  # short: sockets under the work directory
    subs, shards, merged = tmp_path / "submitted", tmp_path / "shards", tmp_path / "merged"
    for student in SHARDED:
        shutil.copytree(samples / student, subs / student)
    env = dict(os.environ, SUBMISSIONS=str(subs), SHARDS=str(shards), REPO=str(REPO),
               PYTHON=sys.executable, JOBS="1", GRADE_ARGS=" ".join(LIMITS),
               SLURM_ARRAY_TASK_COUNT="2", MERGED=str(merged), OUT=str(merged / "scores.csv"))
    tasks = [subprocess.Popen(["bash", str(REPO / "grader/slurm/grade.sbatch")],
                              env=dict(env, SLURM_ARRAY_TASK_ID=str(k)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for k in range(2)]
    outputs = [task.communicate(timeout=900)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    # A shard makes no similarity report (each would compare the whole class again) and says
    # which command makes the one report after the merge.
    assert not any((shards / f"shard-{k}" / "similarity.csv").exists() for k in range(2))
    assert all(f"python -m distlab.grading.similarity {subs}" in o for o in outputs), outputs
    done = subprocess.run(["bash", str(REPO / "grader/slurm/merge.sbatch")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [set(_recorded(shards / f"shard-{k}")) for k in range(2)] == [{s} for s in SHARDED]
    single = _scores(resumed["work"] / "scores.csv")
    assert _scores(merged / "scores.csv") == {(s, LAB1): single[(s, LAB1)] for s in SHARDED}
    assert_gradebook_agrees(merged, merged / "scores.csv")
    for student in SHARDED:
        assert (merged / "feedback" / student / LAB1 / f"{LAB1}.html").is_file()
    # The report after the merge, as the shards said: what one run over these students reports.
    assert similarity.main([str(subs), "--workdir", str(merged)]) == 0
    report = _similarity_rows(merged)
    assert report == [r for r in _similarity_rows(resumed["work"])
                      if r["student"] in SHARDED and r["other"] not in set(STUDENTS) - set(SHARDED)]
    assert any(r["student"] == "partial" for r in report), report   # its answers are the course's
    _merge_refuses_what_does_not_fit(shards, tmp_path)


def _similarity_rows(work: Path) -> list[dict]:
    with open(work / "similarity.csv", newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: tuple(r.values()))


def _merge_refuses_what_does_not_fit(shards: Path, tmp_path: Path) -> None:
    one, two = shards / "shard-0", shards / "shard-1"
    with pytest.raises(MergeError, match=r"shard\(s\) 1/2 missing"):
        merge([one], tmp_path / "m1", tmp_path / "m1.csv")
    with pytest.raises(MergeError, match="given twice"):
        merge([one, one, two], tmp_path / "m2", tmp_path / "m2.csv")
    shutil.copytree(one, tmp_path / "again", ignore=NOT_RESULTS)
    with pytest.raises(MergeError, match="shard 0/2 is given twice"):
        merge([one, tmp_path / "again", two], tmp_path / "m2", tmp_path / "m2.csv")
    # An unfinished shard (killed, or a student failed) is named, with what to do.
    stopped = tmp_path / "stopped"
    shutil.copytree(two, stopped, ignore=NOT_RESULTS)
    manifest = records.read_manifest(stopped)
    records.write_manifest(stopped, manifest["students"], manifest["shard"], complete=False)
    with pytest.raises(MergeError, match="incomplete.*again"):
        merge([one, stopped], tmp_path / "m3", tmp_path / "m3.csv")
    # The same student graded differently in two work directories.
    other = tmp_path / "other"
    shutil.copytree(two, other, ignore=NOT_RESULTS)
    record = records.load_records(other)["partial"]
    record["labs"][LAB1]["row"]["score"] += 1
    records.save_record(other, record)
    records.write_manifest(other, manifest["students"], None, complete=True)
    with pytest.raises(MergeError, match="partial was graded in .* different results"):
        merge([one, two, other], tmp_path / "m4", tmp_path / "m4.csv")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_regrade_then_sigterm_keeps_what_was_recorded(resumed, samples, tmp_path_factory):
    """``--regrade untouched`` grades only untouched; SIGTERM (``kill``, Slurm's time limit) in the
    middle ends the run and its workers and keeps every record; the next run has nothing to do."""
    work = tmp_path_factory.mktemp("rg") / "work"
    shutil.copytree(resumed["work"], work, ignore=NOT_RESULTS)
    before = _recorded(work)
    run = subprocess.Popen(_grade_command(samples, work, "--regrade", "untouched"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (work / "students" / "untouched").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # into the notebook: kernel and ranks running
    started = psutil.Process(run.pid).children(recursive=True)
    assert started, "no worker was running"
    run.send_signal(signal.SIGTERM)
    output = run.communicate(timeout=60)[0]
    assert run.returncode == 130, output
    assert set(re.findall(r"^\s+(\S+)\s+skipped: graded before", output, re.M)) == \
        {"partial", "solution"}, output
    assert "interrupted" in output and "again" in output
    alive = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    assert _recorded(work) == before and records.read_manifest(work)["complete"] is False
    assert _scores(work / "scores.csv") == _scores(resumed["work"] / "scores.csv")
    assert_gradebook_agrees(work, work / "scores.csv")
    again = subprocess.run(_grade_command(samples, work), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and "0 notebooks of 0 students" in again.stdout, again.stdout
    assert _recorded(work) == before and records.read_manifest(work)["complete"] is True


# ---------------------------------------------------------------------------------------------
# The pieces, without grading

def test_shard_argument():
    assert selection.shard_arg("0/4") == (0, 4)
    for bad, says in (("3/2", "K must be in 0..N-1"), ("0/0", "N at least 1"),
                      ("1", "expected K/N"), ("a/b", "expected K/N")):
        with pytest.raises(Exception, match=re.escape(says)):
            selection.shard_arg(bad)


def test_shards_split_students_once_each():
    found = {f"s{i:03d}": [LAB1] for i in range(200)}
    parts = [selection.in_shard(found, (k, 4)) for k in range(4)]
    assert sorted(s for p in parts for s in p) == sorted(found)
    assert all(20 < len(p) < 80 for p in parts)  # sha256 spreads them


def test_plan_skips_what_is_recorded_and_unchanged():
    current = {"ann": {"a": "1", "b": "2"}, "ben": {"a": "3"}, "cat": {"a": "4"}}
    records = {"ann": {"labs": {"a": {"fingerprint": "1"}, "b": {"fingerprint": "old"}}},
               "ben": {"labs": {"a": {"fingerprint": "3"}}}}
    assert selection.plan(current, records, None) == ({"ann": ["b"], "cat": ["a"]}, ["ben"])
    assert selection.plan(current, records, ["ben"]) == \
        ({"ann": ["b"], "ben": ["a"], "cat": ["a"]}, [])
    everyone = {s: list(v) for s, v in current.items()}
    assert selection.plan(current, records, [selection.ALL])[0] == everyone


def test_fingerprint_follows_submission_tests_and_settings(tmp_path):
    template, subs = tmp_path / "template", tmp_path / "subs"
    (template / "source" / LAB1).mkdir(parents=True)
    (template / "source" / LAB1 / f"{LAB1}.ipynb").write_text("tests v1")
    (subs / "ann" / LAB1).mkdir(parents=True)
    (subs / "ann" / LAB1 / f"{LAB1}.ipynb").write_text("answer")

    def fp(settings=None):
        return selection.lab_fingerprints(subs, {"ann": [LAB1]}, template, settings or {})["ann"][LAB1]

    first = fp()
    assert fp() == first
    (subs / "ann" / LAB1 / "notes.txt").write_text("extra file")
    assert fp() != first
    second = fp()
    (template / "source" / LAB1 / f"{LAB1}.ipynb").write_text("tests v2")
    assert fp() != second
    assert fp({"timeout": "60"}) != fp({"timeout": "300"})


def test_regrade_option():
    assert grade.parse_args(["subs", "--regrade"]).regrade == [selection.ALL]
    named = grade.parse_args(["subs", "--regrade", "ann", "--regrade", "ben"])
    assert named.regrade == ["ann", "ben"]
    assert grade.parse_args(["subs"]).regrade is None


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "x" / "scores.csv"
    files.atomic_write(target, "a\n")
    files.atomic_write(target, "b\n")
    assert target.read_text() == "b\n"
    assert [p.name for p in target.parent.iterdir()] == ["scores.csv"]


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # nbgrader's add_submission
def test_gradebook_follows_the_records(tmp_path):
    template = intake.prepare_template(tmp_path, [LAB1])
    db = tmp_path / "gradebook.db"
    gradebook.ensure_structure(db, template)
    tests = gradebook.gradebook_tests(db)[LAB1]
    full, none = dict(tests), dict.fromkeys(tests, 0.0)
    gradebook.sync_gradebook(db, {("ann", LAB1): full, ("ben", LAB1): none})
    # A kill between nbgrader's commits leaves a submission without scores: the next sync redoes it.
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}", gradebook.COURSE) as gb:
        gb.add_student("cat")
        gb.add_submission(LAB1, "cat")
    gradebook.sync_gradebook(db, {("ann", LAB1): full, ("cat", LAB1): none}, {"cat"})
    with Gradebook(f"sqlite:///{db}", gradebook.COURSE) as gb:
        assert {s.id for s in gb.students} == {"ann", "ben", "cat"}  # only cat was synced
        assert gb.find_submission(LAB1, "cat").score == 0
        assert gb.find_submission(LAB1, "ann").score == sum(full.values())
    gradebook.sync_gradebook(db, {("ann", LAB1): none})
    with Gradebook(f"sqlite:///{db}", gradebook.COURSE) as gb:
        assert [s.id for s in gb.students] == ["ann"] and gb.find_submission(LAB1, "ann").score == 0
        # The lab's tests changed (here: their points in this gradebook): the lab is made anew.
        cell = gb.find_grade_cell(next(iter(tests)), LAB1, LAB1)
        cell.max_score += 1
        gb.db.commit()
    gradebook.ensure_structure(db, template)
    assert gradebook.gradebook_tests(db)[LAB1] == tests
    with Gradebook(f"sqlite:///{db}", gradebook.COURSE) as gb:
        assert gb.assignment_submissions(LAB1) == []  # its students are graded again anyway


MANUAL_CELL = '''

# %% [markdown] nbgrader={"grade": true, "grade_id": "explain_busbw", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# Why does busbw, not algbw, compare all-reduce with the hardware's link bandwidth?
#
# ### BEGIN SOLUTION
# Because busbw counts the bytes every link carries, 2(n-1)/n of the message for a ring.
# ### END SOLUTION
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_manual_scores_survive_every_later_grading_run(tmp_path, monkeypatch):
    """A manually graded answer cell: the score an instructor enters in the gradebook (as the
    formgrader does, through nbgrader's API) survives a run that grades nothing, a regrade of
    the same student, and a regrade whose autograded scores change; scores.csv shows it."""
    from nbgrader.api import Gradebook
    course = tmp_path / "course"
    (course / "solutions" / LAB1).mkdir(parents=True)
    source = REPO / "solutions" / LAB1 / f"{LAB1}.py"
    (course / "solutions" / LAB1 / source.name).write_text(source.read_text() + MANUAL_CELL)
    for name in ("data", "grader", "notebooks"):
        (course / name).symlink_to(REPO / name)
    monkeypatch.setenv("DISTLAB_COURSE", str(course))
    template = intake.prepare_template(tmp_path / "release", [LAB1])
    released = template / "release" / LAB1 / f"{LAB1}.ipynb"
    import nbformat
    student = nbformat.read(released, as_version=4)
    assert "explain_busbw" in {c.metadata.get("nbgrader", {}).get("grade_id") for c in student.cells}
    subs, work, out = tmp_path / "submitted", tmp_path / "work", tmp_path / "scores.csv"
    submissions.write(student, subs, "ann", LAB1)

    def grade_again(*extra: str) -> dict:
        args = [str(subs), "--workdir", str(work), "--out", str(out), *LIMITS, *extra]
        assert grade.main(args) == 0
        return _scores(out)[("ann", LAB1)]

    first = grade_again()
    assert first["explain_busbw"] == "ungraded" and float(first["score"]) == 0
    top = float(first["max_score"])
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", gradebook.COURSE) as gb:
        gb.find_grade("explain_busbw", LAB1, LAB1, "ann").manual_score = 1.5
        gb.db.commit()

    def manual_in_gradebook() -> float | None:
        with Gradebook(f"sqlite:///{work / 'gradebook.db'}", gradebook.COURSE) as gb:
            return gb.find_grade("explain_busbw", LAB1, LAB1, "ann").manual_score

    unchanged = grade_again()                    # nothing to grade: outputs rebuilt
    regraded = grade_again("--regrade", "ann")   # the same student graded again
    for row in (unchanged, regraded):
        assert row["explain_busbw"] == "manual 1.5/2" and float(row["score"]) == 1.5
        assert float(row["max_score"]) == top
    assert manual_in_gradebook() == 1.5
    # A new submission scores differently: its autograded entries are redone, the manual stays.
    submissions.write(submissions.replace_cell(student, "bandwidths", _solution_of("bandwidths")),
                      subs, "ann", LAB1)
    changed = grade_again()
    assert changed["test_bandwidths"] == "pass" and changed["explain_busbw"] == "manual 1.5/2"
    assert float(changed["score"]) == 2 + 1.5
    assert manual_in_gradebook() == 1.5


def _solution_of(grade_id: str) -> str:
    cell = next(c for c in submissions.solved(LAB1).cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return cell.source


def test_a_template_is_made_once_for_what_it_is_made_from(tmp_path, monkeypatch):
    from distlab.grading import course_dir, intake
    made = []

    def generate(labs, root):
        made.append(list(labs))
        (root / "gradebook.db").write_text(f"made {len(made)}")
    monkeypatch.setattr(course_dir, "generate", generate)
    monkeypatch.setattr(intake.paths, "build", lambda: tmp_path / "build")
    keys = iter(["k1", "k1", "k1", "k2"])
    monkeypatch.setattr(intake, "template_key", lambda labs: next(keys))
    first = intake.prepare_template(tmp_path / "one", ["01_collectives"])     # made
    other = intake.prepare_template(tmp_path / "two", ["01_collectives"])     # copied
    again = intake.prepare_template(tmp_path / "two", ["01_collectives"])     # the workdir's own
    assert made == [["01_collectives"]]
    assert (first / "gradebook.db").read_text() == (other / "gradebook.db").read_text() == "made 1"
    assert again == other
    changed = intake.prepare_template(tmp_path / "two", ["01_collectives"])   # its labs changed
    assert len(made) == 2 and (changed / "gradebook.db").read_text() == "made 2"


def test_the_template_key_follows_the_lab_s_source_folder(tmp_path, monkeypatch):
    from distlab.grading import intake
    source = tmp_path / "01_collectives" / "01_collectives.py"
    source.parent.mkdir()
    source.write_text("# %% a cell\n")
    monkeypatch.setattr(intake.paths, "lab_source", lambda lab: source)
    keys = [intake.template_key(["01_collectives"])]
    source.write_text("# %% a cell, edited\n")
    keys.append(intake.template_key(["01_collectives"]))
    (source.parent / "figure.png").write_bytes(b"companion")
    keys.append(intake.template_key(["01_collectives"]))
    keys.append(intake.template_key(["01_collectives"]))
    assert len(set(keys[:3])) == 3 and keys[3] == keys[2]
