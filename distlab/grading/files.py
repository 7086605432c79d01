"""Files that survive a kill: written whole or not at all, and a work directory held by one run."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that readers (and a run after a kill or a power cut) see the
    old content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_copy(src: Path, dest: Path) -> None:
    """``shutil.copy2`` that never leaves a half-copied ``dest`` behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def _fsync_dir(folder: Path) -> None:
    # The rename is only durable once the directory entry is on disk.
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stamp_of(folder: Path, name: str) -> str | None:
    """The key a folder made by ``made_whole`` was made for (its file ``name``), or None."""
    try:
        return (folder / name).read_text()
    except OSError:
        return None


def made_whole(dest: Path, stamp: str, key: str, make) -> None:
    """Make ``dest`` with ``make(folder)`` in a folder beside it, write ``key`` to its file
    ``stamp`` last (a folder without it is incomplete) and move it in whole: two runs at once
    each make one, and the one that moves first is kept."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        make(tmp)
        (tmp / stamp).write_text(key)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    except OSError:
        if stamp_of(dest, stamp) != key:
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Busy(RuntimeError):
    """Another grading run holds the work directory."""


@contextlib.contextmanager
def locked(workdir: Path):
    """Hold ``workdir/.lock`` for the run: two runs writing one work directory would mix their
    records. The lock dies with the process, so a killed run never blocks the next."""
    import fcntl
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"another grading run is using {workdir} (it holds {workdir / '.lock'}); "
                       f"wait for it to finish or pass another --workdir.") from None
        for folder in (workdir, workdir / "results", workdir / "feedback"):
            for stale in folder.rglob(".*.tmp"):  # left by a run killed mid-write
                stale.unlink(missing_ok=True)
        yield
