"""The set-up a newcomer relies on: one place for pins, conda agreeing with pip, CI from scratch."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject_pins() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    return set(project["dependencies"]) | set(project["optional-dependencies"]["test"])


def _conda_pins() -> set[str]:
    text = open(os.path.join(ROOT, "environment.yml")).read()
    pip_block = text.split("- pip:", 1)[1]
    return set(re.findall(r"^\s+-\s+(\S+==\S+)\s*$", pip_block, flags=re.M))


def test_every_dependency_is_pinned():
    for pin in _pyproject_pins():
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.+]*", pin), \
            f"{pin!r} is not pinned with ==: an open torch range pulls GB of CUDA wheels"


def test_environment_yml_agrees_with_pyproject():
    assert _conda_pins() == _pyproject_pins()


def test_installed_versions_match_the_pins():
    from importlib.metadata import version
    for pin in _pyproject_pins():
        name, wanted = pin.split("==")
        assert version(name).split("+")[0] == wanted, f"{name} {version(name)} installed, {wanted} pinned"


def test_ci_builds_a_fresh_environment_and_runs_the_readme_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert "rm -rf .venv" in ci and "make test" in ci
    assert "make test" in readme and "make lab" in readme


def test_console_script_lists_its_commands():
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "distlab"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for command in ("doctor", "grade", "build", "references", "site"):
        assert command in done.stdout


def test_doctor_runs_the_smoke_test():
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "distlab"), "doctor"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"2-rank gloo collectives\s+ok", done.stdout), done.stdout


def test_doctor_names_what_an_older_torch_lacks(monkeypatch):
    """torch 2.11 (an H100's image, bench/reports/gpu-2026-11-27-1813-vm.md) lacked the tensor
    collectives the labs call; the doctor says so and names the pinned version to install."""
    import torch
    import torch.distributed as dist
    from distlab.course import doctor
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pin = next(d for d in tomllib.load(f)["project"]
                   ["dependencies"] if d.startswith("torch=="))
    assert doctor._pinned_torch() == pin.split("==")[1]
    assert doctor._torch_problem(torch, dist) is None
    monkeypatch.delattr(dist, "reduce_scatter_single")
    problem = doctor._torch_problem(torch, dist)
    assert "torch.distributed.reduce_scatter_single" in problem and pin in problem
    assert "all_gather_single" not in problem


def test_doctor_fails_with_what_to_fix():
    env = dict(os.environ, GLOO_SOCKET_IFNAME="nonexistent0")
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "distlab"), "doctor"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 1
    assert "FAIL" in done.stdout and "GLOO_SOCKET_IFNAME=nonexistent0 is set" in done.stdout
