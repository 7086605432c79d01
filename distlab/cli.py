"""The ``distlab`` command: ``distlab doctor | grade | merge | build | references | release | site``."""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "doctor": ("distlab.course.doctor", "check this machine: versions, backends, GPUs, a 2-rank smoke test"),
    "grade": ("distlab.grading.grade", "autograde a folder of submissions into scores.csv and feedback"),
    "merge": ("distlab.grading.merge", "merge the work directories of sharded grading runs (grade --shard)"),
    "build": ("distlab.course.notebooks", "regenerate the student labs in notebooks/ (and nbgrader's course) from solutions/"),
    "references": ("distlab.course.references", "rebuild the reference outputs in data/"),
    "release": ("distlab.course.release", "write the student handout (labs, data, package; no solutions) into OUT"),
    "site": ("distlab.course.site", "run every lab and render the course as a static HTML site in build/site/"),
}


def usage() -> str:
    lines = ["usage: distlab COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"distlab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    from distlab.grading.imports import skip_slow_imports
    skip_slow_imports()  # seconds of nbformat's import, in every command that reads notebooks
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
