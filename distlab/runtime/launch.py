"""``run(fn, world_size, *args)``: call ``fn(rank, world_size, *args)`` on fresh ranks.

Every lab cell that touches several ranks goes through here::

    out = distlab.run(fn, 4, x)            # a list: out[r] is what rank r returned
    out.comms[r]                           # rank r's torch.distributed calls (distlab.Comm)

How: a *zygote* process (``distlab.runtime.zygote``) imports torch once and forks the ranks of every run
in milliseconds. ``fn`` travels by cloudpickle, so a function defined in a notebook cell, a lambda
or a closure all work, and because the zygote is a fresh interpreter, a lab exported to a script
with no ``__main__`` guard works too. The ranks meet through a file of the run's own
(``torch.distributed.FileStore``), so two runs, or two notebooks, never collide. Not a TCPStore:
each of its connections formats the peer's address with a reverse DNS lookup of
``::ffff:127.0.0.1``, which on a machine with an unreachable name server stalls for the
resolver's 5 s timeout, here once in about 25 connections.

Failures never hang the caller: an exception on any rank stops all ranks and is raised here as
``RankError`` naming the rank and carrying its traceback; a rank that dies raises ``RankCrashed``;
ranks that disagree about a collective, wait on a rank that has returned, or are still running
after ``timeout`` seconds are killed and ``HangError`` says, rank by rank, where each one was.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) ``fn`` runs in this process on the existing
group, and every process gets the list of all ranks' results::

    torchrun --standalone --nproc-per-node=2 my_lab.py
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import numbers
import os
import pickle
import shutil
import sys
import tempfile

import cloudpickle

from distlab.runtime import call_guard, wire
from distlab.runtime.devices import pick_backend
from distlab.runtime.kill import current_killer
from distlab.runtime.outcome import (DistributedError, HangError, RankCrashed, RankError,  # noqa: F401
                                     Results)
from distlab.runtime.per_rank import ReferenceLeak, for_rank
from distlab.runtime.rank import Task
from distlab.runtime.rank_watch import RankWatch
from distlab.runtime.torchrun import run_in_process
from distlab.runtime.zygote_client import ZygoteHandle


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """How a launcher treats its ranks. The defaults trust them (a student's own notebook); the
    grader's judge, whose ranks run a student's code, distrusts them: their messages and results
    are read with ``distlab.runtime.safe_pickle`` only (plain data, never code), they start in
    ``cwd``, and the zygote and its ranks may write only the ``confine`` folders, read only those
    and the ``readable`` ones (an allow-list; None: anywhere) but not the ``hide`` folders inside
    them (``distlab.runtime.landlock``), and write no file past ``file_limit`` bytes (0: none).
    ``package``: the folder the ranks import distlab from (a student's view of it, without the
    answers of the lab graded: ``distlab.grading.student_package``), in a zygote started afresh,
    never forked from a process that holds the instructor's package."""
    distrust: bool = False
    cwd: str | None = None
    confine: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()
    readable: tuple[str, ...] | None = None
    file_limit: int = 0
    package: str | None = None
    # how another process forks the zygote (ZygoteHandle's ``spawn``): the grader's kernel server
    spawn: object = dataclasses.field(default=None, compare=False, repr=False)
    # modules the zygote imports once, not every rank (None: zygote.TORCH_EXTRAS)
    preload: tuple[str, ...] | None = None
    # the course code ("module:qualname") its ranks' guards watch: the zygote prepares the watch
    guarded: tuple[str, ...] = ()
    # fork the zygote from the launching process where that is safe (ZygoteHandle), not start
    # a fresh interpreter: for a process that has imported torch and runs no student's script
    fork_zygote: bool = False
    # the zygote moves into a network namespace of its own (``distlab.runtime.wire``), so that
    # every byte its ranks send is counted on that namespace's loopback, from outside
    own_network: bool = False

    def rank_env(self) -> dict[str, str]:
        """What the ranks' environment gets on top of the caller's."""
        if not self.cwd:
            return {}
        # Where the ranks may write: their home, caches and temporary files go there too (torch
        # writes caches while importing; a denied write there breaks later imports).
        return dict(HOME=self.cwd, TMPDIR=self.cwd, MPLCONFIGDIR=self.cwd, XDG_CACHE_HOME=self.cwd)

    def zygote_env(self) -> dict[str, str]:
        env = self.rank_env()
        if self.own_network:
            env[wire.OWN_NETWORK_ENV] = "1"
        if self.preload is not None:
            env["DISTLAB_ZYGOTE_PRELOAD"] = os.pathsep.join(self.preload)
        if self.guarded:
            from distlab.runtime.zygote import GUARDED_ENV
            env[GUARDED_ENV] = " ".join(self.guarded)
        if self.confine:
            env.update(DISTLAB_CONFINE=os.pathsep.join(self.confine),
                       DISTLAB_HIDE=os.pathsep.join(self.hide),
                       DISTLAB_FILE_LIMIT=str(self.file_limit))
            if self.readable is not None:   # absent: reads anywhere; empty: only `confine`
                env["DISTLAB_READ"] = os.pathsep.join(self.readable)
        if self.package:
            from distlab.runtime.zygote import PACKAGE_ENV
            env[PACKAGE_ENV] = self.package
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [self.package,
                                                               os.environ.get("PYTHONPATH")]))
        return env

    def rank_path(self) -> list[str]:
        """The ranks' sys.path: the caller's, after the package folder if there is one."""
        return [self.package, *sys.path] if self.package else list(sys.path)

    def loads_message(self, data: bytes):
        if self.distrust:
            from distlab.runtime.safe_pickle import loads_message
            return loads_message(data)
        return pickle.loads(data)

    def load_result(self, data: bytes):
        if self.distrust:
            from distlab.runtime.safe_pickle import loads_value
            return loads_value(data)
        return cloudpickle.loads(data)


