"""Lab 11's schedules on paper, the course's tables beside torch's own: bubble, step length, peak
activations and messages per step, from ``replay`` with t_F = t_B = t_W = 1 for a rank's share of
the layers (a stage of v per rank takes 1/v; a whole backward costs t_B + t_W).

    python bench/lab11_schedules.py [P M]      (default: p = 4, m = 8; v = 2 where a schedule has
                                                virtual stages)
"""
import sys

from distlab.labs.pipeline import tables
from distlab.labs.pipeline.compare import compare_tables
from distlab.labs.pipeline.torch_tables import TORCH_SCHEDULES, torch_table


def main(argv):
    p, m = (int(a) for a in argv) if argv else (4, 8)
    schedules = {
        "1F1B (course)": (tables.one_f_one_b(p, m), list(range(p))),
        "interleaved 1F1B v=2 (course)": (tables.interleaved_1f1b(p, m, 2), tables.round_robin(p, 2)),
        "ZB-H1 (course)": (tables.zb_h1(p, m), list(range(p))),
        "ZB-V (course)": (tables.zb_v(p, m), tables.v_shape(p)),
        "ZB1P v=1 (torch)": torch_table("ScheduleInterleavedZeroBubble", p, m, v=1),
    }
    schedules.update({f"{name[8:]} (torch)": torch_table(name, p, m, v=2) for name in TORCH_SCHEDULES})
    print(f"p = {p}, m = {m}; t_F = t_B = t_W = 1")
    print(compare_tables(schedules))


if __name__ == "__main__":
    main(sys.argv[1:])
