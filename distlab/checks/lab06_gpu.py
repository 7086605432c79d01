"""Lab 6's Exercise 5 (served by ``distlab.checks.lab06``): the course's measures on the real GPU
traces shipped under data/traces, and the hint each answer's failure gives."""
from __future__ import annotations

GPU_KEYS = ("a100_overlap_fraction", "a100_nccl_share", "nsys_exposed_comm_s")


def gpu_answers(reference_overlap_fraction, reference_comm_share, reference_exposed_comm) -> dict:
    """The given measures (``lab06``'s references) run on the shipped files."""
    from distlab.labs.timelines.gpu_traces import a100_timeline, gpu_window, nsys_timeline
    a100, export = a100_timeline(), nsys_timeline()
    return {"a100_overlap_fraction": reference_overlap_fraction(a100, 0),
            "a100_nccl_share": reference_comm_share(a100, 0, gpu_window(a100, 0)),
            "nsys_exposed_comm_s": [reference_exposed_comm(export, r, gpu_window(export, r))
                                    for r in range(export.world_size)]}


GPU_HINTS = {
    "a100_overlap_fraction": "overlap_fraction(a100, 0): 1 - exposed / NCCL time, over the "
                             "trace's one step range.",
    "a100_nccl_share": "comm_share(a100, 0, gpu_window(a100, 0)): NCCL kernel time over the "
                       "window, intervals merged (kernels of two streams can overlap).",
    "nsys_exposed_comm_s": "[exposed_comm(export, r, gpu_window(export, r)) for r in range(2)]: "
                           "seconds of NCCL kernels with no other kernel running."}
