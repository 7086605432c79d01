"""distlab.runtime.landlock and distlab.grading.sandbox: Landlock confinement, the wrapper command,
kill_tree and MemoryWatch.

Confinement cannot be undone, so every confined test runs in a fresh interpreter. Importing
distlab there must stay cheap and start no thread (confine() refuses to run once a thread
exists): a regression in distlab/__init__.py shows up here first.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from distlab.grading import sandbox
from distlab.runtime import landlock

REPO = Path(__file__).resolve().parents[1]
SANDBOX_FILE = REPO / "distlab" / "runtime" / "landlock.py"
ABI = landlock.landlock_abi()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
needs_landlock = pytest.mark.skipif(
    ABI == 0, reason="this kernel has no Landlock (needs Linux >= 5.13 with landlock in its LSMs)")
needs_scopes = pytest.mark.skipif(
    ABI < 6, reason=f"Landlock ABI {ABI} < 6: signal scoping needs Linux >= 6.12")

PRELUDE = f"""\
import errno, json, os, signal, subprocess, sys, time
from distlab.grading import sandbox
from distlab.runtime import landlock

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, repr(exc))

def write(path, mode="w"):
    with open(path, mode) as f:
        f.write("x")
"""


def run_py(code: str, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    """`code` (after PRELUDE) in a fresh interpreter; fails the test with its stderr if it fails."""
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc


def start_py(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *map(str, args)],
                            stdout=subprocess.PIPE, text=True)


def wait_for(condition, what: str, timeout: float = 60):
    """Poll `condition` until it is truthy (generous timeout: the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.02)
    return value


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def folders(tmp_path):
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "existing").write_text("old")
    (inside / "mine").write_text("old")
    return inside, outside


def test_landlock_abi_is_the_kernels_answer_or_zero(monkeypatch):
    abi = landlock.landlock_abi.__wrapped__  # the uncached function
    monkeypatch.setattr(landlock, "_syscall", lambda *args: 4)
    assert abi() == 4
    monkeypatch.setattr(landlock, "_syscall", lambda *args: -1)  # no Landlock (ENOSYS, EOPNOTSUPP)
    assert abi() == 0
    monkeypatch.setattr(landlock, "_syscall", lambda *args: 4)
    monkeypatch.setattr(landlock.sys, "platform", "darwin")
    assert abi() == 0


# ---------------------------------------------------------------------------------------------
# confine()

