# ---
# jupyter:
#   distlab:
#     summary: "LAB12-SUMMARY (l12state writes it: one line, the site's summary; see Lab 11's)"
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 12 — When a rank dies
#
# LAB12-INTRO (owner: l12state). The failure numbers of Llama 3 (§3.3.4, Table 5), what the lab
# builds, section by section, and the notation (a run's step, the checkpoint interval, the save
# cost, the mean time between failures).

# %% [markdown]
# ## 1. The whole training state
#
# LAB12-STATE (owner: l12state): Exercise 1, the whole training state, graded by resuming from it.

# %% [markdown]
# ## 2. Saving with torch.distributed.checkpoint, and resharding
#
# LAB12-RESHARD (owner: l12state): Exercise 2, save and load with DCP, each rank its own shards;
# the files and the metadata shown; 4 -> 2 and 2 -> 4; refusals shown.

# %% [markdown]
# ## 3. Saving without stopping: asynchronous checkpoints
#
# LAB12-ASYNC (owner: l12restart): dcp.async_save overlapped with the next steps, the stall
# beside a blocking save, measured side by side.

# %% [markdown]
# ## 4. Restart
#
# LAB12-RESTART (owner: l12restart): the resumable loop, a rank killed from outside with SIGKILL
# at a random step, the restart, the loss curve beside the uninterrupted run's; the same loop
# under torchrun --max-restarts.

# %% [markdown]
# ## 5. How often to save
#
# LAB12-INTERVAL (owner: l12interval): the graded prediction of the fraction of time lost, the
# simulated run that measures it; Young's and Daly's interval; the Llama 3 numbers worked through.

# %% [markdown]
# ## 6. Open design: the checkpoint interval
#
# LAB12-DESIGN (owner: l12interval): the interval (and sync or async) that minimises expected
# lost time, graded on a scale.

# %% [markdown]
# ## Summary
#
# LAB12-SUMMARY-BULLETS (each owner adds its sections' bullets, in section order; l12state
# writes the closing "what this lab does not cover": torchft, silent data corruption).
