"""Pieces the graded checks of several labs share."""
from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from typing import Callable, Sequence

import torch
import torch.nn as nn

from distlab.checks.assertions import CheckFailed, verified
from distlab.runtime.devices import device as rank_device  # noqa: F401 (re-exported for the checks)


def dense_run(model: nn.Module, x: torch.Tensor, dy: torch.Tensor, prefix: str = "") -> dict:
    """Forward x, backward with upstream gradient dy; weights, output, dL/dx and dL/dparams."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * dy).sum().backward()
    out = {f"{prefix}y": y.detach(), f"{prefix}dx": x.grad}
    for name, p in model.named_parameters():
        out[f"{prefix}param.{name}"] = p.detach().clone()
        out[f"{prefix}grad.{name}"] = p.grad
    return out


# Where an exercise hands each rank a full-shape object (the dense layer to shard), the check fills
# what the rank's shard must not read with NaN (distlab.runtime.per_rank.nan_module_outside).
NAN_SHARD_HINT = ("NaN in your result: each rank receives the dense module with every weight "
                  "outside its own shard set to NaN, so this rank read weights it does not own "
                  "(a dense layer used whole, or another rank's rows, columns or heads). Use only "
                  "this rank's shard and combine the partial results with collectives.")


def design_scale(hinted: float, bound: float) -> dict[str, float]:
    """An open design exercise graded on a scale (CONTRIBUTING, "A lab"): its first test's limit,
    the hinted design's figure; its second's, the bar halfway from there to the bound; and the
    bound no design beats. Each verdict shows the student's figure beside all three."""
    return {"hinted": hinted, "bar": (hinted + bound) / 2, "bound": bound}


class DesignRuns:
    """The one run a design exercise's two tests grade (its first test at the hinted design's
    figure, its second at the bar): the first test runs the submission and keeps what it
    measured; the second takes that, once. Use one per design module::

        _RUNS = DesignRuns()
        measured = _RUNS.run(fn, (world_size, seed is None), lambda: measure(fn, ...),
                             first=level == "hinted")

    Keyed on the submission (in the judge the function's cloudpickled source, ``Submitted.data``,
    the same bytes for both tests of a notebook; in a student's kernel the function itself) and
    the case (hashable: world size, visible or hidden, sizes). The first test always runs afresh,
    and the second takes the entry away: a rerun of either cell in a student's kernel runs the
    design again (after a fix to a helper the design calls, the same function object grades its
    new behaviour), and a second test without a first's entry (the first failed, or never ran)
    runs its own. At most ``keep`` entries: a grading worker's judge serves many notebooks, and a
    notebook whose second test never runs leaves its entry behind; the oldest goes first."""

    def __init__(self, keep: int = 8):
        self.keep, self._runs, self._lock = keep, {}, threading.Lock()

    @staticmethod
    def submission(fn):
        """What identifies a submission: its source as the judge received it, or the object."""
        data = getattr(fn, "data", None)
        return data if isinstance(data, bytes) else fn

    def run(self, fn, case: tuple, measure: Callable, *, first: bool):
        """``measure()``'s result for (``fn``, ``case``): run now on a ``first`` test (and kept
        for the second), else the first test's, taken away (or run now when there is none)."""
        key = (self.submission(fn), case)
        try:
            hash(key)
        except TypeError:      # an unhashable object handed in: no sharing, every test runs
            return measure()
        with self._lock:
            found = self._runs.pop(key, self)   # self: no entry (a run may measure None)
        if found is not self and not first:
            return found
        measured = measure()   # outside the lock: a run takes seconds
        if first:
            with self._lock:
                self._runs[key] = measured
                while len(self._runs) > self.keep:
                    self._runs.pop(next(iter(self._runs)))
        return measured

    def __len__(self) -> int:
        return len(self._runs)


def nan_hint(got, expected, hint: str) -> str:
    """``hint``, preceded by NAN_SHARD_HINT when ``got`` holds NaN where ``expected`` has none."""
    if (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
            and bool(got.detach().isnan().any()) and not bool(expected.detach().isnan().any())):
        return f"{NAN_SHARD_HINT}\n{hint}" if hint else NAN_SHARD_HINT
    return hint


