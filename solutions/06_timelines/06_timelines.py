# ---
# jupyter:
#   distlab:
#     summary: "Profiler traces of DP, TP and PP steps merged across ranks, communication share and overlap read from the lanes, and the nsys workflow."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 6 — Reading timelines
#
# Labs 1–5 predicted what parallel training costs: bytes per all-reduce, all-reduces per layer,
# the pipeline bubble. This lab checks those predictions against what actually happened, the way
# performance work is done on real clusters: record a **timeline** of every rank, put the ranks
# side by side on one clock, and measure.
#
# You will
# - profile a few training steps of data parallelism (naive and overlapped, Lab 2), tensor
#   parallelism (Lab 3) and pipeline parallelism (Lab 5) with `torch.profiler` on every rank;
# - merge the per-rank traces, draw them as lanes, and open them in Perfetto;
# - write the measures everyone quotes — **communication share**, **exposed communication**,
#   **overlap** — and a detector that tells DP, TP and PP apart from an unlabelled trace;
# - see how the same is done on GPU nodes with NVIDIA Nsight Systems (`nsys`);
# - compare measured communication shares with what the formulas of Labs 1–5 predict.
#
# **Vocabulary.** A *trace* is a list of timestamped events one process recorded. A *span* is an
# interval on a rank's timeline: a named *range* the code marked (forward, backward, optimizer),
# *compute* (an operator or a GPU kernel), or *communication* (a collective or a message).
# Communication is **exposed** when nothing else runs on that rank meanwhile: the rank is waiting.
# It is **overlapped** (hidden) when compute runs at the same time.

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import distlab
from distlab.labs.timelines import nsys
from distlab.checks.assertions import fresh_seed
from distlab.checks.lab06 import (bucket_problem, check_bucket_plan, check_bucket_plan_bar,
                                  check_classify, check_collective_events, check_comm_share,
                                  check_overlap_fraction, check_predicted_messages,
                                  stored_timeline, stored_trace)
from distlab.labs.timelines.buckets import BucketProblem, exposed, replay_buckets
from distlab.labs.timelines.chrome import export
from distlab.labs.timelines.trace import ITEMSIZE
from distlab.labs.timelines.views import overlap_table, peek, plot, share_table
from distlab.labs.timelines.runs import (closing_note, link_model, predicted_vs_measured,
                                   profile_all)

# %% [markdown]
# ## 1. Profiling every rank
#
# `torch.profiler` (built on Kineto) records, per process, every operator PyTorch runs, the
# ranges you name with `torch.profiler.record_function("forward")`, and — on GPUs — every CUDA
# kernel. Each rank records its own trace; there is no "distributed profiler", so tools (and
# you, below) merge them afterwards.
#
# `profile_all` runs four small training steps on 2 ranks, one after the other. Each rank builds
# its model, runs one warm-up step unrecorded (the first step pays for memory allocation and
# connection set-up), then 3 steps under the profiler, each inside a range named `step`, with
# `forward`, `backward` and `optimizer` ranges inside:
#
# | run | what communicates | where (Lab) |
# | --- | --- | --- |
# | DP naive | one blocking all-reduce per gradient, after backward | 2 |
# | DP overlapped | the same all-reduces, started asynchronously from gradient hooks during backward | 2 |
# | TP | Megatron MLPs (column-, then row-parallel): all-reduces of the (b, s, h) activation in forward and backward | 3 |
# | PP | GPipe: send/recv of each microbatch's activation forward and its gradient backward | 5 |
#
# On gloo, a collective runs on one of gloo's own threads and appears in the trace as a region
# named `gloo:all_reduce` (`gloo:send`, ...) lasting from when the rank starts it until its part
# is done — **including the time spent waiting for the slower peer**. On GPUs the same role is
# played by NCCL's kernels (`ncclDevKernel_AllReduce...`) on a CUDA stream.

# %% nbgrader={"grade": false, "grade_id": "profile_runs", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
runs = profile_all(world_size=2)

# %% [markdown]
# ## 2. One clock, one lane per rank
#
# `merge_traces` (called by `profile_all`) reads each rank's trace into spans and puts all ranks on one
# clock. On one machine Kineto stamps every process with the same system clock, so the traces line
# up as they are. Across machines clocks disagree by up to milliseconds — more than a small
# all-reduce takes — so `merge_traces(traces, align="barrier")` shifts every rank so that the ends of a
# barrier coincide (all ranks leave a barrier within microseconds of the last arrival; the
# profiled region starts with one for that reason).
#
# In the figures each rank has three rows: the ranges, compute, and communication (coloured by
# operation). Vertical lines mark the start of each step. First a tensor-parallel run:

