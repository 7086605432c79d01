"""A copy of the course to run README.md's commands in (tests/test_readme.py), and the site its
`make site` builds there (tests/conftest.py's ``course_site``).

The copy is the checkout's tracked files in a temporary folder, with the checkout's `.venv`
linked in and `PYTHONPATH` pointing at the copy's package, so that what the commands write
(student labs, references, the site, grading folders) never touches the checkout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAKE_SITE = "make site"   # README.md's command that builds the site (every lab run)
MAKE_RELEASE = "make release"   # README.md's command that writes the handout, build/release
MAKE_REFERENCES = "make references"   # README.md's command that rewrites data/ (every lab)


def copy_course(root: Path) -> Path | None:
    """The checkout's tracked files in ``root``, with its .venv linked in; None if the .venv is
    missing or older than pyproject.toml (`make` would then reinstall it inside the copy)."""
    venv = REPO / ".venv"
    stamp = venv / ".installed"
    if not stamp.exists() or stamp.stat().st_mtime < (REPO / "pyproject.toml").stat().st_mtime:
        return None
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)   # copy2 keeps mtimes: make sees nothing stale
    (root / ".venv").symlink_to(venv)
    return root


def environ(course: Path, **extra) -> dict[str, str]:
    # The copy's package, not the checkout's editable install, and no browser to open.
    env = dict(os.environ, PYTHONPATH=str(course), BROWSER="true", **extra)
    env.pop("DISTLAB_JUDGE", None)
    return env


def sh(command: str, course: Path, timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run a README command verbatim with bash in the copy; fail with its output if it fails."""
    done = subprocess.run(["bash", "-c", command], cwd=course, env=environ(course), text=True,
                          capture_output=True, timeout=timeout, **kw)
    assert done.returncode == 0, (f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}"
                                  f"\n{done.stderr[-3000:]}")
    return done
