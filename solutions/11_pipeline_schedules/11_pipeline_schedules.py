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
# LAB11-SECTION-4 (owner: l11design): the open design, graded on a scale.

# %% [markdown]
# ## Summary
#
# LAB11-SUMMARY (owner: l11tables, with one bullet from each section's owner).
