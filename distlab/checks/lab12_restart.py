"""Lab 12, Section 4: the resumable training loop, graded with a rank killed from outside.

``train_resumable(rank, world_size, root, steps, save_every, save, load, spec)`` runs twice, on
the student's own ``save`` (asynchronous: ``(future, folder)``) and ``load``, every rank in a
checkpoint folder of its own (``lab12_restart_ranks``):

1. killed: from step 0; the launcher sends SIGKILL to a victim rank, from outside and by pid,
   when the victim starts its n-th training step's loss ``all_reduce`` (``distlab.runtime.kill``;
   hidden: a fresh seed chooses victim and step); the run must end in ``RankCrashed`` by SIGKILL.
   The judge merges the ranks' folders, save by save (``layout.merge_rank_folders``): c is the
   newest save with ``.metadata``.
2. relaunched: every rank gets the complete saves up to c and, newest of all, an unfinished one
   (no ``.metadata``: a rank died writing it), which must be skipped. In a launch of its own,
   the student's own clean restart from step c: a fresh trainer, the student's ``load`` of step
   c's folder, ``trainer.step()`` to the end (course plumbing: no loop, no search). Its own
   processes: what it computes is the reference, and the loop's ranks (where the student's code
   could find it in memory, or have ``load`` keep it) never hold it.

Graded: the relaunch trained exactly steps - c steps (its loss ``all_reduce`` calls, from the
launcher's record) and its losses and parameters equal the clean restart's to the last bit; every
save was waited for before the next one started and before the loop returned. Comparing with
a restart made of the student's own save and load, not the course's uninterrupted run, keeps a
mistake of Sections 1 to 3 (an RNG not saved) out of this test: it changes both runs alike; a
loop that skips the load, or loads another checkpoint, still differs.
"""
from __future__ import annotations

import glob
import os
import random
import shutil
import tempfile

from distlab.checks.assertions import CheckFailed, verified
from distlab.checks.course_code import CourseCode, names
from distlab.checks.lab12_restart_ranks import FOLDER, clean_rank, resumable_rank

STEP_PREFIX = "step_"
WAIT = ("Wait for a save's future (future.result()) before starting the next save, and before "
        "the loop returns.")
VISIBLE = dict(world_size=2, steps=8, save_every=2, victim=1, kill_at=6)
# A hidden run is two steps longer, so that its kill step is drawn among three (6, 7, 8): a step
# costs a rank hundredths of a CPU-second, a launch more than a tenth.
HIDDEN_STEPS = 10
COURSE_CODE = {"check_train_resumable": CourseCode(forbidden=names(
    "distlab.labs.checkpoint.restart", "train_resumable", "complete_checkpoints"))}


def kill_case(seed: int | None, world_size: int, steps: int, save_every: int) -> tuple:
    """(victim, step, run seed): the visible case, or drawn from ``seed``: two or more steps
    after the second save, so that the first has surely finished on every rank (a loop waits
    for a save before it starts the next, rank 0's wait covers its ``.metadata``, and the loss
    all_reduce of the step between needs rank 0 past that wait), and two before the end, so that
    the signal, sent as the launcher reads that the step began, lands before the run is over."""
    if seed is None:
        return VISIBLE["victim"], VISIBLE["kill_at"], 0
    if steps - 2 < 2 * save_every + 2:
        raise ValueError(f"steps={steps}, save_every={save_every}: a kill two steps after the "
                         f"second save and two before the end needs steps >= 2 * save_every + 4")
    rng = random.Random(seed)
    return (rng.randrange(world_size), rng.randint(2 * save_every + 2, steps - 2),
            rng.randrange(1000))


