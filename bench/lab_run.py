"""One lab top to bottom in a fresh kernel, as the site and a self-learner run it: the solutions in
place, no hidden tests (``distlab.course.notebooks.reader_notebook``), in a scratch copy of the
lab's folder. Prints the slowest cells, the total, and the machine's load beside them.

    python bench/lab_run.py --lab 10_context_parallel [--save OUT.ipynb]

The target: under 90 s on a 2-core machine. No assertions: read the numbers (the machine is
shared; compare runs side by side). ``bench/labNN.py`` runs lab NN.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main(lab: str | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default=lab, required=lab is None)
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args()
    import nbformat
    from nbclient import NotebookClient
    from distlab.course import notebooks

    nb = notebooks.reader_notebook(args.lab)
    stamps: dict[int, float] = {}

    def started(cell, cell_index, **_):
        stamps[cell_index] = time.perf_counter()

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.lab}-") as tmp:
        cwd = notebooks.write_source(args.lab, Path(tmp)).parent
        client = NotebookClient(nb, timeout=600, kernel_name="python3", on_cell_start=started,
                                resources={"metadata": {"path": str(cwd)}})
        start = time.perf_counter()
        client.execute()
        total = time.perf_counter() - start
    if args.save:
        nbformat.write(nb, args.save)
    order = sorted(stamps)
    ends = [stamps[j] for j in order[1:]] + [start + total]
    rows = sorted(((ends[k] - stamps[i], nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", "?"))
                   for k, i in enumerate(order)), reverse=True)
    print(f"{'cell':<28} {'seconds':>8}")
    for seconds, gid in rows[:10]:
        print(f"{gid:<28} {seconds:>8.1f}")
    print(f"{'total (kernel start excluded)':<28} {total:>8.1f}")
    print(f"\n{args.lab}: {total:.1f} s; {os.cpu_count()} cores, load average {load:.2f} before "
          f"the run")


if __name__ == "__main__":
    main()
