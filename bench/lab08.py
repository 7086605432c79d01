"""Lab 8 top to bottom in a fresh kernel, as the site and a student run it: seconds per cell and
in all (the target: under 90 s on a 2-core machine).

    .venv/bin/python bench/lab08.py [--lab 08_sharded_data_parallel]

Executes the solution version (every cell, teaching cells included) with nbclient in a scratch
copy of the lab's folder, then prints the slowest cells and the total.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from distlab.course import notebooks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="08_sharded_data_parallel")
    args = parser.parse_args()
    from nbclient import NotebookClient
    nb = notebooks.reader_notebook(args.lab)
    stamps: dict[int, float] = {}

    def started(cell, cell_index, **_):
        stamps[cell_index] = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix=f"bench-{args.lab}-") as tmp:
        cwd = notebooks.write_source(args.lab, Path(tmp)).parent
        client = NotebookClient(nb, timeout=600, kernel_name="python3", on_cell_start=started,
                                resources={"metadata": {"path": str(cwd)}})
        start = time.perf_counter()
        client.execute()
        total = time.perf_counter() - start
    order = sorted(stamps)
    ends = [stamps[j] for j in order[1:]] + [start + total]
    rows = sorted(((ends[k] - stamps[i], nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", "?"))
                   for k, i in enumerate(order)), reverse=True)
    print(f"{'cell':<28} {'seconds':>8}")
    for seconds, gid in rows[:10]:
        print(f"{gid:<28} {seconds:>8.1f}")
    print(f"{'total (kernel start excluded)':<28} {total:>8.1f}")


if __name__ == "__main__":
    main()
