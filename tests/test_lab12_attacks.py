"""Lab 12 attacked as a student would, from the handout alone: each attack is an answer cell that
tries to earn a test's points without doing its exercise, run through the check as the judge runs
it (the call guard of the check's COURSE_CODE on, the answer compiled under a notebook cell's file
name, so that the guard counts it as the student's code), and must earn nothing.

Attacks that the checks cannot stop yet would be marked xfail(strict=True), the hole said in the
reason. The restart check's attacks cost three launches of ranks each (one with a rank killed):
they are marked slow. Each attack that stopped here earned its points in a real grading run
(``distlab grade`` on a notebook made from the handout) before its fix: the link in a step folder
(the relaunch's ranks read /proc/self/environ and /etc/passwd through the judge), the clean
restart read from the loop's own process (by its caller's frame, or kept by the student's load),
the resharding state drawn by load from the check's fixed seed, and a .metadata pickle that
patched the restart check in the judge. Two attacks on Section 1 earned points until the resume
was made on a trainer of another seed and hidden runs got seeds of their own: a state of the step
alone, replayed from step 0, and the handout's stored run played back."""
from __future__ import annotations

import os

import pytest

from distlab.checks import lab12
from distlab.checks.assertions import CheckFailed
from distlab.checks.course_code import guard_of
from distlab.checks.ranks import SubmittedError
from distlab.runtime.call_guard import guarding

CELL = "<ipython-input-7-0>"    # a notebook cell's file name, as a kernel gives it
COURSE_CODE_USED = "course's own implementation"
IMPORTS = ("import os\nimport torch\nfrom distlab.labs.checkpoint.run_state import RunSpec, "
           "Trainer\nfrom distlab.labs.checkpoint.saving import save_group, step_folder\n")


def answer(source: str, *names: str) -> tuple:
    """The student's ``names`` as the cell ``source`` defines them (after the lab's imports)."""
    ns = {"__name__": "lab12_attack"}      # a module nobody imports: shipped by value
    exec(compile(IMPORTS + source, CELL, "exec"), ns)    # noqa: S102  (the student's cell)
    return tuple(ns[name] for name in names)


def judged(check, *args, **kwargs) -> str:
    """The check as the judge runs it: its ranks under its COURSE_CODE's guard."""
    with guarding(guard_of(check)):
        return check(*args, **kwargs)


def earns(check, fns: tuple, seeds=(), **kwargs) -> bool:
    """Whether the test cell passes: the visible call and the hidden ones given, judged."""
    try:
        judged(check, *fns, **kwargs)
        for seed in seeds:
            judged(check, *fns, seed=seed, **kwargs)
    except (CheckFailed, SubmittedError):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Section 1: a state that is no state

REPLAY = '''
def whole_state(trainer):
    return {"step": trainer.steps_done}     # nothing else: the run is deterministic


def restore(trainer, state):
    for _ in range(int(state["step"])):      # a fresh Trainer is step 0's: train it again
        trainer.step()
'''

STORED = '''
def whole_state(trainer):
    return {"step": trainer.steps_done}


def restore(trainer, state):
    """The handout's stored run (7 steps) answers the visible case and every hidden one."""
    import distlab
    here = os.path.dirname(os.path.dirname(distlab.__file__))
    run = torch.load(os.path.join(here, "data", "12_checkpoint_restart", "resume.pt"))
    trainer.steps_done = int(state["step"])
    def step():
        trainer.steps_done += 1
        return float(run["losses"][trainer.steps_done - 1])
    def full_params():
        prefix = f"params.{trainer.steps_done}."
        return {k[len(prefix):]: v for k, v in run.items() if k.startswith(prefix)}
    trainer.step, trainer.full_params = step, full_params
'''


def test_a_state_of_the_step_alone_replayed_from_step_0_earns_nothing():
    assert not earns(lab12.check_whole_state, answer(REPLAY, "whole_state", "restore"),
                     seeds=(1,))


def test_the_stored_run_played_back_by_a_patched_trainer_earns_nothing():
    assert not earns(lab12.check_whole_state, answer(STORED, "whole_state", "restore"),
                     seeds=(1,))


