# ---
# jupyter:
#   distlab:
#     summary: "Pipelines without bubbles: the backward split into input and weight gradients, schedules written as tables (interleaved 1F1B, ZB-H1, a V-shaped zero-bubble) replayed on paper and run on real ranks beside torch's own, and a schedule designed under a memory cap."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 11 — Pipelines without bubbles
#
# LAB11-INTRO (owner: l11tables): what Lab 5 left (1F1B's bubble (p−1)/(m+p−1) of the step),
# what this lab adds, the list of exercises, notation (p ranks, m microbatches, v virtual stages,
# unit times t_F = t_B = t_W), with sources.

# %% [markdown]
# ## 1. The backward, split in two
#
# LAB11-SECTION-1 (owner: l11split): Exercise 1, split backward (B then W), hooks, memory held
# between B and W, measured.

# %% [markdown]
# ## 2. Schedules as tables
#
# LAB11-SECTION-2 (owner: l11tables): the action table, the replay, interleaved 1F1B (prediction
# first), ZB-H1, the V-shaped placement; the course's and torch's tables side by side.

# %% [markdown]
# ## 3. Running a table on real ranks
#
# LAB11-SECTION-3 (owner: l11exec): the executor exercise (isend/irecv, deadlock-free, equal to
# single-process training), torch's schedules on the same model, DualPipeV shown, timelines, and
# where zero-bubble schedules cost (DeepSeek-V3 §3.2.1).

# %% [markdown]
# ## 4. Open design: a schedule under a memory cap
#
# ZB-H1 kept 1F1B's memory and cut its bubble to a third by moving W into the idle time (Qi et
# al. 2023, "Zero Bubble Pipeline Parallelism", §2.1). Now
# suppose a rank can afford the activations of fewer than the $p$ microbatches 1F1B's rank 0
# holds. Lab 5 met such a cap with whole backwards; a split backward does much better, if you
# place each W well.

# %% nbgrader={"grade": false, "grade_id": "design_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
from distlab.checks.lab11 import check_capped_schedule, check_capped_schedule_bar
from distlab.checks.lab11_design import capped_figures, capped_verdict
from distlab.labs.pipeline.capped import cap_bound, whole_backward_bound
from distlab.labs.pipeline.schedules import replay

# %% [markdown]
# ### Exercise — a schedule under a memory cap (open design, 2 + 1 points)
#
# **Goal.** Write `capped_schedule(num_ranks, num_microbatches, max_held) -> table`: a schedule
# of your own design for $p$ ranks and $m$ microbatches, one stage per rank, that never holds
# more than $k$ = `max_held` microbatches' activations on a rank, with as small a bubble as you
# can make it.
#
# **Contract.** The table is one list per rank $r$ of actions `(op, i, r)`, in the order rank
# $r$ runs them: op `"F"`, `"B"` or `"W"` of microbatch $i$ on stage $r$ (stage $r$ lives on rank
# $r$). Every microbatch's F and B appear once on every rank; a W at most once, after its B (a B
# without a W is the whole backward, as `replay` times it). The checks grade:
#
# - *dependencies:* `replay(table, t_fwd=1, t_bwd=1, t_wgt=1)` runs it to the end (no rank waits
#   forever: a W before its B, a B before the rank's own F, ...);
# - *memory:* on every rank, `Replay.peak` at most $k$: a microbatch's activations are held from
#   the start of its F to the end of its W (of its B when it has no W), as the replay counts
#   them; a W that ends at the instant a forward starts has freed its slot;
# - *values:* the course's executor runs your table on $p$ real ranks; the loss and every
#   gradient equal single-process training's;
# - *bubble:* `Replay.bubble` (idle over compute, $t_F = t_B = t_W$, messages free), on a scale:
#   `test_capped_schedule` (2 points) wants at most the bubble of the design the hints lead to,
#   for $p = 4$, $m = 8$, $k = 3$ (visible) and other cases (hidden);
#   `test_capped_schedule_bar` (1 point) at most the **bar**, halfway from that design's bubble to
#   the course's own design's. Both print your bubble beside the hinted design's, the bar, the
#   course's and the bound.
#
# **How low can it go?** Two floors hold for every table. The fill: rank $p-1$ starts after the
# $p-1$ forwards before it, then computes its $3m$ units, so the step lasts at least
# $p - 1 + 3m$. Rank 0's slots: it holds a microbatch from its F to its W, and in between the
# microbatch goes forward through all $p$ ranks and its gradient comes all the way back: at least
# $2p + 1$ units ($p$ forwards, $p$ B's, one W, in a chain). With at most $k$ held at once, the $m$
# holding times split into $k$ chains that never overlap, one of them $\lceil m/k \rceil$ long.
# Every rank computes $3m$ of the step $T \ge \max(p - 1 + 3m,\ \lceil m/k \rceil (2p+1))$, so the
# bubble is at least $T/3m - 1$ (`cap_bound(p, m, k)`). Lab 5's bound for whole backwards under the
# same cap (`whole_backward_bound`) is higher than the first test's limit on every graded case: a
# whole backward cannot meet it.
#
# **Why it matters.** A cap on activations is what decides a real pipeline's schedule: Qi et al.
# (§3) search their schedules automatically under a memory limit, and DeepSeek-V3 (§3.2.1,
# Table 2) sets DualPipe's bubble beside its activation memory. Try ideas on paper first:
# `replay` times any table in a millisecond.
#
# <details><summary>Hint 1</summary>
#
# Time one microbatch's stay on rank 0, from its F to the end of its backward, with the backward
# whole, then split. Which part of a rank's backward does the rank before it wait for?
# </details>
#
# <details><summary>Hint 2</summary>
#
# A W frees a slot, yet no other action waits for it. When must a rank run a W at the latest,
# and when is the cheapest moment to run it otherwise?
# </details>
#
# <details><summary>Hint 3</summary>
#
# Write the table by simulating it on paper, one unit of time after another. Whenever a rank is
# idle it starts one action whose input has ended: a forward if one is ready and the rank holds
# fewer than $k$; else a ready B; else a ready W. That design meets the first test.
# </details>
#
# <details><summary>Hint 4</summary>
#
# Replay Hint 3's table and print rank 0's actions with their start times. When rank 0 cannot
# start a forward, what is it waiting for? When a rank between it and the last could run either
# a forward or a B, which of the two hands rank 0 its gradient sooner?
# </details>

