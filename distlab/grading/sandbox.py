"""Processes and memory on the grader's side: orphans reaped, process trees killed, a watch on
the memory of a student's processes.

Processes and memory (for the grader's side)::

    become_subreaper() -> bool     # orphans of our descendants reparent to us, not to init
    die_with_parent() -> bool      # SIGKILL when the parent dies (a killed grader's workers)
    descendants(pid) -> [pid]      # living descendants, parents before children
    kill_tree(pid, include_root=True, timeout=10) -> int     # SIGSTOP all, SIGKILL all, repeat
    MemoryWatch(root_pid, limit_bytes, interval=0.2, on_kill=None)   # kill the biggest descendant
        .start() / .stop() / with-block / .poll() / .events          # when their PSS sum > limit

How the grader is meant to combine them (a sketch)::

    # in the grading worker (one per student), before nbclient starts any kernel:
    become_subreaper()                              # daemons a student leaves stay below us
    kernel argv = [sys.executable, "-m", "distlab.runtime.landlock", "--write", ".", "--home", HOME,
                   "--shm-size", "2G", "--", sys.executable, "-m", "ipykernel_launcher",
                   "-f", "{connection_file}"]
    with MemoryWatch(os.getpid(), LIMIT, on_kill=note):
        ...autograde...
    kill_tree(os.getpid(), include_root=False)      # whatever outlived its kernel
    # in the grader, when a worker runs past its time: kill_tree(worker.pid)
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from distlab.grading.polling import PollingWatch
from distlab.runtime.landlock import libc

# ---------------------------------------------------------------------------------------------
# Processes

def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (PR_SET_CHILD_SUBREAPER): a
    double-forked daemon or a setsid'd rank whose parent died becomes our child, not init's, so
    descendants() and kill_tree() still find it. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    return libc().prctl(ctypes.c_int(36), ctypes.c_ulong(1), ctypes.c_ulong(0),
                         ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0


def die_with_parent() -> bool:
    """Be killed (SIGKILL) when the parent dies (PR_SET_PDEATHSIG): a grader killed outright must
    not leave its workers grading on. False where unsupported, or if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    ok = libc().prctl(ctypes.c_int(1), ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    return ok and parent != 1 and os.getppid() == parent


def _read(path: str) -> bytes | None:
    """A small /proc file, None if its process is gone (os.read: half the cost of open())."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int | str) -> tuple[int, str] | None:
    """(ppid, state) of a process, None if gone."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(b")") + 2:].split()  # the name in parentheses may hold anything
    return int(fields[1]), fields[0].decode()


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] not in "ZX"   # a zombie has freed its memory and children


def descendants(pid: int, exited: bool = False) -> list[int]:
    """The living (not zombie) descendants of `pid`, parents before their children; with
    ``exited``, those that have exited but are not reaped yet too (their CPU time is still
    theirs, not yet their parent's)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(entry.name)
            if st is not None and (exited or st[1] not in "ZX"):
                children.setdefault(st[0], []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in children.get(p, ())]
        found += kids
        frontier = kids
    return found


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_all(pid: int, deadline: float) -> list[int]:
    """SIGSTOP every descendant, listing again until no new one appears (a process forking while
    we list is caught by the next listing; once all are stopped nobody forks)."""
    stopped: list[int] = []
    while time.monotonic() < deadline:
        new = [p for p in descendants(pid) if p not in set(stopped)]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped += new
    return stopped


def _wait_dead(pids, deadline: float) -> None:
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.005)


def _reap(pids) -> None:
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:  # not ours: its parent (or init) reaps it
            pass


def kill_tree(pid: int, include_root: bool = True, timeout: float = 10) -> int:
    """Kill every descendant of `pid` (and `pid` itself if `include_root`, unless it is the
    calling process); return how many
    processes were killed. Everything is stopped first (SIGSTOP, so nothing forks while we
    kill), then killed (SIGKILL), and again until no descendant is left: processes reparented
    to `pid` when their parent died are found on the next pass (make `pid` a subreaper, or they
    go to init). Descendants that are our children are reaped; `pid` itself is not, so that its
    owner's Popen.wait() still gets the real status. Gives up after `timeout` seconds (a process
    stuck in the kernel, state D, may outlive SIGKILL for a while)."""
    deadline = time.monotonic() + timeout
    freeze_root = pid != os.getpid()
    if freeze_root and not _signal(pid, signal.SIGSTOP):
        return 0   # already gone (its orphans went to the nearest subreaper)
    killed: set[int] = set()
    while time.monotonic() < deadline:
        procs = _stop_all(pid, deadline)
        if not procs:
            break
        killed.update(p for p in procs if _signal(p, signal.SIGKILL))
        _wait_dead(procs, deadline)  # dead, so their children are reparented before we list again
        _reap(procs)
    if include_root and freeze_root:
        if _signal(pid, signal.SIGKILL):
            killed.add(pid)
        _wait_dead([pid], deadline)
    elif freeze_root:
        _signal(pid, signal.SIGCONT)
    return len(killed)


# ---------------------------------------------------------------------------------------------
# Memory

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss(pid: int) -> int | None:
    """Resident bytes from /proc/PID/statm: O(1) in the kernel, and >= the process's PSS."""
    text = _read(f"/proc/{pid}/statm")
    try:
        return int(text.split()[1]) * _PAGE
    except (AttributeError, IndexError, ValueError):  # gone, or a kernel thread
        return None


