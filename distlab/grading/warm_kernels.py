"""Graded kernels forked from a process that has already imported what every lab imports.

A kernel started cold is an interpreter that imports ipykernel, torch and matplotlib: about
1.5 s of CPU per graded notebook, as much as the rest of its grading. A grading worker
(``distlab.grading.worker``) therefore starts one ``WarmKernels`` beside it, a process that
imports PRELOAD once in the kernels' environment and then forks a kernel for each lab. The server
is itself forked from the worker, which has imported torch already (``distlab.runtime.forked``).

The kernel spec stays the one description of a graded kernel: ``python -m
distlab.runtime.landlock OPTIONS -- python -m ipykernel_launcher -f FILE``. A fork is what that
command would have become:
- confined by the same Landlock options (``landlock.confine_as``), applied in the fork, which
  has a single thread, before any of the student's code runs;
- in a session of its own, as jupyter_client starts kernels (an interrupt reaches its group);
- its working folder the lab's, which is first on ``sys.path``; its environment exactly the one
  jupyter_client built, but ``DISTLAB_JUDGE``, the number of the one descriptor it keeps of the
  server's: its end of the channel to its judge (``Judge.channel``), which came with the request
  (SCM_RIGHTS) and is closed on exec, so that nothing the kernel starts holds it; random numbers of its own (Python's ``random`` reseeds itself at every
  fork, numpy's global generator is reseeded if the server had imported it);
- a child of the worker: the fork is double and the worker is a child subreaper, so the kernel
  is reparented to it. The worker reaps it (a ``ForkedProcess`` is its Popen), its memory counts
  under the worker's MemoryWatch, and what it leaves behind is killed after the lab as before.

A kernel command of another shape, or a server that died or does not answer, starts the kernel
cold (jupyter_client's own launch), with one line on stderr saying why.
"""
from __future__ import annotations

import atexit
import importlib
import os
import socket
import subprocess
import sys
import uuid

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Any

from distlab.grading.imports import freeze_imported
from distlab.grading.json_lines import Client, answer, requests
from distlab.grading.kernel_waits import QuickKernelManager
from distlab.runtime.forked import ForkedProcess, fork_helper

# What (nearly) every lab's first cells import, timed with time.process_time(): torch alone
# is 1.1 s of CPU, ipykernel 0.15 s, matplotlib's pyplot 0.4 s. The labs' own helpers are not
# here: each lab imports different ones, once per notebook either way. ipykernel's debugger
# (debugpy's vendored pydevd) is what every kernel still imported after the fork: its CPU until
# IPKernelApp.start() fell from 0.15 to 0.09 s. It starts no thread and sets no trace at import.
PRELOAD = ("numpy", "torch", "torch.distributed", "torch.nn.functional", "matplotlib.pyplot",
           "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger",
           "distlab.checks.assertions")
# pydevd warns on stderr at import that Python's frozen modules may hide breakpoints: nobody
# debugs a graded kernel, and the warning would land in the worker's log once per student.
QUIET_PYDEVD = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}
# ipykernel sets it unless it is set (kernelapp.init_gui_pylab): matplotlib reads it at import.
MPLBACKEND = "module://matplotlib_inline.backend_inline"
REPLY_TIMEOUT = 60.0   # seconds a fork may take on a loaded machine before the kernel starts cold


class WarmKernels:
    """The worker's end: ``fork(cmd, env, cwd)`` -> the kernel's pid, or None (start it cold).
    The worker hands it to its kernel managers as ``config.WarmKernelManager.kernels``."""

    def __init__(self, env: dict[str, str], cwd: str):
        """``env``: the kernels' environment but what jupyter_client adds per kernel; ``cwd`` a
        folder the student's code cannot write (the server's first entry on sys.path)."""
        mine, theirs = socket.socketpair()
        env = {**env, "MPLBACKEND": env.get("MPLBACKEND", MPLBACKEND)}
        fd = theirs.fileno()
        # Forked from the worker, which has imported torch (a second of CPU a fresh interpreter
        # pays again), where that is safe; else a fresh one.
        self.process = fork_helper(lambda: serve_kernels(fd, cwd), keep=(fd,), env=env, cwd=cwd)
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "distlab.grading.warm_kernels", str(fd)],
                env=env, cwd=cwd, pass_fds=[fd], stdin=subprocess.DEVNULL)
        theirs.close()
        self.client = Client(mine, REPLY_TIMEOUT)   # the judge's thread and nbgrader's both ask

    def __deepcopy__(self, memo):
        return self   # traitlets deep-copies config values: one server, shared

    @property
    def pid(self) -> int:
        return self.process.pid

    def fork(self, cmd: list[str], env: dict[str, str], cwd: str,
             judge: socket.socket | None = None) -> int | None:
        """``judge``: the kernel's end of its judge channel, which the kernel keeps."""
        if self.client.closed or kernel_args(cmd) is None:
            return None
        reply = self.client.ask({"cmd": cmd, "env": env, "cwd": str(cwd),
                                 "judge": judge is not None},
                                fds=[judge.fileno()] if judge is not None else [])
        if "pid" in reply:
            return reply["pid"]
        print(f"distlab grading worker: the warm kernel server failed ({reply['error']}); this "
              f"and later kernels start cold", file=sys.stderr)
        self.close()
        return None

    def preload(self, names) -> None:
        """Have the server import ``names`` (PyTorch modules: ``rank_torch_modules`` of the labs
        graded) before it forks the judge's zygotes, which import them otherwise, one per lab.
        Its reply is read before the next request's is: the worker goes on meanwhile, and one
        request at a time is in flight (a request's descriptors are never read with another)."""
        if names:
            self.client.tell({"preload": list(names)})

    def spawn_zygote(self, env: dict[str, str], sock_fd: int, log_fd: int) -> int | None:
        """A zygote forked from the server with ``env``, talking on ``sock_fd`` and writing to
        ``log_fd``: its pid, or None (start it as a fresh interpreter). ``LaunchSettings.spawn``
        of the judge's ranks: the server holds no answer, and forks while the judge's thread
        runs (a process with threads cannot fork safely)."""
        if self.client.closed:
            return None
        reply = self.client.ask({"zygote": True, "env": env}, fds=[sock_fd, log_fd])
        if "pid" in reply:
            return reply["pid"]
        print(f"distlab grading worker: the warm kernel server could not fork a zygote "
              f"({reply['error']}); it and later ones start as fresh interpreters", file=sys.stderr)
        return None

    def close(self) -> None:
        self.client.close()


