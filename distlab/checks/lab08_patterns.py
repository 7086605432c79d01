"""How Lab 8's exercises communicate, read from a rank's collective record: the ZeRO-2 and
ZeRO-3 patterns (Rajbhandari et al. 2020, sec. 5 and 7) and the timing of prefetched gathers."""
from __future__ import annotations

from distlab.checks.assertions import CheckFailed

GATHERS = {"all_gather", "all_gather_into_tensor", "all_gather_single"}
REDUCE_SCATTERS = {"reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"}
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
    comms = _real(comms)
    reduces = [c for c in comms if c.op == "all_reduce"]
    if reduces:
        raise CheckFailed(
            f"rank {rank} called all_reduce {len(reduces)} times in {steps} steps; ZeRO-2 "
            f"reduce-scatters each bucket's gradient, so that every rank receives the sum of its "
            f"own shard only and never holds the whole summed gradient. An all-reduce gives the "
            f"right values but W times the gradient this rank keeps, and with the all-gather the "
            f"step moves 3 Psi instead of 2 Psi: use dist.reduce_scatter_single.")
    others = sorted({c.op for c in comms} - GATHERS - REDUCE_SCATTERS)
    if others:
        raise CheckFailed(f"rank {rank} also called {others}; a ZeRO-2 step needs only "
                          f"reduce-scatters (gradients) and all-gathers (parameters).")
    for name, ops, what in (("reduce-scatter", REDUCE_SCATTERS, "gradient"),
                            ("all-gather", GATHERS, "updated parameters")):
        calls = [c for c in comms if c.op in ops]
        if len(calls) != len(sizes) * steps:
            raise CheckFailed(
                f"rank {rank} made {len(calls)} {name} calls in {steps} steps; expected one per "
                f"bucket ({len(sizes)} buckets) per step: one {name} of each bucket's {what}.")
        smallest = min(sizes) * BYTES
        small = [c for c in calls if c.bytes < smallest]
        if small:
            raise CheckFailed(f"rank {rank}'s {small[0].describe()} moved {small[0].bytes} bytes, "
                              f"less than a whole bucket ({smallest} bytes): each {name} carries "
                              f"a whole bucket, padded to W * s elements.")


def check_zero3_pattern(comms, probes: dict, rank: int, step: int, block_bytes: list[int]) -> None:
    """One step of ZeRO-3 on n blocks: n all-gathers in forward (before the last block's forward
    ended), n in backward, n reduce-scatters, no all-reduce; each gather the size of a block."""
    n = len(block_bytes)
    where = f"rank {rank}, step {step}"
    reduces = [c for c in comms if c.op == "all_reduce"]
    if reduces:
        raise CheckFailed(f"{where}: {reduces[0].describe()}; ZeRO-3 reduce-scatters each "
                          f"block's gradients into the shards, it never all-reduces.")
    gathers = [c for c in comms if c.op in GATHERS]
    scatters = [c for c in comms if c.op in REDUCE_SCATTERS]
    forward = [c for c in gathers if c.start < probes["fwd_end"][n - 1]]
    backward = [c for c in gathers if c.start >= probes["fwd_end"][n - 1]]
    for count, phase, why in ((len(forward), "forward", "to compute it"),
                              (len(backward), "backward", "again: it was freed after forward"),
                              (len(scatters), "reduce-scatter", "of its gradients")):
        if count != n:
            raise CheckFailed(
                f"{where}: {count} {'all-gathers in ' + phase if phase != 'reduce-scatter' else 'reduce-scatters'} "
                f"for {n} blocks; ZeRO-3 gathers each block once in forward, once in backward, "
                f"and reduce-scatters it once ({phase}: one per block, {why}).")
    wrong = [c for c in gathers if c.bytes not in block_bytes]
    if wrong:
        raise CheckFailed(f"{where}: {wrong[0].describe()} moved {wrong[0].bytes} bytes; a gather "
                          f"fills one block's flat buffer ({sorted(set(block_bytes))} bytes).")


def prefetch_timing(comms, probes: dict, rank: int, step: int) -> None:
    """Gathers 2..n of each pass overlap the previous block's compute: asynchronous, started
    before that compute ended, waited on after it started."""
    n = len(probes["fwd_end"])
    gathers = sorted((c for c in comms if c.op in GATHERS), key=lambda c: c.start)
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
