# ---
# jupyter:
#   distlab:
#     summary: "Every collective on real ranks, all-reduce built twice (reduce-scatter + all-gather, then send/recv), busbw from the bytes your ring sent, and the ring's latency term across world sizes."
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab 1 — Collectives and their cost
#
# Every way of training a model on many devices — data, tensor, pipeline parallelism, ZeRO —
# comes down to a handful of communication patterns called **collectives**. In this lab you run
# each of them on real `torch.distributed` ranks, build all-reduce twice yourself (from two
# collectives, then from nothing but point-to-point messages), and measure what communication
# costs: bandwidth as nccl-tests reports it, and a two-number model (latency, bandwidth) that
# predicts the time of any message.
#
# **Vocabulary.** A *process group* is a set of processes that communicate; each has a *rank*
# (0, 1, …) and the group has a *world size* n. Every rank runs the same function; it decides what
# to do from its rank. A *collective* is a call that **every rank of the group must make**, in the
# same order, with matching shapes — if one rank skips it, the others wait forever (a hang).
#
# **Backends.** `torch.distributed` delegates the actual data movement to a backend: **NCCL** on
# NVIDIA GPUs (NVLink/InfiniBand, tensors on the GPU) and **gloo** on CPUs (TCP, tensors in host
# memory). Everything here runs on gloo with several processes on your machine; the same code runs
# on NCCL when each rank has a GPU.
#
# `distlab.run(fn, n)` starts n fresh ranks, runs `fn(rank, world_size)` on each, and returns their
# return values in rank order; `out.comms[r]` records the collectives rank r called (op, bytes).

# %% nbgrader={"grade": false, "grade_id": "imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch
import torch.distributed as dist

import distlab
from distlab.checks.assertions import fresh_seed
from distlab.checks.lab01 import (check_all_reduce_rs_ag, check_alpha_beta, check_bandwidths,
                                  check_bus_factor, check_ring_all_reduce, check_ring_model)
from distlab.labs.collectives import (bandwidth_table, bus_factors, demo,
                                      latency_and_bandwidth_terms, plot_bandwidth, plot_fit,
                                      ring_record, ring_sweep, sweep, timings)

# %% [markdown]
# Every rank runs the same function. Whatever a rank prints appears under the cell, each line
# prefixed with the rank that printed it (the ranks print in whatever order they get there), and
# `run` hands back what each rank returned, in rank order:

# %% nbgrader={"grade": false, "grade_id": "hello_ranks", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
def hello(rank, world_size):
    print(f"hello from rank {rank} of {world_size}")
    return rank * rank


distlab.run(hello, 4)

# %% [markdown]
# ## 1. The collectives, one by one
#
# In each demo, rank r starts with the values `10r + j`, so every number tells you where it came
# from (23 is rank 2's element 3). The table shows each rank before and after; the figure shows
# who sends to whom, values coloured by the rank they came from (grey: a sum over ranks).
#
# **Broadcast** — one rank's tensor is copied to all ranks (`dist.broadcast(x, src=0)`). Used to
# give every rank the same initial weights.

# %% nbgrader={"grade": false, "grade_id": "demo_broadcast", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("broadcast")

# %% [markdown]
# **Scatter** — the source rank cuts its tensor into n pieces and sends piece r to rank r.
# **Gather** is the reverse: every rank's tensor lands, in rank order, on one rank.

# %% nbgrader={"grade": false, "grade_id": "demo_scatter", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("scatter")

# %% nbgrader={"grade": false, "grade_id": "demo_gather", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("gather")

# %% [markdown]
# **Reduce** — like gather, but the tensors are combined elementwise (sum, max, …) on the way,
# and only the destination rank has the result.

# %% nbgrader={"grade": false, "grade_id": "demo_reduce", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("reduce")