def _pss(pid: int) -> int | None:
    """Proportional set size (+ its share of swap) from /proc/PID/smaps_rollup: each page counts
    1/n in each of the n processes that map it. Walks the page tables: ~10 ms for torch."""
    text = _read(f"/proc/{pid}/smaps_rollup")
    if not text:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"Pss:", b"SwapPss:")):
            total += int(line.split()[1]) * 1024
    return total


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class MemoryEvent:
    """One kill: the process (`pid`, `command`: its command line) that held `bytes` (PSS) when
    the descendants of the watched root held `total` bytes together, over `limit`; `killed`
    processes died (it and its descendants); `time` is time.time()."""
    pid: int
    command: str
    bytes: int
    total: int
    limit: int
    killed: int
    time: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return (f"killed pid {self.pid} ({self.command[:200]}): it used {self.bytes / 2**20:.0f} "
                f"MiB and its group {self.total / 2**20:.0f} MiB, over the limit of "
                f"{self.limit / 2**20:.0f} MiB")


class MemoryWatch(PollingWatch):
    """A daemon thread that keeps the memory (PSS) of `root_pid`'s descendants, `root_pid`
    itself excluded, under `limit_bytes`: every `interval` seconds it sums them and, over the
    limit, kills the largest one with its own descendants, appends a MemoryEvent to `.events`
    and calls `on_kill(event)`. A fast allocator can overshoot the limit by about its allocation
    rate x `interval` before it dies.

        with MemoryWatch(worker.pid, 8 << 30, on_kill=print) as watch:
            worker.wait()
        watch.events        # what was killed, if anything

    Cost: a poll lists /proc (~30 us per process on the machine) and reads each descendant's
    RSS (~20 us); it reads PSS (10-20 ms for a torch process) only when the RSS sum is over
    the limit, and then for each process at most every `refresh` seconds, again for all after
    one of them ended (its share of their common pages moves to the others), and for all when
    the estimate passes the limit."""

    name = "distlab-memory-watch"

    def __init__(self, root_pid: int, limit_bytes: int, interval: float = 0.2, on_kill=None,
                 refresh: float = 10.0):
        self.root_pid, self.limit, self.interval = root_pid, int(limit_bytes), interval
        self.on_kill, self.refresh = on_kill, refresh
        self.events: list[MemoryEvent] = []
        self._known: dict[int, tuple[int, int, float]] = {}   # pid -> (rss, pss, when measured)

    def finished(self) -> bool:
        return not _alive(self.root_pid)

    def poll(self) -> MemoryEvent | None:
        """One check now; the event if it killed something."""
        rss = {p: r for p in descendants(self.root_pid) if (r := _rss(p)) is not None}
        if any(p not in rss for p in self._known):   # an exit raises the survivors' PSS
            self._known.clear()
        if sum(rss.values()) <= self.limit:  # RSS >= PSS: certainly under the limit
            return None
        if sum(self._estimate(p, r) for p, r in rss.items()) <= self.limit:
            return None
        exact = {p: b for p in rss if (b := self._measure(p)) is not None}
        total = sum(exact.values())
        if total <= self.limit or not exact:
            return None
        return self._kill(max(exact, key=exact.get), exact, total)

    def _measure(self, pid: int) -> int | None:
        rss, pss = _rss(pid), _pss(pid)
        if rss is not None and pss is not None:
            self._known[pid] = (rss, pss, time.monotonic())
        return pss

    def _estimate(self, pid: int, rss: int) -> int:
        """PSS now, from the last measure and how much RSS grew since (new pages are private
        until the process forks); measured afresh when unknown or older than `refresh`."""
        known = self._known.get(pid)
        if known is None or time.monotonic() - known[2] > self.refresh:
            pss = self._measure(pid)
            return rss if pss is None else pss
        rss0, pss0, _ = known
        return min(rss, max(0, pss0 + rss - rss0))

    def _kill(self, victim: int, usage: dict[int, int], total: int) -> MemoryEvent:
        command = _cmdline(victim)
        killed = kill_tree(victim)
        event = MemoryEvent(victim, command, usage[victim], total, self.limit, killed)
        self.events.append(event)
        if self.on_kill is not None:
            self.on_kill(event)
        return event

