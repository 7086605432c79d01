"""What an instructor hands out: ``distlab release OUT`` (``make release``: ``build/release/``).

The handout holds
- ``notebooks/<lab>/``: the student labs, built afresh from ``solutions/`` by nbgrader (solution
  code replaced by stubs, hidden tests removed), so a stale ``notebooks/`` cannot leak anything;
- ``data/<lab>/``: the stored references the visible tests read, with their manifests;
- ``distlab/``: the student package (``distlab.grading.student_package``): the package the labs
  import, without the answers of the labs handed out or of any later lab (stubs that say whose
  they are to write); earlier labs' implementations stay, since later labs build on them. So
  hand a term's labs out one week at a time, ``--lab`` by ``--lab``, as nbgrader's
  ``release_assignment`` does;
- ``pyproject.toml``, ``setup.py`` and ``environment.yml``: the pinned environment;
- ``cluster/``: the sbatch scripts of the course's cluster programs;
- ``Makefile`` and ``README.md`` for students: ``make lab`` sets up and opens the labs,
  ``make doctor`` checks the machine.

It leaves out what the instructor keeps: ``solutions/`` (the single source of each lab, with its
solutions and hidden tests), ``grader/``, ``tests/`` (sample submissions are solved labs) and
``bench/``. Before writing, it checks its own output: no line that exists only inside a solution
or hidden-test region of a source may appear in the student labs or the data, and no hidden-test
line anywhere, else it stops and says which.

OUT is replaced whole only when it is absent, empty or a previous handout (its
``.distlab-release`` marker; ``distlab.grading.folders``), or with ``--force``: a folder holding
anything else is refused, naming it, before anything is built.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from distlab import paths
from distlab.course import notebooks
from distlab.grading import student_package
from distlab.grading.folders import claim, mark

PROJECT_FILES = ("pyproject.toml", "setup.py", "environment.yml")
COURSE_FOLDERS = {"solutions", "notebooks", "data", "grader", "distlab", "tests", "bench"}
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "course_files",
                              "*.egg-info")

MAKEFILE = """\
# `make lab` sets up the virtual environment .venv (first time only) and opens the labs;
# `make doctor` checks this machine (versions, backends, GPUs, a 2-rank all-reduce).
PYTHON ?= python3
BIN := .venv/bin
STAMP := .venv/.installed

.PHONY: lab setup doctor

setup: $(STAMP)

$(STAMP): pyproject.toml
\ttest -x $(BIN)/python || $(PYTHON) -m venv .venv
\t$(BIN)/python -m pip install --quiet -e .
\ttouch $(STAMP)

# Jupyter refuses to run as root (containers often are) unless told it may.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

# nbgrader's formgrader is the instructor's: left out here, where it finds no course config and
# would only warn about it.
NO_FORMGRADER := --ServerApp.jpserver_extensions nbgrader.server_extensions.formgrader=False

lab: setup
\t$(BIN)/jupyter lab notebooks/ $(ALLOW_ROOT) $(NO_FORMGRADER)

doctor: setup
\t$(BIN)/distlab doctor
"""

README = """\
# distlab labs

Labs on training large models across many devices, with real `torch.distributed` code on your
laptop's CPU (several processes, gloo) or on NVIDIA GPUs.

On Linux or macOS with Python 3.10+ (`python3`) and `make`:

```bash
make lab       # set everything up (a .venv in this folder, 1-5 minutes) and open the labs
make doctor    # check the machine: versions, backends, GPUs and a 2-rank all-reduce
```

conda users: `conda env create -f environment.yml && conda activate distlab && pip install -e . --no-deps`.

Work through `notebooks/` in order:

{labs}

On a cluster, `cluster/slurm/` holds sbatch scripts that run the course's programs (the
bandwidth sweep `python -m distlab.cluster.busbw`, a 3-D training run
`python -m distlab.cluster.train3d`) with srun and one `torchrun` agent per node; their headers
say how to set them.

