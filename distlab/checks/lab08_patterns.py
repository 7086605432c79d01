"""How Lab 8's exercises communicate, read from a rank's collective record: the ZeRO-2 and
ZeRO-3 patterns (Rajbhandari et al. 2020, sec. 5 and 7) and the timing of prefetched gathers."""
from __future__ import annotations

from distlab.checks.assertions import CheckFailed
from distlab.checks.common import (GATHER_OPS, REDUCE_SCATTER_OPS, Collectives,
                                   expect_collectives, op_in)

BYTES = 8  # the checks train in float64


def _real(comms) -> list:
    return [c for c in comms if c.op != "barrier"]


def step_comms(out, rank: int, step: int) -> list:
    """Rank ``rank``'s collectives that started within step ``step``'s window."""
    lo, hi = out[rank]["steps"][step]["window"]
    return [c for c in _real(out.comms[rank]) if lo <= c.start <= hi]


def check_zero2_pattern(comms, rank: int, sizes: list[int], steps: int) -> None:
    """Per step and bucket: one reduce-scatter of the bucket's whole (padded) gradient and one
    all-gather of its parameters; no all-reduce, nothing else."""
    smallest = min(sizes) * BYTES
    kinds = [Collectives("all_reduce", op_in({"all_reduce"}), 0,
                         "ZeRO-2 reduce-scatters each bucket's gradient, so that every rank "
                         "receives the sum of its own shard only and never holds the whole summed "
                         "gradient. An all-reduce gives the right values but W times the gradient "
                         "this rank keeps, and with the all-gather the step moves 3 Psi instead of "
                         "2 Psi: use dist.reduce_scatter_single.")]
    kinds += [Collectives(name, op_in(ops), len(sizes) * steps,
                          f"ZeRO-2 makes one per bucket ({len(sizes)} buckets) per step: one "
                          f"{name} of each bucket's {what}.", lambda b: b >= smallest,
                          f"less than a whole bucket ({smallest} bytes): each {name} carries a "
                          f"whole bucket, padded to W * s elements.")
              for name, ops, what in (("reduce-scatter", REDUCE_SCATTER_OPS, "gradient"),
                                      ("all-gather", GATHER_OPS, "updated parameters"))]
    expect_collectives(comms, f"rank {rank}, in {steps} steps", kinds,
                       only="a ZeRO-2 step needs only reduce-scatters (gradients) and all-gathers "
                            "(parameters).")


def check_zero3_pattern(comms, probes: dict, rank: int, step: int, block_bytes: list[int]) -> None:
    """One step of ZeRO-3 on n blocks: n all-gathers in forward (before the last block's forward
    ended), n in backward, n reduce-scatters, no all-reduce; each gather the size of a block."""
    n, forward_end = len(block_bytes), probes["fwd_end"][len(block_bytes) - 1]
    rule = ("ZeRO-3 gathers each block once in forward, once in backward, and reduce-scatters it "
            f"once ({n} blocks; {{}}).")
    a_block = (lambda b: b in block_bytes,
               f"a gather fills one block's flat buffer ({sorted(set(block_bytes))} bytes).")
    expect_collectives(comms, f"rank {rank}, step {step}", [
        Collectives("all_reduce", op_in({"all_reduce"}), 0,
                    "ZeRO-3 reduce-scatters each block's gradients into the shards, it never "
                    "all-reduces."),
        Collectives("all-gather in forward",
                    lambda c: c.op in GATHER_OPS and c.start < forward_end, n,
                    rule.format("in forward: one per block, to compute it"), *a_block),
        Collectives("all-gather in backward",
                    lambda c: c.op in GATHER_OPS and c.start >= forward_end, n,
                    rule.format("in backward: one per block, again: it was freed after forward"),
                    *a_block),
        Collectives("reduce-scatter", op_in(REDUCE_SCATTER_OPS), n,
                    rule.format("one reduce-scatter per block, of its gradients"))])


def prefetch_timing(comms, probes: dict, rank: int, step: int) -> None:
    """Gathers 2..n of each pass overlap the previous block's compute: asynchronous, started
    before that compute ended, waited on after it started."""
    n = len(probes["fwd_end"])
    gathers = sorted((c for c in comms if c.op in GATHER_OPS), key=lambda c: c.start)
    forward, backward = gathers[:n], gathers[n:]
    # forward: gather i overlaps block i-1's forward; backward: block j's gather (j = n-2 .. 0)
    # overlaps block j+1's backward, which ends when block j's output gradient arrives.
    windows = [(forward[i], f"block {i} in forward", f"block {i - 1}'s forward",
                probes["fwd_compute"][i - 1], probes["fwd_end"][i - 1]) for i in range(1, n)]
    windows += [(backward[k], f"block {n - 1 - k} in backward", f"block {n - k}'s backward",
                 probes["bwd_compute"][n - k], probes["bwd_start"][n - 1 - k]) for k in range(1, n)]
    for c, what, previous, compute_start, compute_end in windows:
        where = f"rank {rank}, step {step}: the gather of {what}"
        if not c.async_op:
            raise CheckFailed(f"{where} ({c.describe()}) is blocking; issue it with "
                              f"async_op=True and wait on its Work when the block needs it.")
        if c.start >= compute_end:
            raise CheckFailed(f"{where} started after {previous} had ended, so nothing overlapped: "
                              f"issue it when {previous} starts, not when it needs the block.")
        if c.end is None or c.end <= compute_start:
            raise CheckFailed(f"{where} was waited on before {previous} started computing, so it "
                              f"did not overlap: call wait() only when the block itself is about "
                              f"to compute.")