def grade_train_resumable(train, save, load, seed: int | None = None, world_size: int = 2,
                          steps: int | None = None,
                          save_every: int = VISIBLE["save_every"]) -> str:
    __tracebackhide__ = True  # noqa: F841
    if steps is None:
        steps = VISIBLE["steps"] if seed is None else HIDDEN_STEPS
    from distlab.labs.checkpoint.run_state import RunSpec
    victim, kill_at, run_seed = kill_case(seed, world_size, steps, save_every)
    spec = RunSpec(seed=run_seed)
    work = _Workspace()
    try:
        killed = work.killed_run(train, save, load, world_size, steps, save_every, spec,
                                 victim, kill_at)
        c, files = killed["resume_at"], killed["files"]
        if c is None:
            raise CheckFailed(
                f"rank {victim} was killed at step {kill_at} (SIGKILL, from outside) and no "
                f"complete checkpoint was left: with a save every {save_every} steps, the save "
                f"of step {save_every} should have finished (a step folder whose .metadata rank "
                f"0 wrote). Does your loop call save(trainer, root) after every step that is a "
                f"multiple of save_every, and do its saves finish? " + WAIT)
        planted = f"{STEP_PREFIX}{c + save_every:06d}"
        clean = work.launch("your clean restart", clean_rank, world_size, files, load, steps,
                            spec, f"{STEP_PREFIX}{c:06d}")
        relaunch = work.launch("the relaunch", resumable_rank, world_size, {
            **files, f"{planted}/__0_0.distcp": b"unfinished: no .metadata"}, train, save, load,
            steps, save_every, spec)
        trained = _steps_trained(relaunch.comms)
    finally:
        work.close()
    for rank, count in enumerate(trained):
        if count != steps - c:
            raise CheckFailed(
                f"after rank {victim} was killed at step {kill_at}, the newest complete "
                f"checkpoint was step {c} (the folder {planted}, newer, had no .metadata: a save "
                f"that never finished). The relaunch should train steps {c + 1} to {steps}, "
                f"{steps - c} steps; rank {rank} trained {count} (its loss all_reduce calls). "
                + ("Does your loop resume from the newest complete checkpoint under root?"
                   if count > steps - c else "Does it train until steps_done reaches steps?"))
    _same(relaunch, clean, c, victim, kill_at)
    _all_waited(relaunch, "the relaunch")
    verified(f"rank {victim} killed by SIGKILL at step {kill_at}; the relaunch skipped the "
             f"unfinished {planted}, resumed from step {c} and trained {steps - c} steps; its "
             f"{len(relaunch[0]['losses'])} losses and parameters equal your clean restart's "
             f"bit for bit; every save waited for")
    return (f"killed at step {kill_at} (rank {victim}), resumed from step {c}: "
            f"{steps - c} steps, bit-identical to a clean restart")


def _steps_trained(comms: list[list]) -> list[int]:
    """Per rank, the training steps of the loop the launcher's record shows: the Trainer's loss
    all_reduce, on the default group from the main thread, one per step (an asynchronous save's
    calls are made from its own thread, on its own group)."""
    from distlab.runtime.kill import DEFAULT_GROUP
    counts = []
    for rank in comms:
        counts.append(sum(1 for c in rank if c.op == "all_reduce"
                          and c.group_name == DEFAULT_GROUP and not c.threaded))
    return counts


def _same(relaunch, clean, c: int, victim: int, kill_at: int) -> None:
    got, want = relaunch[0], clean[0]
    if got["losses"] != want["losses"]:
        differ = [s for s in sorted(set(got["losses"]) | set(want["losses"]))
                  if got["losses"].get(s) != want["losses"].get(s)]
        s = differ[0]
        raise CheckFailed(
            f"after rank {victim} was killed at step {kill_at}, the relaunch's losses differ from "
            f"your own clean restart from step {c}'s checkpoint (a fresh trainer, your load, "
            f"then trainer.step() to the end): at "
            f"step {s}, {got['losses'].get(s)!r} after the kill, {want['losses'].get(s)!r} in "
            f"the clean restart. Both load the same checkpoint with your load: does your loop "
            f"load the newest complete one, and train on from it?")
    for name, value in want["params"].items():
        other = got["params"].get(name)
        if other is None or other.shape != value.shape or not bool((other == value).all()):
            raise CheckFailed(f"the relaunch's parameter {name} differs from your clean "
                              f"restart's from step {c} (the losses agree): does the loop train "
                              f"one more or one fewer step than it reports?")


def _all_waited(out, what: str) -> None:
    for rank, result in enumerate(out):
        if result["unwaited"]:
            when, late = result["unwaited"][0]
            raise CheckFailed(
                f"in {what}, rank {rank}: when {when}, the save of step {late[0]} had not been "
                f"waited for. An asynchronous save writes in a thread: a rank may end, or save "
                f"again, while a checkpoint is half written. " + WAIT)


def _overlap_hint(exc) -> str:
    """DCP's saves talk through object collectives; two saves in flight interleave theirs."""
    if "_object" not in str(exc):
        return ""
    return ("\nThe calls above are a checkpoint's (DCP plans and finishes a save with "
            "gather_object and scatter_object_list, from the save's thread): a save still in "
            "flight when the next one starts interleaves its calls with the next's, and one in "
            "flight when a rank returns leaves its peers waiting. " + WAIT)


def _plain_files(folders: list[str], entries: bool = True) -> None:
    """The ranks' folders are their own (no links) and, with ``entries``, everything in them a
    plain file: the judge copies them and hands them to the relaunch, so a link (to a file the
    ranks may not read) is refused, never followed."""
    import stat
    for folder in folders:
        inside = sorted(os.listdir(folder)) if entries and not os.path.islink(folder) else []
        for path in [folder] + [os.path.join(folder, name) for name in inside]:
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode) or (path != folder and not stat.S_ISREG(mode)):
                raise CheckFailed(
                    f"{os.path.relpath(path, os.path.dirname(folder))!r}, left by a rank of the "
                    f"run that was killed, is a link or a folder inside a save: a checkpoint is "
                    f"the plain files dcp.save writes in the rank's own folder, and the judge "
                    f"follows no link.")


