"""`distlab release OUT`: the student handout holds no solution and no hidden test, and the labs'
set-up and Lab 1's visible tests work from it.

What counts as secret is read here from the lab sources (``solutions/<lab>/<lab>.py``) on their
own, not through distlab/course/release.py's check: every line inside a solution or hidden-test
region that the source's other text (teaching text, stubs, visible tests) does not show too.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import reuse_venv
from distlab import paths

REPO = Path(__file__).resolve().parents[1]
LAB1 = "01_collectives"
REGIONS = {"solution": ("### BEGIN SOLUTION", "### END SOLUTION"),
           "hidden": ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")}


def secret_lines(source: Path) -> dict[str, set[str]]:
    """{"solution": lines, "hidden": lines} of a lab source that only its regions hold."""
    found = {kind: set() for kind in REGIONS}
    outside, inside = [], None
    for raw in source.read_text().splitlines():
        line = raw.strip()
        opened = [kind for kind, (begin, _) in REGIONS.items() if line == begin]
        if opened:
            inside = opened[0]
        elif inside and line == REGIONS[inside][1]:
            inside = None
        elif inside:
            found[inside].add(line)
        else:
            outside.append(line.lstrip("# "))   # markdown lines are comments in the source
    shown = "\n".join(outside)
    return {kind: {line for line in lines if len(line) >= 20 and line not in shown}
            for kind, lines in found.items()}


@pytest.fixture(scope="module")
def handout(course_release) -> Path:
    """The handout README.md's `make release` (`distlab release build/release`) wrote in the
    session's copy of the course (conftest.py's ``course_release``: made once, for
    tests/test_readme.py too)."""
    out, printed = course_release
    assert "hand out this folder" in printed, printed[-2000:]
    return out


def test_it_holds_the_labs_data_package_and_environment_only(handout):
    top = sorted(p.name for p in handout.iterdir())
    assert top == [".distlab-release", "Makefile", "README.md", "cluster", "data", "distlab",
                   "environment.yml", "notebooks", "pyproject.toml", "setup.py"], top
    assert (handout / "cluster" / "slurm" / "busbw.sbatch").is_file()
    for lab in paths.labs():
        assert (handout / "notebooks" / lab / f"{lab}.ipynb").is_file()
        if (REPO / "data" / lab).is_dir():
            assert sorted(p.name for p in (handout / "data" / lab).iterdir()) == \
                sorted(p.name for p in (REPO / "data" / lab).iterdir() if p.is_file())
    assert (handout / "distlab" / "checks" / "lab01.py").is_file()    # the package
    assert not [p for p in handout.rglob("*") if p.name in ("solutions", "grader", "tests")]
    readme = (handout / "README.md").read_text()
    assert "make lab" in readme and "make doctor" in readme and "solution" not in readme.lower()


def test_no_hidden_test_anywhere_and_no_solution_in_the_labs_or_data(handout):
    secrets = {lab: secret_lines(paths.lab_source(lab)) for lab in paths.labs()}
    assert all(s["solution"] and s["hidden"] for s in secrets.values()), \
        {lab: {k: len(v) for k, v in s.items()} for lab, s in secrets.items()}
    leaks = []
    for path in (p for p in handout.rglob("*") if p.is_file()):
        text = path.read_bytes().decode("utf-8", errors="replace")
        rel = path.relative_to(handout)
        in_labs = rel.parts[0] in ("notebooks", "data")
        for lab, kinds in secrets.items():
            for kind, lines in kinds.items():
                if kind == "hidden" or in_labs:
                    leaks += [f"{rel}: {kind} line of {lab}: {line!r}" for line in lines
                              if line in text]
        if in_labs:
            assert "### BEGIN" not in text and "### END" not in text, rel
    assert not leaks, "\n".join(leaks[:20])


def test_the_handout_refuses_to_overwrite_the_course():
    done = subprocess.run([str(REPO / ".venv" / "bin" / "distlab"), "release", str(REPO / "data")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "would overwrite the course's own files" in done.stderr
    assert (REPO / "data" / LAB1 / "manifest.json").is_file()


def _filled_lab1(handout: Path) -> Path:
    """The handout's Lab 1 with its solution cells answered from the course's source, and a last
    cell that says which package and data it ran with."""
    from distlab.grading.course_dir import source_notebook

    marks = ("### BEGIN SOLUTION", "### END SOLUTION")
    answers = {c.metadata["nbgrader"]["grade_id"]:
               "\n".join(line for line in c.source.splitlines() if line.strip() not in marks)
               for c in source_notebook(LAB1).cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.read(handout / "notebooks" / LAB1 / f"{LAB1}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, distlab, distlab.paths\n"
        "print(json.dumps({'package': distlab.__file__, 'data': str(distlab.paths.data())}))"))
    path = handout / "notebooks" / LAB1 / "filled.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_make_lab_and_lab1s_visible_tests_work_from_the_handout(handout):
    # `make lab`'s set-up, as written in the handout's Makefile, in an environment that reuses the
    # checkout's dependencies (so pip installs only the handout's package, editable).
    reuse_venv.make(handout / ".venv")
    env = reuse_venv.clean_env(handout / ".venv", BROWSER="true")
    done = subprocess.run(["make", "setup"], cwd=handout, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # `make lab` itself: JupyterLab serves the labs.
    server = subprocess.Popen(["make", "lab"], cwd=handout, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        base, token = _jupyter_url(server, timeout=180)
        listing = _get_json(f"{base}/api/contents/{LAB1}?token={token}", timeout=60)
        assert f"{LAB1}.ipynb" in [item["name"] for item in listing["content"]]
    finally:
        import os
        import signal
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    # Lab 1's visible tests, run by the handout's environment on the handout's package and data
    # with the course's answers filled in: every test cell passes (nbconvert stops on an error).
    filled = _filled_lab1(handout)
    done = subprocess.run([str(handout / ".venv" / "bin" / "jupyter"), "nbconvert", "--to",
                           "notebook", "--execute", "--ExecutePreprocessor.timeout=600",
                           "--output", "executed.ipynb", filled.name],
                          cwd=filled.parent, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    executed = nbformat.read(filled.parent / "executed.ipynb", as_version=4)
    text = {c.metadata.get("nbgrader", {}).get("grade_id"): "".join(
        o.get("text", "") for o in c.get("outputs", [])) for c in executed.cells
        if c.cell_type == "code"}
    assert "ring_all_reduce: correct on 2 and 4 ranks" in text["test_ring_all_reduce"]
    where = json.loads(executed.cells[-1].outputs[0]["text"])
    assert where == {"package": str(handout / "distlab" / "__init__.py"),
                     "data": str(handout / "data")}


def _jupyter_url(server: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(http://host:port, token) from what `make lab` prints."""
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line and server.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"http://(?:127\.0\.0\.1|localhost)(:\d+)/\S*\?token=(\w+)", line)
        if found:
            return f"http://127.0.0.1{found.group(1)}", found.group(2)
    raise AssertionError("`make lab` did not print its URL:\n" + "".join(seen[-40:]))


