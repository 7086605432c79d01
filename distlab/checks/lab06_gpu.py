"""Lab 6's Exercise 5 (served by ``distlab.checks.lab06``): the course's measures on the real GPU
traces shipped under data/traces, the hint each answer's failure gives, and the grading."""
from __future__ import annotations

from distlab.checks.assertions import CheckFailed

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


def grade_gpu_answers(answers, stored: dict, rel: float, close) -> str:
    """``answers`` against the ``stored`` references (``close(got, expected)``: within ``rel``,
    relative); on a pass, the line that shows the student's figures and how near they came."""
    if not isinstance(answers, dict) or set(answers) != set(GPU_KEYS):
        raise CheckFailed(f"gpu_answers must be a dict with the keys {list(GPU_KEYS)}, got "
                          f"{answers!r:.200}.")
    worst, yours = 0.0, {}
    for key in GPU_KEYS:
        got, exp = answers[key], stored[key]
        got_list = got if isinstance(got, (list, tuple)) else [got]
        exp_list = exp.tolist() if exp.dim() else [exp.item()]
        try:
            got_list = [float(v) for v in got_list]
        except (TypeError, ValueError):
            raise CheckFailed(f"gpu_answers[{key!r}] must be a number (or one per rank), got {got!r:.100}.")
        if len(got_list) != len(exp_list) or not all(close(g, e) for g, e in zip(got_list, exp_list)):
            raise CheckFailed(f"gpu_answers[{key!r}]: expected {exp_list if len(exp_list) > 1 else exp_list[0]:}, "
                              f"got {got}. {GPU_HINTS[key]}")
        worst = max([worst] + [abs(g - e) / abs(e) if e else abs(g) for g, e in zip(got_list, exp_list)])
        yours[key] = got_list
    exposed = " and ".join(f"{s * 1e3:.6g} ms" for s in yours["nsys_exposed_comm_s"])
    return (f"gpu_answers: your A100 overlap fraction {yours['a100_overlap_fraction'][0]:.6g} and NCCL "
            f"share {yours['a100_nccl_share'][0]:.6g} (rank 0), the nsys export's exposed "
            f"communication {exposed} (by rank): each the course's measure on the shipped traces, "
            f"off by at most {worst:.2g} relative (allowed {rel:g})")
