"""A fresh virtual environment that reuses the checkout's installed dependencies.

Installing torch and Jupyter into a new environment takes minutes; the tests that install the
package (tests/test_installed.py) or set up the handout (tests/test_release.py) need a *fresh*
environment for distlab only. So the new one is made with the same Python and gets a ``.pth`` line
naming the checkout venv's site-packages: its dependencies are found there, after the new
environment's own site-packages. A plain path line, not ``site.addsitedir``: the ``.pth`` files
in that folder (the checkout's own editable install of distlab among them) are not run, so the
checkout's distlab is not importable from the new environment.
"""
from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Resolved: a checkout whose .venv links to another checkout's (a git worktree beside the
# main one) has console scripts whose #! line names the real path, which _copy_scripts matches.
CHECKOUT_VENV = (REPO / ".venv").resolve()


def site_packages(venv: Path) -> Path:
    """The venv's purelib folder (lib/pythonX.Y/site-packages)."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def make(venv: Path) -> Path:
    """Create ``venv`` reusing the checkout venv's packages, pip and setuptools among them (a pip
    of its own would bring the Python's bundled setuptools, older than pyproject.toml needs); its
    python."""
    base = subprocess.run([str(CHECKOUT_VENV / "bin" / "python"), "-c",
                           "import sys; print(sys.base_prefix)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    python = Path(base) / "bin" / f"python{sysconfig.get_python_version()}"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True)
    (site_packages(venv) / "distlab-test-reuse.pth").write_text(
        f"{site_packages(CHECKOUT_VENV)}\n")
    _copy_scripts(venv)
    # What the dependencies installed beside their code (Jupyter's templates, JupyterLab's app,
    # server config) lives under the environment's prefix: share it too.
    for folder in ("share", "etc"):
        if (CHECKOUT_VENV / folder).is_dir() and not (venv / folder).exists():
            (venv / folder).symlink_to(CHECKOUT_VENV / folder)
    return venv / "bin" / "python"


def _copy_scripts(venv: Path) -> None:
    """The dependencies' console scripts (jupyter, alembic, ...), as pip would have written them
    into ``venv``: the checkout's, with their ``#!`` line naming ``venv``'s python (run as they
    are, they would import the checkout's distlab). distlab's own comes with its install."""
    shebang = f"#!{CHECKOUT_VENV / 'bin' / 'python'}"
    for script in sorted((CHECKOUT_VENV / "bin").iterdir()):
        if script.name == "distlab" or script.is_symlink() or not script.is_file():
            continue
        text = script.read_text(errors="replace")
        first, _, rest = text.partition("\n")
        if first.startswith(shebang):
            target = venv / "bin" / script.name
            target.write_text(f"#!{venv / 'bin' / 'python'}\n{rest}")
            target.chmod(0o755)


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """An environment for commands in ``venv``: its bin first on PATH, and nothing that would put
    the checkout's package on the path or name a course."""
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DISTLAB_COURSE", "DISTLAB_JUDGE", "VIRTUAL_ENV",
                        "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env