# %% [markdown]
# **All-gather** — a gather whose result every rank gets (how a sharded tensor is reassembled:
# ZeRO-3/FSDP parameters, sequence-parallel activations). **Reduce-scatter** — a reduction whose
# result is left *sharded*: rank r gets only chunk r of the sum (how ZeRO reduces gradients).

# %% nbgrader={"grade": false, "grade_id": "demo_all_gather", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("all_gather")

# %% nbgrader={"grade": false, "grade_id": "demo_reduce_scatter", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("reduce_scatter")

# %% [markdown]
# **All-reduce** — every rank ends with the full reduction. This is data parallelism's gradient
# sum, and tensor parallelism's row-parallel output sum.

# %% nbgrader={"grade": false, "grade_id": "demo_all_reduce", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("all_reduce")

# %% [markdown]
# **All-to-all** — chunk j of rank r goes to rank j (a transpose of the (rank, chunk) grid): how
# mixture-of-experts routes tokens to experts and how Ulysses sequence parallelism swaps the
# sequence and head dimensions. **Send/recv** — point-to-point: one rank sends, one receives
# (pipeline parallelism's activations). Here every rank sends to its right neighbour.

# %% nbgrader={"grade": false, "grade_id": "demo_all_to_all", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("all_to_all")

# %% nbgrader={"grade": false, "grade_id": "demo_send_recv", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
demo("send_recv")

# %% [markdown]
# ### gloo and NCCL are not the same (checked on torch 2.13)
# - **Names.** In this torch version the tensor-in/tensor-out collectives are
#   `dist.all_gather_single` and `dist.reduce_scatter_single`; the familiar
#   `all_gather_into_tensor` and `reduce_scatter_tensor` still work on both backends but print a
#   `FutureWarning`.
# - **Reductions.** gloo supports `SUM, PRODUCT, MIN, MAX, AVG` (AVG was NCCL-only in older
#   versions; on those, all-reduce with SUM and divide by n) and `BAND, BOR, BXOR` on integer
#   tensors only. `PREMUL_SUM` (NCCL's scale-then-sum, used by FSDP) fails on gloo: multiply first,
#   then SUM.
# - **Shapes.** gloo's `all_gather` wants equal shapes on every rank; pad to the largest and
#   trim, or use `all_gather_object` for ragged Python data.
# - **Point-to-point.** On gloo, messages go through TCP and a blocking `send` can wait for the
#   matching `recv`: if every rank first sends and then receives, large messages can deadlock.
#   Post the send with `isend` (or order sends and receives by rank parity), then `wait()`.
# - **Devices.** NCCL needs tensors on the rank's GPU; gloo works on CPU tensors (it accepts GPU
#   tensors for a few ops by staging through the host, slowly).

# %% [markdown]
# ## 2. Exercise 1 — all-reduce = reduce-scatter + all-gather (2 points)
#
# An all-reduce can be done in two halves: a **reduce-scatter** leaves rank r with chunk r of the
# sum, and an **all-gather** hands every rank all the reduced chunks. This is exactly how NCCL's
# ring all-reduce works, and what ZeRO splits apart (reduce-scatter gradients, update your shard,
# all-gather parameters).
#
# Write `all_reduce_rs_ag(tensor)`, called on every rank: return the elementwise **sum** over ranks
# of `tensor`, in `tensor`'s shape, using one `dist.reduce_scatter_single` and one
# `dist.all_gather_single` (no `all_reduce`). The tensor may have **any** number of elements: pad
# the flattened tensor with zeros to a multiple of the world size, and remove the padding after.

