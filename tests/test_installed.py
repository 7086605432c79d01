"""The package installed with pip (not editable) grades on its own: the course's files travel in
the wheel (setup.py puts them under distlab/course_files/) and distlab/paths.py finds them there.

The package is built from the checkout's tracked files copied to a temporary folder (what a fresh
clone holds), installed into a fresh virtual environment outside the checkout that reuses the
checkout's dependencies (tests/reuse_venv.py: seconds, not minutes), and run from a third folder,
on one sample submission, with the README's grading command.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest

import reuse_venv
import submissions

REPO = Path(__file__).resolve().parents[1]
LAB1 = "01_collectives"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with distlab installed from a copy of the checkout's tracked files; its folder."""
    root = tmp_path_factory.mktemp("installed")
    clone = root / "clone"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, clone / rel)
    venv = root / "venv"
    python = reuse_venv.make(venv)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", str(clone)], capture_output=True, text=True,
                          env=reuse_venv.clean_env(venv), cwd=root, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(clone)          # nothing left to fall back on but the installed copy
    return venv


def test_the_installed_package_and_its_course_are_what_runs(installed, tmp_path):
    probe = ("import json, distlab, distlab.paths as p\n"
             "print(json.dumps({'package': distlab.__file__, 'root': str(p.root()), "
             "'labs': p.labs()}))")
    done = subprocess.run([str(installed / "bin" / "python"), "-c", probe], cwd=tmp_path,
                          env=reuse_venv.clean_env(installed), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    site = reuse_venv.site_packages(installed)
    assert Path(found["package"]).is_relative_to(site), found
    assert found["root"] == str(site / "distlab" / "course_files")
    assert found["labs"] == sorted(p.parent.name for p in (REPO / "solutions").glob("*/*.py")
                                   if p.stem == p.parent.name)


@pytest.mark.timeout(900)
def test_the_installed_package_grades_a_submission(installed, tmp_path):
    submissions.write(submissions.solved(LAB1), tmp_path / "submitted", "alice", LAB1)
    # The README's grading command, `distlab grade submitted --jobs 2`, run by the installed
    # package from a folder outside the checkout.
    done = subprocess.run([str(installed / "bin" / "distlab"), "grade", "submitted", "--jobs", "2"],
                          cwd=tmp_path, env=reuse_venv.clean_env(installed), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(tmp_path / "scores.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["student"], r["lab"]) for r in rows] == [("alice", LAB1)]
    assert float(rows[0]["score"]) == float(rows[0]["max_score"]) > 0, rows[0]
    assert (tmp_path / "grading" / "feedback" / "alice" / LAB1 / f"{LAB1}.html").is_file()
    # the course's own solution, handed in: flagged for the instructor, scored all the same
    assert "answers are the course's own solution (1 student)" in done.stdout, done.stdout[-2000:]
