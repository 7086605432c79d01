"""The judge's ranks start warm: its zygote imports the checks once, so that no rank of a check
imports them again, and of PyTorch's parallel APIs only what the graded labs' ranks use
(distlab.grading.settings.rank_modules, RANK_IMPORTS, DISTLAB_ZYGOTE_PRELOAD)."""
from __future__ import annotations

import sys

import types

import pytest

import distlab.checks
from distlab.grading.settings import GradingSettings, rank_modules, rank_torch_modules
from distlab.runtime import entry_hooks
from distlab.runtime.launch import Launcher, LaunchSettings
from distlab.runtime.zygote import TORCH_EXTRAS


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


def test_the_judge_preloads_the_torch_modules_its_labs_name_and_all_for_one_that_names_none(
        monkeypatch):
    lab1, lab7 = "01_collectives", "07_3d_parallelism"
    assert distlab.checks.checks_module(lab1).RANK_IMPORTS == ()
    torch_part = lambda labs: [m for m in rank_modules(labs) if m.startswith("torch.")]
    assert torch_part((lab1,)) == []
    assert torch_part((lab1, lab7)) == list(distlab.checks.checks_module(lab7).RANK_IMPORTS)
    assert GradingSettings().launch_settings("/tmp", False, (lab1,)).preload == rank_modules((lab1,))
    # what the worker asks its kernels' server to import for the zygotes: the same torch part
    assert rank_torch_modules((lab1,)) == ()
    assert list(rank_torch_modules((lab1, lab7))) == torch_part((lab1, lab7))
    undeclared = types.SimpleNamespace()   # a new lab's checks module that names nothing
    monkeypatch.setattr(distlab.checks, "checks_module", lambda lab: undeclared)
    assert torch_part(("10_new_lab",)) == list(TORCH_EXTRAS)
    assert rank_torch_modules(("10_new_lab",)) == TORCH_EXTRAS


def test_a_zygote_told_what_to_preload_imports_no_other_torch_extras():
    lean, default = Launcher(LaunchSettings(preload=())), Launcher(LaunchSettings())
    try:
        names = list(TORCH_EXTRAS)
        assert lean.run(_imported, 1, names, backend="gloo")[0] == [False] * len(names)
        assert default.run(_imported, 1, names, backend="gloo")[0] == [True] * len(names)
    finally:
        lean.close()
        default.close()


def _builds_an_optimizer(rank, world_size):
    import torch
    warm = "torch._dynamo" in sys.modules
    torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
    return warm, "torch._dynamo" in sys.modules


def test_ranks_that_build_an_optimizer_find_what_it_imports_preloaded():
    """An optimizer's constructor imports torch._dynamo (most of a second a rank): the labs whose
    ranks build one name it, so that their judge's zygote imports it once."""
    for lab in ("02_data_parallel", "06_timelines", "07_3d_parallelism", "08_sharded_data_parallel"):
        assert "torch._dynamo" in distlab.checks.checks_module(lab).RANK_IMPORTS, lab
    bare = Launcher(LaunchSettings(preload=()))
    judge = Launcher(LaunchSettings(preload=rank_modules(("02_data_parallel",))))
    try:
        assert bare.run(_builds_an_optimizer, 1, backend="gloo")[0] == (False, True)
        assert judge.run(_builds_an_optimizer, 1, backend="gloo")[0] == (True, True)
    finally:
        bare.close()
        judge.close()


def _prepared(rank, world_size):
    from distlab.runtime import call_guard
    return sorted({name for _, name in call_guard._with_entry})


@pytest.mark.skipif(not entry_hooks.SUPPORTED, reason="CPython 3.11's bytecode only")
def test_a_zygote_told_the_guarded_names_prepares_its_ranks_watch(tmp_path):
    """The judge names its labs' guarded code to its zygotes, which make the code that calls in
    once before they fork: a rank's watch installs it rather than rewriting ~30 functions."""
    from distlab.checks.course_code import guard_of
    lab = "03_tensor_parallel_mlp"
    module = distlab.checks.checks_module(lab)
    named = {name for check in module.COURSE_CODE
             if (guard := guard_of(getattr(module, check))) is not None for name in guard.guarded}
    assert set(GradingSettings().launch_settings(str(tmp_path), False, (lab,)).guarded) == named
    union = "distlab.labs.timelines.intervals:union"
    cold, told = Launcher(LaunchSettings()), Launcher(LaunchSettings(guarded=(union,)))
    try:
        assert cold.run(_prepared, 1, backend="gloo")[0] == []
        assert told.run(_prepared, 2, backend="gloo") == [[union], [union]]
    finally:
        cold.close()
        told.close()


def test_the_judge_preloads_the_torch_modules_its_labs_guards_name():
    """A guarded rank resolves every name of its check's guard as it starts, importing its
    module: Lab 11's guard names PyTorch's pipeline schedules, whose import pulls in
    torch._dynamo; the zygote imports them once instead of every rank."""
    from distlab.checks.course_code import guard_of
    lab = "11_pipeline_schedules"
    module = distlab.checks.checks_module(lab)
    named = {name.partition(":")[0] for check in module.COURSE_CODE
             if (guard := guard_of(getattr(module, check))) is not None
             for name in guard.guarded if name.startswith("torch.")}
    assert "torch.distributed.pipelining.schedules" in named
    assert named <= set(rank_torch_modules((lab,))) <= set(rank_modules((lab,)))