@needs_landlock
def test_writes_inside_work_writes_outside_fail(folders):
    inside, outside = folders
    out = run_py("""
        inside, outside = sys.argv[1:3]
        assert landlock.confine([inside, "/nonexistent/folder/is/skipped"])
        r = {}
        r["inside create"] = attempt(lambda: write(f"{inside}/new"))
        r["inside overwrite"] = attempt(lambda: write(f"{inside}/mine"))
        r["inside mkdir"] = attempt(lambda: os.makedirs(f"{inside}/a/b"))
        r["inside rename"] = attempt(lambda: os.rename(f"{inside}/new", f"{inside}/a/new"))
        r["inside delete"] = attempt(lambda: os.unlink(f"{inside}/a/new"))
        r["/dev/null"] = attempt(lambda: write("/dev/null"))
        r["/dev/shm"] = attempt(lambda: (write(f"/dev/shm/distlab-test-{os.getpid()}"),
                                         os.unlink(f"/dev/shm/distlab-test-{os.getpid()}")))
        r["outside create"] = attempt(lambda: write(f"{outside}/new"))
        r["outside overwrite"] = attempt(lambda: write(f"{outside}/existing"))
        r["outside append"] = attempt(lambda: write(f"{outside}/existing", "a"))
        r["outside truncate"] = attempt(lambda: os.truncate(f"{outside}/existing", 0))
        r["outside delete"] = attempt(lambda: os.unlink(f"{outside}/existing"))
        r["outside mkdir"] = attempt(lambda: os.mkdir(f"{outside}/d"))
        r["rename into outside"] = attempt(lambda: os.rename(f"{inside}/mine", f"{outside}/mine"))
        r["rename from outside"] = attempt(lambda: os.rename(f"{outside}/existing", f"{inside}/x"))
        r["hard link of outside"] = attempt(lambda: os.link(f"{outside}/existing", f"{inside}/h"))
        r["write through symlink"] = attempt(lambda: (os.symlink(f"{outside}/existing",
                                                                 f"{inside}/link"),
                                                      write(f"{inside}/link")))
        r["device node inside"] = attempt(lambda: os.mknod(f"{inside}/blk", 0o600 | 0o060000))
        r["/tmp"] = attempt(lambda: write(f"/tmp/distlab-test-{os.getpid()}"))
        child = subprocess.run(["sh", "-c", f"echo x > {outside}/from_child"],
                               capture_output=True)
        r["child process outside"] = "ok" if child.returncode == 0 else "failed"
        print(json.dumps(r))
        """, inside, outside)
    results = json.loads(out.stdout)
    allowed = [k for k in results if k.startswith("inside") or k.startswith("/dev/")]
    assert {k: results[k] for k in allowed} == {k: "ok" for k in allowed}
    denied = {k: v for k, v in results.items() if k not in allowed}
    # Landlock says EXDEV to a link across its rules, so that tools fall back to copying; mknod
    # is refused by Landlock (EACCES) or, where checked first, by the capability drop (EPERM).
    special = {"child process outside": {"failed"}, "hard link of outside": {"EXDEV"},
               "device node inside": {"EACCES", "EPERM"}}
    assert {k: v for k, v in denied.items() if v not in special.get(k, {"EACCES"})} == {}
    assert (outside / "existing").read_text() == "old"
    assert sorted(p.name for p in outside.iterdir()) == ["existing"]


@needs_landlock
def test_confine_refuses_a_process_with_threads():
    out = run_py("""
        import threading
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        try:
            landlock.confine(["."])
        except RuntimeError as exc:
            print(exc)
        """)
    assert "must run before this process starts any thread" in out.stdout


@needs_scopes
def test_confined_process_cannot_signal_outside():
    outsider = subprocess.Popen(["sleep", "60"])
    try:
        # Capabilities kept: what stops the kill must be Landlock's scope.
        out = run_py("""
            outsider = int(sys.argv[1])
            assert landlock.confine([], drop_capabilities=False)
            child = subprocess.Popen(["sleep", "60"])          # inside the sandbox
            r = {"kill outside": attempt(lambda: os.kill(outsider, signal.SIGKILL)),
                 "kill own child": attempt(lambda: os.kill(child.pid, signal.SIGKILL))}
            child.wait()
            print(json.dumps(r))
            """, outsider.pid)
        assert json.loads(out.stdout) == {"kill outside": "EPERM", "kill own child": "ok"}
        assert outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()


@needs_landlock
def test_confined_process_cannot_read_outside_memory():
    outsider = subprocess.Popen(["sleep", "60"])
    probe = """
        outsider = int(sys.argv[1])
        assert landlock.confine([], drop_capabilities=sys.argv[2] == "drop")
        def read(name):
            with open(f"/proc/{outsider}/{name}", "rb") as f:
                f.read(1)
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        attached = libc.ptrace(16, outsider, None, None) == 0       # PTRACE_ATTACH
        print(json.dumps({"mem": attempt(lambda: read("mem")),
                          "environ": attempt(lambda: read("environ")),
                          "ptrace": "ok" if attached else errno.errorcode[ctypes.get_errno()]}))
        """
    try:
        # Landlock itself refuses ptrace and /proc/PID/mem of processes outside; reading
        # environ or maps needs only ptrace's "read" mode, which the capability drop refuses.
        kept = json.loads(run_py(probe, outsider.pid, "keep").stdout)
        assert (kept["mem"], kept["ptrace"]) == ("EACCES", "EPERM")
        dropped = json.loads(run_py(probe, outsider.pid, "drop").stdout)
        assert dropped == {"mem": "EACCES", "environ": "EACCES", "ptrace": "EPERM"}
    finally:
        outsider.kill()
        outsider.wait()


