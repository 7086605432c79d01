"""The grader under attack: submissions that patch the checks, read references, kill their kernel,
hang, flood memory, output or the disk, leave processes behind, write outside their folder or
read other copies of the course (tests/submissions/attacks.py). The suite's one shared
``distlab grade --jobs 2`` run (tests/conftest.py's ``graded_samples``) grades them all beside
an honest ``bystander``, whose grade must not move, and beside the other tests' samples.
"""
from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

import pytest

from distlab.grading.settings import DEFAULT_DISK_MB, GradingSettings
from distlab.runtime import landlock
from submissions.attacks import LAB, MEMORY_LIMIT_GB, TESTS, attack_samples, orphans

SAMPLES = attack_samples()
SAMPLE_KINDS = ("attacks",)     # of the shared grading run's samples (tests/conftest.py)
needs_landlock = pytest.mark.skipif(landlock.landlock_abi() == 0,
                                    reason="this kernel has no Landlock: writes are not confined")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def attacked(graded_samples):
    """The attacks, graded in the suite's shared grading run (tests/conftest.py: one ``distlab
    grade --jobs 2`` run with ``--memory-limit`` MEMORY_LIMIT_GB, the bystander's notebook and
    Lab 1's references digested before it)."""
    rows = {student: graded_samples["rows"][(student, LAB)] for student in SAMPLES}
    return {"rows": rows, "before": graded_samples["before"], "out": graded_samples["out"],
            "work": graded_samples["work"]}


def _feedback(row) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", Path(row["feedback"]).read_text()))


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("student", list(SAMPLES))
def test_each_sample_gets_its_grade(attacked, student):
    row = attacked["rows"][student]
    expected = SAMPLES[student][1]
    assert {t: row[t] for t in TESTS} == expected, f"{student}: {row}"
    points = {"test_all_reduce_rs_ag": 2, "test_ring_all_reduce": 4, "test_bandwidths": 2,
              "test_alpha_beta": 2}
    assert float(row["score"]) == sum(points[t] for t, s in expected.items() if s == "pass")


@pytest.mark.slow
def test_bystander_keeps_full_marks(attacked):
    row = attacked["rows"]["bystander"]
    assert float(row["score"]) == float(row["max_score"]) == 10 and row["flags"] == ""


@pytest.mark.slow
def test_patched_checks_are_named_in_the_feedback(attacked):
    text = _feedback(attacked["rows"]["patched_checks"])
    assert "replaced or bypassed the checking functions" in text


@pytest.mark.slow
def test_hidden_test_with_its_own_seed_fails_a_submission_that_read_references(attacked):
    text = _feedback(attacked["rows"]["reads_references"])
    assert "on fresh inputs (seed" in text and "seed 4321" not in text


@pytest.mark.slow
def test_deleted_test_cell_is_flagged_and_named_in_the_feedback(attacked):
    row = attacked["rows"]["deleted_test"]
    assert "deleted locked cell test_ring_all_reduce" in row["flags"]
    assert "deleted locked cell test_ring_all_reduce" in _feedback(row)


@pytest.mark.slow
def test_dead_kernel_is_explained(attacked):
    assert "os._exit" in _feedback(attacked["rows"]["exits"])
    assert "SIGSEGV" in _feedback(attacked["rows"]["segfaults"])
    assert "SIGKILL" in _feedback(attacked["rows"]["kills_kernel"])


@pytest.mark.slow
def test_hangs_carry_the_launchers_diagnosis(attacked):
    assert "did not finish within 10 s" in _feedback(attacked["rows"]["sleeps"])
    assert "did not finish within 10 s" in _feedback(attacked["rows"]["endless_loop"])


@pytest.mark.slow
def test_memory_flood_is_stopped_at_the_limit(attacked):
    text = _feedback(attacked["rows"]["memory_flood"])
    assert f"memory limit of {MEMORY_LIMIT_GB:.1f} GiB" in text


