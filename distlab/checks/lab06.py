"""Graded checks of Lab 6, "Reading timelines".

Exercises, each checked on traces recorded on real ranks with ``torch.profiler`` (gloo on CPU):
1. ``collective_events(trace) -> [(op, bytes, start_s, duration_s), ...]``: the collectives one
   rank executed, read from its raw Kineto (Chrome) trace, in start order.
2. ``comm_share(timeline, rank, window)``: the fraction of the window (start, end) in which the rank
   communicated (the measure of the union of its comm spans clipped to the window, over the
   window's length); ``exposed_comm(timeline, rank, window)``: the seconds of that communication not
   covered by any of the rank's compute spans.
3. ``classify(timeline) -> "DP" | "TP" | "PP"``: which parallelism produced an unlabelled timeline.
4. ``overlap_fraction(timeline, rank)``: over all steps of the rank, the fraction of communication
   time hidden under compute: 1 - sum(exposed) / sum(communication time).

Visible tests read the traces in ``data/06_timelines/`` (recorded on CPU gloo by
``make_references``); hidden tests record fresh runs of other sizes at grading time. The references
are the plain computations below on the same spans.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import random

import torch

from distlab.checks.assertions import CheckFailed
from distlab.checks.lab06_design import grade_bucket_plan, visible_problem
from distlab.checks.ranks import call_each, call_each_of
from distlab.checks.lab06_stored import (collectives_tensors as _collectives_tensors,
                                         stored_collectives as _stored_collectives,
                                         timeline_from, timeline_tensor)
from distlab.labs.timelines.trace import Timeline, collective_events as reference_collectives, merge_traces
from distlab.labs.timelines.intervals import clip, length, minus, union  # noqa: F401
from distlab.labs.timelines.runs import KIND, Spec, profile_all
from distlab.runtime.per_rank import reference

LAB = "06_timelines"
# What this lab's checks' ranks import of PyTorch beyond torch.distributed (measured; distlab/checks/__init__.py)
# torch._dynamo (with DTensor and FSDP): an optimizer's constructor imports it, 0.4-0.8 s a rank.
RANK_IMPORTS = ("torch._dynamo",)
WORLD_SIZE = 2
STEPS = 3
STORED = {"dp_naive": "DP naive", "dp_overlapped": "DP overlapped", "tp": "TP", "pp": "PP"}
LABELS = ["DP", "TP", "PP"]
REL = 1e-9  # the same arithmetic on the same spans: only summation order differs


# ---------------------------------------------------------------------------------------------
# References: interval arithmetic on one rank's spans

def _intervals(timeline: Timeline, rank: int, kind: str, window) -> list[tuple[float, float]]:
    return clip([(s.start, s.end) for s in timeline.of(rank, kind)], *window)


def reference_comm_share(timeline: Timeline, rank: int, window) -> float:
    return length(_intervals(timeline, rank, "comm", window)) / (window[1] - window[0])


def reference_exposed_comm(timeline: Timeline, rank: int, window) -> float:
    return length(minus(_intervals(timeline, rank, "comm", window),
                        _intervals(timeline, rank, "compute", window)))


def reference_overlap_fraction(timeline: Timeline, rank: int) -> float:
    comm = sum(length(_intervals(timeline, rank, "comm", w)) for w in timeline.steps(rank))
    exposed = sum(reference_exposed_comm(timeline, rank, w) for w in timeline.steps(rank))
    return 1 - exposed / comm if comm > 0 else 0.0


def reference_classify(timeline: Timeline) -> str:
    """"DP", "TP" or "PP": the parallelism that produced ``timeline``, read from what any
    timeline shows (ops, counts, sizes, positions relative to the ranges), so the same at any
    size of model, batch or world."""
    comms = [s for s in timeline.spans if s.kind == "comm" and s.op != "barrier"]
    if any(s.op in ("send", "recv", "send_recv") for s in comms):
        return "PP"
    forward = {r: [(s.start, s.end) for s in timeline.of(r, "range", "forward")]
               for r in range(timeline.world_size)}
    inside = [s for s in comms if any(a <= s.start < b for a, b in forward[s.rank])]
    return "TP" if inside else "DP"


# ---------------------------------------------------------------------------------------------
# Recorded traces: stored (visible tests) and fresh (hidden tests)

def _record(name: str, spec: Spec = Spec(), world_size: int = WORLD_SIZE) -> list[bytes]:
    return profile_all(world_size, spec, steps=STEPS, runs=(STORED[name],), backend="gloo")[STORED[name]].traces


@functools.lru_cache(maxsize=None)
def _stored_blobs(name: str) -> list[bytes] | None:
    from distlab.checks.stored import load
    try:
        found = load(LAB, name)
    except (FileNotFoundError, ValueError):
        return None
    return [bytes(found[f"rank{r}"].tolist()) for r in range(int(found["world_size"]))]


def make_references() -> dict[str, dict]:
    """The stored traces, and what the references compute from them.

    Traces are recordings, so they are not reproducible: the ones already in data/06_timelines/
    are kept (and everything derived from them recomputed) unless DISTLAB_RERECORD=1, or a set is
    missing, in which case it is recorded afresh on this machine (CPU, gloo, 2 ranks)."""
    refs, timelines = {}, {}
    for name, run in STORED.items():
        blobs = None if os.environ.get("DISTLAB_RERECORD") == "1" else _stored_blobs(name)
        blobs = blobs or _record(name)
        timeline = timelines[name] = merge_traces(blobs, label=run)
        ranks = range(len(blobs))
        steps = [timeline.steps(r) for r in ranks]
        if reference_classify(timeline.unlabelled()) != KIND[run]:
            raise RuntimeError(f"the recorded {run} run reads as {reference_classify(timeline)}: "
                               f"record it again (DISTLAB_RERECORD=1)")
        refs[name] = {
            "seed": Spec().seed,
            "world_size": torch.tensor(len(blobs)),
            **{f"rank{r}": torch.tensor(list(blob), dtype=torch.uint8) for r, blob in enumerate(blobs)},
            **{key: value for r, blob in enumerate(blobs)
               for key, value in _collectives_tensors(reference_collectives(blob), r).items()},
            "comm_share": torch.tensor([[reference_comm_share(timeline, r, w) for w in steps[r]]
                                        for r in ranks], dtype=torch.float64),
            "exposed_comm": torch.tensor([[reference_exposed_comm(timeline, r, w) for w in steps[r]]
                                          for r in ranks], dtype=torch.float64),
            "overlap_fraction": torch.tensor([reference_overlap_fraction(timeline, r) for r in ranks],
                                             dtype=torch.float64),
            "label": torch.tensor(LABELS.index(KIND[run])),
            "timeline": timeline_tensor(timeline),   # read by _stored_merged
        }
    gpu = reference_gpu_answers()
    refs["gpu"] = {"seed": 0, **{key: torch.tensor(gpu[key], dtype=torch.float64) for key in GPU_KEYS}}
    from distlab.checks.lab06_prediction import messages_set
    refs["messages"] = messages_set()
    from distlab.checks.lab06_design import bucket_set
    refs["buckets"] = bucket_set(timelines["dp_naive"])
    return refs


# Visible tests compare with these stored values: a student's handout has none of the
# references above (they are the exercises' answers); hidden tests compute them in the judge.

def stored_traces(name: str) -> list[bytes]:
    """The stored Kineto traces (gzip bytes, one per rank) of run ``name`` ("dp_naive", ...)."""
    blobs = _stored_blobs(name)
    if blobs is None:
        raise FileNotFoundError(f"data/{LAB}/{name}.pt is missing or stale; run "
                                f"`distlab references {LAB}` to record it.")
    return blobs


def stored_trace(name: str, rank: int) -> dict:
    """Rank ``rank``'s stored Kineto trace of run ``name``, as the JSON dict torch.profiler wrote."""
    from distlab.labs.timelines.trace import load_trace
    return load_trace(stored_traces(name)[rank])


