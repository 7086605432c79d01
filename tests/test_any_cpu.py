"""data/ holds up on any CPU torch supports, not only on the one that wrote it.

Torch picks its CPU kernels by instruction set (AVX-512, AVX2, NEON, none): sums round in another
order and float32 random draws come out a few ulps apart, so every value a test or a check
recomputes and compares with data/ differs in its last bits from one machine to the next.
``ATEN_CPU_CAPABILITY=default`` makes this machine's torch use its plain C++ kernels, the ones
furthest from the vectorised kernels that wrote data/ (and the ones an ARM laptop runs): what
passes under it passes on a student's or an instructor's machine.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AS_ON_ANOTHER_CPU = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
# The kernels torch picked, on the first line, then `python -m pytest ARGS` in the same process.
PROBE_THEN_PYTEST = ("import sys, torch, pytest; "
                     "print(torch.backends.cpu.get_cpu_capability(), flush=True); "
                     "sys.exit(pytest.main(sys.argv[1:]))")


@pytest.mark.timeout(1500)
def test_stored_data_comparisons_pass_as_on_another_cpu():
    """The tests marked ``stored_data``, in a pytest of their own under ATEN_CPU_CAPABILITY=default.
    They are the comparisons with data/ that depend on the CPU, and only those (a few seconds
    each, about 2 minutes in all on an idle 2-core machine, against 37 for the whole suite):
    every stored set against a fresh make_references() (test_notebooks.py), Lab 2's table and its
    stored AdamW and DDP runs, and the visible checks that compare a correct solution with stored
    outputs (Labs 2, 4, 8, 9, 10), where a too tight tolerance would fail a student's right answer.
    Not the notebook executions nor the grading runs: they read the same data through the same
    checks."""
    # One interpreter says which kernels torch picked, then runs the pytest (a probe of its own
    # would import torch once more, for nothing).
    args = ["-n", "0", "-q", "-p", "no:cacheprovider", "-m", "stored_data", *marking_stored_data()]
    done = subprocess.run([sys.executable, "-c", PROBE_THEN_PYTEST, *args], cwd=ROOT,
                          env=AS_ON_ANOTHER_CPU, capture_output=True, text=True, timeout=1400)
    probed = done.stdout.split("\n", 1)[0].strip()
    assert probed == "DEFAULT", f"torch ignored ATEN_CPU_CAPABILITY: {done.stdout[:2000]}" \
                                f"\n{done.stderr[-2000:]}"
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and re.search(r"\d+ passed", summary) \
        and not re.search(r"failed|error|skipped", summary), \
        f"with ATEN_CPU_CAPABILITY=default:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"


def marking_stored_data() -> list[str]:
    """The test modules that may mark a test ``stored_data``: every one that names the marker as
    an attribute (``pytest.mark.stored_data``, ``mark.stored_data``) or a string (``getattr``,
    ``-m``), whatever the way (decorator, ``pytestmark``, a ``pytest.param``'s marks). Collecting
    only these, not the whole suite, costs the pytest above about 7 CPU-s instead of 15; a module
    that matches but marks nothing is only collected."""
    marker = re.compile(r"\.\s*stored_data\b|[\"']stored_data[\"']")
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if p.name != Path(__file__).name and marker.search(p.read_text()))