def _get_json(url: str, timeout: float):
    """The JSON at ``url``, asked again while the server is still starting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                return json.load(reply)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def assert_a_weekly_handout_replaces_a_users_folder_only_when_forced(
        release: list[str], out: Path, cwd: Path, env: dict) -> None:
    """``release`` (`distlab release OUT --lab LAB` as an argv) refuses ``out``, a user's folder,
    naming it and --force, and leaves it alone; with --force it replaces it. (Then README.md's
    weekly command, tests/test_readme.py's test_release_command, replaces its own output
    unforced: two builds of the handout where this test once made two more of its own.)"""
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")   # a user's folder: kept without --force
    done = subprocess.run(release, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and str(out) in done.stderr and "--force" in done.stderr
    assert (out / "notes.txt").read_text() == "my notes"
    done = subprocess.run(release + ["--force"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (out / "notes.txt").exists() and (out / ".distlab-release").is_file()


def assert_a_weekly_handout_holds_its_lab_and_no_answer_to_it_or_a_later_one(out: Path) -> None:
    """``out``, the handout of Lab 3 alone, made over its own previous output, unforced."""
    lab3 = "03_tensor_parallel_mlp"
    assert not (out / "notes.txt").exists() and (out / ".distlab-release").is_file()
    assert [p.name for p in (out / "notebooks").iterdir()] == [lab3]
    assert sorted(p.name for p in (out / "data").iterdir()) == [lab3, "traces"]
    package = out / "distlab" / "labs"
    layers = (package / "tensor_parallel" / "layers.py").read_text()
    assert "ColumnParallelLinear.forward is yours to write in Lab 3 (03_tensor_parallel_mlp)" in layers
    assert "yours to write in Lab 3" in (package / "tensor_parallel" / "ops.py").read_text()
    assert "is yours to write in Lab 9" in (package / "experts" / "parallel.py").read_text()
    # Lab 2's answers stay: Lab 3 may build on them.
    assert "yours to write" not in (package / "data_parallel" / "ddp.py").read_text()


def test_a_handout_of_an_unknown_lab_says_which_labs_there_are(tmp_path):
    done = subprocess.run([str(REPO / ".venv" / "bin" / "distlab"), "release",
                           str(tmp_path / "x"), "--lab", "3"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "no lab 3 in this course: the labs are 01_collectives" \
        in done.stderr