Each exercise has visible tests: run them as often as you like. The grader also runs hidden
tests on fresh inputs, so make your code right, not just the visible cases. Hand in each lab's
notebook (`notebooks/<lab>/<lab>.ipynb`) as your course asks.
"""


def _other_labs(every: list[str], labs: list[str]):
    """shutil's ignore: the data of labs not handed out (and caches); data that belongs to no
    lab (sample traces) goes with every handout."""
    others = set(every) - set(labs)

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(SKIP(folder, names)) | {n for n in names if n in others}
    return ignore


def handout_problems(out: Path) -> list[str]:
    """What in ``out`` gives away a solution or a hidden test; empty when it is fit to hand out."""
    secret = {}
    for lab in paths.labs():
        solution, hidden = _secret_lines(lab)
        secret.update(dict.fromkeys(solution, f"a solution line of {lab}"))
        secret.update(dict.fromkeys(hidden, f"a hidden test of {lab}"))
    problems = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out)
        in_labs = rel.parts[0] in ("notebooks", "data")
        text = path.read_bytes().decode("utf-8", errors="replace")
        for line, what in secret.items():
            if (in_labs or what.startswith("a hidden")) and line in text:
                problems.append(f"{rel}: {what}: {line!r}")
    return problems


def _secret_lines(lab: str) -> tuple[set[str], set[str]]:
    """(solution lines, hidden-test lines) of ``lab``'s source, stripped, that its other text
    (teaching text, stubs, visible tests) does not also show; lines under 20 characters are too
    common to mean anything."""
    regions = {"solution": (notebooks.BEGIN_SOLUTION, notebooks.END_SOLUTION),
               "hidden": (notebooks.BEGIN_HIDDEN, notebooks.END_HIDDEN)}
    found = {kind: set() for kind in regions}
    elsewhere = []
    for cell in notebooks.source_notebook(lab).cells:
        inside = None
        for raw in cell.source.splitlines():
            line = raw.strip()
            starts = [k for k, (begin, _) in regions.items() if line == begin]
            if starts:
                inside = starts[0]
            elif inside and line == regions[inside][1]:
                inside = None
            elif inside:
                found[inside].add(line)
            else:
                elsewhere.append(line)
    shown = "\n".join(elsewhere)
    return tuple({line for line in found[k] if len(line) >= 20 and line not in shown}
                 for k in regions)


def _old_handout(folder: Path) -> bool:
    """A handout written before handouts carried their marker: the student README's title."""
    readme = folder / "README.md"
    return ((folder / "notebooks").is_dir() and readme.is_file()
            and readme.read_text(errors="replace").startswith(README.splitlines()[0] + "\n"))


def _claim(out: Path, force: bool) -> None:
    claim(out, "release", force, legacy=_old_handout,
          remedy="pass --force to replace it and everything in it with the handout")


def _labs_list(labs: list[str]) -> str:
    return "\n".join(f"- `notebooks/{lab}/{lab}.ipynb`" for lab in labs)


def release(out: Path, log=print, labs: list[str] | None = None, force: bool = False) -> Path:
    """Write the handout of ``labs`` (every lab: None) into ``out`` (replaced whole, and only
    once it passed its own check; a folder that is not a previous handout only with ``force``)."""
    root, every = paths.root(), paths.labs()
    unknown = sorted(set(labs or ()) - set(every))
    if unknown:
        raise ValueError(f"no lab {', '.join(unknown)} in this course: the labs are "
                         f"{', '.join(every)}")
    labs = sorted(set(labs)) if labs else every
    out = out.resolve()
    if out in (root, *root.parents) or (out.parent == root and out.name in COURSE_FOLDERS):
        raise ValueError(f"{out} would overwrite the course's own files: give a new folder, "
                         f"e.g. build/release")
    _claim(out, force)   # before the minutes of building, and again before replacing
    with tempfile.TemporaryDirectory(prefix="distlab-release-", dir=out.parent
                                     if out.parent.exists() else None) as tmp:
        stage = Path(tmp) / "handout"
        for lab, files in notebooks.build_student_notebooks(labs).items():
            notebooks.write_student_notebooks(lab, files, out=stage / "notebooks")
            log(f"  notebooks/{lab}/ ({', '.join(sorted(files))})")
        shutil.copytree(paths.data(), stage / "data", ignore=_other_labs(every, labs))
        student_package.write_package(stage, labs)
        log(f"  distlab/ (without the answers of {labs[0]} and every later lab)")
        for name in PROJECT_FILES:
            if (root / name).exists():
                shutil.copy2(root / name, stage / name)
        if (root / "cluster").is_dir():   # the sbatch scripts of the course's cluster programs
            shutil.copytree(root / "cluster", stage / "cluster", ignore=SKIP)
        (stage / "Makefile").write_text(MAKEFILE)
        (stage / "README.md").write_text(README.format(labs=_labs_list(labs)))
        mark(stage, "release")
        problems = handout_problems(stage)
        if problems:
            raise RuntimeError("the handout would give away solutions or hidden tests, so nothing "
                               "was written:\n  " + "\n  ".join(problems[:20]))
        _claim(out, force)
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(stage), out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="distlab release",
        description="Write the student handout into OUT: the student labs, the data their visible "
                    "tests read, the package, the environment and a student README; no solutions, "
                    "no hidden tests.")
    p.add_argument("out", type=Path, metavar="OUT",
                   help="the handout's folder. It is replaced whole only when it is a previous "
                        "handout (it holds .distlab-release) or with --force; another folder "
                        "with files in it is refused")
    p.add_argument("--lab", action="append", metavar="LAB",
                   help="hand out this lab (repeatable; default: every lab). The package holds "
                        "no answer to it or to any later lab; earlier labs' implementations stay.")
    p.add_argument("--force", action="store_true",
                   help="replace OUT even if it is not a previous handout (everything in it is "
                        "deleted)")
    args = p.parse_args(argv)
    try:
        out = release(args.out, labs=args.lab, force=args.force)
    except (RuntimeError, ValueError, FileNotFoundError) as exc:
        print(f"distlab release: {exc}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote the handout to {out} ({size / 1e6:.1f} MB): hand out this folder; keep "
          f"solutions/, grader/ and tests/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