def cut(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    """The plain slice rank r owns: elements [r*n/p, (r+1)*n/p) along dim."""
    n = t.shape[dim] // world_size
    return t.narrow(dim, rank * n, n)


def split_phases(comms, count: int, what: str, rank: int) -> list[list]:
    """Split a rank's record at the barriers the check's rank body puts between phases."""
    from distlab.labs.tensor_parallel import split_at_barriers
    phases = split_at_barriers(comms)
    if len(phases) != count:
        raise CheckFailed(f"{what}: rank {rank} called dist.barrier() itself; remove it (the check "
                          f"uses barriers to tell the forward from the backward).")
    return phases


def _describe(c) -> str:
    return f"{c.op} of {list(c.shapes[0]) if c.shapes else '?'} ({c.bytes} bytes)"


def describe_comms(comms) -> str:
    return ", ".join(_describe(c) for c in comms) or "no collective"


def tally_comms(comms) -> str:
    """``describe_comms`` with repeated calls counted once: "3 × all_reduce of [8] (64 bytes)"."""
    seen = Counter(_describe(c) for c in comms)
    return ", ".join(d if n == 1 else f"{n} × {d}" for d, n in seen.items()) or "no collective"


# ---------------------------------------------------------------------------------------------
# "Exactly these collectives": the pattern checks of Labs 2, 8 and 9

GATHER_OPS = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_single"})
REDUCE_SCATTER_OPS = frozenset({"reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"})


def op_in(ops) -> Callable:
    """A ``Collectives.match`` for calls of any of ``ops`` (names of torch.distributed functions)."""
    return lambda c: c.op in ops


@dataclasses.dataclass(frozen=True)
class Collectives:
    """One kind of collective a record must hold exactly ``count`` of (0: a kind it must not
    issue): which calls are of the kind (``match``), what the rule is and what to do when the
    count is wrong (``why``), and optionally which sizes each call may move (``size_ok(bytes)``,
    explained by ``size_why``)."""
    name: str                       # as the student reads it: "all-gather in forward"
    match: Callable                 # Comm -> bool
    count: int
    why: str
    size_ok: Callable | None = None
    size_why: str = ""


def expect_collectives(comms, where: str, kinds: Sequence[Collectives], only: str = "") -> None:
    """Check that ``comms`` (a rank's record, or one phase or step of it; barriers are the
    checks' own and are ignored) holds exactly ``kind.count`` calls of each kind, in the order the
    kinds are given (so a forbidden kind listed first is said first), each of a size
    ``kind.size_ok`` accepts; with ``only`` (what the pattern needs), also no call of another
    kind. ``where`` names the rank (and step or phase); a failure says it, what the rank issued,
    and the kind's ``why``."""
    comms = [c for c in comms if c.op != "barrier"]
    for kind in kinds:
        calls = [c for c in comms if kind.match(c)]
        if len(calls) != kind.count:
            issued = f" ({tally_comms(calls)})" if calls else ""
            rest = f" All it issued: {tally_comms(comms)}." if calls != comms else ""
            raise CheckFailed(f"{where}: {len(calls)} {'call' if len(calls) == 1 else 'calls'} of "
                              f"{kind.name}{issued}, expected {kind.count}. {kind.why}{rest}")
        wrong = [c for c in calls if kind.size_ok is not None and not kind.size_ok(c.bytes)]
        if wrong:
            raise CheckFailed(f"{where}: {wrong[0].describe()} moved {wrong[0].bytes} bytes; "
                              f"{kind.size_why}")
    others = [c for c in comms if not any(kind.match(c) for kind in kinds)]
    if only and others:
        raise CheckFailed(f"{where}: it also called {tally_comms(others)}; {only}")
    verified(f"{where}: {tally_comms(comms)}, as the pattern needs")


def numbers_by_key(call: str, got, keys: Sequence[str]) -> list[float]:
    """``[float(got[k]) for k in keys]`` of a prediction that returns a dict of byte counts; a
    check fails on anything else, saying what came and what was expected."""
    try:
        return [float(got[k]) for k in keys]
    except (TypeError, KeyError, ValueError):
        raise CheckFailed(f"{call} returned {got!r:.160}: expected a dict with the keys "
                          f"{list(keys)}, each a number of bytes.") from None