# %% nbgrader={"grade": false, "grade_id": "capped_figures", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(capped_figures())    # the visible tests' scale
print(f"cap_bound(4, 8, 3) = {cap_bound(4, 8, 3):.3f}; "
      f"whole_backward_bound(4, 8, 3) = {whole_backward_bound(4, 8, 3):.3f}")

# %% nbgrader={"grade": false, "grade_id": "capped_schedule", "locked": false, "schema_version": 3, "solution": true, "task": false}
def capped_schedule(num_ranks, num_microbatches, max_held):
    """One list per rank r of actions (op, i, r), never more than max_held microbatches held."""
    ### BEGIN SOLUTION
    p, m, k = num_ranks, num_microbatches, max_held

    def waits_for(op, i, r):
        if op == "F":
            return None if r == 0 else ("F", i, r - 1)
        if op == "B":
            return ("F", i, r) if r == p - 1 else ("B", i, r + 1)
        return ("B", i, r)

    ends = {}                                   # action -> when it ends, on paper (unit times)
    table = [[] for _ in range(p)]
    started = [dict(F=0, B=0, W=0) for _ in range(p)]
    busy_until = [0] * p
    now = 0
    while sum(map(len, table)) < 3 * p * m:
        for r in range(p):
            if busy_until[r] > now:
                continue
            held = started[r]["F"] - sum(1 for i in range(started[r]["W"])
                                         if ends[("W", i, r)] <= now)
            # A B first: the ranks before this one wait for it, and so does rank 0's slot.
            # Then a forward, while under the cap. A W last: only memory waits for it.
            for op in "BFW":
                i = started[r][op]
                if i == m or (op == "F" and held >= k):
                    continue
                before = waits_for(op, i, r)
                if before is None or ends.get(before, now + 1) <= now:
                    table[r].append((op, i, r))
                    started[r][op] += 1
                    ends[(op, i, r)] = busy_until[r] = now + 1
                    break
        now += 1
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_capped_schedule", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_capped_schedule(capped_schedule, world_size=4, num_microbatches=8, max_held=3)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_capped_schedule(capped_schedule, world_size=2, num_microbatches=6, max_held=2,
                      seed=fresh_seed())    # two ranks, the cap at 1F1B's own peak
check_capped_schedule(capped_schedule, world_size=4, num_microbatches=4, max_held=3,
                      seed=fresh_seed())    # as many microbatches as ranks
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "test_capped_schedule_bar", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_capped_schedule_bar(capped_schedule, world_size=4, num_microbatches=8, max_held=3)
### BEGIN HIDDEN TESTS
from distlab.checks.assertions import fresh_seed   # the grader's seeds
check_capped_schedule_bar(capped_schedule, world_size=4, num_microbatches=4, max_held=3,
                          seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Your table on the scale: its replay beside the hinted design's, the bar, the course's and the
# bound, and how many microbatches each rank held at its peak.

# %% nbgrader={"grade": false, "grade_id": "capped_verdict", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
print(capped_verdict(capped_schedule))

# %% [markdown]
# ## Summary
#
# LAB11-SUMMARY (owner: l11tables, with one bullet from each section's owner).
