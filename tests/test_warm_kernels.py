"""distlab.grading.warm_kernels: graded kernels forked from a server that imported torch once.

The server is itself forked from the worker (distlab.runtime.forked). A forked kernel must be
what the kernel spec's command would have started: confined by the same
Landlock options, in the lab's folder with the environment jupyter_client built, in a session of
its own, with random numbers of its own, and a child of the worker (a subreaper) that reads its
exit code and interrupts it, and holding one descriptor of the worker's: its judge channel
(closed on exec; a kernel started cold inherits it with ``pass_fds``). Every kernel of the suite's shared grading run (tests/conftest.py)
is forked this way, so the attacks of tests/test_grader_attacks.py are graded through it too.

Each test drives a small worker in a fresh interpreter: becoming a subreaper cannot be undone.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from distlab.runtime import landlock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# A worker in miniature: a subreaper with a WarmKernels and a kernel spec shaped like the
# grading worker's (distlab.grading.worker._write_kernelspec).
WORKER = """\
import asyncio, json, os, socket, sys
from pathlib import Path
from distlab.grading import sandbox
from distlab.grading.warm_kernels import WarmKernelManager, WarmKernels

root = Path(sys.argv[1])
lab, scratch, secret, outside = (root / n for n in ("lab", "scratch", "secret", "outside"))
for folder in (lab, scratch, secret, outside, root / "jupyter" / "kernels" / "python3"):
    folder.mkdir(parents=True, exist_ok=True)
(secret / "answers").write_text("hidden")
env = {"HOME": str(scratch), "TMPDIR": str(scratch), "MPLCONFIGDIR": str(scratch / "mpl"),
       "IPYTHONDIR": str(scratch / "ipython"), "PROBE": "from the spec", "JUPYTER_PATH": ""}
from distlab import paths
from distlab.grading.settings import SYSTEM_READS, python_installation
reads = [a for f in (*SYSTEM_READS, *python_installation(), paths.PACKAGE)
         for a in ("--read", str(f))]
argv = [sys.executable, "-m", "distlab.runtime.landlock", "--write", str(lab), "--write",
        str(scratch), *reads, "--", sys.executable, "-m", "ipykernel_launcher",
        "-f", "{connection_file}"]   # `secret` is on no list: unreadable
(root / "jupyter" / "kernels" / "python3" / "kernel.json").write_text(json.dumps(
    {"argv": argv, "env": env, "language": "python", "interrupt_mode": "signal"}))
# jupyter_client writes connection files to TMPDIR: the kernel reads them (worker._private_folders)
os.environ.update(JUPYTER_PATH=str(root / "jupyter"), JUPYTER_RUNTIME_DIR=str(scratch),
                  TMPDIR=str(scratch))
assert sandbox.become_subreaper()
from traitlets.config import Config
config = Config()
config.WarmKernelManager.kernels = WarmKernels({**os.environ, **env}, cwd=str(root / "jupyter"))
# What the worker asks its server to import for the judge's zygotes (rank_torch_modules): PyTorch's
# modules only; a course module in the list (the checks hold answers) is not imported.
config.WarmKernelManager.kernels.preload(["torch.utils.bundled_inputs", "distlab.checks.lab01"])

