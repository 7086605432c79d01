"""distlab.runtime.forked: helpers forked from a process that has imported torch.

A forked helper must be what a fresh interpreter would have been, but for the imports: none of
the parent's file descriptors but those it keeps, the environment, working folder and temporary
folder it is given, its own session, an exit code its parent reads. Where the parent runs threads
a fork is not safe, and the helper starts as a fresh interpreter instead. The grading worker forks
its judge's zygote and its kernels' server this way (the shared grading run grades through them).

Each test runs in a fresh interpreter: pytest-xdist's worker runs threads, so it cannot fork.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


CHILD = """\
import json, os, sys, tempfile, threading, time
from distlab.runtime.forked import ForkedProcess, can_fork, fork_helper

root = sys.argv[1]
os.makedirs(os.path.join(root, "child"), exist_ok=True)
os.environ["TMPDIR"] = root
tempfile.gettempdir()                      # the parent's, cached
secret_r, secret_w = os.pipe()             # a pipe the child must not hold
report_r, report_w = os.pipe()
log = tempfile.TemporaryFile()

def child_main():
    def held(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False
    print("said on the output", flush=True)
    os.write(report_w, json.dumps({
        "cwd": os.getcwd(), "env": dict(os.environ), "tmp": tempfile.gettempdir(),
        "holds the secret pipe": held(secret_r) or held(secret_w), "stdin": os.read(0, 10).decode(),
        "session leader": os.getsid(0) == os.getpid(), "parent": os.getppid()}).encode())
    return 7

child = fork_helper(child_main, keep=(report_w,), env={"TMPDIR": os.path.join(root, "child"),
                    "PROBE": "given"}, cwd=os.path.join(root, "child"), output=log.fileno(),
                    new_session=True)
os.close(report_w)
seen = json.loads(os.read(report_r, 1 << 16))
code = child.wait()

def crash():
    raise ValueError("in the helper")
crashed = fork_helper(crash, output=log.fileno())
crashed_code = crashed.wait()
sleeper = fork_helper(lambda: time.sleep(60))
try:
    sleeper.wait(timeout=0.2)
    timed_out = False
except Exception as exc:
    timed_out = type(exc).__name__
sleeper.kill()
killed = sleeper.wait()
threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
log.seek(0)   # the children wrote through the same open file, moving its offset
print(json.dumps({"seen": seen, "code": code, "me": os.getpid(), "output": log.read().decode(),
                  "crashed": crashed_code, "timed out": timed_out, "killed": killed,
                  "with a thread": fork_helper(lambda: 0) is None and not can_fork()}))
"""


def test_a_forked_helper_holds_only_what_it_is_given(tmp_path):
    r = _run(CHILD, str(tmp_path))
    seen = r["seen"]
    assert r["code"] == 7 and seen["parent"] == r["me"]
    assert seen["cwd"] == str(tmp_path / "child") and seen["env"] == {
        "TMPDIR": str(tmp_path / "child"), "PROBE": "given"}
    # Not the parent's cached temporary folder: a confined child may write only its own.
    assert seen["tmp"] == str(tmp_path / "child")
    assert not seen["holds the secret pipe"] and seen["stdin"] == ""
    assert seen["session leader"]
    assert "said on the output" in r["output"]


def test_a_forked_helpers_crash_exit_and_kill_reach_its_parent(tmp_path):
    r = _run(CHILD, str(tmp_path))
    assert r["crashed"] == 1 and "ValueError: in the helper" in r["output"]
    assert r["timed out"] == "TimeoutExpired" and r["killed"] == -9


def test_a_process_with_threads_forks_no_helper(tmp_path):
    assert _run(CHILD, str(tmp_path))["with a thread"]


# A launcher like the grading worker's judge's: its zygote forked from a process that has imported
# torch, unless a thread runs.
LAUNCHER = """\
import json, os, sys, threading, time
import torch
from distlab.runtime.launch import Launcher, LaunchSettings

def zygote_is_a_fork(launcher):   # a fork runs this very command; a fresh one its own
    with open(f"/proc/{launcher.zygote_pid()}/cmdline", "rb") as f, \
            open("/proc/self/cmdline", "rb") as me:
        return f.read() == me.read()

def total(rank, world_size):
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()

results = {}
for name in ("single thread", "with a thread"):
    if name == "with a thread":
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    launcher = Launcher(LaunchSettings(fork_zygote=True))
    launcher.warm_up()
    out = launcher.run(total, 2, timeout=120)
    results[name] = {"forked": zygote_is_a_fork(launcher), "out": list(out)}
    launcher.close()
print(json.dumps(results))
"""


def test_a_launcher_forks_its_zygote_only_where_that_is_safe():
    r = _run(LAUNCHER)
    assert r["single thread"] == {"forked": True, "out": [3.0, 3.0]}, r
    assert r["with a thread"] == {"forked": False, "out": [3.0, 3.0]}, r
