"""What crossed the network against the collective record (distlab.checks.crossed): honest
communication of every kind passes, a record that hides traffic fails."""
import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.checks.assertions import CheckFailed
from distlab.checks.crossed import assert_crossed_as_recorded, largest_segment, recorded_bound
from distlab.runtime.wire import MAX_SEGMENT
from distlab.runtime import wire
from distlab.runtime.launch import Launcher, LaunchSettings

pytestmark = pytest.mark.skipif(wire.count([]) is None,
                                reason="the kernel's TCP counters (sock_diag) cannot be read here")


def _ring(t, rank, n):
    """An honest ring all-reduce from isend/irecv (2(n-1) steps of one chunk)."""
    chunks = list(t.chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        send_i = (rank - step) % n if step < n - 1 else (rank - step + 1) % n
        recv_i = (send_i - 1) % n
        incoming = torch.empty_like(chunks[recv_i])
        reqs = [dist.isend(chunks[send_i].contiguous(), right), dist.irecv(incoming, left)]
        for r in reqs:
            r.wait()
        if step < n - 1:
            chunks[recv_i] += incoming
        else:
            chunks[recv_i].copy_(incoming)
    return torch.cat(chunks)


def _communicate(rank, world_size, how, numel):
    t = torch.arange(numel, dtype=torch.float32) + rank
    if how == "ring":
        return _ring(t, rank, world_size)
    if how == "collectives":      # every kind a lab uses, honestly
        dist.all_reduce(t)
        out = torch.empty(numel * world_size)
        dist.all_gather_into_tensor(out, t)
        part = torch.empty(numel // world_size)
        dist.reduce_scatter_tensor(part, t[: numel // world_size * world_size])
        dist.broadcast(t, 0)
        a2a = torch.empty(numel // world_size * world_size)
        dist.all_to_all_single(a2a, t[: numel // world_size * world_size])
        dist.barrier()
        return t
    if how == "hidden_all_reduce":   # route 3 of issue 41: the work unrecorded, a ring for show
        dist.distributed_c10d._get_default_group().allreduce([t]).wait()
        _ring(torch.zeros_like(t), rank, world_size)
        return t
    if how == "destroyed_group":     # the work unrecorded, on a group gone before the count
        group = dist.new_group(list(range(world_size)))
        group.allreduce([t]).wait()
        dist.destroy_process_group(group)
        _ring(torch.zeros_like(t), rank, world_size)
        return t
    if how == "through_the_store":    # the data as a store key: no network at all
        store = dist.distributed_c10d._get_default_store()
        store.set(f"rank{rank}", t.numpy().tobytes())
        for other in range(world_size):
            if other != rank:
                t += torch.frombuffer(bytearray(store.get(f"rank{other}")), dtype=torch.float32)
        _ring(torch.zeros_like(t), rank, world_size)
        return t
    raise ValueError(how)


@pytest.mark.parametrize("world_size,numel", [(2, 13), (4, 13), (4, 1031), (4, 65536)])
@pytest.mark.parametrize("how", ["ring", "collectives"])
def test_honest_communication_is_within_its_record(how, world_size, numel):
    out = distlab.run(_communicate, world_size, how, numel, backend="gloo")
    assert_crossed_as_recorded(out)


def _reduce_scatters(rank, world_size, numel):
    """Both forms alone, whose bytes no other call's allowance covers: gloo computes a
    reduce-scatter as an all-reduce of the whole buffer."""
    t = torch.arange(numel * world_size, dtype=torch.float32) + rank
    part = torch.empty(numel)
    dist.reduce_scatter_tensor(part, t)
    dist.reduce_scatter(part, list(t.chunk(world_size)))
    return part


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_reduce_scatter_is_within_its_record(world_size):
    out = distlab.run(_reduce_scatters, world_size, 65536, backend="gloo")
    assert_crossed_as_recorded(out)


def test_nothing_is_asserted_on_nccl_whose_data_does_not_cross_by_tcp():
    """NCCL moves data over the GPUs' links and its bootstrap over TCP: gloo's bounds do not
    describe it (the gloo run of ``--backend both`` is the one checked)."""
    out = distlab.run(_communicate, 2, "ring", 13, backend="gloo")
    out.wire = wire.RunWire(ranks=[wire.Wire(sent=10**9, received=0, sockets=1)] * 2, total=None)
    with pytest.raises(CheckFailed, match="crossed outside"):
        assert_crossed_as_recorded(out)
    out.backend = "nccl"
    assert_crossed_as_recorded(out)


@pytest.mark.parametrize("numel", [1031, 65536])
def test_an_all_reduce_that_skips_the_record_fails(numel):
    out = distlab.run(_communicate, 4, "hidden_all_reduce", numel, backend="gloo")
    expected = sum(torch.arange(numel, dtype=torch.float32) + r for r in range(4))
    assert torch.equal(out[0], expected)            # the values are right: only the wire tells
    assert {c.op for c in out.comms[0]} == {"isend", "irecv"}
    with pytest.raises(CheckFailed, match="crossed outside"):
        assert_crossed_as_recorded(out, "ring_all_reduce")


def test_data_through_the_rendezvous_store_fails():
    out = distlab.run(_communicate, 4, "through_the_store", 1031, backend="gloo")
    assert torch.equal(out[1], sum(torch.arange(1031, dtype=torch.float32) + r for r in range(4)))
    with pytest.raises(CheckFailed, match="rendezvous store"):
        assert_crossed_as_recorded(out)


def test_a_group_destroyed_before_the_count_is_caught_on_the_ranks_own_network():
    launcher = Launcher(LaunchSettings(own_network=True))
    try:
        launcher.warm_up().wait_ready()
        if not wire.in_own_network(launcher.zygote_pid()):
            pytest.skip("this kernel gives no network namespace to this user (unshare refused)")
        honest = launcher.run(_communicate, 4, "ring", 1031, backend="gloo")
        assert_crossed_as_recorded(honest)
        # A busy machine retransmits a segment now and then (CI saw it hide this exchange when
        # each retransmission was allowed a whole 64 KiB segment): each is allowed the largest
        # recorded transfer, here 3 KiB with framing, against the 20 KiB hidden, so a run with
        # more than four (rare: at most 3 in 12 runs beside three busy loops) is run again.
        for _ in range(3):
            out = launcher.run(_communicate, 4, "destroyed_group", 1031, backend="gloo")
            if out.wire.retransmitted <= 4:
                break
        with pytest.raises(CheckFailed, match="the ranks together"):
            assert_crossed_as_recorded(out)
    finally:
        launcher.close()


def test_each_retransmission_is_allowed_one_recorded_transfer_not_a_whole_segment():
    out = distlab.run(_communicate, 4, "ring", 1031, backend="gloo")
    bounds = sum(recorded_bound(out.comms[r], 4) for r in range(4))
    allowance = largest_segment(out.comms)
    assert allowance < MAX_SEGMENT // 10      # the ring sends quarters of 4 KiB
    out.wire = wire.RunWire(ranks=out.wire.ranks, total=bounds + 2 * allowance, retransmitted=2)
    assert_crossed_as_recorded(out)
    out.wire = wire.RunWire(ranks=out.wire.ranks, total=bounds + 2 * allowance + 1,
                            retransmitted=2)
    with pytest.raises(CheckFailed, match="the ranks together"):
        assert_crossed_as_recorded(out)