class Judge:   # what a kernel manager asks of the judge: a channel for each kernel it starts
    def __init__(self):
        self.ends = []
    def __deepcopy__(self, memo):
        return self
    def channel(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ends.append(mine)
        return theirs
    def heard(self):   # what the last kernel sent on a connection it passed over its channel
        try:
            self.ends[-1].settimeout(30)
            _, fds, _, _ = socket.recv_fds(self.ends[-1], 16, 1)
            with socket.socket(fileno=fds[0]) as conn:
                conn.settimeout(30)
                return conn.recv(64).decode()
        except (OSError, IndexError) as exc:
            return repr(exc)
judge = config.WarmKernelManager.judge = Judge()

PROBE = '''
import errno, json, os, sys
warm = "torch" in sys.modules and "matplotlib.pyplot" in sys.modules
imported = {name: name in sys.modules for name in ("torch.utils.bundled_inputs",
            "distlab.checks.lab01", "torch.distributed.tensor", "torch.distributed.fsdp")}
import gc, torch, ipykernel.debugger
mine = [[]]   # the kernel's own: made after the fork
tracked = {id(o) for o in gc.get_objects()}   # every generation but the frozen one
frozen = {"torch": gc.is_tracked(vars(torch)) and id(vars(torch)) not in tracked,
          "debugger": id(vars(ipykernel.debugger)) not in tracked, "mine": id(mine) not in tracked}
import numpy
channel = int(os.environ["DISTLAB_JUDGE"])
inheritable = os.get_inheritable(channel)
from distlab.checks import messenger
with messenger.connect(messenger._channel(str(channel))) as conn:
    conn.sendall(b"hello from the kernel")
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
print(json.dumps({"warm": warm, "imported": imported, "frozen": frozen, "cwd": os.getcwd(), "path0": sys.path[0],
    "warm up": os.environ.get("DISTLAB_WARM_UP"), "ppid": os.getppid(), "session leader": os.getsid(0) == os.getpid(), "env": os.environ["PROBE"],
    "random": numpy.random.rand(), "write outside": attempt(lambda: open(%r, "w")),
    "read hidden": attempt(lambda: open(%r).read()), "write lab": attempt(lambda: open("f", "w")),
    "channel inheritable": inheritable, "channel closed on exec": os.system(f"true <&{channel}") != 0}))
''' % (str(outside / "x"), str(secret / "answers"))

async def run(code, interrupt=False):
    km = WarmKernelManager(kernel_name="python3", config=config)
    await km.start_kernel(cwd=str(lab))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    out = []
    def hook(msg):   # interrupted once the cell has started (a busy machine may be slow to get there)
        out.append(msg["content"])
        if interrupt and "sleeping" in msg["content"].get("text", ""):
            asyncio.ensure_future(km.interrupt_kernel())
    process = km.provisioner.process
    if code.startswith("import os; os._exit"):   # no reply comes: wait for the exit itself
        kc.execute(code)
        for _ in range(1200):
            if process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        status = None
    else:
        reply = await kc.execute_interactive(code, timeout=120, output_hook=hook)
        status = reply["content"]["status"], reply["content"].get("ename")
    result = {"status": status, "text": "".join(c.get("text", "") for c in out),
              "forked": type(process).__name__ == "ForkedProcess", "exit": process.poll()}
    kc.stop_channels()
    await km.shutdown_kernel(now=True)
    return result

async def main():
    server = config.WarmKernelManager.kernels.process
    results = {"server forked": type(server).__name__ == "ForkedProcess" and server.pid != os.getpid(),
               "first": await run(PROBE), "heard": judge.heard(), "second": await run(PROBE),
               "exit": await run("import os; os._exit(3)"),
               "interrupt": await run("import time; print('sleeping', flush=True); time.sleep(60)",
                                        interrupt=True)}
    config.WarmKernelManager.kernels.process.kill()
    config.WarmKernelManager.kernels.process.wait()
    results["after the server died"] = await run(PROBE)
    results["heard cold"] = judge.heard()
    results["worker"] = os.getpid()
    print(json.dumps(results))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    proc = subprocess.run([sys.executable, "-c", WORKER, str(root)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    for name in ("first", "second", "after the server died"):
        text = results[name]["text"]
        results[name]["probe"] = json.loads(text) if text.startswith("{") else text
    return results, root, proc.stderr


def test_a_forked_kernel_starts_with_torch_imported_in_its_labs_folder(kernels):
    results, root, _ = kernels
    probe = results["first"]["probe"]
    assert results["first"]["forked"] and probe["warm"], results["first"]
    assert results["server forked"]   # from the worker, not a fresh interpreter
    assert probe["cwd"] == probe["path0"] == str(root / "lab")
    assert probe["ppid"] == results["worker"]   # reparented to the worker, which reaps it
    assert probe["session leader"] and probe["env"] == "from the spec"
    assert probe["write lab"] == "ok"
    # The server imports the lab's package before it confines the kernel: distlab/__init__.py
    # would start a rank launcher there, outside the kernel's Landlock domain, with the ranks
    # it forks (the grader's environment says so too; a kernel's fork does not count on it).
    assert probe["warm up"] == "0", probe


def test_the_server_imports_the_torch_modules_it_is_told_and_no_course_code(kernels):
    """The server imports PyTorch's parallel APIs only where the worker's labs' ranks use them
    (``WarmKernels.preload``): most labs use none, and they cost a second of CPU per student.
    A course module in the list is not imported: kernels are forked from the server."""
    imported = kernels[0]["first"]["probe"]["imported"]
    assert imported == {"torch.utils.bundled_inputs": True, "distlab.checks.lab01": False,
                        "torch.distributed.tensor": False, "torch.distributed.fsdp": False}


def test_a_forked_kernel_holds_its_servers_objects_out_of_the_collectors_reach(kernels):
    """What the server imported (torch's modules, ipykernel's debugger, which each kernel
    imported at its start) is frozen before the fork: the kernel's collections do not scan it.
    The student's own objects are collected as before (the freeze is the server's, not theirs)."""
    probe = kernels[0]["first"]["probe"]
    assert probe["frozen"] == {"torch": True, "debugger": True, "mine": False}, probe


@pytest.mark.skipif(landlock.landlock_abi() == 0, reason="this kernel has no Landlock")
def test_a_forked_kernel_is_confined_as_its_spec_says(kernels):
    probe = kernels[0]["first"]["probe"]
    assert probe["write outside"] == "EACCES" and probe["read hidden"] == "EACCES", probe


def test_two_forked_kernels_draw_different_random_numbers(kernels):
    results = kernels[0]
    assert results["second"]["forked"] and results["second"]["probe"]["warm"]
    assert results["first"]["probe"]["random"] != results["second"]["probe"]["random"]


def test_a_forked_kernels_exit_code_and_interrupt_reach_the_worker(kernels):
    results = kernels[0]
    assert results["exit"]["forked"] and results["exit"]["exit"] == 3, results["exit"]
    assert results["interrupt"]["status"] == ["error", "KeyboardInterrupt"], results["interrupt"]


def test_without_its_server_a_kernel_starts_cold_and_says_so(kernels):
    results, _, stderr = kernels
    after = results["after the server died"]
    assert not after["forked"] and not after["probe"]["warm"], after
    assert after["probe"]["random"] not in (results["first"]["probe"]["random"],
                                            results["second"]["probe"]["random"])
    assert stderr.count("the warm kernel server failed") == 1, stderr
    assert "start cold" in stderr


def test_each_kernel_reaches_the_judge_on_a_channel_of_its_own(kernels):
    # The channel is a descriptor, passed to the warm server with the request (SCM_RIGHTS) or
    # inherited by a cold kernel (pass_fds); what the kernel starts does not inherit it.
    results = kernels[0]
    assert results["heard"] == results["heard cold"] == "hello from the kernel", results
    warm, cold = results["first"]["probe"], results["after the server died"]["probe"]
    assert warm["channel inheritable"] is False, warm
    assert cold["channel inheritable"] is True, cold   # until the messenger first uses it
    assert warm["channel closed on exec"] and cold["channel closed on exec"], (warm, cold)