# %% nbgrader={"grade": false, "grade_id": "plot_tp", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
plot(runs["TP"].timeline, title="TP: 4 Megatron MLPs on 2 ranks, 3 steps (gloo, CPU)");

# %% [markdown]
# Short all-reduces appear *inside* forward and backward, one per MLP each way (backward has one
# fewer: the first MLP's input needs no gradient, so autograd skips its all-reduce), and compute
# stops while each one runs: the next layer needs the summed activation. Now naive data parallelism:

# %% nbgrader={"grade": false, "grade_id": "plot_dp", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
plot(runs["DP naive"].timeline, title="DP naive: all-reduce every gradient after backward (gloo, CPU)");

# %% [markdown]
# Forward and backward run undisturbed; then one all-reduce per gradient (8 here: a weight and a
# bias per layer), back to back, while the rank does nothing else. The ranks rarely arrive
# together, so the first collective of a burst often shows one rank waiting for the other.
#
# To look closer, open the merged timeline in **Perfetto** (https://ui.perfetto.dev, runs in the
# browser, nothing is uploaded): zoom with W/S, pan with A/D, click a span for its arguments
# (operation, bytes). `runs[name].save(folder)` writes the raw per-rank traces, which Perfetto
# opens too, with every operator nested.

# %% nbgrader={"grade": false, "grade_id": "export", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
export(runs["TP"].timeline, "lab06_tp");

# %% [markdown]
# ## 3. Exercise 1 — the collectives in a raw trace (2 points)
#
# A Kineto trace is JSON: `{"traceEvents": [...], ...}`. A *complete* event has `"ph": "X"`, a
# `name`, a category `cat`, a start `ts` and a duration `dur` in **microseconds**, the process
# `pid` and thread `tid`, and `args`. Here are a few raw events of rank 0 of the stored DP run:

# %% nbgrader={"grade": false, "grade_id": "peek", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
peek(stored_trace("dp_naive", 0))

# %% [markdown]
# `c10d::allreduce_` is the call on the rank's main thread: it only *enqueues* the collective.
# The execution is the `gloo:all_reduce` event on gloo's thread; with shapes recorded it carries
# its tensors' `"Input Dims"` (a list of shapes) and `"Input type"` (a list of C++ type names,
# `"float"` = 4 bytes; `ITEMSIZE` maps every name to bytes).
#
# **Build** `collective_events(trace)`: the collectives one rank executed, read from its raw trace.
#
# **Contract.** Input: one rank's trace (a dict, as above). Output: one tuple
# `(op, bytes, start, duration)` per collective executed, sorted by start, where
# - a collective is a complete event of category `user_annotation` whose name starts with
#   `gloo:`, and `op` is the rest of the name (`"all_reduce"`, `"send"`, `"barrier"`, ...);
# - `bytes` is what its input tensors hold (0 when the event has no `Input Dims`, as for a
#   barrier);
# - `start` and `duration` are in **seconds**.
#
# The check compares your list, element by element, with the course's on every rank of the four
# stored runs (hidden: on runs recorded at grading time).
#
# **Why it matters.** Every measure below starts from this: a profiler's raw events, turned into
# what moved, when and for how long. (On GPUs the execution is a kernel: category `kernel`, name
# starting with `nccl`, and `args["Collective name"]`, `args["In msg nelems"]`, `args["dtype"]`;
# `distlab.labs.timelines.trace`'s reader handles both. The graded traces are gloo's.)
#
# <details><summary>Hint 1</summary>
#
# The events are in `trace["traceEvents"]`; many have no `cat` or no `args`, so read them with
# `.get`. Kineto's times `ts` and `dur` are microseconds.
# </details>
#
# <details><summary>Hint 2</summary>
#
# `args["Input Dims"]` and `args["Input type"]` are parallel lists: for each input, the number of
# elements of its shape (`math.prod`, 1 for a scalar's `[]`) times `ITEMSIZE[type]`; sum them.
# </details>

# %% nbgrader={"grade": false, "grade_id": "collective_events", "locked": false, "schema_version": 3, "solution": true, "task": false}
import math


def collective_events(trace: dict) -> list[tuple[str, int, float, float]]:
    """(op, bytes, start s, duration s) of every gloo collective in ``trace``, by start."""
    ### BEGIN SOLUTION
    found = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "user_annotation" or not e["name"].startswith("gloo:"):
            continue
        args = e.get("args", {})
        nbytes = sum(math.prod(dims) * ITEMSIZE[kind]
                     for dims, kind in zip(args.get("Input Dims", []), args.get("Input type", [])))
        found.append((e["name"][len("gloo:"):], nbytes, e["ts"] * 1e-6, e["dur"] * 1e-6))
    return sorted(found, key=lambda c: (c[2], c[3]))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_collective_events", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_collective_events(collective_events)
