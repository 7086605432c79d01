"""Where a process of a cluster program sits, and how it joins its ranks: one code path for a
laptop (``distlab.run`` starts the ranks), ``torchrun --standalone`` and torchrun across nodes.

Nodes: under torchrun a node is what one agent started (``LOCAL_WORLD_SIZE`` processes, ranks
numbered node by node, as torchrun assigns them); on a laptop ``--nproc-per-node`` cuts the ranks
into pretend nodes, so the same tables (within a node, across nodes) can be read there.

Settings that cannot work are said in words (``SettingsError``), before any rank waits on another:
more processes on a node than GPUs under NCCL, a rendezvous endpoint that nothing answers (within
``DISTLAB_RENDEZVOUS_WAIT`` seconds, default 20, naming the host and port), a world size that does
not fit what the program was asked to build.
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass

RENDEZVOUS_WAIT = 20.0   # seconds a process waits for the rendezvous endpoint to answer


class SettingsError(Exception):
    """Settings that cannot work; the programs print the message and exit with status 2."""


def under_torchrun() -> bool:
    """torchrun (or srun with the variables set) started this process as one rank of a group."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@dataclass(frozen=True)
class Placement:
    """``world_size`` ranks, ``per_node`` on each node, numbered node by node."""
    world_size: int
    per_node: int
    torchrun: bool

    @property
    def nodes(self) -> int:
        return self.world_size // self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def describe(self) -> str:
        how = "torchrun" if self.torchrun else "distlab.run on this machine"
        return (f"{self.world_size} ranks = {self.nodes} node(s) x {self.per_node} process(es) "
                f"({how})")


def placement(nproc: int, per_node: int | None) -> Placement:
    """The ranks of this run: torchrun's when it started us, else ``nproc`` local ranks in
    pretend nodes of ``per_node`` (default: one node)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if world % local:
            raise SettingsError(f"WORLD_SIZE={world} is not a whole number of nodes of "
                                f"LOCAL_WORLD_SIZE={local} processes: start the same "
                                f"--nproc_per_node on every node")
        return Placement(world, local, True)
    if nproc < 1:
        raise SettingsError(f"--nproc must be at least 1, got {nproc}")
    per_node = per_node or nproc
    if nproc % per_node:
        raise SettingsError(f"--nproc {nproc} is not a whole number of pretend nodes of "
                            f"--nproc-per-node {per_node}")
    return Placement(nproc, per_node, False)


def choose_backend(requested: str, where: Placement) -> str:
    """NCCL when every process of a node has a GPU of its own ("auto" then picks it), else gloo.
    ``--backend nccl`` with fewer GPUs than processes on a node is an error that says so."""
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    flag = "--nproc_per_node" if where.torchrun \
        else "--nproc-per-node" if where.per_node != where.world_size else "--nproc"
    also = " (GPUS_PER_NODE in cluster/slurm/*.sbatch)" if where.torchrun else ""
    if requested == "auto":
        if 0 < gpus < where.per_node and printer():
            print(f"note: {where.per_node} processes on this node but {gpus} GPU(s): running on "
                  f"the CPU with gloo (NCCL needs a GPU per process; {flag} {gpus}{also} uses "
                  f"them)",
                  file=sys.stderr)
        return "nccl" if gpus >= where.per_node and gpus > 0 else "gloo"
    if requested == "nccl" and gpus < where.per_node:
        raise SettingsError(
            f"--backend nccl needs a GPU for every process of a node: {where.per_node} processes "
            f"per node ({flag} {where.per_node}{also}) but {gpus} GPU(s) on "
            f"{socket.gethostname()}. "
            + (f"Start one process per GPU ({flag} {gpus}), or use --backend gloo." if gpus else
               "Run on nodes with GPUs, or use --backend gloo (the CPU)."))
    if requested not in ("gloo", "nccl"):
        raise SettingsError(f"--backend must be auto, gloo or nccl, not {requested!r}")
    return requested


def check_endpoint(host: str, port: int, wait: float, hosting: bool = False) -> None:
    """Return once something accepts connections on ``host:port``; a SettingsError naming both
    when the name does not resolve (at once) or nothing answers within ``wait`` seconds. The
    process that will host the endpoint (``hosting``) only checks the name."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise SettingsError(
            f"the rendezvous endpoint {host}:{port} cannot be reached: the host name {host!r} "
            f"does not resolve ({exc.strerror}). Set it (MASTER_ADDR, or torchrun's "
            f"--rdzv_endpoint) to the first node's address; in a Slurm job, "
            f"`scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`.") from None
    if hosting:
        return
    deadline, last = time.monotonic() + wait, None
    while True:
        for family, kind, proto, _, address in addresses:
            try:
                with socket.socket(family, kind, proto) as s:
                    s.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
                    s.connect(address)
                return
            except OSError as exc:
                last = exc
        if time.monotonic() >= deadline:
            raise SettingsError(
                f"the rendezvous endpoint {host}:{port} cannot be reached: nothing answered there "
                f"within {wait:g} s ({last}). Check that the first node's process (or torchrun "
                f"agent) runs, that MASTER_ADDR and MASTER_PORT (--rdzv_endpoint) name it, and "
                f"that no firewall closes the port between the nodes.")
        time.sleep(0.2)


