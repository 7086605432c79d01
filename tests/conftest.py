"""Fixtures several test files share, and how the suite spreads over pytest-xdist's workers.

The expensive work is done once per run and read by many tests: every sample submission (each
lab's solution and untouched version, the special cases, the attacks, the delegations) is graded
in one ``distlab grade`` run (``graded_samples``), and the site is built once, by README.md's
`make site` in the session's copy of the course (``course_site``).
"""
from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import time
from pathlib import Path

import pytest

import suite_times

# The site's pages the browser reads one by one at two widths: Lab 1 (rank output, figures, links),
# Lab 2 (formulas), Lab 5 (the schedule widget) and Lab 7 (the planner) cover every kind of
# content a page has (tests/test_site.py reads every page's HTML).
SITE_LABS = ("01_collectives", "02_data_parallel", "05_pipeline_parallel", "07_3d_parallelism")
# Where a skipped test's message sends a newcomer for what to install (README.md's section).
INSTALL_HELP = 'README.md, "What the optional tests need"'
# pytest-timeout's limit for a test that makes course_site (its set-up counts): `make site` runs
# every lab, about 3 minutes on an idle 2-core machine.
SITE_TIMEOUT = 1900


@pytest.fixture(scope="session")
def course(tmp_path_factory) -> Path:
    """One copy of the course for the session, where README.md's commands run
    (tests/course_copy.py)."""
    from course_copy import copy_course
    root = copy_course(tmp_path_factory.mktemp("readme") / "course")
    if root is None:
        pytest.fail("run `make setup` first: the README's commands reuse the checkout's .venv, "
                    "and in a copy with a stale .venv `make` would reinstall it there")
    return root


@pytest.fixture(scope="session")
def course_site(course, tmp_path_factory, request):
    """The site README.md's `make site` builds in the course copy, every lab run once for
    tests/test_readme.py, tests/test_site.py and tests/test_browser.py, moved aside (the README's
    later commands build other sites there): (folder, pages, seconds `make site` took); each
    page's seconds are those its build printed."""
    from course_copy import MAKE_SITE, sh
    from distlab.course import notebooks, site, site_assets

    if not site_assets.can_vendor():
        message = ("the site fetches its scripts (require.js, the widget manager, MathJax) once with "
                   f"npm, which is not on PATH: install it (Debian/Ubuntu: `sudo apt-get install "
                   f"npm`; see {INSTALL_HELP}) to run the site tests")
        if os.environ.get("DISTLAB_REQUIRE_BROWSER") == "1":   # CI: mandatory
            pytest.fail(message)
        pytest.skip(f"site tests skipped: {message}")
    start = time.perf_counter()
    with suite_times.note_cost(request, f"course_site: `{MAKE_SITE}`, every lab run"):
        done = sh(MAKE_SITE, course, timeout=SITE_TIMEOUT - 100)
    seconds = time.perf_counter() - start
    ran = dict(re.findall(r"^(\S+): ran in (\S+) s$", done.stdout, re.M))
    pages = [site.Page(lab, site.title_of(site.lab_notebook(lab, "solutions"), lab),
                       notebooks.lab_summary(lab), float(ran[lab])) for lab in notebooks.labs()]
    out = tmp_path_factory.mktemp("site") / "site"
    shutil.copytree(course / "build" / "site", out)
    return out, pages, seconds


@pytest.fixture(scope="session")
def course_release(course) -> tuple[Path, str]:
    """The handout README.md's `make release` writes in the course copy, made once (about 12
    CPU-s) for tests/test_readme.py, which runs the command, and tests/test_release.py, which
    reads and uses what it holds: (its folder, what the command printed)."""
    from course_copy import MAKE_RELEASE, sh
    done = sh(MAKE_RELEASE, course, timeout=600)
    return course / "build" / "release", done.stdout


@pytest.fixture(scope="session")
def course_references(course) -> Path:
    """README.md's `make references` in the course copy, run once for tests/test_readme.py, which
    runs the command, and tests/test_notebooks.py, which compares what it wrote with the
    checkout's data/ (every lab's make_references() computed once, not twice: about 25 CPU-s,
    most of them ranks'): the copy's data folder."""
    from course_copy import MAKE_REFERENCES, sh
    sh(MAKE_REFERENCES, course, timeout=1800)
    return course / "data"


# ---------------------------------------------------------------------------------------------
# The sample submissions, graded once

