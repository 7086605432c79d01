"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd on localhost, started
from a generated ``slurm.conf`` in a temporary folder, and stopped with it.

The node declares 16 CPUs and 64 GiB (``SlurmdParameters=config_overrides``: Slurm believes the
configuration, not the 2-core machine), because the course's ``grader/slurm/*.sbatch`` ask for
8 CPUs and 32 GiB per task; two of the array's tasks then run at once. Clients (sbatch, squeue, scontrol)
find the cluster through ``SLURM_CONF`` in ``Cluster.env``.

``Cluster(root, nodes=2)`` starts two slurmd daemons on this one host, each a node of its own
(``node1``, ``node2``: distinct names, ports, spool folders and logs; ``NodeHostname=localhost``),
so a job of ``--nodes=2`` gets ``SLURM_NNODES=2`` and one task per node, as on a real cluster
(Debian's packaged ``slurm-wlm``, 22.05, runs several slurmd on one host this way; tests that use
it say so).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from conftest import INSTALL_HELP

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")
CONF = """\
ClusterName=distlabtest
SlurmctldHost=localhost
SlurmUser={user}
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""
ONE_NODE = "NodeName=localhost CPUs=16 RealMemory=65536 State=UNKNOWN"
# One of several nodes on this host: slurmd -N NAME reads its own line (its port; %n in the
# spool, pid and log paths is the node's name).
NODE = "NodeName={name} NodeHostname=localhost Port={port} CPUs=16 RealMemory=65536 State=UNKNOWN"


def missing() -> str | None:
    """Why no cluster can start here (None if it can)."""
    absent = [d for d in DAEMONS if shutil.which(d) is None
              and not Path("/usr/sbin", d).exists()]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} not found): install it with "
                f"`sudo apt-get install slurm-wlm munge` to run the Slurm test (see {INSTALL_HELP})")
    if os.geteuid() != 0:
        return "a test cluster's slurmd must run as root (it starts jobs as their users)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
    """``with Cluster(tmp) as cluster:`` a running cluster; ``cluster.env`` for its clients."""

    def __init__(self, root: Path, nodes: int = 1):
        self.root = Path(root)
        self.nodes = nodes
        # One node is named after its host; several are node1, node2, ... on this one host.
        self.node_names = ["localhost"] if nodes == 1 else [f"node{i + 1}" for i in range(nodes)]
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.root / "slurm.conf"))

    def __enter__(self) -> "Cluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        conf_text = CONF.format(root=self.root, user="root", ctld_port=_free_port(),
                                d_port=_free_port(), node_names=",".join(self.node_names),
                                nodes=ONE_NODE if self.nodes == 1 else "\n".join(
                                    NODE.format(name=n, port=_free_port())
                                    for n in self.node_names))
        if self.nodes > 1:   # each slurmd its own spool folder, pid file and log
            conf_text = conf_text.replace(f"{self.root}/spool", f"{self.root}/spool/%n") \
                .replace("slurmd.pid", "slurmd-%n.pid").replace("slurmd.log", "slurmd-%n.log")
            for name in self.node_names:
                (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
        (self.root / "slurm.conf").write_text(conf_text)
        munge = self.root / "munge"
        self._spawn([_exe("munged"), "-F", "-f", f"--key-file={key}",
                     f"--socket={munge / 'munge.sock'}", f"--pid-file={munge / 'munged.pid'}",
                     f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}"], "munged")
        self._wait(lambda: (munge / "munge.sock").exists(), "munged to create its socket")
        conf = str(self.root / "slurm.conf")
        self._spawn([_exe("slurmctld"), "-D", "-i", "-f", conf], "slurmctld")
        self._wait(self._controller_answers, "slurmctld to answer")
        for name in self.node_names:
            self._spawn([_exe("slurmd"), "-D", "-N", name, "-f", conf],
                        "slurmd" if self.nodes == 1 else f"slurmd-{name}")
        self._wait(self._node_idle, "the node to register as idle" if self.nodes == 1
                   else f"{self.nodes} nodes to register as idle")

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                           env=self.env, start_new_session=True))

    def _controller_answers(self) -> bool:
        return self.run(["scontrol", "ping"], check=False).returncode == 0

    def _node_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return sorted(states) == sorted(self.node_names) and all(
            state in ("idle", "mix", "alloc") for state in states.values())

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Slurm daemon exited while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())

    def run(self, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check,
                              timeout=60, **kw)

    def wait_idle(self, timeout: float) -> None:
        """Until no job is pending or running (a dependency that can never be met fails)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.run(["squeue", "-h", "-o", "%i %T %r"]).stdout.strip()
            if not queue:
                return
            if "DependencyNeverSatisfied" in queue:
                raise RuntimeError(f"a job's dependency can never be met:\n{queue}")
            time.sleep(1)
        raise RuntimeError(f"jobs still queued after {timeout:g} s:\n"
                           f"{self.run(['squeue']).stdout}\n{self.logs()}")

    def job_states(self) -> dict[str, str]:
        """{job id (array tasks as JOB_TASK): state} of every job the controller remembers."""
        out = self.run(["scontrol", "-o", "show", "job"]).stdout
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            job = fields.get("JobId", "?")
            if fields.get("ArrayTaskId"):
                job = f"{fields.get('ArrayJobId')}_{fields['ArrayTaskId']}"
            states[job] = fields.get("JobState", "?")
        return states

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