@functools.lru_cache(maxsize=None)
def _stored_merged(name: str) -> Timeline:
    """The stored run's merged timeline, as ``make_references`` merged its stored traces."""
    from distlab.checks.stored import load
    return timeline_from(load(LAB, name)["timeline"])


def stored_timeline(name: str, labelled: bool = True) -> Timeline:
    """The merged timeline of stored run ``name`` (a copy: yours to change)."""
    tl = _stored_merged(name)
    return dataclasses.replace(tl, spans=list(tl.spans), label=tl.label if labelled else "")


def fresh_spec(seed: int) -> Spec:
    """Other sizes than the stored runs', drawn from ``seed``."""
    rng = random.Random(seed)
    return Spec(hidden=rng.choice([128, 192, 256]), layers=rng.choice([2, 3, 4]),
                microbatches=rng.choice([2, 4]), dp_batch=rng.choice([256, 384, 512]), seed=seed)


_FRESH: dict[int, dict] = {}


def fresh_timelines(seed: int) -> tuple[int, dict[str, tuple[list[bytes], Timeline]]]:
    """Every run recorded now with ``fresh_spec(seed)``. Recording takes seconds, so the first
    call's recording serves every later one in this process (all hidden tests of a grading run):
    returns (the seed it was recorded with, {name: (traces, timeline)})."""
    if not _FRESH:
        profiles = profile_all(WORLD_SIZE, fresh_spec(seed), steps=STEPS, backend="gloo")
        _FRESH[seed] = {name: (profiles[run].traces, profiles[run].timeline)
                        for name, run in STORED.items()}
    return next(iter(_FRESH.items()))