def join(backend: str) -> None:
    """Make the default process group from torchrun's variables, after checking that the
    rendezvous endpoint answers (rank 0 hosts it when no torchrun agent does)."""
    import torch
    import torch.distributed as dist
    if dist.is_initialized():
        return
    rank = int(os.environ["RANK"])
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if host and port and (rank != 0 or agent_store):
        wait = float(os.environ.get("DISTLAB_RENDEZVOUS_WAIT", RENDEZVOUS_WAIT))
        check_endpoint(host, int(port), wait)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    atexit.register(_leave)


def _leave() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(fn, where: Placement, backend: str, *args, timeout: float = 600):
    """``fn(rank, world_size, *args)`` on every rank; every rank's result (``distlab.run``)."""
    import distlab
    if where.torchrun:
        join(backend)
    return distlab.run(fn, where.world_size, *args, backend=backend, timeout=timeout)


def printer() -> bool:
    """This process prints the tables: the only one on a laptop, rank 0 under torchrun."""
    return os.environ.get("RANK", "0") == "0"


def main(argv=None) -> int:
    """``python -m distlab.cluster.group HOST:PORT --node-rank K``: what cluster/slurm/torchrun.sh
    runs on each node before its torchrun agent. Every node checks that HOST resolves; a node
    other than the first (whose agent hosts the c10d store) waits until something answers at
    HOST:PORT, so a wrong endpoint is one line naming it, not torchrun's traceback minutes later."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m distlab.cluster.group",
                                     description=main.__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="HOST:PORT, torchrun's --rdzv_endpoint")
    parser.add_argument("--node-rank", type=int, default=1, help="0 hosts the endpoint")
    parser.add_argument("--wait", type=float, default=RENDEZVOUS_WAIT,
                        help=f"seconds to wait for the endpoint (default {RENDEZVOUS_WAIT:g})")
    args = parser.parse_args(argv)
    host, _, port = args.endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"the rendezvous endpoint is HOST:PORT, not {args.endpoint!r}")
    check_endpoint(host, int(port), args.wait, hosting=args.node_rank == 0)
    return 0


def guarded(prog: str, main, argv=None) -> int:
    """Run ``main(argv)``; settings that cannot work and failed ranks become one message on
    stderr and an exit status (2 and 1), not a traceback from deep inside torch. The class of a
    failed run is imported only once something failed (a run that failed imported it already):
    the endpoint check each node runs before its torchrun agent (``main`` here) imports no torch,
    about 2 CPU-seconds a node and a job saved."""
    try:
        return main(argv) or 0
    except SettingsError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from distlab.runtime.outcome import DistributedError
        if not isinstance(exc, DistributedError):
            raise
        print(f"{prog}: the ranks failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(guarded("distlab.cluster.group", main))
