"""distlab.grading.disk: the size of a student's folders, the watch that stops their processes
past the disk limit, and the lab folder's files that nbgrader copies into the feedback.

The whole path (a submission that writes 300 MB, graded) is tests/test_grader_attacks.py's
``fills_disk`` sample."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from nbgrader.utils import find_all_files

from distlab.grading import disk

MB = 2**20


def _file(path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_folder_bytes_counts_every_file_and_at_least_a_block_each(tmp_path):
    _file(tmp_path / "a" / "big", 3 * MB)
    for i in range(10):
        (tmp_path / f"empty{i}").touch()
    counted = disk.folder_bytes([tmp_path, tmp_path / "missing"])
    # each entry at its length or its blocks (as the filesystem allocated them), at least a block
    expected = sum(max(st.st_size, st.st_blocks * 512, disk.BLOCK) for st in
                   (p.lstat() for p in tmp_path.rglob("*")))
    assert counted == expected >= 3 * MB + 11 * disk.BLOCK


def test_folder_bytes_counts_a_sparse_file_at_its_length(tmp_path):
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(50 * MB)
    assert disk.folder_bytes([tmp_path]) == 50 * MB


def test_folder_bytes_stops_counting_past_the_limit(tmp_path):
    for i in range(100):
        (tmp_path / f"f{i}").touch()
    assert disk.folder_bytes([tmp_path], stop_above=10 * disk.BLOCK) == 11 * disk.BLOCK


def test_the_watch_stops_the_processes_once_the_folders_pass_the_limit(tmp_path):
    stopped, notes = [], []
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    def stop() -> int:
        writer.kill()
        stopped.append(writer.pid)
        return 1

    try:
        watch = disk.DiskWatch([tmp_path], 2 * MB, stop, on_stop=notes.append)
        _file(tmp_path / "one", MB)
        assert watch.poll() is None and not stopped
        _file(tmp_path / "two", 2 * MB)
        event = watch.poll()
        assert stopped == [writer.pid] and notes == [event] and watch.events == [event]
        assert writer.wait(timeout=60) != 0
        assert event.bytes > event.limit == 2 * MB
        assert "disk limit of 2 MB" in str(event) and "were stopped" in str(event)
    finally:
        writer.kill()
        writer.wait()


def test_the_watch_reports_nothing_when_nothing_is_left_to_stop(tmp_path):
    _file(tmp_path / "big", 3 * MB)
    watch = disk.DiskWatch([tmp_path], MB, stop=lambda: 0)
    assert watch.poll() is None and watch.events == []


def test_the_feedback_copies_files_up_to_its_limit_and_names_the_rest(tmp_path):
    lab = tmp_path / "autograded" / "ann" / "lab"
    small = _file(lab / "a_small.txt", MB)
    big = [_file(lab / "out" / f"b{i}.bin", 4 * MB) for i in range(3)]
    _file(lab / "lab.ipynb", 6 * MB)   # converted by the feedback, never copied as a file
    skips = disk.feedback_skips(lab, 6 * MB)
    assert skips == [(big[1], 4 * MB), (big[2], 4 * MB)]
    note = disk.skipped_note(skips, 6 * MB)
    assert "`b1.bin` (4.0 MB)" in note and "`b2.bin`" in note and "b0.bin" not in note

    class CourseDirectory:   # the one attribute nbgrader's copy reads
        ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback"]

    coursedir = CourseDirectory()
    with disk.left_out(coursedir, skips):
        copied = find_all_files(os.path.abspath(lab), coursedir.ignore + ["*.ipynb"])
    assert sorted(copied) == sorted(map(str, [small, big[0]]))
    assert coursedir.ignore == CourseDirectory.ignore


def test_a_file_with_glob_characters_in_its_name_is_left_out_alone(tmp_path):
    lab = tmp_path / "lab"
    odd = _file(lab / "[a]*.bin", 2 * MB)
    plain = _file(lab / "a.bin", MB)
    skips = disk.feedback_skips(lab, MB)
    assert skips == [(odd, 2 * MB)]

    class CourseDirectory:
        ignore: list = []

    with disk.left_out(CourseDirectory, skips):
        copied = find_all_files(str(lab), CourseDirectory.ignore)
    assert copied == [str(plain)]
    shutil.rmtree(lab)