class Launcher:
    """Runs functions on fresh ranks forked from a zygote of its own, started on first use (or by
    ``warm_up``) with its settings and restarted if it died. Launchers do not share anything:
    two in one process, with different settings, each keep theirs."""

    def __init__(self, settings: LaunchSettings = LaunchSettings()):
        self.settings = settings
        self.zygote: ZygoteHandle | None = None
        self.run_ids = itertools.count(1)
        self.scratch: str | None = None   # this launcher's own folder for rendezvous files

    def rendezvous_file(self, run_id: int) -> str:
        """A fresh path for one run's FileStore, in a folder its ranks may write: the ranks' own
        folder where the settings name one (a judge's confined scratch), else a private one."""
        folder = self.settings.cwd
        if folder is None:
            if self.scratch is None:
                self.scratch = tempfile.mkdtemp(prefix="distlab-rendezvous-")
            folder = self.scratch
        path = os.path.join(folder, f".distlab-rendezvous-{os.getpid()}-{id(self):x}-{run_id}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)   # one a killed process left: its keys would mislead this run
        # Made here, empty: a rank confined to its own folder may write this file, not make it.
        open(path, "x").close()
        return path

    def warm_up(self) -> ZygoteHandle:
        """Start the zygote now (in the background) so the first ``run`` does not wait for torch."""
        if self.zygote is None or not self.zygote.alive():
            # A zygote of a student's view never forks from here: this process may hold answers.
            self.zygote = ZygoteHandle(self.settings.zygote_env(), self.settings.loads_message,
                                       fork=self.settings.fork_zygote and not self.settings.package,
                                       spawn=self.settings.spawn)
        return self.zygote

    def zygote_pid(self) -> int | None:
        """The zygote's process id while it runs (a grader keeps it alive between labs)."""
        return self.zygote.proc.pid if self.zygote is not None and self.zygote.alive() else None

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    @contextlib.contextmanager
    def active(self):
        """Within the block (in this thread or task), ``distlab.run`` uses this launcher."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def run(self, fn, world_size: int, *args, backend: str = "auto", timeout: float = 60,
            threads: int | None = None, **kwargs) -> Results:
        """``distlab.run`` on this launcher's ranks."""
        world_size = check_arguments(fn, world_size, backend, timeout)
        backend = pick_backend(backend, world_size)
        calls = _calls(fn, args, kwargs, world_size)   # before any rank starts: a leak stops here
        zygote = self.warm_up()
        zygote.wait_ready()
        zygote.drain()
        zygote.exits.clear()  # notices of earlier runs' ranks are of no further use
        run_id = next(self.run_ids)
        store_path = self.rendezvous_file(run_id)
        tasks = [pickle.dumps(Task(
            call=call, world_size=world_size, backend=backend, store_path=store_path,
            timeout=timeout, cwd=self.settings.cwd or os.getcwd(), path=self.settings.rank_path(),
            env=dict(os.environ, **self.settings.rank_env()),
            threads=threads or max(1, (os.cpu_count() or 1) // world_size),
            plain_results=self.settings.distrust, guard=call_guard.active_guard()))
            for call in calls]
        zygote_pid = self.zygote_pid()
        own = zygote_pid is not None and wire.in_own_network(zygote_pid)
        watch = RankWatch(zygote, run_id, world_size, backend, timeout,
                          self.settings.loads_message, self.settings.load_result,
                          store=f"file {store_path}", killer=current_killer())
        try:
            before = wire.loopback(zygote_pid) if own else None
            out = watch.go(tasks)
            # every byte of this run (runs of one launcher never overlap), and of its store
            total, again = wire.payload(before, wire.loopback(zygote_pid)) or (None, 0)
            with contextlib.suppress(OSError):
                out.wire = wire.RunWire(ranks=out.wire.ranks, total=total,
                                        store=os.path.getsize(store_path), retransmitted=again)
            return out
        finally:
            with contextlib.suppress(OSError):
                os.unlink(store_path)


def _calls(fn, args: tuple, kwargs: dict, world_size: int) -> list[bytes]:
    """One pickled call per rank: rank r's holds its own ``PerRank`` values and no other rank's."""
    calls = []
    for rank in range(world_size):
        rank_args, rank_kwargs = for_rank(args, kwargs, rank, world_size)
        try:
            calls.append(cloudpickle.dumps((fn, rank_args, rank_kwargs)))
        except ReferenceLeak:
            raise
        except Exception as exc:
            raise DistributedError(
                f"distlab.run could not send your function or its arguments to rank {rank}: "
                f"{exc}. Arguments must be picklable (tensors, numbers, modules, functions)."
            ) from exc
    return calls


# The launcher ``distlab.run`` uses inside ``Launcher.active()`` (a context variable: each thread
# and task sees its own, so a judge's checks never reach another judge's ranks).
_ACTIVE: contextvars.ContextVar[Launcher | None] = contextvars.ContextVar("distlab_launcher",
                                                                          default=None)


@functools.lru_cache(maxsize=None)
def default_launcher() -> Launcher:
    """The launcher of a notebook or script: default settings, made on first use."""
    launcher = Launcher()
    atexit.register(launcher.close)
    return launcher


def current_launcher() -> Launcher:
    return _ACTIVE.get() or default_launcher()


def warm_up() -> ZygoteHandle:
    """Start the current launcher's zygote now, so the first ``run`` does not wait for torch."""
    return current_launcher().warm_up()


BACKENDS = ("auto", "gloo", "nccl")


def _kind(value) -> str:
    name = type(value).__name__
    return f"{value!r} ({'an' if name[0] in 'aeiouAEIOU' else 'a'} {name})"


def check_arguments(fn, world_size, backend, timeout) -> int:
    """Refuse, before any process starts, arguments ``run`` cannot use, saying what came and what
    to pass: a mistyped world size otherwise surfaces as a comparison of str and int, or as a
    TypeError from deep in the ranks seconds later. Returns the world size as an int (a numpy
    integer from a loop over an array is one too)."""
    if not callable(fn):
        raise TypeError(f"distlab.run(fn, world_size, ...): fn must be the function each rank "
                        f"runs, fn(rank, world_size, ...); got {_kind(fn)[:200]}. Pass the "
                        f"function itself (`fn`, not `fn(...)`).")
    # bool is an int to Python, but run(fn, True) is a slip, not one rank.
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        fix = ""
        if isinstance(world_size, float) and world_size.is_integer() and world_size >= 1:
            fix = f" Pass {int(world_size)}."
        elif isinstance(world_size, str) and world_size.strip().isdigit():
            fix = f" Pass {int(world_size)}, a number, not a string."
        raise TypeError(f"distlab.run(fn, world_size, ...): world_size is the number of ranks, "
                        f"an int >= 1; got {_kind(world_size)[:200]}.{fix}")
    if world_size < 1:
        raise ValueError(f"distlab.run(fn, world_size, ...): world_size is the number of ranks, "
                         f"an int >= 1; got {world_size}.")
    if backend not in BACKENDS:
        raise ValueError(f"distlab.run: backend must be one of {', '.join(map(repr, BACKENDS))}; "
                         f"got {_kind(backend)[:200]}. 'auto' picks NCCL when every rank can "
                         f"have a GPU of its own, gloo otherwise.")
    number = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
    if not (number and timeout > 0):
        raise (ValueError if number else TypeError)(
            f"distlab.run: timeout is the seconds the ranks may run, a number > 0; "
            f"got {_kind(timeout)[:200]}.")
    return int(world_size)


def run(fn, world_size: int, *args, backend: str = "auto", timeout: float = 60,
        threads: int | None = None, **kwargs) -> Results:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` fresh ranks; return the
    ranks' return values in rank order (a ``Results`` list with ``.comms``).

    backend: "auto" (NCCL when each rank can have its own GPU, else gloo), "gloo" or "nccl".
    timeout: seconds before hung ranks are killed and ``HangError`` explains where each one was.
    threads: intra-op threads per rank (default: this machine's cores shared among the ranks).
    """
    world_size = check_arguments(fn, world_size, backend, timeout)
    if os.environ.get("DISTLAB_RANK") == "1":
        raise DistributedError("distlab.run was called inside a rank. Call it from the notebook "
                               "or script, and pass the work as the function it runs.")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return run_in_process(fn, world_size, args, kwargs, backend)
    return current_launcher().run(fn, world_size, *args, backend=backend, timeout=timeout,
                                  threads=threads, **kwargs)