def _cases(seed: int | None, merged: bool = True):
    """(what, traces, timeline, stored) for every run: stored (with its stored reference set) or
    fresh (``stored`` None: the references are computed, in the judge). ``merged=False``: the
    stored runs' timelines are left unmerged (None), for a check that reads the raw traces only."""
    from distlab.checks.stored import load
    if seed is None:
        for name in STORED:
            yield (f"the stored {STORED[name]} trace", stored_traces(name),
                   stored_timeline(name) if merged else None, load(LAB, name))
    else:
        recorded_with, runs = fresh_timelines(seed)
        for name, (traces, timeline) in runs.items():
            yield (f"a fresh {STORED[name]} trace (sizes from seed {recorded_with})", traces,
                   timeline, None)


def _close(got, expected: float, rel: float = REL, abs_: float = 1e-12) -> bool:
    try:
        return math.isclose(float(got), expected, rel_tol=rel, abs_tol=abs_)
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Checks

def check_collective_events(fn, seed: int | None = None) -> str:
    """``fn(trace)`` must list rank r's collectives: (op, bytes, start s, duration s), in start order."""
    cases = [(what, rank, blob, stored) for what, traces, _, stored in _cases(seed, merged=False)
             for rank, blob in enumerate(traces)]
    # The traces go as their gzip bytes, each parsed on the rank for its call: parsed, the
    # stored ones are 9 MB of dicts, and pickling them there and back cost seconds.
    answers = call_each(_OnTrace(fn), [(blob,) for _, _, blob, _ in cases])   # one launch
    for (what, rank, blob, stored), got in zip(cases, answers):
        expected = reference(reference_collectives(blob) if stored is None
                             else _stored_collectives(stored, rank))
        where = f"collective_events on {what}, rank {rank}"
        try:
            got = [tuple(g) for g in got]
        except TypeError:
            raise CheckFailed(f"{where}: return a list of (op, bytes, start, duration) tuples, "
                              f"got {type(got).__name__}.")
        if len(got) != len(expected):
            raise CheckFailed(
                f"{where}: expected {len(expected)} collectives, got {len(got)}. A collective's "
                f"execution is a complete ('ph' 'X') event named 'gloo:<op>' (category "
                f"user_annotation) or, on GPUs, a kernel whose name starts with 'nccl'.")
        for i, (g, e) in enumerate(zip(got, expected)):
            if len(g) != 4 or g[0] != e[0] or g[1] != e[1]:
                raise CheckFailed(
                    f"{where}: collective #{i} expected ({e[0]!r}, {e[1]} bytes, ...), got {g!r}. "
                    f"op is the name after 'gloo:'; bytes = elements of 'Input Dims' x the size "
                    f"of 'Input type' (ITEMSIZE), summed over the inputs.")
            if not (_close(g[2], e[2], 1e-12) and _close(g[3], e[3], 1e-9, 1e-12)):
                raise CheckFailed(
                    f"{where}: collective #{i} ({e[0]}) expected start {e[2]:.6f} s and duration "
                    f"{e[3] * 1e6:.3f} us, got {g[2]!r} and {g[3]!r}. Trace times ('ts', 'dur') "
                    f"are microseconds: multiply by 1e-6; sort by start.")
    counts = sorted(len(got) for got in answers)
    return (f"collective_events on {len(cases)} rank traces: your {counts[0]} to {counts[-1]} collectives a "
            f"trace, each op and bytes as recorded, start and duration within 1e-12 and 1e-09 relative")