def kernel_args(cmd: list[str]) -> tuple[list[str], list[str]] | None:
    """(landlock options, ipykernel's arguments) of a graded kernel's command, or None when
    ``cmd`` is not ``python -m distlab.runtime.landlock OPTIONS -- python -m ipykernel_launcher
    ARGS`` with this interpreter."""
    head = [sys.executable, "-m", "distlab.runtime.landlock"]
    if cmd[:3] != head or "--" not in cmd:
        return None
    split = cmd.index("--")
    kernel = cmd[split + 1:]
    if kernel[:3] != [sys.executable, "-m", "ipykernel_launcher"]:
        return None
    return cmd[3:split + 1] + ["true"], kernel[3:]


class WarmProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, but the kernel is forked warm when it can be, and it
    gets a channel of its own to the judge (a descriptor, never an address)."""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        from distlab.checks.messenger import ENV
        judge = self.parent.judge
        kwargs["env"] = {k: v for k, v in (kwargs.get("env") or os.environ).items() if k != ENV}
        channel = judge.channel() if judge is not None else None
        try:
            return await self._launch(cmd, channel, **kwargs)
        finally:
            if channel is not None:
                channel.close()   # the kernel has its copy: this process keeps the judge's end

    async def _launch(self, cmd: list[str], channel, **kwargs):
        server = self.parent.kernels
        cwd = str(kwargs.get("cwd") or os.getcwd())
        pid = server.fork(cmd, kwargs["env"], cwd, channel) if server else None
        if pid is None:   # started cold: the channel is the one descriptor it inherits
            if channel is not None:
                from distlab.checks.messenger import ENV
                kwargs["env"][ENV] = str(channel.fileno())
                kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), channel.fileno())
            return await super().launch_kernel(cmd, **kwargs)
        self.process = ForkedProcess(pid)   # reparented here: reaped by this process
        self.pid = self.pgid = pid   # the kernel leads its own session and group
        self.cwd = cwd
        return self.connection_info


class WarmKernelManager(QuickKernelManager):
    """The kernel manager of graded notebooks (``GradedExecute``): a WarmProvisioner's kernels."""
    kernels = Any(None, allow_none=True, help="the worker's WarmKernels (None: start kernels "
                                              "cold)").tag(config=True)
    judge = Any(None, allow_none=True, help="the worker's Judge, which makes each kernel its "
                                            "channel (None: checks run in the kernel)").tag(config=True)

    async def _async_pre_start_kernel(self, **kw):
        if self.provisioner is None:
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", None) or str(uuid.uuid4())
            self.provisioner = WarmProvisioner(kernel_id=self.kernel_id,
                                               kernel_spec=self.kernel_spec, parent=self)
        return await super()._async_pre_start_kernel(**kw)


# ---------------------------------------------------------------------------------------------
# The server: `python -m distlab.grading.warm_kernels FD`

def main(argv: list[str]) -> int:
    return serve_kernels(int(argv[0]), os.getcwd())