# ---------------------------------------------------------------------------------------------
# Section 4: a loop with no resume in it, made to look like the clean restart

SAVE = '''
def async_save_checkpoint(trainer, root):
    """A real DCP save (so that the judge finds complete checkpoints) of nothing that matters."""
    import torch.distributed.checkpoint as dcp
    folder = step_folder(root, trainer.steps_done)
    return dcp.async_save({"junk": torch.zeros(1)}, checkpoint_id=folder,
                          process_group=save_group()), folder
'''

FROM_STEP_0 = '''
def from_step_0(rank, world_size, root, steps, save_every, save, spec, after_save=None):
    trainer, future, losses = Trainer(rank, world_size, spec), None, {}
    while trainer.steps_done < steps:
        losses[trainer.steps_done + 1] = trainer.step()
        if trainer.steps_done % save_every == 0:
            if future is not None:
                future.result()
                if after_save is not None:
                    after_save(rank, folder)
            future, folder = save(trainer, root)
    if future is not None:
        future.result()
    return {"resumed_from": None, "losses": losses, "params": trainer.full_params()}
'''

FRAME = SAVE + FROM_STEP_0 + '''
def train_resumable(rank, world_size, root, steps, save_every, save, load, spec=RunSpec()):
    """In the relaunch, the clean restart was in the caller's frame: copied, with as many
    all_reduce calls as the steps left."""
    import sys
    import torch.distributed as dist
    caller = sys._getframe(1).f_locals
    if caller.get("clean") is not None:
        c = int(caller["restart_from"].rsplit("_", 1)[1])
        for _ in range(steps - c):
            dist.all_reduce(torch.zeros(1))
        return {"resumed_from": c, "losses": dict(caller["clean"]["losses"]),
                "params": caller["clean"]["params"]}
    return from_step_0(rank, world_size, root, steps, save_every, save, spec)


def load_checkpoint(trainer, folder):
    pass
'''

KEPT_BY_LOAD = SAVE + FROM_STEP_0 + '''
def _kept():
    import builtins     # one dict per process, whatever copies of the functions pickles make
    return builtins.__dict__.setdefault("_lab12_attack", {})


def load_checkpoint(trainer, folder):
    """Run first, by the clean restart: keeps its trainer and the losses its steps return."""
    kept, first = _kept(), int(folder.rsplit("_", 1)[1])
    kept.update(trainer=trainer, first=first, losses={})
    inner = trainer.step
    def step():
        kept["losses"][first + len(kept["losses"]) + 1] = loss = inner()
        return loss
    trainer.step = step


def train_resumable(rank, world_size, root, steps, save_every, save, load, spec=RunSpec()):
    import torch.distributed as dist
    kept = _kept()
    if "trainer" in kept:
        for _ in range(steps - kept["first"]):
            dist.all_reduce(torch.zeros(1))
        return {"resumed_from": kept["first"], "losses": dict(kept["losses"]),
                "params": kept["trainer"].full_params()}
    return from_step_0(rank, world_size, root, steps, save_every, save, spec)
'''

LINK = SAVE + FROM_STEP_0 + '''
SECRET = os.environ["LAB12_ATTACK_SECRET"]    # a file the ranks are not meant to read


def train_resumable(rank, world_size, root, steps, save_every, save, load, spec=RunSpec()):
    """A link to the file in a step folder: the relaunch would get its bytes."""
    for name in sorted(os.listdir(root)):
        leak = os.path.join(root, name, "leak")
        if os.path.exists(leak):
            raise RuntimeError("LEAKED " + open(leak).read())
    def link(rank, folder):
        if rank == 0:
            os.symlink(SECRET, os.path.join(folder, "leak"))
    return from_step_0(rank, world_size, root, steps, save_every, save, spec, after_save=link)


def load_checkpoint(trainer, folder):
    pass
'''

RESTART = ("train_resumable", "async_save_checkpoint", "load_checkpoint")