# %% nbgrader={"grade": false, "grade_id": "all_reduce_rs_ag", "locked": false, "schema_version": 3, "solution": true, "task": false}
def all_reduce_rs_ag(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over all ranks via reduce-scatter then all-gather."""
    ### BEGIN SOLUTION
    n = dist.get_world_size()
    flat = tensor.reshape(-1)                                   # (N,)
    pad = (-flat.numel()) % n
    padded = torch.cat([flat, flat.new_zeros(pad)])             # (N + pad,) = (n * c,)
    shard = padded.new_empty(padded.numel() // n)               # (c,): this rank's reduced chunk
    dist.reduce_scatter_single(shard, padded)
    full = torch.empty_like(padded)                             # (n * c,)
    dist.all_gather_single(full, shard)
    return full[:flat.numel()].reshape(tensor.shape)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_all_reduce_rs_ag", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_all_reduce_rs_ag(all_reduce_rs_ag, world_size=2)
check_all_reduce_rs_ag(all_reduce_rs_ag, world_size=4)
print("all_reduce_rs_ag: correct on 2 and 4 ranks")
### BEGIN HIDDEN TESTS
check_all_reduce_rs_ag(all_reduce_rs_ag, world_size=4, seed=fresh_seed())
check_all_reduce_rs_ag(all_reduce_rs_ag, world_size=2, numel=1, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Exercise 2 — ring all-reduce from point-to-point messages (4 points)
#
# Arrange the n ranks in a ring; rank r sends only to rank r+1 and receives only from rank r-1
# (mod n). Cut the tensor into n chunks (`torch.tensor_split` makes them as even as possible when
# n does not divide the length).
#
# 1. **Reduce-scatter phase**, n-1 steps: at step s, rank r sends chunk (r - s) mod n to the right,
#    receives chunk (r - s - 1) mod n from the left and adds it to its own copy. After n-1 steps
#    rank r holds the full sum of chunk (r + 1) mod n.
# 2. **All-gather phase**, n-1 steps: at step s, rank r sends chunk (r + 1 - s) mod n and receives
#    chunk (r - s) mod n, which overwrites its copy.
#
# Every rank sends 2(n-1) messages of about N/n elements: **2(n-1)/n · N** in total. That is
# the least any all-reduce can send: every rank's N elements must leave it reduced with the n-1
# others' contributions, and each rank must receive the (n-1)/n of the result it did not reduce
# itself, so each rank sends and receives at least 2(n-1)/n · N (Patarasuk and Yuan 2009, §3;
# Thakur et al. 2005, §4). The ring meets this lower bound: it is **bandwidth-optimal**.
#
# It is not latency-optimal. Its 2(n-1) steps run one after another, each paying a message's
# fixed cost α, so its time is **2(n-1)·α + 2(n-1)/n · N/B**: the bandwidth term stays almost
# constant as n grows, the latency term grows linearly with n. At thousands of ranks, or for small
# messages, that term dominates — which is why NCCL also implements **trees** (double binary
# trees, whose latency term grows as log₂ n) and picks between ring and tree by size and scale.
# Section 7 measures α on 2 and 4 ranks and shows both terms.
#
# The check verifies the values, that you used only `send`/`recv`/`isend`/`irecv`, 2(n-1) sends
# to one neighbour, and the bytes.
#
# Post each send with `dist.isend` and receive with `dist.recv`, then wait for the send: if every
# rank did a blocking `send` first, they could all wait for each other.

# %% nbgrader={"grade": false, "grade_id": "ring_all_reduce", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over all ranks, by a ring of point-to-point messages."""
    ### BEGIN SOLUTION
    n, r = dist.get_world_size(), dist.get_rank()
    out = tensor.reshape(-1).clone()                            # (N,)
    chunks = list(torch.tensor_split(out, n))                   # n views, sizes N//n or N//n + 1
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):                                   # reduce-scatter
        send_c, recv_c = (r - step) % n, (r - step - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c] += incoming
    for step in range(n - 1):                                   # all-gather
        send_c, recv_c = (r + 1 - step) % n, (r - step) % n
        incoming = torch.empty_like(chunks[recv_c])
        work = dist.isend(chunks[send_c].contiguous(), right)
        dist.recv(incoming, left)
        work.wait()
        chunks[recv_c].copy_(incoming)
    return out.reshape(tensor.shape)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_ring_all_reduce", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