class _OnTrace:
    """``fn(load_trace(blob))``, on the rank: the trace a student's ``collective_events`` reads,
    parsed from the recorded bytes for each call (a dict of its own, as a pickled copy was)."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "name", None) or getattr(fn, "__name__", "collective_events")

    def __call__(self, blob: bytes):
        from distlab.labs.timelines.trace import load_trace
        return self.fn(load_trace(blob))


def check_comm_share(share_fn, exposed_fn, seed: int | None = None) -> str:
    """``share_fn(timeline, rank, window)`` and ``exposed_fn(...)`` on every step of every rank."""
    cases = [(what, timeline, stored, rank, i, window) for what, _, timeline, stored in _cases(seed)
             for rank in range(timeline.world_size)
             for i, window in enumerate(timeline.steps(rank))]
    calls = [(timeline, rank, window) for _, timeline, _, rank, _, window in cases]
    shares, exposures = call_each_of([share_fn, exposed_fn], calls)   # one launch, both graded
    worst = 0.0
    for (what, timeline, stored, rank, i, window), got_share, got_exposed in zip(cases, shares, exposures):
        where = f"on {what}, rank {rank}, step {i} (window {window[0]:.6f}..{window[1]:.6f} s)"
        share = reference(reference_comm_share(timeline, rank, window) if stored is None
                          else stored["comm_share"][rank][i].item())
        if not _close(got_share, share):
            raise CheckFailed(
                f"comm_share {where}: expected {share:.6f}, got {got_share!r}. Clip the rank's comm "
                f"spans to the window, merge overlapping ones (gloo runs collectives on "
                f"several threads), and divide their total length by the window's.")
        exposed = reference(reference_exposed_comm(timeline, rank, window)
                            if stored is None else stored["exposed_comm"][rank][i].item())
        if not _close(got := got_exposed, exposed):
            raise CheckFailed(
                f"exposed_comm {where}: expected {exposed * 1e3:.6f} ms, got "
                f"{got if not isinstance(got, (int, float)) else f'{got * 1e3:.6f} ms'}. "
                f"Subtract the union of the compute spans from the union of the comm spans, "
                f"both clipped to the window; answer in seconds.")
        worst = max([worst] + [abs(float(g) - e) / abs(e) for g, e in ((got_share, share), (got, exposed)) if e])
    ms = [float(e) * 1e3 for e in exposures]
    return (f"comm_share and exposed_comm on {len(cases)} steps (every rank of every run): your shares "
            f"{min(map(float, shares)):.3f} to {max(map(float, shares)):.3f}, exposed {min(ms):.3g} to "
            f"{max(ms):.3g} ms, each off the reference by at most {worst:.2g} relative (allowed {REL:g})")


def check_classify(fn, seed: int | None = None) -> str:
    """``fn(timeline)`` must name the parallelism of every unlabelled timeline."""
    cases = list(_cases(seed))
    answers = call_each(fn, [(timeline.unlabelled(),) for _, _, timeline, _ in cases])
    for (what, _, timeline, stored), got in zip(cases, answers):
        expected = reference_classify(timeline) if stored is None else LABELS[int(stored["label"])]
        if got != expected:
            raise CheckFailed(
                f"classify on {what}: "
                f"expected {expected!r}, got {got!r}. Measure: are there point-to-point "
                f"messages (send/recv)? Do collectives happen inside the forward range, or only "
                f"after it? How many per step, how large?")
    made = ", ".join(f"{got} ({timeline.label})" for (_, _, timeline, _), got in zip(cases, answers))
    return f"classify on {len(cases)} unlabelled timelines: your {made}: each the parallelism that made it"


def check_overlap_fraction(fn, seed: int | None = None) -> str:
    """``fn(timeline, rank)`` on the data-parallel runs, naive and overlapped, every rank."""
    cases = [(what, timeline, stored, rank) for what, _, timeline, stored in _cases(seed)
             if timeline.label.startswith("DP") for rank in range(timeline.world_size)]
    answers = call_each(fn, [(timeline, rank) for _, timeline, _, rank in cases])
    for (what, timeline, stored, rank), got in zip(cases, answers):
        expected = reference(reference_overlap_fraction(timeline, rank) if stored is None
                             else stored["overlap_fraction"][rank].item())
        if not _close(got, expected, 1e-9, 1e-9):
            raise CheckFailed(
                f"overlap_fraction on {what}, rank {rank}: expected {expected:.6f}, got {got!r}. "
                f"Over all steps: 1 - (sum of exposed communication) / (sum of communication "
                f"time), the communication time of a step being comm_share x its length.")
    yours = "; ".join(f"{t.label} rank {r} {float(a):.3f}" for (_, t, _, r), a in zip(cases, answers))
    return f"overlap_fraction: your {yours}: each the reference's within 1e-09"


__all__ = ["check_collective_events", "check_comm_share", "check_classify", "check_overlap_fraction",
           "check_gpu_traces",
           "make_references", "stored_timeline", "stored_trace", "stored_traces"]


# ---------------------------------------------------------------------------------------------
# Exercise 5: the real GPU traces shipped under data/traces

from distlab.checks.lab06_gpu import GPU_KEYS, grade_gpu_answers, gpu_answers  # noqa: E402,F401


def reference_gpu_answers() -> dict:
    """The course's own measures (the references above) run on the shipped files."""
    return gpu_answers(reference_overlap_fraction, reference_comm_share, reference_exposed_comm)


