"""The course's settings the site shows, from one file the instructor edits,
``grader/course.cfg`` (INI, read with the standard library's configparser, so no new dependency):
``author`` (the pages' footer) and ``repository`` (the "Run it yourself" box of every page, the
index and the header's link). An empty value means the site leaves that line out: it never prints
a placeholder. ``grader/`` travels with an installed course (setup.py), so ``distlab site`` from a
wheel reads the same file.
"""
from __future__ import annotations

import configparser
import dataclasses
import subprocess
from pathlib import Path

from distlab import paths
from distlab.course.site_assets import SiteError

SECTION = "course"


@dataclasses.dataclass(frozen=True)
class SiteSettings:
    """What the pages say about the course; "" where the instructor set nothing."""
    author: str = ""
    repository: str = ""


def settings_file() -> Path | None:
    """``grader/course.cfg`` of the course; None in a student handout (it has no ``grader/``)."""
    folder = paths.root() / "grader"
    return folder / "course.cfg" if folder.is_dir() else None


def read_settings(path: Path | None = None) -> SiteSettings:
    """The settings in ``path`` (default: the course's ``grader/course.cfg``); a missing file or
    key reads as empty; a file that is not INI is a ``SiteError`` naming it."""
    path = settings_file() if path is None else path
    if path is None or not path.is_file():
        return SiteSettings()
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as e:
        raise SiteError(f"{path} is not a course settings file ({e}); it holds `key = value` "
                         f"lines under [{SECTION}], as the copy in the course's grader/ shows.") from None
    section = parser[SECTION] if parser.has_section(SECTION) else {}
    return SiteSettings(author=section.get("author", "").strip(),
                        repository=section.get("repository", "").strip())


def git_origin(repo: Path) -> str:
    """The checkout's ``origin`` as a web URL ("" when it has none, or it is not on the web: a
    clone of a local copy has a path there)."""
    try:
        done = subprocess.run(["git", "-C", str(repo), "remote", "get-url", "origin"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    url = done.stdout.strip()
    if url.startswith("git@github.com:"):
        url = "https://github.com/" + url.split(":", 1)[1]
    return url.removesuffix(".git") if done.returncode == 0 and url.startswith("http") else ""


def site_settings(repository: str | None = None, path: Path | None = None) -> SiteSettings:
    """The settings a build uses: the file's, ``repository`` (the command line's) overriding its
    URL, and the checkout's git origin where neither names one."""
    found = read_settings(path)
    url = repository or found.repository or git_origin(paths.root())
    return dataclasses.replace(found, repository=url)
