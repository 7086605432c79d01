"""Lab 12, Section 1: the whole training state, graded by resuming from it (the judge serves only
``distlab.checks.lab12``'s ``check_*``: ``check_whole_state`` there calls ``grade_whole_state``).

``whole_state(trainer) -> state`` and ``restore(trainer, state)`` for the FSDP2 ``Trainer`` of
``distlab.labs.checkpoint.run_state``. On real gloo ranks (``resume.resume_with``), the ranks
train ``save_at`` steps, take the student's state, serialize it (``torch.save`` to bytes and
back: data, never a live object), restore it into a fresh trainer of another seed (other weights
and generators, the data position of step 0: a restore that replays the run from step 0 does
not land on it), and train to ``steps``. The judge compares the losses after
the resume and every parameter gathered whole at the end with the uninterrupted run's, to the
last bit (float64, ``torch.equal``): a resume that is not bit-identical cannot hide in rounding.
The step the restored trainer holds must be ``save_at``.

The uninterrupted run is the course's, with no student code in it: stored for the visible case
(``resume`` in ``data/12_checkpoint_restart``: 7 steps, the parameters after steps 5 to 7); where
the stored run differs from what this machine computes (another CPU's kernels round other bits:
``distlab.checks.stored``), the course's run is made again here, on ranks of its own, and
decides. A hidden case is a run of seeds drawn from the seed (the handout's stored run is not
its reference), stopped after step 3 or 4 and trained 2 or 3 steps more; its uninterrupted run
is made here, on ranks of its own.
"""
from __future__ import annotations

import torch

from distlab.checks.assertions import CheckFailed, assert_close, recording
from distlab.checks.rank_failures import ranks_failed
from distlab.checks.ranks import rank_timeout
from distlab.labs.checkpoint.resume import epoch_starts, resume_with, uninterrupted
from distlab.labs.checkpoint.run_state import RunSpec
from distlab.runtime.per_rank import plain, reference

LAB = "12_checkpoint_restart"
VISIBLE = dict(world_size=2, steps=6, save_at=3)   # on 2 ranks an epoch is 2 steps: step 5 reshuffles
def visible_set() -> dict:
    """The visible case's uninterrupted run, stored (RunSpec's defaults, 2 ranks, 6 steps): every
    loss, and every parameter at the end."""
    run = _uninterrupted(RunSpec(), VISIBLE["world_size"], VISIBLE["steps"], 0)
    return {"seed": RunSpec().seed,
            "losses": torch.tensor(plain(run["losses"]), dtype=torch.float64),
            **{f"params.{name}": plain(value) for name, value in run["params"].items()}}


def _stored(save_at: int) -> dict:
    """The stored run's losses after step ``save_at`` and its parameters at the end, marked."""
    from distlab.checks.stored import load
    stored = load(LAB, "resume")
    return reference({"losses": stored["losses"].tolist()[save_at:],
                      "params": {k.removeprefix("params."): v for k, v in stored.items()
                                 if k.startswith("params.")}})


def _uninterrupted(spec: RunSpec, world_size: int, steps: int, save_at: int) -> dict:
    """The course's run on ranks of its own, marked: no rank that runs student code gets it."""
    import distlab
    out = distlab.run(uninterrupted, world_size, spec, steps, save_at, backend="gloo",
                      timeout=rank_timeout())
    return reference(out[0])


