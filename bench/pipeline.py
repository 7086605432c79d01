"""Step time and bubble of naive / GPipe / 1F1B (the lab's own solutions) and of
torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B, on real ranks.

    python bench/pipeline.py                      # p = 2 and 4, m = 4 and 8, gloo on CPU
    python bench/pipeline.py --stages 2 --micro 8 --hidden 1024 --repeats 5

For each (p, m) one launch runs every schedule: a warm-up step, then ``--repeats`` timed steps;
the table reports the median step time and the bubble of that median step, measured from the
forward/backward events every stage recorded, each with the spread over the steps (min-max),
next to (p-1)/(m+p-1). On a machine with fewer
cores than ranks, ranks share cores and the measured bubble says more about the CPU than about
the schedule.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from distlab.course.solutions import solution_functions  # noqa: E402
from distlab.labs.pipeline import PipeSpec, library_step, run_schedules, schedule_table  # noqa: E402


def measure(p: int, m: int, spec: PipeSpec, repeats: int) -> dict:
    sol = solution_functions("05_pipeline_parallel", ("partition", "naive_step", "gpipe_step",
                                                       "one_f_one_b_step"))
    schedules = {"naive": (sol["naive_step"], None), "GPipe": (sol["gpipe_step"], m),
                 "1F1B": (sol["one_f_one_b_step"], m),
                 "torch GPipe": (library_step("ScheduleGPipe"), m),
                 "torch 1F1B": (library_step("Schedule1F1B"), m)}
    # one launch: a warm-up step, then ``repeats`` timed steps; each run keeps its median step
    return run_schedules(schedules, p, spec, warmup=1, steps=repeats, timeout=300)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--micro", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    spec = PipeSpec(num_layers=args.layers, hidden=args.hidden, batch=args.batch, seed=0)
    print(f"model: {args.layers} blocks of width {args.hidden}, batch {args.batch}, "
          f"{os.cpu_count()} CPU cores, median of {args.repeats} steps\n")
    for p in args.stages:
        for m in args.micro:
            print(schedule_table(measure(p, m, spec, args.repeats), spec))
            print()


if __name__ == "__main__":
    main()
