"""Lab 11's executor: schedule tables run on real ranks (gloo, isend/irecv) give the single-process
loss and gradients. In float64: the issue's 1e-6 is then far above the order of sums (about 1e-14
here), and far below the gradients' size (every parameter's largest |gradient| is over 1 here)."""
import pytest
import torch

from distlab.labs.pipeline import PipeSpec, tables
from distlab.labs.pipeline.executor import run_tables, single_process_step, table_error
from distlab.labs.pipeline.torch_tables import torch_table

TOL = 1e-6   # the figure
SPEC = PipeSpec(num_layers=8, hidden=16, batch=16, seed=3)


@pytest.fixture(scope="module")
def runs():
    p, m = 2, 4
    return run_tables({
        "1f1b": (tables.one_f_one_b(p, m), [0, 1]),
        "interleaved": (tables.interleaved_1f1b(p, m, 2), tables.round_robin(p, 2)),
        "zb_h1": (tables.zb_h1(p, m), [0, 1]),
        "zb_v": (tables.zb_v(p, m), tables.v_shape(p)),
        "torch ZBV": torch_table("ScheduleZBVZeroBubble", p, m, 2),
        "torch DualPipeV": torch_table("ScheduleDualPipeV", p, m, 2),
        "zb_h1, a W left out": ([row[:-1] if r == 0 else row
                                 for r, row in enumerate(tables.zb_h1(p, m))], [0, 1]),
    }, SPEC, m, dtype=torch.float64, timeout=120)


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb_h1", "zb_v", "torch ZBV",
                                  "torch DualPipeV"])
def test_a_table_run_on_ranks_matches_one_process(runs, name):
    loss_error, grad_error = table_error(runs[name], SPEC, torch.float64)
    assert loss_error <= TOL and grad_error <= TOL
    assert set(runs[name]["grads"]) == set(single_process_step(SPEC, torch.float64)[1])


def test_a_backward_without_its_w_is_the_whole_backward(runs):
    """Rank 0's last W left out of ZB-H1: its B then computes the weights' gradient too (the
    table's convention, as ``replay`` times it), and the gradients still match."""
    assert table_error(runs["zb_h1, a W left out"], SPEC, torch.float64)[1] <= TOL


def test_tables_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match=r"run on \[2, 3\] ranks"):
        run_tables({"a": (tables.zb_h1(2, 4), [0, 1]), "b": (tables.zb_h1(3, 4), [0, 1, 2])})
