"""Lab 9 (expert parallelism) top to bottom in a fresh kernel, as a self-learner runs it: the
solutions in place, no hidden tests (``distlab.course.notebooks.reader_notebook``).

    python bench/lab09.py [--save OUT.ipynb]   # prints seconds per cell and the total; target < 90 s on 2 cores

No assertions: read the numbers (and the load of the machine, printed beside them).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

LAB = "09_expert_parallel"


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args()
    import nbformat
    from nbclient import NotebookClient
    from distlab.course.notebooks import reader_notebook
    from distlab.labs.tables import format_table

    nb = reader_notebook(LAB)
    times: dict[int, float] = {}
    started: dict[str, float] = {}

    def on_start(cell, cell_index, **_):
        started["t"] = time.perf_counter()

    def on_complete(cell, cell_index, **_):
        times[cell_index] = time.perf_counter() - started["t"]

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        client = NotebookClient(nb, timeout=600, kernel_name="python3", on_cell_start=on_start,
                                on_cell_executed=on_complete, resources={"metadata": {"path": tmp}})
        t0 = time.perf_counter()
        client.execute()
        total = time.perf_counter() - t0
    if args.save:
        nbformat.write(nb, args.save)
    rows = [{"cell": i, "grade_id": nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", ""),
             "seconds": f"{s:.2f}"} for i, s in sorted(times.items()) if s >= 0.05]
    print(format_table(rows))
    print(f"\n{LAB}: {total:.1f} s in a fresh kernel (kernel start included); "
          f"{os.cpu_count()} cores, load average {load:.2f} before the run")


if __name__ == "__main__":
    main()