# The limits of the shared grading run (the attacks' memory flood is stopped at MEMORY_LIMIT_GB).
GRADE_LIMITS = ["--backend", "gloo", "--rank-timeout", "10", "--timeout", "120",
                "--notebook-timeout", "400"]
# pytest-timeout's limit for the test that makes graded_samples (it counts the fixture's set-up):
# the run takes about 10 minutes on an idle 2-core machine, 35 on one loaded 15 deep and 40 at
# load 20 (146 notebooks, 1,100 CPU-seconds by the workers' records: the labs' planted mistakes
# 430, Lab 8's eight 230 of them; the delegations 250, the solutions 165, the attacks 145, the
# special cases 70, the untouched labs 35). The planted mistakes of Labs 7-10 now share notebooks
# (tests/submissions/packing.py): 26 notebooks became 13, Lab 8's eight 3. The delegations are a
# covering design now (tests/submissions/delegation.py): 24 notebooks in 2 folders where every
# route on every lab was 96 in 8, 95 CPU-seconds with their worker starts where those took 386
# (both graded alone at a load of 18-36).
GRADED_SAMPLES_TIMEOUT = 5400


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# What each kind of sample is (a module that reads ``graded_samples`` names the kinds it reads in
# its SAMPLE_KINDS; a run grades only the kinds its selected tests read):
# - "labs": every lab's solution (``solution``) and untouched student version (``untouched``);
# - "special": the special cases of tests/submissions (``special_samples``);
# - "attacks": Lab 1's attacks beside the honest ``bystander`` (tests/submissions/attacks.py);
#   the bystander is Lab 1's ``solution`` too (the same notebook, graded once);
# - "delegation": every delegable lab answered with the course's own code, each by two routes or
#   more, each route on three labs or more (tests/submissions/delegation.py's design()).
# A module may add samples of its own: its ``own_graded_samples()`` returns {(student, lab):
# notebook} (a lab's planted mistakes), graded in the same run.
SAMPLE_KINDS = ("labs", "special", "attacks", "delegation")


def write_samples(root: Path, kinds=SAMPLE_KINDS, own=()) -> dict:
    """The samples of ``kinds`` and of the modules' ``own`` makers, written under ``root/submitted`` from student notebooks built
    fresh from the sources (what they give today, not the committed ones). {"submitted": folder,
    "folders": {(student, lab): its folder name}, "expected": {(student, lab): what the sample's
    module expects}, "released": the fresh student notebooks}."""
    import submissions
    from distlab.course import notebooks
    from submissions import attacks, delegation

    released, subs = root / "released", root / "submitted"
    labs = notebooks.labs()
    for lab, files in notebooks.build_student_notebooks(labs).items():
        notebooks.write_student_notebooks(lab, files, out=released)
    samples, expected, mixed, delegations = {}, {}, [], []
    with submissions.released_from(released):
        if "labs" in kinds:
            for lab in labs:
                samples[("solution", lab)] = submissions.solved(lab)
                samples[("untouched", lab)] = submissions.student(lab)
        if "special" in kinds:
            for key, (nb, statuses) in submissions.special_samples().items():
                samples[key], expected[key] = nb, statuses
                mixed.append(key)
        if "attacks" in kinds:
            for student, (nb, statuses) in attacks.attack_samples().items():
                samples[(student, attacks.LAB)], expected[(student, attacks.LAB)] = nb, statuses
        if "delegation" in kinds:
            for key, (nb, zeroed) in delegation.delegation_samples().items():
                samples[key], expected[key] = nb, zeroed
                delegations.append(key)
        kind_of = {key: _kind(key, set(expected) - set(mixed)) for key in samples}
        for make in own:
            for key, nb in make().items():
                samples[key] = nb
                kind_of.setdefault(key, "the lab modules' own")
                if key[0] not in ("solution", "untouched"):
                    mixed.append(key)
    if ("solution", attacks.LAB) in samples:
        # Lab 1's solution is the attacks' honest bystander (the attack that writes outside its
        # folder aims at submitted/bystander/): graded once, under that name.
        samples[("bystander", attacks.LAB)] = samples.pop(("solution", attacks.LAB))
    # A student's folder holds all their labs, as a real student's: one worker grades them (one
    # worker start, one judge), and the run starts the students with the most labs first. The
    # special cases and the labs' planted mistakes (each one lab with one thing wrong) share
    # folders, no lab twice in one: a student with a hang in Lab 1 and a mistake in Lab 8 is
    # graded as two students would be, for a worker start less (the attacks keep one each). The
    # delegation samples (a student per route, each on a few labs) share folders of their own the
    # same way: as many folders as a lab has routes (two), not one per route (eight).
    folders = {key: key[0] for key in samples}
    folders.update(_mixed_folders(mixed))
    folders.update(_mixed_folders(delegations, "delegates"))
    for key, nb in samples.items():
        submissions.write(nb, subs, folders[key], key[1])
    if ("bystander", attacks.LAB) in folders:
        folders[("solution", attacks.LAB)] = folders[("bystander", attacks.LAB)]
    return {"submitted": subs, "folders": folders, "expected": expected, "released": released,
            "kind_of": kind_of}