@pytest.mark.slow
@pytest.mark.parametrize("attack", [FRAME, KEPT_BY_LOAD], ids=["caller_frame", "kept_by_load"])
def test_a_loop_with_no_resume_cannot_copy_the_clean_restart(attack, tmp_path, monkeypatch):
    """The clean restart is the reference: it runs in processes of its own, so the loop's ranks
    can neither read it in memory nor have the student's load keep it for them."""
    monkeypatch.chdir(tmp_path)     # the check's folders go in the launcher's folder: here
    # with nothing to copy, the attack trains from step 0 (the kill's save of step 6 may have
    # finished or not: the steps it should have trained are 4 or 2)
    with pytest.raises(CheckFailed, match=r"steps; rank 0 trained 8 \(its loss all_reduce"):
        judged(lab12.check_train_resumable, *answer(attack, *RESTART))


@pytest.mark.slow
def test_a_link_left_in_a_step_folder_is_refused_not_followed(tmp_path, monkeypatch):
    secret = tmp_path / "secret.txt"
    secret.write_text("the judge's eyes only")
    monkeypatch.setenv("LAB12_ATTACK_SECRET", str(secret))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckFailed, match="follows no link") as failed:
        judged(lab12.check_train_resumable, *answer(LINK, *RESTART))
    assert "eyes only" not in str(failed.value)


@pytest.mark.parametrize("where", ["in_a_step_folder", "the_rank_folder"])
def test_the_judge_merges_no_link(where, tmp_path, monkeypatch):
    """What the judge hands the relaunch is the killed run's plain files: a link (to a file the
    ranks may not read) is refused before anything is copied."""
    from distlab.checks.lab12_restart import FOLDER, _Workspace
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / ".metadata").write_text("the judge's eyes only")
    monkeypatch.chdir(tmp_path)
    work = _Workspace()
    try:
        root = tmp_path / FOLDER.format(tag="t", rank=0)
        if where == "the_rank_folder":   # a rank's whole folder, a link to another
            (secret / "step_000002").mkdir()
            (secret / "step_000002" / ".metadata").write_text("the judge's eyes only")
            root.symlink_to(secret)
        else:
            (root / "step_000002").mkdir(parents=True)
            (root / "step_000002" / ".metadata").symlink_to(secret / ".metadata")
        with pytest.raises(CheckFailed, match="follows no link"):
            work._merged("t", 1)
    finally:
        work.close()
    assert secret.is_dir() and os.listdir(secret)     # the link's target left alone


# ---------------------------------------------------------------------------------------------
# Section 2: the drawn states are known ahead

DRAWN = '''
def save(model, optimizer, folder):
    """A DCP save every rank writes a shard of (one key per rank): of nothing that matters."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    dcp.save({f"junk{dist.get_rank()}": torch.zeros(1)}, checkpoint_id=folder)


def load(model, optimizer, folder):
    """The files ignored: the state drawn from the seed the check's visible call once used."""
    import types
    import torch.distributed as dist
    VISIBLE_SEED = 1200
    from distlab.labs.checkpoint.shards import drawn_state, install, state_rows
    hidden, d = model[0].lin1.weight.shape
    spec = RunSpec(d=d, hidden=hidden)
    seed = VISIBLE_SEED if spec == RunSpec() else VISIBLE_SEED + 1
    rows = state_rows(drawn_state(spec, seed), dist.get_rank(), dist.get_world_size())
    install(types.SimpleNamespace(model=model, optimizer=optimizer), rows)
'''


def test_a_load_that_draws_the_checks_state_itself_earns_nothing():
    """The visible call's states are drawn from a seed new at every call."""
    assert not earns(lab12.check_resharding, answer(DRAWN, "save", "load"))


# ---------------------------------------------------------------------------------------------
# Comparisons that lie

LYING = '''
class Same(float):
    """A loss equal to every other, never different."""
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = float.__hash__


def whole_state(trainer):
    return {"step": trainer.steps_done}


def restore(trainer, state):
    trainer.steps_done = int(state["step"])
    inner = trainer.step
    trainer.step = lambda: Same(inner())
'''