# ---------------------------------------------------------------------------------------------
# The wrapper command

@needs_landlock
def test_wrapper_confines_the_command(folders, tmp_path):
    inside, outside = folders
    script = f"echo a > f; echo $HOME $TMPDIR > env; echo b > {outside}/g"
    proc = subprocess.run([sys.executable, "-m", "distlab.runtime.landlock", "--write", ".", "--home",
                           str(tmp_path / "home"), "--", "sh", "-c", script],
                          cwd=inside, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
    assert (inside / "f").read_text() == "a\n"
    assert not (outside / "g").exists()
    home = tmp_path / "home"
    assert (inside / "env").read_text().split() == [str(home), str(home / "tmp")]


def _python_reads() -> list[str]:
    """The --read options a confined interpreter needs: the grader's system folders and Python."""
    from distlab.grading.settings import SYSTEM_READS, python_installation
    return [arg for folder in (*SYSTEM_READS, *python_installation()) for arg in ("--read", folder)]


READ_PROBE = ("import os, sys\nfor p in sys.argv[1:]:\n    try:\n"
              "        print(open(p).read() if os.path.isfile(p) else len(os.listdir(p)), end=' ')\n"
              "    except OSError: print('refused', end=' ')\n")


@needs_landlock
def test_reads_are_an_allow_list_with_hidden_folders_carved_out(tmp_path):
    # The allowed folder holds a hidden one, which holds the command's own (writable) folder; a
    # second copy of the course elsewhere on the machine is simply not on the list.
    open_, elsewhere = tmp_path / "open", tmp_path / "course-copy"
    secret, mine = open_ / "secret", open_ / "secret" / "mine"
    for folder, text in ((open_, "o"), (secret, "s"), (mine, "m"), (elsewhere, "e")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "f").write_text(text)
    (open_ / "link").symlink_to(secret)
    proc = subprocess.run([sys.executable, "-m", "distlab.runtime.landlock", "--write", str(mine),
                           *_python_reads(), "--read", str(open_), "--hide", str(secret), "--",
                           sys.executable, "-c", READ_PROBE, str(open_ / "f"), str(mine / "f"),
                           str(secret / "f"), str(open_ / "link" / "f"), str(elsewhere / "f"),
                           str(open_), str(elsewhere), str(Path.home())],
                          capture_output=True, text=True, timeout=60)
    entries = str(len(os.listdir(open_)))
    assert proc.stdout.split() == ["o", "m", "refused", "refused", "refused", entries, "refused",
                                   "refused"], proc.stderr


def test_wrapper_limits_the_size_of_a_file_with_or_without_landlock(tmp_path):
    code = ("try:\n    open('big', 'wb').write(bytes(2 << 20))\nexcept OSError as exc:\n"
            "    print(exc.strerror)\nimport os\nprint(os.path.getsize('big'))")
    proc = subprocess.run([sys.executable, "-m", "distlab.runtime.landlock", "--write", ".",
                           "--max-file-size", "1M", "--", sys.executable, "-c", code],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[:2] == ["File too large", str(1 << 20)], proc.stderr


def test_wrapper_wants_the_allowed_folders_a_hidden_one_is_carved_from():
    proc = subprocess.run([sys.executable, str(SANDBOX_FILE), "--write", ".", "--hide", "/tmp",
                           "--", "true"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "name those too" in proc.stderr


def test_wrapper_without_landlock_warns_once_and_runs_the_command(monkeypatch, capsys):
    monkeypatch.setattr(landlock, "landlock_abi", lambda: 0)
    ran = []
    monkeypatch.setattr(landlock.os, "execvp", lambda file, argv: ran.append(argv))
    landlock.main(["--write", ".", "--", "true", "x"])
    assert ran == [["true", "x"]]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning" in err and "unconfined" in err


def test_wrapper_needs_a_command():
    proc = subprocess.run([sys.executable, str(SANDBOX_FILE), "--write", "."],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "put -- before the command" in proc.stderr


# ---------------------------------------------------------------------------------------------
# Processes

DAEMON_ROOT = """
    assert sandbox.become_subreaper()
    pidfile = sys.argv[1]
    if os.fork() == 0:                 # a child that double-forks a daemon in its own session
        os.setsid()
        if os.fork() == 0:
            if os.fork() == 0:         # the daemon's own child
                time.sleep(600)
                os._exit(0)
            with open(pidfile + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            time.sleep(600)
            os._exit(0)
        os._exit(0)                    # the daemon is orphaned: it reparents to us
    os.wait()
    time.sleep(600)
    """


def test_kill_tree_kills_a_daemon_reparented_to_a_subreaper(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    root = start_py(DAEMON_ROOT, pidfile)
    try:
        daemon = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), "the daemon"))
        wait_for(lambda: psutil.Process(daemon).ppid() == root.pid, "the daemon to reparent")
        assert daemon in sandbox.descendants(root.pid)
        assert len(sandbox.descendants(root.pid)) == 2
        assert sandbox.kill_tree(root.pid) == 3           # root, daemon, the daemon's child
        assert root.wait(timeout=30) == -signal.SIGKILL
        assert dead(daemon)
    finally:
        root.kill()
        root.wait()


def test_kill_tree_stops_a_process_that_keeps_forking():
    root = start_py("""
        for _ in range(500):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
            time.sleep(0.01)
        time.sleep(600)
        """)
    try:
        wait_for(lambda: len(sandbox.descendants(root.pid)) >= 10, "ten children")
        killed = sandbox.kill_tree(root.pid)
        assert killed >= 11
        assert root.wait(timeout=30) == -signal.SIGKILL
        assert sandbox.descendants(root.pid) == []
    finally:
        root.kill()
        root.wait()


def test_kill_tree_can_spare_the_root():
    root = start_py("""
        children = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
        print("ready", flush=True)
        print(sorted(c.wait() for c in children), flush=True)
        time.sleep(600)
        """)
    try:
        assert root.stdout.readline() == "ready\n"
        assert sandbox.kill_tree(root.pid, include_root=False) == 3
        assert root.stdout.readline() == "[-9, -9, -9]\n"    # the root runs on and reaps them
        assert psutil.Process(root.pid).status() != psutil.STATUS_STOPPED
    finally:
        root.kill()
        root.wait()


# ---------------------------------------------------------------------------------------------
# MemoryWatch

MB = 1 << 20
ALLOCATE = """
    chunks = []
    for _ in range(100):                      # up to 2 GB, 20 MB at a time, every page touched
        chunks.append(b"x" * (20 << 20))
        time.sleep(0.02)
    time.sleep(600)
    """


def test_memory_watch_kills_the_allocator_and_spares_its_small_sibling():
    root = start_py("""
        small = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        big = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
        print(small.pid, big.pid, flush=True)
        print(big.wait(), flush=True)
        time.sleep(600)
        """, "import time\n" + textwrap.dedent(ALLOCATE))
    seen = []
    try:
        small, big = map(int, root.stdout.readline().split())
        with sandbox.MemoryWatch(root.pid, 300 * MB, interval=0.05, on_kill=seen.append) as watch:
            wait_for(lambda: watch.events, "the watch to kill the allocator")
        assert root.stdout.readline() == f"{-signal.SIGKILL}\n"
        event, = watch.events
        assert seen == [event]
        assert event.pid == big and "b\"x\" * (20 << 20)" in event.command
        assert event.total > 300 * MB and event.bytes > 200 * MB and event.killed == 1
        assert not dead(small) and not dead(root.pid)
        assert watch.error is None
    finally:
        sandbox.kill_tree(root.pid)
        root.wait()


def test_memory_watch_counts_copy_on_write_pages_once():
    root = start_py("""
        data = b"x" * (200 << 20)              # 200 MB, then shared by 4 forked children
        for _ in range(4):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
        print("ready", flush=True)
        time.sleep(600)
        """)
    try:
        assert root.stdout.readline() == "ready\n"
        children = sandbox.descendants(root.pid)
        rss = sum(sandbox._rss(p) for p in children)
        pss = sum(sandbox._pss(p) for p in children)
        assert pss < 600 * MB < rss           # RSS counts the shared 200 MB once per child
        watch = sandbox.MemoryWatch(root.pid, 600 * MB)
        assert watch.poll() is None and watch.events == []
        assert sandbox.descendants(root.pid) == children
    finally:
        sandbox.kill_tree(root.pid)
        root.wait()


# ---------------------------------------------------------------------------------------------
# What the labs need still works when confined

CONFINED_LAB = """
import json, os, sys
import torch
import torch.distributed as dist
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import distlab

def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

def plot():
    plt.plot([1, 2])
    plt.savefig("figure.png")

def gloo(store):
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()

def ranks(rank, world_size):
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    return t.tolist()

r = {"plot": attempt(plot),
     "gloo FileStore": attempt(lambda: gloo(dist.FileStore(os.path.abspath("store"), 1))),
     "gloo TCPStore": attempt(lambda: gloo(dist.TCPStore("127.0.0.1", 0, 1, True))),
     "distlab.run": attempt(lambda: print(distlab.run(ranks, 2, backend="gloo", timeout=120))),
     "write outside": attempt(lambda: open(sys.argv[1], "w"))}
print(json.dumps(r))
"""


@pytest.mark.slow
@needs_landlock
def test_torch_matplotlib_gloo_and_distlab_run_work_confined(folders, tmp_path):
    inside, outside = folders
    (inside / "lab.py").write_text(CONFINED_LAB)
    env = {k: v for k, v in os.environ.items() if k not in ("DISTLAB_RANK", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "distlab.runtime.landlock", "--write", ".", "--home",
                           str(tmp_path / "home"), "--", sys.executable, "lab.py",
                           str(outside / "x")],
                          cwd=inside, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    assert results == {"plot": "ok", "gloo FileStore": "ok", "gloo TCPStore": "ok",
                       "distlab.run": "ok",
                       "write outside": f"PermissionError: [Errno 13] Permission denied: "
                                        f"'{outside / 'x'}'"}, proc.stderr
    assert "[[1.0, 1.0], [1.0, 1.0]]" in proc.stdout
    assert (inside / "figure.png").stat().st_size > 0


@needs_landlock
def test_a_readable_folder_inside_a_hidden_one_inside_a_readable_one_can_be_read(tmp_path):
    # An installed course: site-packages (allowed) holds the instructor's package (hidden),
    # which holds the course's data (allowed). Python lists site-packages to import from it.
    site, package = tmp_path / "site-packages", tmp_path / "site-packages" / "distlab"
    data = package / "data"
    data.mkdir(parents=True)
    (site / "numpy.py").write_text("n")
    (package / "answer.py").write_text("s")
    (data / "ref.txt").write_text("d")
    proc = subprocess.run([sys.executable, "-m", "distlab.runtime.landlock", "--write",
                           str(tmp_path / "w"), *_python_reads(), "--read", str(site), "--hide",
                           str(package), "--read", str(data), "--", sys.executable, "-c",
                           READ_PROBE, str(site / "numpy.py"), str(data / "ref.txt"),
                           str(package / "answer.py"), str(site), str(package)],
                          capture_output=True, text=True, timeout=60)
    # A name is no secret (the folders on the way to a hidden one are listable); a file's text is.
    assert proc.stdout.split() == ["n", "d", "refused", "2", "2"], proc.stderr
