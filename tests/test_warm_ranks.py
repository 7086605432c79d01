"""The judge's ranks start warm: its zygote imports the checks once, so that no rank of a check
imports them again (distlab.grading.settings.rank_modules, DISTLAB_ZYGOTE_PRELOAD)."""
from __future__ import annotations

import sys

from distlab.grading.settings import GradingSettings, rank_modules
from distlab.runtime.launch import Launcher, LaunchSettings


def _imported(rank, world_size, names):
    return [name in sys.modules for name in names]


def test_the_judges_launcher_preloads_every_checks_module(tmp_path):
    ranks = GradingSettings().launch_settings(str(tmp_path), confine=False)
    assert ranks.preload == rank_modules()
    assert "distlab.grading.judge" in ranks.preload  # Submitted calls unpickle its _call
    assert {"distlab.checks.lab01", "distlab.checks.lab07"} <= set(ranks.preload)
    assert ranks.zygote_env()["DISTLAB_ZYGOTE_PRELOAD"].split(":")[0] == "distlab.grading.judge"


def test_ranks_of_a_preloading_zygote_find_the_modules_imported(tmp_path):
    names = ["distlab.checks.lab01", "distlab.grading.judge"]
    cold, warm = Launcher(LaunchSettings()), Launcher(LaunchSettings(preload=tuple(names)))
    try:
        # _imported travels by reference to this test module, which imports neither module
        assert cold.run(_imported, 1, names, backend="gloo")[0] == [False, False]
        assert warm.run(_imported, 2, names, backend="gloo") == [[True, True], [True, True]]
    finally:
        cold.close()
        warm.close()
