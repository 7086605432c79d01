"""Lab 1's checks and plumbing: correct answers pass, typical wrong answers fail with CheckFailed,
the demos move data as each collective defines."""
from __future__ import annotations

import matplotlib
import pytest
import torch
import torch.distributed as dist

from distlab.labs import collectives
from distlab.checks.assertions import VERDICT_CHARS, CheckFailed
from distlab.checks import lab01, lab01_records
from distlab.checks.lab01_lines import duration, rate, size

matplotlib.use("Agg")


# Answers, as a student might write them (module level: ranks import them by name) -----------

def rs_ag(tensor):
    n = dist.get_world_size()
    flat = tensor.reshape(-1)
    padded = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])  # (n * c,)
    shard = padded.new_empty(padded.numel() // n)  # (c,)
    dist.reduce_scatter_single(shard, padded)
    full = torch.empty_like(padded)
    dist.all_gather_single(full, shard)
    return full[:flat.numel()].reshape(tensor.shape)


def plain_all_reduce(tensor):
    out = tensor.clone()
    dist.all_reduce(out)
    return out


def ring(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    out = tensor.reshape(-1).clone()
    chunks = list(torch.tensor_split(out, n))
    for phase in ("reduce", "gather"):
        for step in range(n - 1):
            send_c = (r - step) % n if phase == "reduce" else (r + 1 - step) % n
            recv_c = (send_c - 1) % n
            incoming = torch.empty_like(chunks[recv_c])
            work = dist.isend(chunks[send_c].contiguous(), (r + 1) % n)
            dist.recv(incoming, (r - 1) % n)
            work.wait()
            if phase == "reduce":
                chunks[recv_c] += incoming
            else:
                chunks[recv_c].copy_(incoming)
    return out.reshape(tensor.shape)


def whole_tensor_ring(tensor):
    """Right values, wrong traffic: passes the whole tensor around the ring n-1 times, twice."""
    n, r = dist.get_world_size(), dist.get_rank()
    total, current = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(current)
        work = dist.isend(current, (r + 1) % n)
        dist.recv(incoming, (r - 1) % n)
        work.wait()
        total += incoming
        current = incoming
    for _ in range(n - 1):
        work = dist.isend(total, (r + 1) % n)
        dist.recv(torch.empty_like(total), (r - 1) % n)
        work.wait()
    return total


def _shown(line: str, *figures: str) -> None:
    """A passing check's line (issue 42, item 5): one line, short, with each figure in it."""
    assert "\n" not in line and len(line) <= VERDICT_CHARS, line
    for figure in figures:
        assert figure in line, (figure, line)


def _ring_sent(n: int, numel: int, rank: int) -> int:
    """Bytes ``rank`` sends in this file's ``ring`` on ``n`` ranks: chunk (r - s) mod n at
    reduce-scatter step s, (r + 1 - s) mod n at all-gather step s, float32."""
    chunks = [4 * len(c) for c in torch.tensor_split(torch.arange(numel), n)]
    return sum(chunks[(rank - s) % n] + chunks[(rank + 1 - s) % n] for s in range(n - 1))


def test_rs_ag_passes_stored_and_fresh():
    lab01.check_all_reduce_rs_ag(rs_ag, world_size=2)
    line = lab01.check_all_reduce_rs_ag(rs_ag, world_size=4, numel=7, seed=5)
    total = lab01.all_reduce_inputs(4, 7, 5).sum(0)     # what the hidden case checks against
    allowed = 1e-4 * max(1.0, float(total.abs().max()))
    padded = 4 * (7 + (-7) % 4)     # bytes rs_ag reduce-scatters: 7 elements padded to 4 shards
    _shown(line, "on 4 ranks, 7 elements", f"(allowed {allowed:.2g} + 1e-05·|sum|)",
           f"one reduce-scatter ({padded:,} bytes, the whole tensor's {4 * 7:,} or more) then one all-gather")
    assert "seed" not in line    # a hidden case's seed stays hidden


def test_rs_ag_rejects_plain_all_reduce():
    with pytest.raises(CheckFailed, match="reduce-scatter"):
        lab01.check_all_reduce_rs_ag(plain_all_reduce, world_size=2)


@pytest.mark.parametrize("world_size,numel", [(2, 10), (4, 13), (3, 5)])
def test_ring_passes(world_size, numel):
    line = lab01.check_ring_all_reduce(ring, world_size=world_size, numel=numel, seed=world_size + numel)
    n, sent = world_size, [_ring_sent(world_size, numel, r) for r in range(world_size)]
    shown = f"{min(sent):,}" if min(sent) == max(sent) else f"{min(sent):,} to {max(sent):,}"
    _shown(line, f"2(n-1) = {2 * (n - 1)} messages", f"{shown} bytes",
           f"2(n-1)/n of {4 * numel:,}: {2 * (n - 1) / n * 4 * numel:,.0f}")


def test_ring_rejects_collectives_and_excess_traffic():
    with pytest.raises(CheckFailed, match="point-to-point|send/recv"):
        lab01.check_ring_all_reduce(plain_all_reduce, world_size=2)
    with pytest.raises(CheckFailed, match="bytes"):
        lab01.check_ring_all_reduce(whole_tensor_ring, world_size=4, numel=12, seed=1)


def test_bandwidths_check():
    line = lab01.check_bandwidths(lab01.reference_bandwidths)
    cases = lab01.bandwidth_cases(lab01.SEED)    # the stored cases' code
    algbw = cases["nbytes"] / cases["seconds"] / 1e9
    busbw = algbw * cases["factor"]
    _shown(line, f"{len(algbw)} cases", f"your algbw {rate(algbw.min())} to {rate(algbw.max())} GB/s",
           f"busbw {rate(busbw.min())} to {rate(busbw.max())} GB/s",
           f"{size(cases['nbytes'].min())} to {size(cases['nbytes'].max())}",
           f"(allowed {lab01.BANDWIDTH_TOL:g})")
    lab01.check_bandwidths(lab01.reference_bandwidths, seed=99)

    def no_bus_factor(nbytes, seconds, factor):
        return nbytes / seconds / 1e9, nbytes / seconds / 1e9
    with pytest.raises(CheckFailed, match="busbw"):
        lab01.check_bandwidths(no_bus_factor)


def test_bus_factor_comes_from_the_rings_own_record():
    line = lab01.check_bus_factor(lab01.reference_bus_factor, ring)
    nbytes = 4 * lab01.BUS_FACTOR_NUMEL
    ring_factors = [_ring_sent(n, lab01.BUS_FACTOR_NUMEL, 0) / nbytes for n in lab01.BUS_FACTOR_WORLD_SIZES]
    _shown(line, f"{nbytes:,}-byte buffer",
           *[f"{f:.4g} (a ring, {n} ranks)" for f, n in zip(ring_factors, lab01.BUS_FACTOR_WORLD_SIZES)],
           "3 (direct, 4 ranks)", "1 (reduce-then-broadcast)", f"(allowed {lab01.BUS_FACTOR_TOL:g})")
    line = lab01.check_bus_factor(lab01.reference_bus_factor, ring, world_sizes=(3, 4), seed=3)
    _shown(line, "(your ring, 3 ranks)", "(your ring, 4 ranks)")

    def from_the_table(comms, nbytes):
        # 2(n-1)/n looked up from the number of messages: right for a ring, for nothing else
        n = len([c for c in comms if c.op in ("send", "isend")]) // 2 + 1
        return 2 * (n - 1) / n
    with pytest.raises(CheckFailed, match="record"):
        lab01.check_bus_factor(from_the_table, ring)
    with pytest.raises(CheckFailed, match="record"):
        lab01.check_bus_factor(from_the_table, ring, seed=3)


def test_bus_factor_visible_test_needs_no_reference_implementation(monkeypatch):
    """The visible path compares with the stored factors (a handout withholds the reference)."""
    def withheld(*args, **kwargs):
        raise NotImplementedError("withheld in the handout")
    monkeypatch.setattr(lab01, "reference_bus_factor", withheld)
    lab01.check_bus_factor(lambda comms, nbytes: sum(
        c.bytes for c in comms if c.op in ("send", "isend")) / nbytes, ring)


def test_sweep_runs_5_warmup_and_20_timed_iterations_per_size():
    from distlab import run
    out = run(collectives._sweep_rank, 2, ["all_reduce"], [1024], collectives.WARMUP,
              collectives.ITERS, None)
    calls = [c for c in out.comms[0] if c.op == "all_reduce"]
    assert len(calls) == 5 + 20 + 1   # + the all_reduce(MAX) that takes the slowest rank's time


def test_ring_model_fit_shows_the_latency_term():
    world = torch.tensor([2.0, 2, 2, 4, 4, 4], dtype=torch.float64)
    sizes = torch.tensor([1e3, 1e5, 1e7] * 2, dtype=torch.float64)
    n = world
    times = 2 * (n - 1) * 20e-6 + 2 * (n - 1) / n * sizes / 1e9
    alpha, bandwidth = collectives.reference_ring_fit(world, sizes, times)
    assert alpha == pytest.approx(20e-6, rel=1e-9) and bandwidth == pytest.approx(1e9, rel=1e-9)
    lab01.check_ring_model(collectives.reference_ring_fit)
    line = lab01.check_ring_model(collectives.reference_ring_fit, seed=3)
    sample = lab01.ring_model_sample(3)
    alpha, bandwidth = collectives.reference_ring_fit(sample["world_sizes"], sample["sizes"], sample["times"])
    _shown(line, f"{len(sample['sizes'])} runs (2 and 4 ranks",
           f"your alpha {duration(alpha)} and bandwidth {bandwidth / 1e9:.4g} GB/s",
           f"(allowed {lab01.FIT_TOL:g})")
    assert "seed" not in line

    def ignores_world_size(world_sizes, sizes, times):
        return lab01.reference_fit(sizes, times)
    with pytest.raises(CheckFailed, match="2\\(n-1\\)"):
        lab01.check_ring_model(ignores_world_size)


def test_alpha_beta_check():
    def predict(alpha, bandwidth, nbytes):
        return alpha + nbytes / bandwidth
    lab01.check_alpha_beta(lab01.reference_fit, predict)
    line = lab01.check_alpha_beta(lab01.reference_fit, predict, seed=7)
    sample = lab01.sweep_sample(7)
    alpha, bandwidth = lab01.reference_fit(sample["sizes"], sample["times"])
    unseen = float(sample["unseen"])
    _shown(line, f"{len(sample['sizes'])} sizes", f"your alpha {duration(alpha)} and bandwidth "
           f"{bandwidth / 1e9:.4g} GB/s", f"predict_time at {size(unseen)}: your "
           f"{duration(predict(alpha, bandwidth, unseen))}", f"(allowed {lab01.PREDICT_TOL:g})")
    assert "seed" not in line
    with pytest.raises(CheckFailed, match="relative"):
        lab01.check_alpha_beta(collectives.plain_fit, predict, seed=7)


def test_reference_fit_recovers_exact_model():
    sizes = 2.0 ** torch.arange(10, 20, dtype=torch.float64)
    alpha, bandwidth = lab01.reference_fit(sizes, 3e-5 + sizes / 2e9)
    assert alpha == pytest.approx(3e-5, rel=1e-9) and bandwidth == pytest.approx(2e9, rel=1e-9)


@pytest.mark.parametrize("op", collectives.OPS)
def test_demo_moves_data_as_defined(op):
    n = 4
    x = [torch.arange(n, dtype=torch.float32) + 10 * r for r in range(n)]  # what each rank starts with
    total = torch.stack(x).sum(0)
    expected = {
        "broadcast": [x[0]] * n,
        "scatter": [x[0][r:r + 1] for r in range(n)],
        "gather": [torch.tensor([10.0 * r for r in range(n)])] + [None] * (n - 1),
        "reduce": [total] + [None] * (n - 1),
        "all_gather": [torch.tensor([10.0 * r for r in range(n)])] * n,
        "reduce_scatter": [total[r:r + 1] for r in range(n)],
        "all_reduce": [total] * n,
        "all_to_all": [torch.stack(x)[:, r] for r in range(n)],
        "send_recv": [x[(r - 1) % n] for r in range(n)],
    }[op]
    pairs = collectives.demo(op, world_size=n, show=False)
    for rank, ((_, after), want) in enumerate(zip(pairs, expected)):
        if want is None:
            assert after is None
        else:
            torch.testing.assert_close(after, want, msg=f"{op} rank {rank}")


def test_draw_and_sweep_plots():
    pairs = collectives.demo("all_to_all", world_size=2, show=False)
    assert collectives.draw("all_to_all", pairs) is not None
    rows = collectives.sweep(world_size=2, max_bytes=1 << 12, ring=ring, iters=1, warmup=1)
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                       "ring_all_reduce"}
    record = collectives.ring_record(ring, world_size=2)
    factors = collectives.bus_factors(lab01.reference_bus_factor, record)
    assert factors["all_reduce"] == pytest.approx(1.0) and factors["all_gather"] == pytest.approx(0.5)
    rows = collectives.bandwidth_table(rows, lab01.reference_bandwidths, factors)
    assert all(r["busbw"] > 0 for r in rows)
    assert collectives.plot_bandwidth(rows) is not None
    sizes, times = collectives.timings(rows, "all_reduce")
    assert len(sizes) == 2


def test_bus_factor_check_builds_a_ring_record_when_the_ring_does_not_run():
    def unanswered(tensor):
        raise NotImplementedError
    lab01.check_bus_factor(lab01.reference_bus_factor, unanswered, seed=5)
    record = lab01_records.ring_records(4, 1030)
    assert lab01.reference_bus_factor(record, 1030 * 4) == pytest.approx(2 * 3 / 4, rel=1e-2)


def test_a_frame_walk_to_every_ranks_row_earns_nothing():
    """Issue 41, route 1: the student's function walks up to the rank body's locals for every
    rank's row and returns their sum, with a dummy reduce-scatter and all-gather for the record.
    A rank holds its own row only, so the walk finds nothing and the answer is wrong."""
    from submissions import frame_walk
    inputs = torch.randn(2, 10)

    def leaky_body(inputs):          # what the rank body held before: every rank's rows
        return frame_walk.steal_rows(inputs[0], 2)
    assert leaky_body(inputs) is inputs   # the walk finds them where they are
    with pytest.raises(CheckFailed, match=r"all_reduce_rs_ag on fresh inputs.*rank 0.*differ"):
        lab01.check_all_reduce_rs_ag(frame_walk.all_reduce_rs_ag, world_size=2, numel=10, seed=41)


@pytest.mark.skipif(__import__("distlab.runtime.wire", fromlist=["count"]).count([]) is None,
                    reason="the kernel's TCP counters (sock_diag) cannot be read here")
def test_a_ring_that_all_reduces_outside_the_record_earns_nothing(monkeypatch):
    """Issue 41, route 3: the sum by a ProcessGroup's own all-reduce (unrecorded), a ring of
    chunk-sized messages of zeros for the record. Graded on the record alone it passes; the bytes
    the kernel counted fail it. The bus-factor check, which runs the student's ring for its
    record, falls back to a correct ring's record and still grades bus_factor."""
    from submissions.attacks import HIDES_ALL_REDUCE
    ns = {"__name__": "hides_all_reduce", "torch": torch, "dist": dist}
    exec(HIDES_ALL_REDUCE, ns)
    hiding = ns["ring_all_reduce"]
    with pytest.raises(CheckFailed, match=r"ring_all_reduce on fresh inputs.*crossed outside"):
        lab01.check_ring_all_reduce(hiding, world_size=4, seed=7)
    lab01.check_bus_factor(lab01.reference_bus_factor, hiding, world_sizes=(3, 4), seed=3)
    monkeypatch.setattr(lab01, "assert_crossed_as_recorded", lambda *args, **kwargs: None)
    lab01.check_ring_all_reduce(hiding, world_size=4, seed=7)     # the record alone: a ring