def serve_kernels(fd: int, cwd: str) -> int:
    """Import PRELOAD, then fork a kernel for each request on the socket ``fd`` until it closes;
    ``cwd`` (this process's working folder) is first on sys.path, as for ``python -m``."""
    from distlab.grading.sandbox import die_with_parent
    import gc
    gc.disable()   # until the imports below are done and frozen (freeze_imported)
    die_with_parent()
    sys.path[0] = cwd
    quiet = {k: v for k, v in QUIET_PYDEVD.items() if k not in os.environ}
    os.environ.update(quiet)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in quiet:   # the forks' environments are the requests' own anyway
        del os.environ[name]
    from distlab.grading import kernel_tracebacks   # what every kernel's first traceback costs
    kernel_tracebacks.prepare_server()
    # The judge's zygotes for the student's ranks fork from here too, one per lab: what every
    # rank imports is imported once; what the graded labs' ranks import of PyTorch's parallel
    # APIs (a second of CPU, and most labs use none) comes with the worker's ``preload``.
    from distlab.runtime.zygote import RANK_BASE
    _import_extras(RANK_BASE)
    freeze_imported()
    with socket.socket(fileno=fd) as sock:
        for request, fds in requests(sock):
            try:
                if "preload" in request:
                    _import_extras(request["preload"])
                    freeze_imported()
                    reply = {"imported": True}
                else:
                    reply = {"pid": _fork_zygote(request, fds) if request.get("zygote")
                             else _fork_kernel(request, fds)}
            except Exception as exc:   # noqa: BLE001 - the worker starts that one cold
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            finally:
                for passed in fds:
                    os.close(passed)
            answer(sock, reply)
    return 0


def _import_extras(names) -> None:
    """Import ``names``, PyTorch's modules only (this process holds no course code that a kernel
    forked from here could reach); one that fails to import is left to the rank that needs it."""
    for name in names:
        if str(name).split(".")[0] not in ("torch", "cloudpickle"):
            continue
        try:
            importlib.import_module(name)
        except Exception:   # noqa: BLE001 - an optional extra: a rank imports it if it needs it
            pass


def _fork_zygote(request: dict, fds: list[int]) -> int:
    """A rank launcher's zygote (``distlab.runtime.zygote``) forked from here, a process that has
    imported torch but never a line of the course's answers: the judge's ranks that run a
    student's code come from it. ``fds``: its socket and its log. It switches to the student
    package its environment names before anything else."""
    from distlab.runtime import zygote
    from distlab.runtime.forked import fork_helper
    sock_fd, log_fd = fds

    def start() -> int:
        child = fork_helper(lambda: zygote.main(sock_fd), keep=(sock_fd,), env=request["env"],
                            output=log_fd, new_session=True)
        if child is None:
            raise RuntimeError("the zygote could not be forked")
        return child.pid
    return _fork_twice(start, "zygote")


def _fork_kernel(request: dict, fds: list[int]) -> int:
    """The kernel the request describes, forked from here; ``fds``: its judge channel's end."""
    judge = fds[0] if request.get("judge") and fds else None

    def start() -> int:
        kernel = os.fork()
        if kernel == 0:
            _become_kernel(request, judge)
        return kernel
    return _fork_twice(start, "kernel")


def _fork_twice(start, what: str) -> int:
    """Run ``start()`` (which forks the process wanted and returns its pid) in a middle process
    that exits at once, so that the process is reparented to the nearest subreaper, the worker,
    which reaps it and counts its memory; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read)
            os.write(write, str(start()).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(middle, 0)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read()
    if not text:
        raise RuntimeError(f"the {what} could not be forked")
    return int(text)


def _become_kernel(request: dict, judge: int | None):
    """Turn this fork into the kernel the request's command describes, keeping descriptor
    ``judge`` (its judge channel, or None); never returns."""
    code = 1
    try:
        from distlab.checks.messenger import ENV
        landlock_opts, kernel_argv = kernel_args(request["cmd"])
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        # The server's socket above all: a kernel cannot ask for forks.
        from distlab.runtime.forked import close_all_but
        close_all_but({0, 1, 2} | ({judge} if judge is not None else set()))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["DISTLAB_WARM_UP"] = "0"   # distlab, imported below while unconfined, starts no launcher
        os.environ.pop(ENV, None)
        if judge is not None:
            os.set_inheritable(judge, False)
            os.environ[ENV] = str(judge)
        package = os.environ.get("DISTLAB_PACKAGE")
        if package:   # the lab's student package: what this server imported of distlab is dropped
            from distlab.runtime.forked import import_package_from
            import_package_from(package)
        from distlab.runtime import landlock
        try:
            landlock.confine_as(landlock.parse(landlock_opts)[0], single_thread=True)
        except OSError as exc:
            print(landlock.REFUSED.format(exc), file=sys.stderr)
            code = 126
            return
        if "numpy.random" in sys.modules:   # numpy imports it lazily: reseed it if it was
            sys.modules["numpy.random"].seed()
        from ipykernel import kernelapp
        launcher = os.path.join(os.path.dirname(os.path.dirname(kernelapp.__file__)),
                                "ipykernel_launcher.py")
        sys.argv = [launcher, *kernel_argv]
        sys.path[0] = os.getcwd()
        kernelapp.launch_new_instance(argv=kernel_argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:   # noqa: BLE001 - said on stderr, as a cold kernel's crash would be
        import traceback
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()   # the kernel's and the student's, as at a cold kernel's exit
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001
                pass
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
