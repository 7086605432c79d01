"""What a ``distlab.run`` gives back: the ranks' results in rank order, or an error that says
which rank failed and how."""
from __future__ import annotations

from distlab.runtime.comms import Comm


class DistributedError(RuntimeError):
    """Something went wrong on the ranks of a ``distlab.run``."""


class RankError(DistributedError):
    """Your function raised an exception on a rank. ``rank``, ``exc_type`` and ``rank_traceback``
    say where and what."""

    def __init__(self, message: str, rank: int, exc_type: str, rank_traceback: str):
        super().__init__(message)
        self.rank, self.exc_type, self.rank_traceback = rank, exc_type, rank_traceback


class RankCrashed(DistributedError):
    """A rank's process died (a signal, ``os._exit``, an abort inside the backend)."""


class HangError(DistributedError):
    """The ranks could not all finish: a timeout or a collective mismatch. The message has a line
    per rank saying where it was."""


class Results(list):
    """The ranks' return values in rank order, plus ``comms[r]``: rank r's collective record,
    ``backend``, ``seconds`` (wall time of the run) and ``wire``: the bytes that crossed,
    counted by the kernel outside the ranks (``distlab.runtime.wire.RunWire``; None under
    torchrun)."""
    comms: list[list[Comm]]
    wire: object = None
    backend: str
    seconds: float