class _Workspace:
    """The runs' folders (the ranks' own, and the judge's merged copies), removed at the end."""

    def __init__(self):
        from distlab.runtime.launch import current_launcher
        launcher = current_launcher()
        # in the judge: the launcher of the student's ranks (theirs are the folders read)
        launcher = getattr(launcher, "student", launcher)
        self.base = launcher.settings.cwd or os.getcwd()
        self.tags: list[str] = []
        self.mine = tempfile.mkdtemp(prefix="lab12-judge-", dir=self.base)

    def _tag(self) -> str:
        tag = os.path.basename(self.mine).removeprefix("lab12-judge-") + f"-{len(self.tags)}"
        self.tags.append(tag)
        return tag

    def rank_roots(self, tag: str, world_size: int) -> list[str]:
        """Each rank's folder: in the launcher's folder, or in a confined rank's own one."""
        roots = []
        for rank in range(world_size):
            name = FOLDER.format(tag=tag, rank=rank)
            found = glob.glob(os.path.join(self.base, name)) + glob.glob(
                os.path.join(self.base, "*", name))
            roots.append(found[0] if len(found) == 1 else None)
        return roots

    def launch(self, what, body, world_size, files, *args):
        """``body(rank, world_size, tag, files, *args)`` on ranks of a launch of its own."""
        import distlab
        from distlab.checks.ranks import rank_timeout
        from distlab.runtime.outcome import HangError, RankError
        tag = self._tag()
        try:
            out = distlab.run(body, world_size, tag, files, *args, backend="gloo",
                              timeout=rank_timeout())
        except RankError as exc:
            raise CheckFailed(f"{what} failed: {exc}") from None
        except HangError as exc:
            raise CheckFailed(f"{what} did not finish: {exc}{_overlap_hint(exc)}") from None
        out.tag = tag
        return out

    def killed_run(self, train, save, load, world_size, steps, save_every, spec, victim,
                   kill_at) -> dict:
        import distlab
        from distlab.checks.ranks import rank_timeout
        from distlab.runtime.kill import KillPlan, killing
        from distlab.runtime.outcome import HangError, RankCrashed, RankError
        tag, fired = self._tag(), []
        try:
            with killing(KillPlan(rank=victim, call=kill_at)) as fired:
                distlab.run(resumable_rank, world_size, tag, {}, train, save, load, steps,
                            save_every, spec, backend="gloo", timeout=rank_timeout())
        except RankCrashed as exc:
            if "SIGKILL" not in str(exc) or "on purpose" not in str(exc):
                raise CheckFailed(f"the run meant to lose rank {victim} at step {kill_at} "
                                  f"failed otherwise: {exc}") from None
        except RankError as exc:
            # a peer that raised once the victim was gone (its connection dropped) is the
            # kill's aftermath, however the backend words it
            if not fired or exc.rank == victim:
                raise CheckFailed(f"your loop, from step 0, failed before rank {victim} was "
                                  f"killed at step {kill_at}: {exc}") from None
        except HangError as exc:
            raise CheckFailed(f"your loop, from step 0, did not get to step {kill_at}, where "
                              f"rank {victim} was to be killed: {exc}{_overlap_hint(exc)}"
                              ) from None
        else:
            raise CheckFailed(f"rank {victim} was to be killed as it started training step "
                              f"{kill_at} (its {kill_at}th loss all_reduce), and your loop "
                              f"returned first: does it train {steps} steps?")
        return self._merged(tag, world_size)

    def _merged(self, tag: str, world_size: int) -> dict:
        """The complete saves the ranks' folders hold, merged: {"resume_at": newest step or
        None, "files": {"step_NNNNNN/name": bytes}}."""
        from distlab.labs.checkpoint.layout import merge_rank_folders
        roots = [r for r in self.rank_roots(tag, world_size) if r is not None]
        _plain_files(roots, entries=False)
        steps = sorted({n for root in roots for n in os.listdir(root)
                        if n.startswith(STEP_PREFIX) and n[len(STEP_PREFIX):].isdigit()})
        files, newest = {}, None
        for name in steps:
            folders = [os.path.join(r, name) for r in roots if os.path.isdir(os.path.join(r, name))]
            if not any(os.path.exists(os.path.join(f, ".metadata")) for f in folders):
                continue
            _plain_files(folders)
            try:
                into = merge_rank_folders(folders, os.path.join(self.mine, tag, name))
            except ValueError as err:    # CheckpointRefused too: its .metadata unreadable
                raise CheckFailed(f"{name}, a save of the run that was killed, is no checkpoint "
                                  f"the judge can read: {err}") from None
            for file in sorted(os.listdir(into)):
                with open(os.path.join(into, file), "rb") as f:
                    files[f"{name}/{file}"] = f.read()
            newest = int(name[len(STEP_PREFIX):])
        return {"resume_at": newest, "files": files}

    def close(self) -> None:
        for tag in self.tags:    # this check's folders, each rank's, the clean restart's too
            pattern = FOLDER.format(tag=tag, rank="*") + "*"
            for root in glob.glob(os.path.join(self.base, pattern)) + glob.glob(
                    os.path.join(self.base, "*", pattern)):
                shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(self.mine, ignore_errors=True)
