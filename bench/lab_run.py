"""Labs top to bottom in a fresh kernel, as the site and a self-learner run them: the solutions in
place, no hidden tests (``distlab.course.notebooks.reader_notebook``), in a scratch copy of the
lab's folder. Prints each lab's costliest cells, in wall seconds and in CPU-seconds of the kernel
and every process under it (its ranks, their zygote), the totals, and the machine's load.

    python bench/lab_run.py --lab 10_context_parallel [--save OUT.ipynb]
    python bench/lab_run.py --lab all            # every lab, then one line per lab

The target: under 90 s on a 2-core machine. CPU-seconds are the figure to compare on a shared
machine (wall time stretches with the load, CPU time much less). No assertions: read the numbers.
Every lab runs two or three times in `make test` (the site, the student package, the browser), so
a CPU-second cut from a lab's run saves one to one and a half seconds of the suite's wall time on
two cores. ``bench/labNN.py`` runs lab NN.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

TOP = 10   # cells shown per lab


def tree_cpu() -> float:
    """CPU-seconds of every process under this one (the kernel, its zygote, their ranks): each
    live process's own time plus what its ended children left it."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:   # ended between the listing and the read: counted by its parent
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def run(lab: str, save: str | None = None) -> dict:
    """Execute ``lab``; {"cells": [(wall, cpu, grade_id)], "wall", "cpu", "start_cpu", "load"}."""
    import nbformat
    from nbclient import NotebookClient
    from distlab.course import notebooks

    nb = notebooks.reader_notebook(lab)
    before: dict[int, tuple[float, float]] = {}
    after: dict[int, tuple[float, float]] = {}

    def started(cell, cell_index, **_):
        before[cell_index] = (time.perf_counter(), tree_cpu())

    def executed(cell, cell_index, **_):
        after[cell_index] = (time.perf_counter(), tree_cpu())

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix=f"bench-{lab}-") as tmp:
        cwd = notebooks.write_source(lab, Path(tmp)).parent
        client = NotebookClient(nb, timeout=600, kernel_name="python3", on_cell_start=started,
                                on_cell_executed=executed,
                                resources={"metadata": {"path": str(cwd)}})
        client.execute()
    if save:
        nbformat.write(nb, save)
    cells = [(after[i][0] - before[i][0], after[i][1] - before[i][1],
              nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", f"cell {i}"))
             for i in sorted(before) if i in after]
    first = min(before)
    return {"cells": cells, "wall": sum(c[0] for c in cells), "cpu": sum(c[1] for c in cells),
            "start_cpu": before[first][1], "load": load}


def show(lab: str, result: dict) -> None:
    print(f"\n{lab}  (load average {result['load']:.2f} before the run, {os.cpu_count()} cores)")
    print(f"{'cell':<32} {'wall s':>7} {'CPU s':>7}")
    for wall, cpu, gid in sorted(result["cells"], key=lambda c: -c[1])[:TOP]:
        print(f"{gid:<32} {wall:>7.1f} {cpu:>7.1f}")
    print(f"{'all cells (kernel start excluded)':<32} {result['wall']:>7.1f} {result['cpu']:>7.1f}")
    print(f"{'kernel start':<32} {'':>7} {result['start_cpu']:>7.1f}")


def main(lab: str | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default=lab, required=lab is None, help="a lab's name, or all")
    parser.add_argument("--save", help="write the executed notebook here (one lab)")
    args = parser.parse_args()
    from distlab.course import notebooks

    labs = notebooks.labs() if args.lab == "all" else [args.lab]
    results = {}
    for name in labs:
        results[name] = run(name, args.save if len(labs) == 1 else None)
        show(name, results[name])
    if len(labs) > 1:
        print(f"\n{'lab':<32} {'wall s':>7} {'CPU s':>7} {'load':>5}")
        for name, r in results.items():
            print(f"{name:<32} {r['wall']:>7.1f} {r['cpu']:>7.1f} {r['load']:>5.1f}")
        print(f"{'all labs':<32} {sum(r['wall'] for r in results.values()):>7.1f} "
              f"{sum(r['cpu'] for r in results.values()):>7.1f}")


if __name__ == "__main__":
    main()
