"""Lab 12, Section 5's figures: the Llama 3 numbers worked through (each figure the lab's text
states, computed here from the paper's counts), the table that sets a prediction beside the
simulated run, and Section 6's save costs measured on real ranks."""
import math
import re

import pytest

from distlab import paths
from distlab.labs.checkpoint import interval_views, llama3
from distlab.labs.checkpoint.interval import lost_fraction, lost_fraction_first_order, young_period

LAB = "12_checkpoint_restart"


def _source() -> str:
    return paths.lab_source(LAB).read_text()


def test_the_jobs_mtbf_from_table_5():
    assert llama3.job_mtbf() == 54 * 86400 / 466
    assert llama3.gpu_mtbf_years() == pytest.approx(llama3.job_mtbf() * 16384 / (365.25 * 86400))
    assert llama3.CHECKPOINT_BYTES == 405e9 * 12


def test_the_figures_the_text_states():
    """Every number the lab's text gives about Llama 3 is the code's, rounded as written."""
    text = _source()
    mtbf = llama3.job_mtbf()
    assert f"{mtbf / 3600:.1f} hours" == "2.8 hours" and "every 2.8 hours" in text
    assert f"{600 / mtbf:.0%}" == "6%" and "at 10 minutes,\n# 6%" in text
    row = llama3.plan_row(lost_fraction, 5.0, 60.0)
    assert round(row["write_GBps"] / 1000) == 1 and "about 1 TB/s" in text     # a 5 s save
    assert 10 <= row["per_gpu_MBps"] < 100 and "tens of MB/s per GPU" in text
    assert round(llama3.CHECKPOINT_BYTES / 1e12) == 5 and "~5 TB" in text
    assert 419 / 466 < 1 and "466 job interruptions" in text and "419 were unexpected" in text
    # the prediction's cases, M of 1 to 8 days: "a few hundred to two thousand GPUs"
    gpus = [llama3.gpu_mtbf_years() * 365.25 * 86400 / (days * 86400) for days in (1, 8)]
    assert 1500 < gpus[0] <= 2000 and 200 < gpus[1] < 300
    assert "a job of a few hundred to two\n# thousand GPUs" in text
    # "restarts of a minute or two and saves of seconds": 3% needs both
    assert 1 < llama3.largest_save(lost_fraction, 0.03, 60.0) < 10
    assert llama3.largest_save(lost_fraction, 0.03, 600.0) == 0.0


def test_the_largest_save_meets_its_target():
    for restart, target in ((60.0, 0.03), (300.0, 0.05), (60.0, 0.05)):
        save = llama3.largest_save(lost_fraction, target, restart)
        assert save > 0
        tau = young_period(save, llama3.job_mtbf())
        assert lost_fraction(tau, save, restart, llama3.job_mtbf()) == pytest.approx(target,
                                                                                    rel=1e-6)


def test_the_llama3_view_runs_with_any_model():
    shown = interval_views.llama3_figures(lost_fraction_first_order)
    assert "MTBF is 2.78 h" in shown and "16,384 GPUs" in shown
    assert len(llama3.llama3_table(lost_fraction)) == 6


def test_the_measurement_table_sets_the_model_beside_the_simulation():
    shown = interval_views.prediction_beside_simulation(lost_fraction, segments=4000)
    apart = [float(x) for x in re.findall(r"([+-]\d+\.\d)\s*$", shown, re.MULTILINE)]
    assert len(apart) == len(interval_views.MEASURED_CASES)
    assert all(abs(a) < 4 for a in apart), shown
    # first order drifts where failures are frequent: the text's "it drifts"
    first = interval_views.prediction_beside_simulation(lost_fraction_first_order,
                                                        segments=4000)
    last = float(re.findall(r"([+-]\d+\.\d)\s*$", first, re.MULTILINE)[-1])
    assert last > 4, first


def test_save_costs_measured_on_ranks(tmp_path):
    from distlab.labs.checkpoint.run_state import RunSpec
    from distlab.labs.checkpoint.save_costs import measure_save_costs
    costs = measure_save_costs(2, repeats=1, spec=RunSpec(), where=str(tmp_path))
    assert set(costs) == {"blocking", "async_stall", "async_write", "load"}
    assert all(v > 0 and math.isfinite(v) for v in costs.values())
    assert list(tmp_path.iterdir()) == []          # the checkpoints removed
    problem = interval_views.measured_problem(costs, mtbf=2.0)
    shown = interval_views.plan_on_measured(lambda *a: (0.2, "async"), problem, checkpoints=500)
    assert "(yours)" in shown and "blocking" in shown
