"""How a check runs a student's code on ranks: on which backends, and how long before the ranks
count as hung. The grader chooses both (``distlab grade --backend --rank-timeout``) and hands them
to every process that runs checks (its judge, the kernels) in the environment, read once per
call into an immutable ``CheckSettings``; a student's own notebook gets the defaults.
"""
from __future__ import annotations

import dataclasses
import os

from distlab.runtime.stuck import ENV_STUCK_AFTER

ENV_BACKEND, ENV_RANK_TIMEOUT = "DISTLAB_BACKEND", "DISTLAB_RANK_TIMEOUT"


@dataclasses.dataclass(frozen=True)
class CheckSettings:
    backend: str = "auto"        # gloo, nccl, auto, or both (gloo, and NCCL where GPUs allow)
    rank_timeout: float = 60.0   # seconds before a check's ranks are declared hung

    @classmethod
    def current(cls) -> "CheckSettings":
        return cls(backend=os.environ.get(ENV_BACKEND, cls.backend),
                   rank_timeout=float(os.environ.get(ENV_RANK_TIMEOUT, cls.rank_timeout)))

    def environ(self) -> dict[str, str]:
        """The environment variables that hand these settings to another process. Ranks that
        are stuck count as hung after ``rank_timeout`` in every run there, a lab helper's with a
        longer timeout included (``distlab.runtime.stuck.stuck_after``)."""
        return {ENV_BACKEND: self.backend, ENV_RANK_TIMEOUT: str(self.rank_timeout),
                ENV_STUCK_AFTER: str(self.rank_timeout)}


def rank_timeout() -> float:
    """Seconds a check's ``distlab.run`` waits before declaring the ranks hung."""
    return CheckSettings.current().rank_timeout


def backends(world_size: int) -> list[str]:
    """The backends each check runs on; "both" is gloo plus NCCL where every rank can have a GPU."""
    choice = CheckSettings.current().backend
    if choice != "both":
        return [choice]
    import torch
    return ["gloo"] + (["nccl"] if torch.cuda.device_count() >= world_size else [])


def run_each_backend(fn, world_size: int, *args) -> list:
    """[(backend, results)] of ``distlab.run(fn, world_size, *args)`` on each of ``backends()``."""
    import distlab
    return [(b, distlab.run(fn, world_size, *args, backend=b, timeout=rank_timeout()))
            for b in backends(world_size)]


class SubmittedError(Exception):
    """A student's function raised while a check called it: ``exc_type`` is what it raised (the
    judge reports it, and a stub's NotImplementedError counts as not done)."""

    def __init__(self, exc_type: str, message: str):
        super().__init__(message)
        self.exc_type = exc_type


def call_each(fn, calls: list, names: list[str] | None = None) -> list:
    """``[fn(*args) for args in calls]``, run on one rank in one launch (a call given as a dict
    is made with keywords, ``fn(**kwargs)``, as a test that names the arguments calls it). A
    check that calls a student's function on many cases (every step of every rank of a trace)
    pays one rank's start instead of one per call (in the judge, each call of a submitted
    function is a launch). Each call gets its own copy of its arguments, as a launch of its own
    would: a function that changes what it was given cannot change a later case.

    If ``fn`` raises on case k, the calls stop there, as a loop of calls would: the answers
    read on raise a ``SubmittedError`` at k (``Answers``), which names that case (``names[k]``,
    else the call with its arguments) above the traceback. A hang is the launch's:
    ``distlab.run`` stops the rank after ``rank_timeout()`` and says where it was."""
    return call_each_of([fn], calls, names)[0]


def call_each_of(fns: list, calls: list, names: list[str] | None = None) -> list:
    """``[call_each(fn, calls, names) for fn in fns]`` in one launch: each function on every
    case in turn, each call on its own copy of its arguments, a raise stopping only its own
    function's calls. A check that grades two functions on the same cases pays one rank's
    start, and ships the cases once."""
    import distlab
    from distlab.runtime.outcome import HangError, RankError
    calls = [dict(args) if isinstance(args, dict) else tuple(args) for args in calls]
    shown = [getattr(fn, "name", None) or getattr(fn, "__name__", None) or "your function"
             for fn in fns]
    name = " and ".join(shown)
    try:
        out = distlab.run(_call_each, 1, list(fns), calls, backend="gloo",
                          timeout=rank_timeout())[0]
    except HangError as exc:   # still a hang; said of the student's function, not of "the ranks"
        raise HangError(f"{name}, called on {len(calls)} cases one after another on one rank, "
                        f"did not return: {exc}") from None
    except RankError as exc:   # raised outside any one call (loading it, or exiting the process)
        raise SubmittedError(exc.exc_type, f"{name} raised {exc.exc_type}:\n"
                             f"{exc.rank_traceback.rstrip()}") from None
    return [_answers(done, fn_name, calls, names) for done, fn_name in zip(out, shown)]


def _answers(out: tuple, name: str, calls: list, names: list[str] | None) -> list:
    """One function's answers from its rank's outcome (``_call_each``)."""
    if out[0] != "raised":
        return list(out[1])
    answers, k, exc_type, text = list(out[1]), int(out[2]), str(out[3]), str(out[4])
    case = names[k] if names else f"{name}({_shown(calls[k])})"
    return Answers(answers, SubmittedError(exc_type, f"{name} raised {exc_type} on case {k + 1} "
                                           f"of {len(calls)}, {case}:\n{text.rstrip()}"))


class Answers:
    """The answers of the calls before the one that raised; reading on raises its error. A check
    that compares case by case thus reports an earlier case's wrong answer first, as the loop of
    one call per case did."""

    def __init__(self, answers: list, error: SubmittedError):
        self.answers, self.error = answers, error

    def __iter__(self):
        yield from self.answers
        raise self.error

    def __getitem__(self, k: int):
        if 0 <= k < len(self.answers):
            return self.answers[k]
        raise self.error


def _shown(args: tuple | dict) -> str:
    import reprlib
    shown = reprlib.Repr()
    shown.maxstring, shown.maxother, shown.maxlist, shown.maxdict = 80, 200, 8, 8
    if isinstance(args, dict):
        return ", ".join(f"{k}={shown.repr(v)}" for k, v in args.items())
    return ", ".join(shown.repr(a) for a in args)


def _call_each(rank: int, world_size: int, fns: list, calls: list) -> list:
    """For each function: ("done", answers), or ("raised", the answers before, k, exception
    type, traceback) for the first call k that raised: the launcher would only say that rank 0
    raised, not where."""
    return [_each_call(fn, calls) for fn in fns]


def _each_call(fn, calls: list):
    import pickle
    import traceback
    answers = []
    for k, args in enumerate(calls):
        # Copied by pickling (faster than deepcopy on a trace's dicts): calls may share a timeline.
        args = pickle.loads(pickle.dumps(args))
        try:
            answers.append(fn(**args) if isinstance(args, dict) else fn(*args))
        except Exception as exc:   # noqa: BLE001 - the judge reports it on its case
            # From the student's frame on, not this loop's.
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
            return ("raised", answers, k, type(exc).__name__, text)
    return ("done", answers)
