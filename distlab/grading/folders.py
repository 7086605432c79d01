"""Folders a command writes: it replaces (or writes into) only a folder that is absent, empty or
its own output, never one a user made.

A command marks what it writes with ``.distlab-<command>`` (a line saying what wrote it), so that
running it again recognises its own output; any other folder with something in it is refused,
with its name and what to do, unless the user says ``--force``. Outputs written before the marker
existed are recognised by a ``legacy`` test of the command's own (a grading work directory by its
records, a handout by its README). tests/test_folders.py holds every command to this.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

IGNORED = (".lock",)   # a grading run's lock, left by a run killed before it wrote anything


class FolderInUse(RuntimeError):
    """The folder holds something its command did not write; the message says what to do."""


def marker(folder: Path, command: str) -> Path:
    return folder / f".distlab-{command}"


def mark(folder: Path, command: str, program: str | None = None) -> None:
    """Say in ``folder`` that ``distlab command`` (or ``program``) wrote it (and may replace it
    next time)."""
    program = program or f"distlab {command}"
    folder.mkdir(parents=True, exist_ok=True)
    marker(folder, command).write_text(
        f"Written by `{program}` on {time.strftime('%Y-%m-%d %H:%M')}.\n`{program}` may replace "
        f"what it wrote here; delete this file to keep it from doing so.\n")


def contents(folder: Path) -> list[str]:
    """The names in ``folder`` that count (a grading run's lock does not)."""
    return sorted(p.name for p in folder.iterdir() if p.name not in IGNORED)


def is_own(folder: Path, command: str, legacy: Callable[[Path], bool] | None = None) -> bool:
    """``folder`` is absent, empty, or the output of ``distlab command``."""
    if not folder.exists():
        return True
    if not folder.is_dir():
        return False
    return (not contents(folder) or marker(folder, command).is_file()
            or bool(legacy and legacy(folder)))


def claim(folder: Path, command: str, force: bool = False,
          legacy: Callable[[Path], bool] | None = None, what: str = "replace it whole",
          remedy: str | None = "pass --force to replace it and everything in it",
          program: str | None = None) -> None:
    """Raise ``FolderInUse`` unless ``distlab command`` (or ``program``) may write ``folder``: it
    is absent, empty, its own output, or ``force`` says so (a file is never replaced)."""
    program = program or f"distlab {command}"
    if folder.exists() and not folder.is_dir():
        raise FolderInUse(f"{folder} is a file, not a folder: `{program}` writes a folder "
                          f"there. Give another path.")
    if force or is_own(folder, command, legacy):
        return
    names = contents(folder)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise FolderInUse(
        f"{folder} is not empty ({shown}) and was not written by `{program}` (it has no "
        f"{marker(folder, command).name}), which would {what}. Nothing was changed. Give a new or "
        f"empty folder" + (f", or {remedy}." if remedy else "."))