events = collective_events(stored_trace("tp", 0))
print(f"collective_events: correct. Rank 0 of the stored TP run: {len(events)} collectives, e.g.",
      [(op, b, f"{d * 1e3:.2f} ms") for op, b, _, d in events[1:4]])
### BEGIN HIDDEN TESTS
check_collective_events(collective_events, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise 2 — communication share and exposed communication (3 points)
#
# From here on you work on merged timelines. `timeline.of(rank, kind)` lists a rank's spans of one
# kind (`"range"`, `"compute"`, `"comm"`), each with `.start`, `.end` (seconds), `.name`, `.op`,
# `.bytes`; `timeline.steps(rank)` gives the `(start, end)` window of each step.
#
# - **Communication share** of a window: the time in which the rank was communicating, divided
#   by the window's length. Spans overlap — gloo runs collectives on two threads, and asynchronous
#   all-reduces run side by side — so first clip the spans to the window and **merge overlapping
#   intervals**; summing durations would count some time twice.
# - **Exposed communication**: the seconds of that communication during which the rank computed
#   nothing — the union of comm intervals *minus* the union of compute intervals, both clipped to
#   the window. That is the time communication adds to the step; overlapped communication is free.
#
# **Build** two helpers on lists of `(start, end)` intervals, then both measures:
#
# **Contract.**
# - `merge_intervals(intervals)`: disjoint intervals, sorted by start, covering exactly the union;
# - `subtract(first, second)`: disjoint sorted intervals covering the union of `first` minus the
#   union of `second`;
# - `comm_share(timeline, rank, window)`: a fraction in [0, 1]; `exposed_comm(timeline, rank,
#   window)`: seconds. `clipped` (given) turns a rank's spans of one kind into intervals cut to a
#   window.
#
# The check runs both measures on every step window of every rank of the four stored runs
# (hidden: runs of other sizes recorded at grading time) against the plain interval arithmetic,
# to a relative 1e-9.
#
# **Why it matters.** These two numbers are what everyone quotes about a step's communication;
# computed wrongly (durations summed) they report more communication than the step holds.
#
# <details><summary>Hint 1</summary>
#
# Sorted by start, an interval either overlaps (or touches) the last one kept, and extends it,
# or begins a new one.
# </details>
#
# <details><summary>Hint 2</summary>
#
# For `subtract`, walk the merged `first`; from each interval cut out every merged `second`
# interval that overlaps it, keeping the pieces before each cut and what remains after the last.
# </details>
#
# <details><summary>Hint 3</summary>
#
# The share is the total length of `merge_intervals(clipped(..., "comm", window))` over the
# window's length; the exposed time the total length of `subtract(comm, compute)`, both clipped.
# </details>

# %% nbgrader={"grade": false, "grade_id": "intervals", "locked": false, "schema_version": 3, "solution": true, "task": false}
def merge_intervals(intervals) -> list[tuple[float, float]]:
    """Disjoint intervals, sorted by start, covering exactly the union of ``intervals``."""
    ### BEGIN SOLUTION
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
    ### END SOLUTION


def subtract(first, second) -> list[tuple[float, float]]:
    """The parts of the union of ``first`` not covered by the union of ``second``."""
    ### BEGIN SOLUTION
    out, cover = [], merge_intervals(second)
    for a, b in merge_intervals(first):
        for c, d in cover:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
        if a < b:
            out.append((a, b))
    return out
    ### END SOLUTION


def clipped(timeline, rank: int, kind: str, window) -> list[tuple[float, float]]:
    """``rank``'s spans of ``kind`` as (start, end) intervals cut to ``window``."""
    lo, hi = window
    return [(max(s.start, lo), min(s.end, hi)) for s in timeline.of(rank, kind)
            if min(s.end, hi) > max(s.start, lo)]


# %% nbgrader={"grade": false, "grade_id": "comm_share", "locked": false, "schema_version": 3, "solution": true, "task": false}
def comm_share(timeline, rank: int, window: tuple[float, float]) -> float:
    """Fraction of ``window`` during which ``rank`` was communicating."""
    ### BEGIN SOLUTION
    comm = merge_intervals(clipped(timeline, rank, "comm", window))
    return sum(b - a for a, b in comm) / (window[1] - window[0])
    ### END SOLUTION


def exposed_comm(timeline, rank: int, window: tuple[float, float]) -> float:
    """Seconds of ``window`` in which ``rank`` communicated and computed nothing."""
    ### BEGIN SOLUTION
    exposed = subtract(clipped(timeline, rank, "comm", window),
                       clipped(timeline, rank, "compute", window))
    return sum(b - a for a, b in exposed)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_comm_share", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_comm_share(comm_share, exposed_comm)
print("comm_share and exposed_comm: correct on every step of every rank of the stored runs")
### BEGIN HIDDEN TESTS
check_comm_share(comm_share, exposed_comm, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Your measures on the runs you just recorded. In naive DP all communication is exposed (the
# rank waits in every all-reduce); in TP too, because each layer needs the previous all-reduce's
# result.

# %% nbgrader={"grade": false, "grade_id": "share_tables", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
share_table(runs["DP naive"].timeline, comm_share, exposed_comm)
share_table(runs["TP"].timeline, comm_share, exposed_comm);

# %% [markdown]
# ## 5. Exercise 3 — recognise the signature (3 points)
#
# Each parallelism leaves its own mark on a timeline:
# - **TP**: many short all-reduces *inside* forward and backward, one per tensor-parallel MLP
#   (or attention) block each way: two per transformer layer in the forward and two in the
#   backward (with sequence parallelism each becomes a reduce-scatter and an all-gather), each on
#   the critical path;
# - **DP**: few, large all-reduces of gradients at the end of (or overlapped with the end of)
#   backward, none in forward;
# - **PP**: point-to-point `send`/`recv` at the stage edges (activations forward, gradients
#   back), and idle time (the bubble) that shows up as long waits in `recv`.
#
# **Build** `classify(timeline)`.
#
# **Contract.** Input: an **unlabelled** timeline (its `label` hidden). Output: `"DP"`, `"TP"` or
# `"PP"`, from measurable features only (ops, counts, sizes, positions relative to the ranges;
# barriers are not part of any step's work). The check runs it on the four stored runs and, at
# grading, on runs of other sizes recorded then: a rule tuned to this lab's sizes fails there.
#
# **Why it matters.** Reading a stranger's trace starts with recognising what it is.
#
# <details><summary>Hint 1</summary>
#
# Which op appears in only one of the three? That settles one label at once.
# </details>
#
# <details><summary>Hint 2</summary>
#
# Between DP and TP, counts and sizes change with the model; *where* a collective starts, relative
# to the `forward` range (`timeline.of(rank, "range", "forward")`), does not.
# </details>

# %% nbgrader={"grade": false, "grade_id": "classify", "locked": false, "schema_version": 3, "solution": true, "task": false}
def classify(timeline) -> str:
    """"DP", "TP" or "PP": the parallelism that produced ``timeline``."""
    ### BEGIN SOLUTION
    ops = {s.op for s in timeline.spans if s.kind == "comm"}
    if ops & {"send", "recv", "send_recv"}:
        return "PP"
    for rank in range(timeline.world_size):
        forward = timeline.of(rank, "range", "forward")
        for s in timeline.of(rank, "comm"):
            if s.op != "barrier" and any(f.start <= s.start < f.end for f in forward):
                return "TP"
    return "DP"
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_classify", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_classify(classify)
print("classify: right on the four stored runs")
### BEGIN HIDDEN TESTS
check_classify(classify, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# And on the four runs you recorded in section 1, their names hidden from it:

# %% nbgrader={"grade": false, "grade_id": "classify_own_runs", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
{name: classify(profile.timeline.unlabelled()) for name, profile in runs.items()}

# %% [markdown]
# ## 6. Exercise 4 — how much did overlapping buy? (2 points)
#
# In Lab 2 you started each gradient's all-reduce from a hook as soon as autograd produced it, so
# that communication runs while backward computes earlier layers. Whether it *did* is a timeline
# question.
#
# **Build** `overlap_fraction(timeline, rank)`. **Contract:** over all steps of the rank, the
# fraction of communication time hidden under compute,
#
# $$\text{overlap} = 1 - \frac{\sum_\text{steps} \text{exposed}}{\sum_\text{steps} \text{communication time}},$$
#
# with a step's communication time = its communication share × its length; 0 when the rank did
# not communicate. The check compares it with the course's on the stored naive and overlapped DP
# runs (hidden: runs recorded at grading time), to a relative 1e-9.
#
# <details><summary>Hint 1</summary>
#
# `timeline.steps(rank)` gives the windows; your `comm_share` and `exposed_comm` give each step's
# two sums. Sum over steps before dividing: a mean of per-step fractions weights short steps wrongly.
# </details>

# %% nbgrader={"grade": false, "grade_id": "overlap_fraction", "locked": false, "schema_version": 3, "solution": true, "task": false}
def overlap_fraction(timeline, rank: int) -> float:
    """Fraction of ``rank``'s communication time, over all steps, that overlapped compute."""
    ### BEGIN SOLUTION
    windows = timeline.steps(rank)
    comm = sum(comm_share(timeline, rank, w) * (w[1] - w[0]) for w in windows)
    exposed = sum(exposed_comm(timeline, rank, w) for w in windows)
    return 1 - exposed / comm if comm > 0 else 0.0
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_overlap_fraction", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_overlap_fraction(overlap_fraction)
print("overlap_fraction: correct on the stored naive and overlapped DP runs")
### BEGIN HIDDEN TESTS
check_overlap_fraction(overlap_fraction, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# On the runs recorded in this session (and the stored ones, recorded on the course's machine):

# %% nbgrader={"grade": false, "grade_id": "overlap_tables", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
overlaps = overlap_table({"DP naive": runs["DP naive"].timeline,
                          "DP overlapped": runs["DP overlapped"].timeline,
                          "stored naive": stored_timeline("dp_naive"),
                          "stored overlapped": stored_timeline("dp_overlapped")}, overlap_fraction)
plot(runs["DP overlapped"].timeline, title="DP overlapped: all-reduces start during backward");

# %% [markdown]
# Naive DP hides nothing, by construction. The overlapped version hides part of its
# communication. (Its communication *share* may even be larger than naive DP's: its all-reduces
# start earlier, during backward, so they also spend longer waiting for the other rank. Share
# alone does not tell you whether overlapping paid off; the exposed time and the step time do.)
# It hides less than a GPU would: here the ranks and gloo's threads share the same few
# CPU cores, so communicating slows computing down, and the last gradients (the first layer's)
# are only ready when backward ends, so their all-reduce cannot hide behind anything. On GPUs,
# NCCL's collectives are kernels on a CUDA stream of their own (they use SMs; copy engines can
# only move data, for all-gathers as an opt-in, never add for a reduction): they run concurrently with the compute kernels, slowing them a little by sharing
# SMs and memory bandwidth, and bucketed overlap (DDP) typically hides most of the all-reduce
# time except the last bucket's.

# %% [markdown]
# ### Exercise 7 — plan the buckets (open design, 3 points)
#
# Overlap hides communication only behind backward that is still to come. One all-reduce per
# gradient pays the per-call cost α every time; one bucket for all waits for the last gradient
# and hides nothing. Somewhere between is the plan that makes the step wait least after backward.
#
# **Goal.** Write `plan_buckets(sizes, ready, alpha, bandwidth)` returning a plan: how many layers
# go in each bucket, in backward order (the last layer's bucket first), e.g. `[1, 3]`.
#
# **The model** (`distlab.labs.timelines.buckets`): `sizes[j]` are the bytes of the gradients of
# the j-th layer that backward reaches, complete `ready[j]` seconds after backward starts; a
# bucket's all-reduce starts when its last layer is ready and the previous all-reduce is done, and
# takes α + S/B (Lab 1's model). The lab's problem is measured on the stored naive DP trace: the
# backward range over the layers, and α and B fitted to the medians of its two all-reduce sizes.
#
# **Budget, on a scale** (printed below, in ms waited after backward). The first test's budget
# is what the hints lead to; the second test's bar lies halfway from there to the bound, the least
# any plan of contiguous buckets waits. The first test also runs your plan on 2 real ranks, one
# flat all-reduce per bucket, and compares the collective record (one all-reduce per bucket, of
# its bytes) and the averaged gradients with the single-process ones. Hidden tests: other widths,
# depths and speeds, each with its own scale. The feedback shows your wait beside all three.
#
# **Why it matters.** This is the choice behind DDP's `bucket_cap_mb` (Lab 2): the same trade of
# per-call cost against overlap, read off a timeline. `replay_buckets(problem, plan)` and
# `exposed(problem, plan)` try a plan on paper.
#
# <details><summary>Hint 1</summary>
#
# Work out both extremes on the lab's problem first. Where does each lose its time?
# </details>
#
# <details><summary>Hint 2</summary>
#
# The last bucket's all-reduce always runs after backward ends: keep it small. The early buckets
# have backward to hide behind, but the link must be free when the last one starts.
# </details>
#
# <details><summary>Hint 3</summary>
#
# A plan that hides the last bucket well may still not be the best one. How many plans of
# contiguous buckets are there for the depths the check uses (at most 7 layers), and how long
# does `exposed` take to price one?
# </details>

# %% nbgrader={"grade": false, "grade_id": "bucket_problem", "locked": true, "schema_version": 3, "solution": false, "task": false}
spec6, problem, scale = bucket_problem()
print(f"{len(problem.sizes)} layers of {problem.sizes[0]} bytes, one every "
      f"{problem.ready[0] * 1e3:.2f} ms of backward; alpha = {problem.alpha * 1e3:.2f} ms, "
      f"B = {problem.bandwidth / 1e6:.1f} MB/s; first test: wait at most "
      f"{scale['hinted'] * 1e3:.3f} ms, second: at most {scale['bar'] * 1e3:.3f} ms; no plan "
      f"waits less than {scale['bound'] * 1e3:.3f} ms")

# %% nbgrader={"grade": false, "grade_id": "plan_buckets", "locked": false, "schema_version": 3, "solution": true, "task": false}
def plan_buckets(sizes, ready, alpha, bandwidth) -> list[int]:
    """Layers per bucket, in backward order, so that the step waits least after backward."""
    ### BEGIN SOLUTION
    import itertools
    problem = BucketProblem(tuple(sizes), tuple(ready), alpha, bandwidth)
    layers, best = len(sizes), None
    for cuts in itertools.product((False, True), repeat=layers - 1):
        plan, n = [], 1
        for cut in cuts:                            # a cut after layer j closes a bucket
            if cut:
                plan.append(n)
                n = 0
            n += 1
        plan.append(n)
        if best is None or exposed(problem, plan) < exposed(problem, best):
            best = plan
    return best
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_plan_buckets", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_bucket_plan(plan_buckets);   # prints its verdict: your wait beside the scale
### BEGIN HIDDEN TESTS
check_bucket_plan(plan_buckets, seed=fresh_seed());  # another width, depth (3-7 layers) and link
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_plan_buckets_bar", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_bucket_plan_bar(plan_buckets);   # the bar, between the hinted designs and the bound
### BEGIN HIDDEN TESTS
check_bucket_plan_bar(plan_buckets, seed=fresh_seed());  # the first cell's hidden problem and plan
### END HIDDEN TESTS

# %% [markdown]
# ## 7. The same on a GPU node: NVIDIA Nsight Systems
#
# `torch.profiler` sees what PyTorch does. **Nsight Systems** (`nsys`) sees the whole machine:
# every CUDA kernel and copy of every process, CUDA API calls, OS runtime calls, and **NVTX**
# ranges — the named ranges of the GPU world, which PyTorch emits per operator inside
# `torch.autograd.profiler.emit_nvtx()` and NCCL emits per call (`ncclAllReduce`, `ncclSend`,
# `ncclGroupStart`, ...). The workflow on a node with 2 GPUs, for the TP run of this lab:

# %% nbgrader={"grade": false, "grade_id": "nsys_commands", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print("\n".join(nsys.commands("tp", nproc=2)))

# %% [markdown]
# 1. `nsys profile` wraps `torchrun`, so one report holds every rank's process. `-t cuda,nvtx,osrt`
#    chooses what to trace; `-s none --cpuctxsw=none` turns off CPU sampling (large and not needed
#    here); `--capture-range=cudaProfilerApi` records only between the script's
#    `torch.cuda.profiler.start()` and `stop()`, after warm-up (`python -m distlab.labs.timelines.runs`
#    does that, and wraps the steps in `emit_nvtx()` and an NVTX range `step`).
# 2. `nsys stats` prints tables from the report: time per kernel name (`cuda_gpu_kern_sum`: how
#    much of the GPU time went to `ncclDevKernel_*`), time per NVTX range (`nvtx_sum`).
# 3. `nsys export --type sqlite` turns the report into a database (tables
#    `CUPTI_ACTIVITY_KIND_KERNEL`, `NVTX_EVENTS`, `CUPTI_ACTIVITY_KIND_RUNTIME`, names in
#    `StringIds`, nanosecond times on one clock). `distlab.labs.timelines.nsys.read_nsys` loads it into the same
#    timeline as before — NCCL kernels as communication, other kernels and copies as compute, NVTX
#    ranges as ranges — so `plot`, your `comm_share` and `exposed_comm` apply unchanged.
#
# Open the `.nsys-rep` in the Nsight Systems GUI for the full picture. Below, the lab records a
# fresh profile where `nsys` and 2 GPUs are present; where not, it says so and reads the real
# 2-GPU export shipped with the course (`data/traces/nsys_2gpu_sendrecv.sqlite`, trimmed to the
# tables read here; notice in `data/traces/NOTICE.md`).

# %% nbgrader={"grade": false, "grade_id": "nsys_timeline", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
gpu_timeline = nsys.timeline_for_lab("tp", nproc=2)
if gpu_timeline is not None:
    print(nsys.format_summary(nsys.kernel_summary(gpu_timeline, merge_intervals)))   # your union
    end = min(s.start for s in gpu_timeline.spans if s.kind == "comm") + 0.02
    plot(gpu_timeline, window=(end - 0.04, end), title=gpu_timeline.label + " (40 ms)")

# %% [markdown]
# On GPUs the compute row is the GPU's own work, so "exposed" has its exact meaning: time the GPU
# spent in NCCL kernels with no other kernel running. Note that an NCCL kernel also lasts from
# launch until the peers have arrived: a long `ncclDevKernel_SendRecv` is usually a stage waiting
# for its neighbour, not a slow link.

# %% [markdown]
# ## 7b. Exercise 5 — measure real GPU traces (2 points)
#
# The CPU runs above cannot show what overlap buys on GPUs. The course ships two real traces
# (`data/traces/`, recorded by others on GPUs; sources and MIT notices in its `NOTICE.md`):
#
# - `a100_timeline()`: rank 0 of a 2-rank DDP run on A100s (torch.profiler, NCCL 2.17.1): three
#   iterations, compute kernels and NCCL's `ncclKernel_AllReduce_RING_LL` kernels, one `step`
#   range over the whole profiled window;
# - `nsys_timeline()`: the nsys export read above (2 GPUs, NCCL send/recv).
#
# `gpu_window(timeline, rank)` is the rank's first to last kernel. With **your** functions,
# compute `gpu_answers`: the A100 trace's overlap fraction (`overlap_fraction(a100, 0)`) and NCCL
# share over its GPU window, and the nsys export's exposed communication of each rank, in seconds,
# over that rank's GPU window (a list, rank 0 first). The check recomputes them with the course's
# own measures on the same files.

# %% nbgrader={"grade": false, "grade_id": "gpu_answers", "locked": false, "schema_version": 3, "solution": true, "task": false}
from distlab.labs.timelines.gpu_traces import a100_timeline, gpu_window, nsys_timeline

a100, export = a100_timeline(), nsys_timeline()
### BEGIN SOLUTION
gpu_answers = {
    "a100_overlap_fraction": overlap_fraction(a100, 0),
    "a100_nccl_share": comm_share(a100, 0, gpu_window(a100, 0)),
    "nsys_exposed_comm_s": [exposed_comm(export, r, gpu_window(export, r)) for r in range(2)],
}
### END SOLUTION
print({k: (v if isinstance(v, float) else [round(x * 1e3, 3) for x in v]) for k, v in gpu_answers.items()})

# %% nbgrader={"grade": true, "grade_id": "test_gpu_answers", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab06 import check_gpu_traces
check_gpu_traces(gpu_answers)
print("gpu_answers: correct")

# %% [markdown]
# What they say. On the A100 run, NCCL kernels take about 7% of the GPU's window. DDP's bucketed
# all-reduces do start during backward: in each iteration 4 of the 5 all-reduce kernels run while
# backward's kernels run beside them on another stream, and only the last bucket's runs after
# backward. Yet compute kernels cover only about 16% of the NCCL time: this small model's backward
# leaves the GPU mostly idle between its short kernels, so overlap has little to hide behind. The
# overlap is real (on the CPU it was slower than naive), its payoff is bounded by how much compute
# there is to hide behind. In the nsys export, no NCCL
# send/recv kernel runs beside a compute kernel: a pipeline's point-to-point transfers are on the
# critical path (17 ms on rank 0, 8 ms on rank 1 of a 300 ms window), which is what the bubble of
# Lab 5 and interleaved schedules are about. Compare with the CPU runs above, where gloo's
# threads compete with compute for two cores.

# %% [markdown]
# ## 8. Reading real numbers: measured against predicted
#
# The formulas of Labs 1–5 predict each run's communication: the messages per step (which
# collectives, how many, how large: Labs 2, 3 and 5; Exercise 6 asks you for them), their time
# with Lab 1's model t(S) = α + S/B, fitted below on a short all-reduce sweep on these ranks, and
# for PP the bubble:
# an idle (p−1)/m of the compute time (Lab 5 stated the same idle time as (p−1)/(m+p−1) of the
# step: a ratio r to compute is r/(1+r) of the step). With the compute time measured on the
# trace, the predicted share is predicted comm / (predicted comm + compute).
#
# ### Exercise 6 — predict the messages before reading them (2 points)
#
# **Build** `predict_messages(run, spec, world_size, rank)`: the messages rank `rank` sends in one
# step of run `run` (`"DP naive"`, `"DP overlapped"`, `"TP"`, `"PP"`, as profiled in section 1),
# as a list of `(op, bytes)` pairs, `op` being `"all_reduce"` or `"send"`, bytes counted as
# nccl-tests does (the tensor's size).
#
# **Contract.** `spec` is the runs' `Spec` (`spec.batch`, `spec.dp_batch`, `spec.hidden`,
# `spec.layers`, `spec.seq`, `spec.microbatches`; all float32). The runs, as `profile_all` builds
# them: DP, `layers` blocks `Linear(h, h)` + tanh, every gradient all-reduced; TP, `layers`
# Megatron MLPs h → 4h → h on an input of `(batch // 4, seq, hidden)`; PP, GPipe on
# `batch // microbatches` rows of width h per microbatch. The check compares, per op, the count and
# the total bytes with the formulas on every run and rank at the lab's sizes and a smaller one
# (hidden: sizes drawn afresh, 2 to 4 ranks). The cell below then prints your bytes (formula B)
# beside the bytes the traces hold (traced B).
#
# **Why it matters.** A prediction that gets the bytes right and the time wrong tells you the
# time went to waiting, not to the wire: that is what the table below is for.
#
# <details><summary>Hint 1</summary>
#
# Which of the three depend on the batch? Which on the rank?
# </details>
#
# <details><summary>Hint 2</summary>
#
# TP: does the first MLP's input need a gradient, and what does autograd do with a backward
# collective whose result nobody needs? PP: which stages have a next stage to send activations
# to, and which a previous one to send gradients back to? How often, per step?
# </details>

# %% nbgrader={"grade": false, "grade_id": "predict_messages", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_messages(run: str, spec, world_size: int, rank: int) -> list[tuple[str, int]]:
    """(op, bytes) of every message ``rank`` sends in one step of ``run``, by the formulas."""
    ### BEGIN SOLUTION
    item, h = 4, spec.hidden
    if run.startswith("DP"):
        return [("all_reduce", h * h * item), ("all_reduce", h * item)] * spec.layers
    if run == "TP":
        activation = max(1, spec.batch // 4) * spec.seq * h * item     # (b, s, h)
        return [("all_reduce", activation)] * (2 * spec.layers - 1)
    micro = spec.batch // spec.microbatches * h * item                  # (b/m, h)
    forward = [("send", micro)] * spec.microbatches if rank < world_size - 1 else []
    backward = [("send", micro)] * spec.microbatches if rank > 0 else []
    return forward + backward
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_predict_messages", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_predicted_messages(predict_messages)
print("predict_messages: the formulas' messages on every run and rank")
### BEGIN HIDDEN TESTS
check_predicted_messages(predict_messages, seed=fresh_seed())  # two specs drawn afresh, 2 to 4 ranks
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "grade_id": "predicted", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
alpha, bandwidth = link_model(world_size=2)
print(f"all-reduce on this machine: alpha = {alpha * 1e6:.0f} us, B = {bandwidth / 1e9:.2f} GB/s\n")
rows = predicted_vs_measured(runs, comm_share, alpha, bandwidth, merge_intervals=merge_intervals,
                             messages=predict_messages)    # formula B: your prediction

# %% [markdown]
# The formulas, now that you have written them: DP all-reduces every gradient once, P bytes in
# all (Lab 2); TP all-reduces the `(b, s, h)` activation once per MLP in forward and once in
# backward, less the first MLP's backward one, whose input needs no gradient (Lab 3): 2L − 1 in
# all; PP sends one `(b/m, h)` activation per microbatch to the next stage unless it is the last,
# and one gradient per microbatch back unless it is the first (Lab 5).
#
# The byte counts agree exactly: the trace and the formulas describe the same messages. The times
# do not, and the way they disagree is the lesson of this lab:
# - A collective's time on a timeline includes **waiting for the slowest rank**. On a shared CPU
#   the ranks drift apart by milliseconds per step, and every synchronising collective absorbs the
#   drift; α + S/B describes an idle link between ranks that arrive together.
# - Many small messages (TP) pay α each time: the per-call cost dominates unless messages are
#   large or fused.
# - PP's communication is mostly bubble: the bytes are tiny, the waiting is not.
#
# ## What to take away
# Below, the numbers measured in this run (they change from run to run and machine to machine;
# that is the point of measuring):

# %% nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
closing_note(rows, overlaps={k: v for k, v in overlaps.items() if not k.startswith("stored")});

# %% [markdown]
# - A trace per rank, merged on one clock, answers questions no single number does: *where* the
#   step's time went, on which rank, and whether communication hid behind compute.
# - Communication share counts time a rank communicated; only the **exposed** part costs step time.
#   Overlap is the fraction of communication that was hidden.
# - The signatures: TP = many short all-reduces inside forward/backward; DP = few large ones at the
#   end of backward; PP = send/recv at stage edges and a bubble.
# - Formulas predict bytes exactly and times only up to the waiting the timeline shows; on GPU
#   clusters the same measures come from `torch.profiler` traces or an `nsys` export.