def _kind(key: tuple[str, str], attacks_or_delegations: set) -> str:
    if key[0] in ("solution", "untouched"):
        return "labs"
    if key in attacks_or_delegations:
        return "delegation" if key[0].startswith("delegates_") else "attacks"
    return "special"


def costs_by_kind(work: Path, folders: dict, kind_of: dict) -> str:
    """What each kind of sample cost in the grading run, by the workers' records (their starts,
    once per student folder, apart): where the run's time goes, printed with the suite's costs."""
    import json
    spent: dict[str, list] = {}
    for path in (work / "results").glob("*.json"):
        for lab, entry in json.loads(path.read_text())["labs"].items():
            start = entry.get("worker_start") or {"seconds": 0.0, "cpu_seconds": 0.0}
            for name, s, c in (("worker starts", start["seconds"], start["cpu_seconds"]),
                               (None, entry["seconds"] - start["seconds"],
                                (entry.get("cpu_seconds") or 0.0) - start["cpu_seconds"])):
                if name is None:
                    name = next((kind_of[k] for k, f in folders.items()
                                 if (f, k[1]) == (path.stem, lab) and k in kind_of), "?")
                total = spent.setdefault(name, [0, 0.0, 0.0])
                total[0] += name != "worker starts" or s > 0
                total[1:] = total[1] + s, total[2] + (c or 0.0)
    return "graded_samples by kind, by the workers' records: " + "; ".join(
        f"{name} {n} x, {s:.0f} s, {c:.0f} CPU-s" for name, (n, s, c) in
        sorted(spent.items(), key=lambda kv: -kv[1][2]))


def _mixed_folders(keys: list, name: str = "mixed") -> dict:
    """{(student, lab): "mixedN"} (``name`` then N): ``keys`` in as few folders as hold each lab
    once."""
    labs_in: list[set] = []
    folders = {}
    for student, lab in keys:
        n = next((i for i, labs in enumerate(labs_in) if lab not in labs), len(labs_in))
        if n == len(labs_in):
            labs_in.append(set())
        labs_in[n].add(lab)
        folders[(student, lab)] = f"{name}{n + 1}"
    return folders


def _samples_read(session) -> tuple[tuple[str, ...], list]:
    """The sample kinds the selected tests that read ``graded_samples`` need (their modules'
    SAMPLE_KINDS; all of them for a module that names none), and the modules' own sample makers
    (``own_graded_samples``): `pytest tests/test_grader_attacks.py` grades the attacks only."""
    kinds, own = set(), {}
    for item in session.items:
        if "graded_samples" in getattr(item, "fixturenames", ()):
            kinds.update(getattr(item.module, "SAMPLE_KINDS", SAMPLE_KINDS))
            if hasattr(item.module, "own_graded_samples"):
                own[item.module.__name__] = item.module.own_graded_samples
    return tuple(k for k in SAMPLE_KINDS if k in kinds), list(own.values())


