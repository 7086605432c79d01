"""What README.md states about the course holds for the course as it is: its lab counts and its
labs table come from the labs themselves, its extrapolations add up, and the tests that skip
for a missing program point to the README section that says how to install it. (The README's
commands are run by tests/test_readme.py.)"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import slurm_cluster
from conftest import INSTALL_HELP
from distlab import paths

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_every_lab_count_in_the_readme_is_the_courses():
    counts = [int(n) for n in re.findall(r"(\d+)\s+labs\b", README)]
    assert counts, "the README no longer states a lab count: drop this test's first check"
    assert set(counts) == {len(paths.labs())}, (
        f"README.md says {sorted(set(counts))} labs; the course has {len(paths.labs())} "
        f"({', '.join(paths.labs())})")


def test_the_labs_table_lists_every_lab_in_order():
    listed = re.findall(r"^\| `notebooks/(\w+)` \|", README, re.M)
    assert listed == paths.labs()


def test_the_labs_table_gives_each_labs_points():
    """The points column is each lab's graded cells' points, as nbgrader scores them."""
    from distlab.course.notebooks import source_notebook
    listed = dict(re.findall(r"^\| `notebooks/(\w+)` \|.*\| (\d+) \|$", README, re.M))
    for lab in paths.labs():
        cells = [c.metadata["nbgrader"] for c in source_notebook(lab).cells
                 if c.metadata.get("nbgrader", {}).get("grade")]
        assert int(listed.get(lab, -1)) == sum(c.get("points", 0) for c in cells), lab


def test_the_grading_extrapolation_adds_up():
    found = re.search(r"took ([\d.]+) s per\s+notebook.*?i\.e\. ([\d.]+) h for (\d+) students x\s+"
                      r"(\d+) labs", README, re.S)
    assert found, "the README's grading-at-scale sentence changed: update this test with it"
    per_notebook, hours, students, labs = (float(g) for g in found.groups())
    assert hours == round(per_notebook * students * labs / 3600, 1)


def test_grading_scale_extrapolates_to_every_lab():
    spec = importlib.util.spec_from_file_location("grading_scale",
                                                  REPO / "bench" / "grading_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.course_size()[1] == len(paths.labs())


def test_skip_messages_point_to_the_readme_section_on_installing():
    section = INSTALL_HELP.split('"')[1]
    assert f"\n### {section}\n" in README
    body = README.split(f"### {section}\n")[1].split("\n## ")[0]
    for needed in ("sudo apt-get install chromium", "if `npm` is not on your PATH",
                   "sudo apt-get install npm", "sudo apt-get install slurm-wlm munge"):
        assert needed in " ".join(body.split()), needed
    ci = (REPO / ".ci" / "run").read_text()
    assert all(f"need+=({package})" in ci for package in ("chromium", "npm", "slurm-wlm", "munge"))


def test_the_slurm_skip_says_what_to_install_and_where_it_is_explained(monkeypatch):
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name: None)
    monkeypatch.setattr(slurm_cluster.Path, "exists", lambda self: False)
    why = slurm_cluster.missing()
    assert "sudo apt-get install slurm-wlm munge" in why and INSTALL_HELP in why



def test_the_delegation_sample_counts_are_the_designs():
    """The README's count of the grading run's delegation samples, before the covering design and
    with it, is tests/submissions/delegation.py's."""
    from submissions import delegation
    found = re.search(r"delegation samples went from (\d+) notebooks \(every route on\s+"
                      r"every lab\)\s+to (\d+) \(each lab by (\w+) routes, each route on (\w+) labs",
                      README)
    assert found, "the README's sentence on the delegation samples changed: update this test"
    design = delegation.design()
    words = {"two": 2, "three": 3, "four": 4}
    assert int(found[1]) == len(delegation.ROUTES) * len(delegation.DELEGATED)
    assert int(found[2]) == sum(len(routes) for routes in design.values())
    assert {len(routes) for routes in design.values()} == {words[found[3]]}
    assert {sum(r in routes for routes in design.values()) for r in delegation.ROUTES} == \
        {words[found[4]]}
