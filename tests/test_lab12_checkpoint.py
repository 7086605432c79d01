"""Lab 12's checkpoints on real ranks (FSDP2 on gloo): a resume is bit-identical to the run it
interrupts, and only because every part of the state is restored; a checkpoint of 4 ranks loads on
2 and back on 4; a folder that cannot be loaded whole is refused, naming the file."""
import os
import shutil

import pytest
import torch

import distlab
from distlab.labs.checkpoint.layout import (files_written, merge_rank_folders, tensor_chunks,
                                            writers)
from distlab.labs.checkpoint.refusals import CheckpointRefused, checked_folder
from distlab.labs.checkpoint.run_state import RunSpec
from distlab.labs.checkpoint.runs import FORGETTABLE, reshard, resume_beside
from distlab.labs.checkpoint.saving import save_checkpoint

STEPS, SAVE_AT = 6, 3    # on 2 ranks an epoch is 2 steps: the resume reshuffles at step 5


def _resumes(rank, world_size, root):
    """One launch: a full resume, then one resume per part of the state left out."""
    return {forget: resume_beside(rank, world_size, os.path.join(root, "-".join(forget) or "all"),
                                  STEPS, SAVE_AT, forget=forget)
            for forget in [(), *((part,) for part in FORGETTABLE)]}