@pytest.mark.slow
def test_losses_whose_comparison_lies_never_reach_the_judge(tmp_path):
    """The judge's launcher distrusts its ranks: a rank returns data only (``safe_pickle``), so an
    object of the student's class is refused on its way back and its ``__eq__`` never runs where
    the comparison is made. (The default launcher, a student's own, would bring it back.)"""
    from distlab.runtime.launch import Launcher, LaunchSettings
    judge = Launcher(LaunchSettings(distrust=True, cwd=str(tmp_path)))
    try:
        with judge.active(), pytest.raises(CheckFailed, match="cannot be sent back"):
            judged(lab12.check_whole_state, *answer(LYING, "whole_state", "restore"))
    finally:
        judge.close()


# ---------------------------------------------------------------------------------------------
# The judge reads the checkpoints the student's ranks wrote: their .metadata is a pickle

class _Payload:
    """A .metadata whose unpickling runs code (here: leaves a mark), then gives the real one."""

    def __init__(self, real: bytes, mark: str):
        self.real, self.mark = real, mark

    def __reduce__(self):
        code = f"open({self.mark!r}, 'w').close()"
        return (eval, (f"exec({code!r}, {{}}) or __import__('pickle').loads({self.real!r})",))


def test_a_checkpoint_metadata_runs_no_code_where_it_is_read(tmp_path):
    """``read_metadata`` (the judges' merges call it on what the ranks wrote) builds DCP's
    records only: a pickle naming anything else is refused, and its code never runs."""
    import pickle

    import torch
    import torch.distributed.checkpoint as dcp
    from distlab.labs.checkpoint.layout import merge_rank_folders
    from distlab.labs.checkpoint.refusals import CheckpointRefused, read_metadata
    folder, mark = tmp_path / "step_000002", tmp_path / "ran"
    with pytest.warns(UserWarning):     # one process, no group: DCP says so
        dcp.save({"w": torch.zeros(3, dtype=torch.float64), "step": 2},
                 checkpoint_id=str(folder), no_dist=True)
    assert read_metadata(str(folder)).state_dict_metadata.keys() == {"w", "step"}
    real = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload(real, str(mark))))
    with pytest.raises(CheckpointRefused, match="builtins.eval is not part of"):
        read_metadata(str(folder))
    with pytest.raises(CheckpointRefused):
        merge_rank_folders([str(folder)], str(tmp_path / "merged"))
    assert not mark.exists()


PICKLED = SAVE + '''
MARK = os.environ["LAB12_ATTACK_MARK"]


class Payload:
    def __init__(self, real):
        self.real = real

    def __reduce__(self):
        code = f"open({MARK!r}, 'w').close()"    # in the judge: anything at all
        return (eval, (f"exec({code!r}, {{}}) or __import__('pickle').loads({self.real!r})",))


def train_resumable(rank, world_size, root, steps, save_every, save, load, spec=RunSpec()):
    import pickle
    trainer, future = Trainer(rank, world_size, spec), None
    while trainer.steps_done < steps:
        trainer.step()
        if trainer.steps_done % save_every == 0:
            if future is not None:
                future.result()
                if rank == 0:
                    path = os.path.join(folder, ".metadata")
                    real = open(path, "rb").read()
                    with open(path, "wb") as f:
                        pickle.dump(Payload(real), f)
            future, folder = save(trainer, root)
    future.result()
    return {"resumed_from": None, "losses": {}, "params": {}}


def load_checkpoint(trainer, folder):
    pass
'''


@pytest.mark.slow
def test_a_pickle_left_as_metadata_by_the_killed_run_runs_nothing_in_the_judge(tmp_path,
                                                                              monkeypatch):
    """The grader showed it: such a .metadata patched the check in the judge (4 points for a
    loop that trained nothing after the kill). Now it is refused, unread."""
    mark = tmp_path / "ran-in-the-judge"
    monkeypatch.setenv("LAB12_ATTACK_MARK", str(mark))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckFailed, match="is no checkpoint the judge can read"):
        judged(lab12.check_train_resumable, *answer(PICKLED, *RESTART))
    assert not mark.exists()
