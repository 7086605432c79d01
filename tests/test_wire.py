"""Bytes that crossed, counted by the kernel outside the ranks (distlab.runtime.wire)."""
import socket

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.runtime import wire
from distlab.runtime.launch import Launcher, LaunchSettings

NUMEL, WORLD = 50_000, 4
RING = 2 * (WORLD - 1) / WORLD * 4 * NUMEL       # a ring all-reduce's bytes per rank (gloo's)


def _all_reduce(rank, world_size, how):
    t = torch.ones(NUMEL)
    if how == "recorded":
        dist.all_reduce(t)
    elif how == "process_group":      # straight to the ProcessGroup: no record is kept
        dist.distributed_c10d._get_default_group().allreduce([t]).wait()
    elif how == "short_lived_group":  # a group made, used and destroyed before returning
        group = dist.new_group(list(range(world_size)))
        dist.all_reduce(t, group=group)
        dist.destroy_process_group(group)
    return float(t[0])


def _linux_counters():
    if wire.count([]) is None:
        pytest.skip("the kernel's TCP counters (sock_diag) cannot be read here")


@pytest.mark.parametrize("how", ["recorded", "process_group"])
def test_every_byte_a_rank_sends_is_counted_whatever_called_the_collective(how):
    _linux_counters()
    out = distlab.run(_all_reduce, WORLD, how, backend="gloo")
    assert list(out) == [float(WORLD)] * WORLD
    recorded = sum(c.bytes for c in out.comms[0])
    assert recorded == (4 * NUMEL if how == "recorded" else 0)
    for rank, counted in enumerate(out.wire.ranks):
        # gloo's ring sends 2(n-1)/n of the buffer; its headers add well under 1%
        assert RING <= counted.sent <= RING * 1.01 + 4096, (rank, counted)
    assert out.wire.total is None      # the machine's own network: shared, not counted whole


@pytest.fixture(scope="module")
def own_network():
    launcher = Launcher(LaunchSettings(own_network=True))
    launcher.warm_up().wait_ready()
    if not wire.in_own_network(launcher.zygote_pid()):
        launcher.close()
        pytest.skip("this kernel gives no network namespace to this user (unshare refused)")
    yield launcher
    launcher.close()


def test_a_run_of_its_own_network_counts_even_a_group_destroyed_before_the_end(own_network):
    honest = own_network.run(_all_reduce, WORLD, "recorded", backend="gloo")
    hidden = own_network.run(_all_reduce, WORLD, "short_lived_group", backend="gloo")
    assert list(hidden) == [float(WORLD)] * WORLD
    # every rank's ring bytes, less what the header estimate takes from small packets
    for out in (honest, hidden):
        assert WORLD * RING * 0.98 <= out.wire.total <= WORLD * RING * 1.05 + 16384, out.wire


def _connect(rank, world_size, port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__


def test_ranks_of_their_own_network_cannot_reach_the_machines(own_network):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert list(distlab.run(_connect, 1, port, backend="gloo")) == ["connected"]
        assert own_network.run(_connect, 1, port, backend="gloo")[0] != "connected"


def test_a_run_of_its_own_network_still_counts_each_rank(own_network):
    out = own_network.run(_all_reduce, WORLD, "process_group", backend="gloo")
    for counted in out.wire.ranks:
        assert RING <= counted.sent <= RING * 1.01 + 4096, out.wire