def check_gpu_traces(answers) -> str:
    """``answers``: the A100 trace's overlap fraction and NCCL share (rank 0, over its GPU window)
    and the nsys export's exposed communication per rank (seconds, over each rank's GPU window)."""
    from distlab.checks.stored import load
    stored = load(LAB, "gpu")   # the references on the shipped files, stored: a handout has none
    return grade_gpu_answers(answers, stored, REL, _close)


def check_predicted_messages(predict_messages, seed: int | None = None) -> str:
    """``predict_messages(run, spec, world_size, rank)``: the (op, bytes) messages the rank sends
    per step, by the formulas of Labs 2, 3 and 5 (``lab06_prediction``)."""
    from distlab.checks.lab06_prediction import grade_messages
    return grade_messages(predict_messages, seed)


def check_bucket_plan(plan_buckets, seed: int | None = None) -> str:
    """The open design exercise, first cell: ``plan_buckets(sizes, ready, alpha, bandwidth)``'s
    wait (on paper) within the hinted designs', and its run on real ranks (``lab06_design``)."""
    return _said(grade_bucket_plan(plan_buckets, seed, "hinted"))


def check_bucket_plan_bar(plan_buckets, seed: int | None = None) -> str:
    """The design's second cell: its wait within the bar, between the hinted designs' and the bound."""
    return _said(grade_bucket_plan(plan_buckets, seed, "bar"))


def _said(verdict: str) -> str:   # printed: the lab's cells end in ";", hidden cases too
    print(verdict)
    return verdict


def bucket_problem():
    """The design exercise's visible problem and scale, as stored: (spec, problem, {"hinted",
    "bar", "bound"}: seconds waited after backward)."""
    return visible_problem()


# The course code these exercises may not use (see distlab.checks.course_code).
from distlab.checks.course_code import LAB6_SHIPPED, CourseCode, names  # noqa: E402
COURSE_CODE = dict.fromkeys([
    "check_collective_events", "check_comm_share", "check_classify", "check_overlap_fraction",
    "check_predicted_messages", "check_bucket_plan", "check_bucket_plan_bar"],
    CourseCode(forbidden=LAB6_SHIPPED + names("distlab.labs.timelines.runs", "formula_messages")
               + names("distlab.checks.lab06_design", "_best_exposed")))
# Graded on values handed in (numbers the kernel computed from the shipped traces): no course code runs on the judge's ranks for
# these, so there is nothing for a guard to notice.
GRADED_ON_VALUES = ("check_gpu_traces",)
from distlab.checks.messenger import judge_module  # noqa: E402  (while grading, checks run in the judge)
judge_module(globals())
