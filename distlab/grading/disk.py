"""A student's disk while graded: what their folders may hold, and what reaches the feedback.

RLIMIT_FSIZE bounds each file the kernel and its ranks write (``distlab.runtime.landlock``,
``--max-file-size``); ``DiskWatch`` bounds them all, as ``distlab.grading.sandbox.MemoryWatch``
bounds memory: over the limit it stops the student's processes, and the notebook ends with its
message. nbgrader copies every file of the lab's folder into the feedback folder:
``feedback_skips`` names those that would take it past its own limit, left out with a note.

    folder_bytes(folders, stop_above=None) -> int
    DiskWatch(folders, limit_bytes, stop, interval=1.0, on_stop=None).start() / .stop() / with
    feedback_skips(folder, limit_bytes) -> [(path, bytes)]; skipped_note(skips, limit) -> str
    left_out(coursedir, skips)           # with-block: nbgrader's copy skips them
"""
from __future__ import annotations

import contextlib
import glob
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab.grading.polling import PollingWatch

BLOCK = 4096   # what an empty file or a folder costs at least: inodes fill a disk too


def _cost(st) -> int:
    # The larger of its length and its blocks: a sparse file is cheap on disk but not to copy.
    return max(st.st_size, st.st_blocks * 512, BLOCK)


def folder_bytes(folders, stop_above: int | None = None) -> int:
    """Bytes the entries beneath ``folders`` take (links not followed), each at least BLOCK;
    counting stops once past ``stop_above`` (a folder of a million files is not walked whole)."""
    total, stack = 0, [os.fspath(f) for f in folders]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:   # gone, or not a folder
            continue
        with entries:
            for entry in entries:
                try:
                    total += _cost(entry.stat(follow_symlinks=False))
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except OSError:   # removed while we counted
                    continue
                if stop_above is not None and total > stop_above:
                    return total
    return total


@dataclass
class DiskEvent:
    """The student's folders held ``bytes`` (at least), over ``limit``; ``killed`` processes were
    stopped."""
    bytes: int
    limit: int
    killed: int
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return (f"its files took more than the grader's disk limit of {self.limit / 2**20:.0f} MB "
                f"(at least {self.bytes / 2**20:.0f} MB in the lab's folder and its scratch "
                f"folders), so the kernel and its ranks were stopped; write less, or smaller "
                f"files (what is there counts for the student's later labs too)")


class DiskWatch(PollingWatch):
    """A daemon thread that sums the sizes beneath ``folders`` every ``interval`` seconds and,
    over ``limit_bytes``, calls ``stop()`` (which kills the student's processes and returns how
    many); when it killed any, appends a DiskEvent to ``.events`` and calls ``on_stop(event)``.
    A fast writer can overshoot by its write rate x ``interval`` before it is stopped (and no file
    grows past RLIMIT_FSIZE meanwhile)."""

    name = "distlab-disk-watch"

    def __init__(self, folders, limit_bytes: int, stop, interval: float = 1.0, on_stop=None):
        self.folders, self.limit, self.stop_processes = list(folders), int(limit_bytes), stop
        self.interval, self.on_stop = interval, on_stop
        self.events: list[DiskEvent] = []

    def poll(self) -> DiskEvent | None:
        """One check now; the event if it stopped something."""
        used = folder_bytes(self.folders, stop_above=self.limit)
        if used <= self.limit:
            return None
        killed = self.stop_processes()
        if not killed:   # nothing of the student's runs now: nothing to stop
            return None
        event = DiskEvent(used, self.limit, killed)
        self.events.append(event)
        if self.on_stop is not None:
            self.on_stop(event)
        return event


def feedback_skips(folder: Path, limit_bytes: int) -> list[tuple[Path, int]]:
    """The files of ``folder`` (notebooks aside: the feedback converts those) that nbgrader
    would copy into the feedback past ``limit_bytes`` in all, in path order: (path, bytes)."""
    total, skips = 0, []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and not p.is_symlink()
                       and p.suffix != ".ipynb"):
        size = _cost(path.lstat())
        if total + size > limit_bytes:
            skips.append((path, size))
        else:
            total += size
    return skips


def skipped_note(skips: list[tuple[Path, int]], limit_bytes: int, shown: int = 20) -> str:
    """Markdown for the top of the feedback: which files were left out of it, and why."""
    lines = [f"- `{path.name}` ({size / 2**20:.1f} MB)" for path, size in skips[:shown]]
    if len(skips) > shown:
        lines.append(f"- and {len(skips) - shown} more")
    return (f"**Files not copied into this feedback:** the lab's folder held more than the "
            f"grader copies ({limit_bytes / 2**20:.0f} MB of files in all).\n\n" + "\n".join(lines))


@contextlib.contextmanager
def left_out(coursedir, skips: list[tuple[Path, int]]):
    """nbgrader's copy of the lab's folder (``CourseDirectory.ignore``: globs, matched against
    each file's absolute path) leaves ``skips`` out while the block runs."""
    before = list(coursedir.ignore)
    coursedir.ignore = before + [glob.escape(os.path.abspath(path)) for path, _ in skips]
    try:
        yield
    finally:
        coursedir.ignore = before