@pytest.fixture(scope="session")
def graded_samples(request, tmp_path_factory):
    """The samples the selected tests read, graded in one ``distlab grade --jobs 2`` run (with
    the attacks' memory limit), and what the attacks must not change, digested before it.
    write_samples' keys, plus {"rows": {(student, lab): CSV row}, "work": the work folder,
    "out": scores.csv, "before": {path: sha256}, "autograded": (student, lab) -> the autograded
    notebook}."""
    from distlab.course.references import DATA
    from distlab.grading import grade
    from submissions import attacks

    kinds, own = _samples_read(request.session)
    with suite_times.note_cost(request, "graded_samples: the samples written"):
        samples = write_samples(tmp_path_factory.mktemp("graded"), kinds, own)
    subs, folders = samples["submitted"], samples["folders"]
    read = [*kinds, *(["the lab modules' own"] if own else [])]
    graded = (f"graded_samples: {len(list(subs.glob('*/*/*.ipynb')))} notebooks of "
              f"{len(list(subs.iterdir()))} students graded ({', '.join(read)})")
    root, lab1 = subs.parent, attacks.LAB
    protected = sorted(subs.glob(f"bystander/{lab1}/*.ipynb")) + sorted((DATA / lab1).iterdir())
    before = {p: _digest(p) for p in protected}
    out, work = root / "scores.csv", root / "work"
    if "attacks" in kinds:
        attacks.plant_course_copy()   # another copy of the course, for reads_course_copy
    try:
        with suite_times.note_cost(request, graded):
            status = grade.main([str(subs), "--out", str(out), "--jobs", "2", "--workdir",
                                 str(work), *GRADE_LIMITS, "--memory-limit",
                                 str(attacks.MEMORY_LIMIT_GB)])
        assert status == 0
        suite_times.suite_item(request).user_properties.append(
            (suite_times.COST, costs_by_kind(work, folders, samples["kind_of"])))
        with open(out) as f:
            by_folder = {(r["student"], r["lab"]): r for r in csv.DictReader(f)}
        rows = {key: by_folder[(folder, key[1])] for key, folder in folders.items()}

        def autograded(student: str, lab: str) -> Path:
            folder = folders[(student, lab)]
            return work / "students" / folder / "autograded" / folder / lab / f"{lab}.ipynb"

        yield {**samples, "rows": rows, "work": work, "out": out, "before": before,
               "autograded": autograded}
    finally:
        for proc in attacks.orphans():   # never leave them on the machine, even when a test fails
            proc.kill()
        shutil.rmtree(attacks.COURSE_COPY, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# pytest-xdist: what shares a fixture runs on one worker

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (pyproject.toml's addopts), tests that share a module- or
    session-scoped fixture of this suite go to one worker, each group as a whole: every worker
    would otherwise make the fixture again (a grading run, a site, a copy of the course). Groups
    are the connected sets of tests and such fixtures, so a test that reads two of them (the
    browser's site test: its module's browser and the session's site) joins both groups into one.
    The other tests are spread one by one."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    shared_of = {}
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = []
        for name in (info.names_closure if info else ()):
            for fixturedef in info.name2fixturedefs.get(name, ())[-1:]:
                # this suite's own (pytest's and plugins' have no base id), made once per module
                # or session
                if fixturedef.baseid and fixturedef.scope in ("module", "package", "session"):
                    shared.append(f"{fixturedef.baseid}::{name}")
        shared_of[item] = shared
        for key in shared[1:]:
            parent[find(key)] = find(shared[0])
    grouping = hasattr(config, "workerinput") and config.getvalue("loadgroup")
    for item in items:
        # The first test to read a shared run makes it within its own time: the limit is the
        # run's, which is bounded by its own limits (GRADE_LIMITS, make site's).
        names = getattr(item, "fixturenames", ())
        if "graded_samples" in names:
            item.add_marker(pytest.mark.timeout(GRADED_SAMPLES_TIMEOUT), append=False)
        elif "course_site" in names:
            own = item.get_closest_marker("timeout")
            if own is None or own.args[0] < SITE_TIMEOUT:
                item.add_marker(pytest.mark.timeout(SITE_TIMEOUT), append=False)
    group_of = {item: find(shared[0]) for item, shared in shared_of.items() if shared}
    for item, group in group_of.items():
        item.add_marker(pytest.mark.xdist_group(group))
        if grouping:
            _join_group(item, group)
    if grouping:   # the workers' collection is the scheduler's queue: longest units first
        items[:] = suite_times.longest_first(items, group_of, suite_times.workers_seconds(config))


def pytest_configure(config):
    """The suite's own marker; and each test's seconds are kept for the next run's order
    (tests/suite_times.py), by the one process that sees every test's report: xdist's
    controller, or pytest itself under -n 0."""
    config.addinivalue_line(
        "markers", "stored_data: compares data/ with values recomputed on this machine's CPU; "
                   "tests/test_any_cpu.py runs these again as on another CPU")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(suite_times.Recorder(config), "distlab-durations")


def _join_group(item, group: str) -> None:
    """What xdist's worker does for an ``xdist_group`` mark under --dist loadgroup: the group's
    name after an ``@`` at the end of the test's node id, where the scheduler reads it. xdist
    3.8.0 writes it to ``item._nodeid``, which pytest 9 no longer reads (it keeps the id in
    ``item._id``): without this every grouped test would be scheduled on its own, and each
    worker would make the shared fixtures again."""
    from _pytest.nodeid import coerce_node_id

    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")