def _case(seed, world_size: int, steps: int, save_at: int):
    """(spec, world size, steps, save_at, where): the visible case, or a hidden one from
    ``seed``: a run of seeds drawn from it (no stored run is its reference) stopped after step 3
    or 4 (on 2 ranks an epoch is 2 steps, so Python's random has shuffled once more than a fresh
    trainer's by then), then trained 2 or 3 steps more (so that a new epoch starts after the
    resume and its shuffle reads that state)."""
    if seed is None:
        return RunSpec(), world_size, steps, save_at, "the stored run"
    save_at = 3 + seed % 2
    steps = save_at + 2 + (seed // 2) % 2
    spec = RunSpec(seed=1000 + seed % 10**6, data_seed=2 * 10**6 + seed % 10**6)
    return (spec, world_size, steps, save_at,
            f"a fresh run of seed {spec.seed} stopped after step {save_at} (seed {seed})")


def _resumed(whole_state, restore, spec, world_size, steps, save_at, what):
    import distlab
    from distlab.runtime.outcome import DistributedError
    try:
        return distlab.run(resume_with, world_size, whole_state, restore, spec, steps, save_at,
                           backend="gloo", timeout=rank_timeout())
    except DistributedError as err:
        hint = SERIALIZE_HINT if "pickl" in str(err).lower() or "torch.save" in str(err) else ""
        raise ranks_failed(what, err, hint) from None


SERIALIZE_HINT = ("torch.save could not write your state: a checkpoint holds data (tensors, "
                  "numbers, strings, lists and dicts of them; a generator's state is "
                  "get_state(), a ByteTensor), never live objects such as the trainer, its "
                  "model or a lambda.")
FIRST_STEP = ("The first step after the resume already differs. What does a step read and draw? "
              "Its rows (the data position), the noise added to them (the trainer's own "
              "generator, trainer.noise), the dropout masks (torch's global generator), the "
              "weights and AdamW's moments. The check resumes on a fresh Trainer of another "
              "seed, its data at step 0: whatever your state leaves out stays as that trainer "
              "has it.")
RESHUFFLE = ("Step {k} starts a new epoch: its rows are shuffled again with Python's random "
             "(DataPosition.next_rows), whose state is part of the run's too.")
LATER = ("What does that step read that the ones before did not? AdamW's moments and its step "
         "count shape every update after the first.")


def _compare(out, expected, spec, world_size, steps, save_at, where) -> str:
    what = f"a resume after step {save_at} of {steps} on {world_size} ranks ({where})"
    for rank in range(world_size):
        got = out[rank]["restored_step"]
        if got != save_at:
            raise CheckFailed(f"{what}: after restore, rank {rank}'s trainer.steps_done is {got}; "
                              f"the state was taken after step {save_at}. The step is part of "
                              f"the state.")
    losses, ref = out[0]["losses"], expected["losses"]
    for i, (a, b) in enumerate(zip(losses, ref)):
        if a != b:
            k = save_at + 1 + i
            new_epoch = k in epoch_starts(spec, world_size, steps)
            hint = FIRST_STEP if i == 0 else f"The losses agree until step {k}."
            if new_epoch:
                hint += f" {RESHUFFLE.format(k=k)}"
            elif i > 0:
                hint += f" {LATER}"
            raise CheckFailed(f"{what}: the loss of step {k} is {a!r}, the uninterrupted run's "
                              f"{float(b)!r} (to the last bit: the same run must give the same "
                              f"float64 numbers).\n{hint}")
    if len(losses) != len(ref):
        raise CheckFailed(f"{what}: {len(losses)} losses after the resume, expected {len(ref)}.")
    for name, value in expected["params"].items():
        with recording():
            assert_close(out[0]["params"].get(name), value, atol=0.0, rtol=0.0, rank=0,
                         what=f"{what}: {name} at step {steps}, beside the uninterrupted run's",
                         hint=LATER)
    return (f"resumed after step {save_at} of {steps} on {world_size} ranks ({where}): the "
            f"{len(ref)} losses after the resume and all {len(expected['params'])} parameters "
            f"equal the uninterrupted run's to the last bit (float64); the state "
            f"{out[0]['bytes']:,} bytes on rank 0")


def grade_whole_state(whole_state, restore, seed=None, world_size=VISIBLE["world_size"],
                      steps=VISIBLE["steps"], save_at=VISIBLE["save_at"]) -> str:
    """Resume from ``whole_state`` through ``restore`` (module doc); the verdict line."""
    __tracebackhide__ = True  # noqa: F841
    spec, world_size, steps, save_at, where = _case(seed, world_size, steps, save_at)
    if world_size != VISIBLE["world_size"] or not 0 < save_at < steps \
            or (seed is None and steps != VISIBLE["steps"]):
        raise CheckFailed(f"the stored run is {VISIBLE['steps']} steps on "
                          f"{VISIBLE['world_size']} ranks; call the check as the test cell does")
    out = _resumed(whole_state, restore, spec, world_size, steps, save_at,
                   f"whole_state and restore on {world_size} ranks ({where})")
    if seed is not None:       # a hidden run: its reference made here, with no student code
        return _compare(out, _uninterrupted(spec, world_size, steps, save_at), spec, world_size,
                        steps, save_at, where)
    try:
        return _compare(out, _stored(save_at), spec, world_size, steps, save_at, where)
    except CheckFailed:
        # This machine may round otherwise than the one that stored the run: the course's run
        # made here, on ranks of its own, decides.
        where += ", made again on this machine"
    expected = _uninterrupted(spec, world_size, steps, save_at)
    return _compare(out, expected, spec, world_size, steps, save_at, where)