@pytest.mark.slow
def test_output_flood_is_cut_and_feedback_stays_small(attacked):
    row = attacked["rows"]["output_flood"]
    assert Path(row["feedback"]).stat().st_size < 2_000_000
    text = _feedback(row)
    # Stopped by whichever limit comes first. The output limit can only cut what reaches the
    # grader: a loop that prints while holding the GIL starves the kernel's IOPub thread, so on a
    # busy machine its buffer can pass the memory limit before one message is sent. Either way the
    # cell is stopped, the feedback says why, and nothing it printed floods the feedback or the log.
    cut = "dropped the rest of this cell's output" in text
    if cut:
        assert "had not stopped" in text or "memory limit" in text
    else:
        assert "the kernel was stopped in alpha_beta" in text and "memory limit" in text, text[-3000:]
    log = attacked["work"] / "students" / "output_flood" / "grading.log"
    assert log.stat().st_size < 1_000_000


@pytest.mark.slow
def test_no_process_of_a_student_survives_grading(attacked):
    assert orphans() == []


@pytest.mark.slow
@needs_landlock
def test_writes_outside_the_folder_are_refused(attacked):
    for path, digest in attacked["before"].items():
        assert _digest(path) == digest, f"{path} was changed by a submission"
    assert "WRITTEN-BY-A-STUDENT" not in attacked["out"].read_text()
    text = _feedback(attacked["rows"]["writes_outside"])
    assert "refused: ['own gradebook', 'scores', 'another submission', 'references', " \
           "'grader folder', 'own gradebook (sql)']" in text
    assert "from ranks: ['refused', 'refused']" in text
    assert "unreadable: ['another submission', \"the grader's template\"]" in text


def test_the_course_s_own_solution_is_out_of_a_submission_s_reach(attacked):
    # Its lab source, the git history and the grader's source notebooks all hold the answers.
    assert "copied from: []" in _feedback(attacked["rows"]["copies_solution"])


@needs_landlock
def test_other_copies_of_the_course_are_out_of_a_submission_s_reach(attacked):
    # Reads are an allow-list: a copy of the course anywhere else on the machine, and the
    # instructor's checkout, are on no list; the ranks are confined as the kernel is.
    text = _feedback(attacked["rows"]["reads_course_copy"])
    assert "copied from other copies: []" in text
    assert "a second copy: PermissionError" in text
    assert "the instructor's checkout: PermissionError" in text
    assert "other copy from ranks: ['PermissionError', 'PermissionError']" in text


@pytest.mark.slow
def test_a_disk_flood_is_stopped_and_stays_out_of_the_feedback(attacked):
    row = attacked["rows"]["fills_disk"]
    text = _feedback(row)
    assert f"disk limit of {DEFAULT_DISK_MB:.0f} MB" in text, text[-3000:]
    assert "were stopped" in text
    assert "Files not copied into this feedback" in text and "filler" in text
    student = attacked["work"] / "students" / "fills_disk"
    written = sorted((student / "autograded" / "fills_disk" / LAB).glob("filler*.bin"))
    assert written, "the sample wrote nothing: it tests nothing"
    # The feedback copies the lab folder's files up to its limit in all: the 50 MB fillers stay
    # out; the one the flood was stopped in may be small enough to fit (seen in CI: filler4).
    limit = GradingSettings().feedback_files * 2**20
    copied = {path.name: path.stat().st_size for path in (student / "feedback").rglob("filler*.bin")}
    assert sum(copied.values()) <= limit, copied
    assert not {path.name for path in written if path.stat().st_size > limit} & set(copied), copied
    for path in written:   # a quarter GB of zeros need not wait for pytest to rotate its folders
        path.unlink()


def test_the_kernel_and_the_ranks_hold_no_answer_to_their_lab(attacked):
    # Both import Lab 1's student package, and neither was forked from a process that holds
    # the instructor's: no function of Lab 1's answers is anywhere in their memory.
    text = _feedback(attacked["rows"]["seeks_answers"])
    assert "answers held in the kernel: []" in text
    assert "answers held on the rank: []" in text and "answers held on the rank: ['" not in text
