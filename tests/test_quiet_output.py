"""What the course's commands print is what a user can act on (issue 40): no pytest-xdist
"bringing up nodes..." in `make test`, a handout's `make lab` without the formgrader's "No
nbgrader_config.py file found", and `distlab release` naming the files it wrote rather than
counting them ("(1 files)"). `distlab site`'s output is checked by tests/test_site.py's
assert_one_lab_site_shows_the_settings_and_prints_no_noise on README's one-lab site
(tests/test_readme.py's test_site_commands), the checkout's `make lab` by test_readme.py's
test_setup_commands."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from distlab import paths
from distlab.course import release

REPO = paths.root()


def _make_recipe(target: str) -> str:
    """The command `make TARGET` runs in the checkout (make -n prints it, expanded, runs nothing)."""
    # Under `make test` itself (CI, a contributor) this make is a sub-make: without the outer
    # one's variables it prints no "make[1]: Leaving directory" after the recipe.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(300)
def test_make_test_prints_worker_status_not_bringing_up_nodes():
    command = _make_recipe("test")
    assert "-m pytest" in command
    # The recipe as written (the workers of pyproject.toml's addopts included) on two quick tests.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_"))}     # this run's own, if it runs under xdist
    done = subprocess.run(
        [*command.split(), "-p", "no:cacheprovider", "tests/test_site.py", "-k",
         "lab_mentions or colab_only"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bringing up nodes" not in done.stdout + done.stderr
    assert re.search(r"^2 workers \[2 items\]$", done.stdout, re.M), done.stdout[-2000:]


def _recipe_lines(makefile: str, name: str) -> list[str]:
    """The definition of make variable ``name`` and the `lab` target's recipe in ``makefile``."""
    variable = re.search(rf"^{name} :=.*$", makefile, re.M)
    recipe = re.search(r"^lab: setup\n\t(.*)$", makefile, re.M)
    assert variable and recipe, f"no {name} or lab target in:\n{makefile}"
    return [variable.group(0), recipe.group(1)]


def test_a_handouts_make_lab_starts_jupyterlab_as_the_checkouts_does():
    """The handout's Makefile leaves the formgrader out as the checkout's does (that `make lab` is
    run and its output read by tests/test_readme.py's test_setup_commands)."""
    ours = _recipe_lines((REPO / "Makefile").read_text(), "NO_FORMGRADER")
    assert _recipe_lines(release.MAKEFILE, "NO_FORMGRADER") == ours
    assert "$(NO_FORMGRADER)" in ours[1] and "formgrader=False" in ours[0]


@pytest.mark.timeout(600)
def test_release_names_the_notebooks_it_wrote(tmp_path):
    lab = "01_collectives"
    lines = []
    release.release(tmp_path / "handout", log=lines.append, labs=[lab])
    assert f"  notebooks/{lab}/ ({lab}.ipynb)" in lines, lines
    assert not any(re.search(r"\(1 files\)", line) for line in lines)