@pytest.fixture(scope="module")
def resumes(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab12-resume")
    out = distlab.run(_resumes, 2, str(root), timeout=240)
    yield out
    shutil.rmtree(root)


def test_a_resume_from_an_async_save_is_bit_identical(resumes):
    for rank in range(2):
        run = resumes[rank][()]
        assert len(run["resumed"]) == STEPS - SAVE_AT
        # the same float64 numbers, not close ones: the same computation on the same state
        assert run["resumed"] == run["uninterrupted"]
        for name, value in run["params"].items():
            assert torch.equal(run["resumed_params"][name], value), name
    assert resumes[0][()]["params"].keys() == dict(RunSpec().model().named_parameters()).keys()


@pytest.mark.parametrize("part", FORGETTABLE)
def test_each_part_of_the_state_is_needed(resumes, part):
    run = resumes[0][(part,)]
    assert run["resumed"] != run["uninterrupted"], f"leaving out {part} changed nothing"


def _reshard_all(tmp):
    """4 ranks train 2 steps and save; 2 ranks try a broken copy (refused), load the 4 ranks'
    checkpoint and save it; 4 ranks load that."""
    four, two = os.path.join(tmp, "four"), os.path.join(tmp, "two")
    first = distlab.run(reshard, 4, steps=2, target=four, timeout=240)
    broken = os.path.join(tmp, "broken")
    shutil.copytree(os.path.join(four, "step_000002"), broken)
    os.unlink(os.path.join(broken, "__3_0.distcp"))
    second = distlab.run(reshard, 2, source=os.path.join(four, "step_000002"), target=two,
                         broken=broken, timeout=240)
    third = distlab.run(reshard, 4, source=second[0]["saved"], timeout=240)
    return first, second, third


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab12-reshard")
    yield (*_reshard_all(str(tmp)), str(tmp))
    shutil.rmtree(tmp)


def _assert_same(got: dict, expected: dict, what: str):
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{what}: {name}"


def test_four_ranks_checkpoint_loads_on_two_and_back_on_four(resharded):
    first, second, third, _ = resharded
    for rank in range(2):
        _assert_same(second[rank]["params"], first[0]["params"], "4 -> 2 parameters")
        _assert_same(second[rank]["optimizer"], first[0]["optimizer"], "4 -> 2 optimizer")
    for rank in range(4):
        _assert_same(third[rank]["params"], second[0]["params"], "2 -> 4 parameters")
        _assert_same(third[rank]["optimizer"], second[0]["optimizer"], "2 -> 4 optimizer")
    assert any(k.endswith("exp_avg_sq") for k in first[0]["optimizer"])


def test_a_missing_shard_is_refused_on_the_ranks_with_nothing_loaded(resharded):
    second = resharded[1]
    for rank in range(2):
        path, reason = second[rank]["refused"]
        assert path.endswith("__3_0.distcp") and "missing" in reason
        assert second[rank]["untouched"]


def test_the_files_and_the_metadata_that_make_resharding_possible(resharded):
    folder = os.path.join(resharded[3], "four", "step_000002")
    names = {row["file"] for row in files_written(folder)}
    assert names == {".metadata", *(f"__{r}_0.distcp" for r in range(4))}
    assert writers(folder) == 4
    spec, chunks = RunSpec(), tensor_chunks(folder)
    rows = [r for r in chunks if r["key"] == "model.0.lin1.weight"]
    # FSDP2 shards dim 0 (the hidden units) evenly: one chunk per rank, tiling the tensor
    assert [r["offsets"] for r in rows] == [(r * spec.hidden // 4, 0) for r in range(4)]
    assert all(r["sizes"] == (spec.hidden // 4, spec.d) for r in rows)
    assert all(r["global shape"] == (spec.hidden, spec.d) for r in rows)
    assert sorted(r["file"] for r in rows) == [f"__{r}_0.distcp" for r in range(4)]
    # each rank's generators under its own key, written by that rank
    for rank in range(4):
        (row,) = [r for r in chunks if r["key"] == f"rng.rank{rank}.noise"]
        assert row["file"] == f"__{rank}_0.distcp"


def _model_state(spec: RunSpec) -> dict:
    return {"model": spec.model().state_dict()}


def test_refusals_name_the_file_and_the_reason(resharded, tmp_path):
    complete = os.path.join(resharded[3], "four", "step_000002")
    checked_folder(complete, _model_state(RunSpec()))       # whole: no refusal

    def broken(name, damage):
        folder = tmp_path / name
        shutil.copytree(complete, folder)
        damage(folder)
        return str(folder)

    cases = [
        (broken("unfinished", lambda f: os.unlink(f / ".metadata")), RunSpec(),
         ".metadata", "did not finish"),
        (broken("lost", lambda f: os.unlink(f / "__1_0.distcp")), RunSpec(),
         "__1_0.distcp", "missing"),
        (broken("short", lambda f: os.truncate(f / "__2_0.distcp", 10)), RunSpec(),
         "__2_0.distcp", "truncated"),
        (complete, RunSpec(hidden=24), ".metadata", "shape (16, 8) in the checkpoint, (24, 8)"),
        (complete, RunSpec(blocks=3), ".metadata", "another model or run"),
        (str(tmp_path / "nowhere"), RunSpec(), "nowhere", "no such checkpoint folder"),
    ]
    for folder, spec, file, reason in cases:
        with pytest.raises(CheckpointRefused) as caught:
            checked_folder(folder, _model_state(spec))
        assert caught.value.path.endswith(file), (folder, caught.value)
        assert reason in caught.value.reason and "Nothing was loaded" in str(caught.value)


def _save_apart(rank, world_size, base):
    """Each rank saves into a folder of its own (as a confined rank must), then loads the merged
    checkpoint the test made."""
    from distlab.labs.checkpoint.run_state import Trainer
    trainer = Trainer(rank, world_size)
    trainer.step()
    save_checkpoint(trainer, os.path.join(base, f"rank{rank}"))
    return trainer.full_params()


def _load_merged(rank, world_size, folder):
    from distlab.labs.checkpoint.run_state import Trainer
    from distlab.labs.checkpoint.saving import load_checkpoint
    trainer = Trainer(rank, world_size)
    load_checkpoint(trainer, folder)
    return trainer.full_params()


def test_ranks_that_save_apart_make_one_checkpoint_once_merged(tmp_path):
    saved = distlab.run(_save_apart, 2, str(tmp_path), timeout=240)
    parts = [str(tmp_path / f"rank{r}" / "step_000001") for r in range(2)]
    assert sorted(os.listdir(parts[1])) == ["__1_0.distcp"]        # rank 0 alone writes .metadata
    merged = merge_rank_folders(parts, str(tmp_path / "merged"))
    with pytest.raises(FileExistsError):
        merge_rank_folders(parts, merged)
    with pytest.raises(ValueError, match=r"\.metadata is in both"):
        merge_rank_folders([parts[0], parts[0]], str(tmp_path / "twice"))
    back = distlab.run(_load_merged, 2, merged, timeout=240)
    _assert_same(back[0], saved[0], "merged checkpoint")