check_ring_all_reduce(ring_all_reduce, world_size=2)
check_ring_all_reduce(ring_all_reduce, world_size=4)   # 13 elements on 4 ranks: uneven chunks
print("ring_all_reduce: correct on 2 and 4 ranks, point-to-point only, 2(n-1)/n of the data sent")
### BEGIN HIDDEN TESTS
check_ring_all_reduce(ring_all_reduce, world_size=4, seed=fresh_seed())
check_ring_all_reduce(ring_all_reduce, world_size=3, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise 3 — algorithm and bus bandwidth (2 points)
#
# nccl-tests, the standard benchmark of collectives, reports two bandwidths for a message of
# size S (bytes) that took t seconds:
#
# - **algbw = S / t**, where S is the size of the user's buffer: the tensor for all-reduce and
#   broadcast, the *whole gathered* buffer (n × the per-rank piece) for all-gather and
#   reduce-scatter.
# - **busbw = algbw × factor**, the rate at which each rank's link actually carries data, so that
#   it can be compared with the hardware's link bandwidth whatever n is. The factor is the bytes
#   one rank sends over S — for the ring, what you just counted.
#
# Do not look the factor up: derive it from what your own ring sent. `out.comms[r]`, the record of
# rank r's calls, has one entry per `send`/`isend` with its `bytes`. Write
# `bus_factor(comms, nbytes)`: the bytes sent by the `send`/`isend` entries of `comms` over
# `nbytes`; and `bandwidths(nbytes, seconds, factor)` returning `(algbw, busbw)` in **GB/s**
# (1 GB = 10⁹ bytes). The check passes you a ring all-reduce's records on 2 and 4 ranks (the
# grader's hidden test: your own `ring_all_reduce`'s, on 3 and 4 ranks), and also the records of
# two other algorithms (whose factor is not the ring's).

# %% nbgrader={"grade": false, "grade_id": "bandwidths", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bus_factor(comms: list, nbytes: float) -> float:
    """Bytes that the sends of a rank's collective record carried, over the buffer's ``nbytes``."""
    ### BEGIN SOLUTION
    return sum(c.bytes for c in comms if c.op in ("send", "isend")) / nbytes
    ### END SOLUTION


def bandwidths(nbytes: float, seconds: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of a collective on a buffer of ``nbytes`` that took ``seconds``."""
    ### BEGIN SOLUTION
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * factor
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_bandwidths", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_bus_factor(bus_factor, ring_all_reduce)
check_bandwidths(bandwidths)
print("bus_factor and bandwidths: correct")
### BEGIN HIDDEN TESTS
check_bus_factor(bus_factor, ring_all_reduce, world_sizes=(3, 4), seed=fresh_seed())
check_bandwidths(bandwidths, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Your ring's factors, from its record on 2 ranks: the whole record for all-reduce (2(n-1)/n),
# its reduce-scatter phase (the first n-1 sends) and its all-gather phase (the last n-1) for
# those two collectives ((n-1)/n each). A broadcast pipelined along a chain forwards the whole
# buffer once per rank: factor 1. These are nccl-tests' factors (its `doc/PERFORMANCE.md`),
# derived here from bytes you sent.

# %% nbgrader={"grade": false, "grade_id": "factors", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
factors = bus_factors(bus_factor, ring_record(ring_all_reduce, world_size=2))
print({op: round(f, 4) for op, f in factors.items()})

# %% [markdown]
# ## 5. Measuring: bandwidth against message size
#
# Now time the collectives for message sizes from 1 KiB upward on 2 ranks, together with your
# ring all-reduce, and turn the times into bandwidths with your functions. As nccl-tests does,
# each size runs 5 untimed warm-up calls and then 20 timed ones (the mean of the 20, the slowest
# rank's). On this CPU the sweep stops at 4 MiB, in steps of 4×, to keep the lab about a minute
# (`sweep(max_bytes=1 << 26)` goes to 64 MiB; on GPUs try `world_size=torch.cuda.device_count()`).

# %% nbgrader={"grade": false, "grade_id": "sweep", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
rows = bandwidth_table(sweep(world_size=2, max_bytes=1 << 22, ring=ring_all_reduce), bandwidths,
                       factors)

# %% nbgrader={"grade": false, "grade_id": "plot_sweep", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
plot_bandwidth(rows)

# %% [markdown]
# **Reading the plot honestly.** Small messages reach a tiny fraction of the peak: their time is
# almost all fixed cost (the *latency*: Python, the backend's bookkeeping, a TCP round trip), so
# bandwidth grows roughly in proportion to size until the message is large enough to amortise it.
# On CPU gloo, "the link" is the loopback device and memory copies on a laptop's shared cores, so
# the absolute numbers say more about this machine (and whatever else runs on it: expect noise)
# than about a network; your Python ring pays the per-message cost 2(n-1) times and usually trails
# the built-in all-reduce. On GPUs with NCCL the same curve climbs to hundreds of GB/s of busbw
# over NVLink, and busbw, not algbw, is what to compare with the link's specification.

# %% [markdown]
# ## 6. Exercise 4 — a latency-bandwidth (alpha-beta) model (2 points)
#
# The simplest useful cost model of a message of S bytes is **t(S) = α + S / B**: a fixed latency
# α plus the size over a bandwidth B (Hockney's model). With α and B fitted from a sweep you can
# predict the time of a message you never measured — the first step of every parallelism
# decision.
#
# Fit it to minimise the **relative** error Σᵢ ((α + Sᵢ/B − tᵢ) / tᵢ)²: times span four orders of
# magnitude, and an ordinary least-squares fit would let the largest messages decide everything
# (its α often comes out negative). The model is linear in (α, 1/B): divide each row of
# `[1, Sᵢ] · [α, 1/B] = tᵢ` by tᵢ and solve by least squares (`torch.linalg.lstsq` in float64).
#
# Write `fit_alpha_beta(sizes, times)` returning `(alpha, bandwidth)` in seconds and bytes/s, and
# `predict_time(alpha, bandwidth, nbytes)`.
#
# **The ring's model, across world sizes.** One world size cannot separate the ring's two terms:
# on 2 ranks 2(n-1)·α = 2α and 2(n-1)/n · S/B = S/B, so the fit above finds an "α" of 2α, and
# nothing tells how it grows with n. Also write `fit_ring_model(world_sizes, sizes, times)` (one
# row per measurement, float64 tensors) that fits **t(n, S) = 2(n-1)·α + 2(n-1)/n · S/B** to
# rows from 2 and 4 ranks at once, the same relative least squares, with rows
# [2(n-1), 2(n-1)/n · S] / t. Its α is the cost of one ring step, and the model predicts any n.

# %% nbgrader={"grade": false, "grade_id": "alpha_beta", "locked": false, "schema_version": 3, "solution": true, "task": false}
def fit_alpha_beta(sizes: torch.Tensor, times: torch.Tensor) -> tuple[float, float]:
    """(alpha seconds, bandwidth bytes/s) minimising sum(((alpha + S/B - t) / t)^2)."""
    ### BEGIN SOLUTION
    s, t = sizes.double(), times.double()
    design = torch.stack([1 / t, s / t], dim=1)                 # (k, 2)
    coef = torch.linalg.lstsq(design, torch.ones(len(t), 1, dtype=torch.float64)).solution
    alpha, inv_bandwidth = coef.squeeze(1).tolist()             # (2,) -> two floats
    return alpha, 1 / inv_bandwidth
    ### END SOLUTION


def predict_time(alpha: float, bandwidth: float, nbytes: float) -> float:
    """Seconds the alpha-beta model predicts for a message of ``nbytes``."""
    ### BEGIN SOLUTION
    return alpha + nbytes / bandwidth
    ### END SOLUTION


def fit_ring_model(world_sizes: torch.Tensor, sizes: torch.Tensor,
                   times: torch.Tensor) -> tuple[float, float]:
    """(alpha s per ring step, bandwidth bytes/s) of t = 2(n-1) alpha + 2(n-1)/n S/B."""
    ### BEGIN SOLUTION
    n, s, t = world_sizes.double(), sizes.double(), times.double()
    design = torch.stack([2 * (n - 1) / t, 2 * (n - 1) / n * s / t], dim=1)   # (k, 2)
    coef = torch.linalg.lstsq(design, torch.ones(len(t), 1, dtype=torch.float64)).solution
    alpha, inv_bandwidth = coef.squeeze(1).tolist()
    return alpha, 1 / inv_bandwidth
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "test_alpha_beta", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_alpha_beta(fit_alpha_beta, predict_time)
check_ring_model(fit_ring_model)
print("fit_alpha_beta, predict_time and fit_ring_model: correct")
### BEGIN HIDDEN TESTS
check_alpha_beta(fit_alpha_beta, predict_time, seed=fresh_seed())
check_ring_model(fit_ring_model, seed=fresh_seed())
### END HIDDEN TESTS

# %% [markdown]
# Fit your measured all-reduce times and predict a size the sweep skipped (3 MiB). The dashed
# line is the ordinary least-squares fit, for comparison.

# %% nbgrader={"grade": false, "grade_id": "fit_measured", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
sizes, times = timings(rows, "all_reduce")
alpha, bandwidth = fit_alpha_beta(sizes, times)
print(f"alpha = {alpha * 1e6:.1f} us, B = {bandwidth / 1e9:.3f} GB/s; "
      f"predicted all-reduce of 3 MiB: {predict_time(alpha, bandwidth, 3 * 2**20) * 1e3:.2f} ms")
plot_fit(sizes, times, alpha, bandwidth, predict=predict_time, unseen=3 * 2**20)

# %% [markdown]
# ## 7. The ring's latency term, measured
#
# Your ring on 2 and 4 ranks (1 KiB to 1 MiB, steps of 8×), fitted with `fit_ring_model`, and the two terms
# extrapolated to large n for a 1 MiB message, beside a tree's latency term 2·log₂(n)·α. On
# this machine 4 ranks share 2 cores, so α also holds waiting for a core: the numbers are this
# machine's, the shape (linear against logarithmic) is the lesson.

# %% nbgrader={"grade": false, "grade_id": "ring_fit_measured", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["teaching"]
ring_rows = ring_sweep(ring_all_reduce, world_sizes=(2, 4))
ring_n = torch.tensor([r["world_size"] for r in ring_rows], dtype=torch.float64)
ring_alpha, ring_bandwidth = fit_ring_model(ring_n, *timings(ring_rows, "ring_all_reduce"))
print(f"ring: alpha = {ring_alpha * 1e6:.1f} us per step, B = {ring_bandwidth / 1e9:.3f} GB/s")
latency_and_bandwidth_terms(ring_alpha, ring_bandwidth, nbytes=2**20);

# %% [markdown]
# ## What to take away
# - Eight collectives and point-to-point cover all the communication of parallel training;
#   all-reduce = reduce-scatter + all-gather, and a ring does it sending 2(n-1)/n of the data per
#   rank — the lower bound, so the ring is bandwidth-optimal.
# - Its 2(n-1) sequential steps make its latency term 2(n-1)·α grow with n: at scale and for small
#   messages NCCL switches to trees (latency ~ log n).
# - Report **busbw** to compare against hardware; **algbw** is what your training step feels. The
#   factor between them is the bytes the algorithm sends per byte of buffer.
# - Small messages are latency-bound, large ones bandwidth-bound: α and B tell you where the
#   crossover is (S ≈ α·B), which is why frameworks bucket many small gradients into one message.
#
# Next, Lab 2 uses all-reduce for data parallelism, and reduce-scatter + all-gather for ZeRO.
