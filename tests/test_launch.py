"""distlab.run: results, errors, hangs, output, records, on real gloo ranks."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.runtime.launch import DistributedError, HangError, RankCrashed, RankError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sum_ranks(rank, world_size, scale):
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    return t * scale


def test_results_come_back_in_rank_order():
    out = distlab.run(lambda rank, world_size: (rank, world_size), 4)
    assert list(out) == [(r, 4) for r in range(4)]
    assert out.backend == "gloo"


def test_args_kwargs_and_tensors_travel():
    out = distlab.run(_sum_ranks, 2, scale=2.0)
    expected = torch.full((3,), float(sum(range(2)) * 2))
    for value in out:
        torch.testing.assert_close(value, expected)


def test_closure_over_a_local_tensor():
    data = torch.arange(6.0)

    def shard(rank, world_size):
        return data.chunk(world_size)[rank].sum().item()

    assert distlab.run(shard, 3) == [1.0, 5.0, 9.0]


def test_exception_names_rank_type_and_traceback():
    def fn(rank, world_size):
        if rank == 1:
            raise ValueError("bad shard")
        dist.barrier()

    start = time.perf_counter()
    with pytest.raises(RankError) as info:
        distlab.run(fn, 3, timeout=60)
    assert time.perf_counter() - start < 20  # named at once, not after the timeout
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1 raised ValueError: bad shard" in str(err)
    assert 'raise ValueError("bad shard")' in err.rank_traceback
    # Rank 0 is somewhere between joining the group and waiting in the barrier.
    assert re.search(r"rank 0: (in barrier #1|running your function|still joining)", str(err))


def _recv_from_each_other(rank, world_size):
    dist.recv(torch.zeros(3), 1 - rank)


def test_deadlock_is_named_at_once():
    start = time.perf_counter()
    with pytest.raises(HangError) as info:
        distlab.run(_recv_from_each_other, 2, timeout=60)
    assert time.perf_counter() - start < 15
    text = str(info.value)
    assert "deadlocked" in text
    assert "rank 0: in recv #1 from rank 1 on [3] float32, entered and never returned" in text
    assert "rank 1: in recv #1 from rank 0 on [3] float32, entered and never returned" in text


def test_barrier_against_a_recv_is_a_deadlock():
    def fn(rank, world_size):
        if rank == 0:
            dist.barrier()
            dist.send(torch.zeros(1), 1)
        else:
            dist.recv(torch.zeros(1), 0)
            dist.barrier()

    with pytest.raises(HangError, match="deadlocked: rank 0 waits in barrier #1 for rank"):
        distlab.run(fn, 2, timeout=60)


def test_a_hang_with_no_visible_cycle_waits_for_the_timeout():
    def fn(rank, world_size):
        if rank == 0:
            time.sleep(30)  # busy in its own code: it might still send
        dist.recv(torch.zeros(1), 1 - rank)

    start = time.perf_counter()
    with pytest.raises(HangError) as info:
        distlab.run(fn, 2, timeout=3)
    assert 2.5 < time.perf_counter() - start < 15
    assert "did not finish within 3 s" in str(info.value)
    assert "rank 1: in recv #1 from rank 0" in str(info.value)


def test_ring_exchange_is_not_a_deadlock():
    def fn(rank, world_size):
        send = dist.isend(torch.full((2,), float(rank)), (rank + 1) % world_size)
        got = torch.zeros(2)
        dist.recv(got, (rank - 1) % world_size)
        send.wait()
        dist.all_reduce(got)
        return got[0].item()

    assert distlab.run(fn, 4) == [6.0] * 4


def _different_collectives(rank, world_size):
    t = torch.zeros(4)
    dist.all_reduce(t)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.all_gather([torch.zeros(4) for _ in range(world_size)], t)


def _two_groups_of_the_same_ranks(rank, world_size):
    import threading
    side = dist.new_group(backend="gloo")   # as an async checkpoint's own group (Lab 12)
    a, b = torch.ones(2), torch.ones(3)
    if rank == 0:   # the side group's call from a thread, first; the main group's after it
        thread = threading.Thread(target=dist.all_reduce, args=(b,), kwargs={"group": side})
        thread.start()
        time.sleep(0.2)
        dist.all_reduce(a)
        thread.join()
    else:
        dist.all_reduce(a)
        dist.all_reduce(b, group=side)
    return a.sum().item() + b.sum().item()


def test_two_groups_of_the_same_ranks_are_numbered_apart():
    # The same ranks, two groups, calls in another order on each rank: no disagreement (the
    # record once numbered them as one sequence and stopped the run).
    out = distlab.run(_two_groups_of_the_same_ranks, 2)
    assert list(out) == [10.0, 10.0]
    calls = [c for c in out.comms[0] if c.op == "all_reduce"]
    assert len({c.group_name for c in calls}) == 2 and {c.seq for c in calls} == {1}


def test_different_collectives_are_named_without_waiting_for_the_timeout():
    start = time.perf_counter()
    with pytest.raises(HangError) as info:
        distlab.run(_different_collectives, 2, timeout=60)
    assert time.perf_counter() - start < 15
    assert "rank 0 is in all_reduce #3 on [4] float32, rank 1 in all_gather #3 on [4]" in str(info.value)


def test_different_shapes_at_the_same_step_are_named():
    def fn(rank, world_size):
        dist.all_reduce(torch.zeros(4 if rank == 0 else 8))

    with pytest.raises(HangError) as info:
        distlab.run(fn, 2, timeout=60)
    assert "rank 0 is in all_reduce #1 on [4] float32, rank 1 in all_reduce #1 on [8] float32" \
        in str(info.value)


def test_receive_buffer_of_the_wrong_size_is_named():
    def fn(rank, world_size):
        if rank == 0:
            dist.send(torch.zeros(4), 1)
        else:
            dist.recv(torch.zeros(5), 0)

    with pytest.raises(HangError, match=r"rank 0 sends \[4\] float32 .* rank 1 receives into \[5\]"):
        distlab.run(fn, 2, timeout=60)


def test_a_message_of_the_same_elements_in_another_shape_is_delivered():
    """The transport matches elements and dtype, not shapes: torch 2.11's pipelining sends a 0-d
    tensor that its peer receives into shape [1] (seen on an H100, bench/reports/gpu-2026-11-27-*)."""
    def fn(rank, world_size):
        if rank == 0:
            dist.send(torch.tensor(3.5), 1)
            return None
        got = torch.zeros(1)
        dist.recv(got, 0)
        return got.item()

    assert distlab.run(fn, 2, timeout=60) == [None, 3.5]


def test_a_message_of_another_dtype_is_named():
    def fn(rank, world_size):
        if rank == 0:
            dist.send(torch.zeros(4), 1)
        else:
            dist.recv(torch.zeros(4, dtype=torch.float64), 0)

    with pytest.raises(HangError, match=r"rank 0 sends \[4\] float32 .* rank 1 receives into \[4\] float64"):
        distlab.run(fn, 2, timeout=60)


def test_waiting_on_a_rank_that_returned_fails_at_once():
    def fn(rank, world_size):
        if rank == 1:
            dist.recv(torch.zeros(2), 0)

    start = time.perf_counter()
    with pytest.raises(HangError, match="rank 0 has already returned"):
        distlab.run(fn, 2, timeout=60)
    assert time.perf_counter() - start < 15


def test_endless_loop_outside_collectives_is_bounded():
    def fn(rank, world_size):
        while rank == 0:
            pass
        dist.barrier()

    with pytest.raises(HangError) as info:
        distlab.run(fn, 2, timeout=2)
    text = str(info.value)
    assert "rank 0: running your function, no collective called yet" in text
    assert "rank 1: in barrier #1, entered and never returned" in text


@pytest.mark.parametrize("how,expected", [("exit", "exited with code 7"),
                                          ("abort", "killed by SIGABRT"),
                                          ("segv", "killed by SIGSEGV")])
def test_a_dying_rank_is_reported(how, expected):
    def fn(rank, world_size):
        if rank == 1:
            if how == "exit":
                os._exit(7)
            os.kill(os.getpid(), signal.SIGABRT if how == "abort" else signal.SIGSEGV)
        dist.barrier()

    with pytest.raises(RankCrashed, match=f"rank 1 died: its process was {expected}|rank 1 died: its process {expected}"):
        distlab.run(fn, 2, timeout=30)


def test_rank_output_is_prefixed_and_goes_to_stdout(capfd):
    def fn(rank, world_size):
        print(f"python says {rank}")
        print(f"stderr says {rank}", file=sys.stderr)
        os.write(1, f"C level {rank}\n".encode())

    distlab.run(fn, 2)
    out, err = capfd.readouterr()
    for rank in range(2):
        for text in (f"python says {rank}", f"stderr says {rank}", f"C level {rank}"):
            assert f"[rank {rank}] {text}" in out
    assert "says" not in err


def test_collective_record():
    def fn(rank, world_size):
        t = torch.ones(8)
        dist.all_reduce(t)
        gathered = torch.zeros(8 * world_size)
        dist.all_gather_into_tensor(gathered, t)
        peer = (rank + 1) % world_size
        send = dist.isend(t, peer)
        dist.recv(torch.zeros(8), (rank - 1) % world_size)
        send.wait()
        sub = dist.new_group([0, 1])
        if rank in (0, 1):
            dist.broadcast(t, 0, group=sub)
        return True

    out = distlab.run(fn, 3)
    rank1 = out.comms[1]
    assert [c.op for c in rank1] == ["all_reduce", "all_gather_into_tensor", "isend", "recv", "broadcast"]
    all_reduce, all_gather, isend, recv, bcast = rank1
    assert (all_reduce.seq, all_reduce.shapes, all_reduce.dtype, all_reduce.bytes) == (1, [(8,)], "float32", 32)
    assert all_gather.seq == 2 and all_gather.bytes == 8 * 3 * 4
    assert (isend.peer, isend.async_op, recv.peer) == (2, True, 0)
    assert bcast.group == (0, 1) and bcast.seq == 1
    assert all(c.end is not None and c.end >= c.start for c in rank1)
    assert [c.op for c in out.comms[2]][-1] == "recv"
    # One clock for all ranks: rank 0's all-reduce overlaps rank 1's.
    a, b = out.comms[0][0], out.comms[1][0]
    assert a.start <= b.end and b.start <= a.end


def test_back_to_back_runs_get_fresh_processes():
    pids = [distlab.run(lambda r, w: os.getpid(), 2) for _ in range(3)]
    assert len({pid for run in pids for pid in run}) == 6


def test_zygote_runs_no_threads():
    """Forking is only safe for OpenMP and CUDA if the zygote never started a thread."""
    zygote = distlab.warm_up()
    zygote.wait_ready()
    with open(f"/proc/{zygote.proc.pid}/status") as status:
        threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    assert threads == 1


def test_openmp_in_the_parent_then_in_the_ranks():
    """The parent uses its OpenMP pool first; ranks must still compute (no fork deadlock)."""
    torch.set_num_threads(2)
    a = torch.randn(512, 512)
    (a @ a).sum()

    def fn(rank, world_size):
        b = torch.randn(512, 512)
        return torch.get_num_threads(), float((b @ b).abs().sum() > 0)

    out = distlab.run(fn, 2, timeout=60)
    assert all(ok == 1.0 for _, ok in out)


def test_run_inside_a_rank_is_refused():
    with pytest.raises(RankError, match="called inside a rank"):
        distlab.run(lambda r, w: distlab.run(lambda a, b: 0, 1), 1)


def test_unpicklable_return_value_is_explained():
    with pytest.raises(RankError, match="cannot be sent back"):
        distlab.run(lambda r, w: (x for x in range(3)), 1)


@pytest.fixture
def no_ranks(monkeypatch):
    """A launcher that fails the test if it is asked to start processes."""
    from distlab.runtime import launch

    def started(self):
        raise AssertionError("distlab.run started processes before checking its arguments")
    monkeypatch.setattr(launch.Launcher, "warm_up", started)


@pytest.mark.parametrize("world_size,error,said", [
    ("2", TypeError, r"got '2' \(a str\)\. Pass 2, a number, not a string\."),
    (2.0, TypeError, r"got 2\.0 \(a float\)\. Pass 2\."),
    (2.5, TypeError, r"an int >= 1; got 2\.5 \(a float\)\.$"),
    (True, TypeError, r"got True \(a bool\)"),
    (None, TypeError, r"got None \(a NoneType\)"),
    (0, ValueError, r"an int >= 1; got 0\."),
    (-2, ValueError, r"got -2\."),
])
def test_a_world_size_that_is_not_a_count_of_ranks_is_refused_at_once(no_ranks, world_size,
                                                                       error, said):
    with pytest.raises(error, match=said) as caught:
        distlab.run(lambda r, w: 0, world_size)
    assert "world_size is the number of ranks" in str(caught.value)


def test_a_function_that_is_not_callable_is_refused_at_once(no_ranks):
    with pytest.raises(TypeError, match=r"fn must be the function each rank runs.*got 4 \(an "
                                        r"int\)\. Pass the function itself"):
        distlab.run(4, 2)


@pytest.mark.parametrize("backend", ["mpi", "NCCL", None, ""])
def test_an_unknown_backend_is_refused_at_once(no_ranks, backend):
    with pytest.raises(ValueError, match=r"backend must be one of 'auto', 'gloo', 'nccl'; "
                                         rf"got {re.escape(repr(backend))} "):
        distlab.run(lambda r, w: 0, 2, backend=backend)


@pytest.mark.parametrize("timeout,error", [(0, ValueError), (-1.0, ValueError),
                                           ("60", TypeError), (True, TypeError)])
def test_a_timeout_that_is_not_a_positive_number_is_refused_at_once(no_ranks, timeout, error):
    with pytest.raises(error, match=r"timeout is the seconds the ranks may run, a number > 0"):
        distlab.run(lambda r, w: 0, 2, timeout=timeout)


def test_a_numpy_integer_is_a_world_size():
    import numpy as np
    out = distlab.run(lambda rank, world_size: (rank, type(world_size).__name__), np.int64(2))
    assert list(out) == [(0, "int"), (1, "int")]


def test_nccl_without_gpus_is_explained():
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs: the NCCL path is tested in test_nccl_all_reduce")
    with pytest.raises(DistributedError, match="needs a GPU per rank"):
        distlab.run(lambda r, w: 0, 2, backend="nccl")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs for NCCL ranks")
def test_nccl_all_reduce():
    def fn(rank, world_size):
        t = torch.full((4,), float(rank), device="cuda")
        dist.all_reduce(t)
        return t, torch.cuda.current_device()

    out = distlab.run(fn, 2)
    assert out.backend == "nccl"
    assert [device for _, device in out] == [0, 1]
    for t, _ in out:
        assert t.device.type == "cpu"
        torch.testing.assert_close(t, torch.full((4,), 1.0))


def _script(tmp_path, body: str):
    path = tmp_path / "lab_script.py"
    path.write_text(textwrap.dedent(body))
    return path


SCRIPT = """
    import torch, torch.distributed as dist, distlab

    def fn(rank, world_size):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    print(f"RESULT {distlab.run(fn, 2)}")  # one write: torchrun's two processes share stdout
"""


@pytest.fixture(scope="module")
def two_scripts(tmp_path_factory) -> list[tuple[int, str, str]]:
    """SCRIPT, its run made five times, as two notebooks run at once with plain python:
    (exit status, stdout, stderr) of each. Top-level code without a __main__ guard, as
    `jupyter nbconvert --to script` makes of a lab: the two tests below read the same runs (one
    python, torch and zygote start each, not three)."""
    tmp_path = tmp_path_factory.mktemp("scripts")
    path = _script(tmp_path, SCRIPT.replace("distlab.run(fn, 2)}",
                                            "[distlab.run(fn, 2) for _ in range(5)][-1]}"))
    procs = [subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(2)]
    outputs = [proc.communicate(timeout=180) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs)]


def test_script_without_main_guard(two_scripts):
    """What `jupyter nbconvert --to script` makes of a lab: top-level code, no __main__ guard."""
    for returncode, out, err in two_scripts:
        assert returncode == 0, err
        assert "RESULT [3.0, 3.0]" in out


# SCRIPT, and what the group is at the interpreter's very end: a handler registered before distlab
# is imported runs after every exit handler distlab registers (atexit runs them last in, first
# out), so it sees what they left.
LEAVES = """
    import atexit

    def _left():
        import torch.distributed as dist
        print(f"LEFT {not dist.is_initialized()}")

    atexit.register(_left)
""" + SCRIPT


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory) -> subprocess.CompletedProcess:
    """LEAVES under `torchrun --nproc-per-node=2`, run once for the two tests below (one torchrun
    agent and two ranks that import torch, not twice that)."""
    tmp_path = tmp_path_factory.mktemp("torchrun")
    path = _script(tmp_path, LEAVES)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return subprocess.run([torchrun, "--standalone", "--nproc-per-node=2", str(path)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)


def test_torchrun_uses_the_existing_processes(under_torchrun):
    done = under_torchrun
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("RESULT [3.0, 3.0]") == 2
    assert "terminate called" not in done.stderr


def test_torchrun_ranks_leave_their_group_at_exit(under_torchrun):
    # A group still alive while the interpreter exits can abort the rank ("terminate called
    # without an active exception"): the group distlab.run made is destroyed at exit.
    done = under_torchrun
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("LEFT True") == 2, done.stdout


def test_torchrun_with_the_wrong_world_size_is_explained(tmp_path):
    path = _script(tmp_path, SCRIPT.replace("distlab.run(fn, 2)", "distlab.run(fn, 4)"))
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node=2", str(path)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode != 0
    assert "--nproc-per-node=4" in done.stderr


def test_two_launchers_at_once(two_scripts):
    """Two notebooks on one machine: each has its own zygote and store port."""
    assert len(two_scripts) == 2
    for returncode, out, err in two_scripts:
        assert returncode == 0, err
        assert "RESULT [3.0, 3.0]" in out


def test_notebook_defined_function_through_a_real_kernel(tmp_path):
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "import torch, torch.distributed as dist, distlab",
        "class Scale(torch.nn.Module):\n    def forward(self, x):\n        return 2 * x\n"
        "def fn(rank, world_size):\n    t = Scale()(torch.tensor([rank + 1.0]))\n"
        "    dist.all_reduce(t)\n    print('partial', rank)\n    return t.item()",
        "out = distlab.run(fn, 2)\nprint('RESULT', list(out))",
        "print('LAMBDA', list(distlab.run(lambda r, w: r * w, 2)))",
    )]
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("name") == "stderr" or o["output_type"] == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "RESULT [6.0, 6.0]" in text and "LAMBDA [0, 2]" in text
    assert "[rank 0] partial 0" in text and "[rank 1] partial 1" in text


def test_new_and_old_names_of_the_tensor_collectives_are_recorded_once():
    def fn(rank, world_size):
        x = torch.ones(4)
        out = torch.zeros(4 * world_size)
        dist.all_gather_single(out, x)
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_single(x, out)
        return True

    out = distlab.run(fn, 2)
    ops = [(c.op, c.bytes) for c in out.comms[0]]
    assert ops == [("all_gather_single", 32), ("all_gather_into_tensor", 32),
                   ("reduce_scatter_single", 32)]


def test_output_split_inside_a_character_survives(capfd):
    def fn(rank, world_size):
        text = "é🏖️" * 5000  # far more than one read, so reads end inside characters
        print(text)
        return len(text)

    distlab.run(fn, 1)
    out, _ = capfd.readouterr()
    assert "[rank 0] " + "é🏖️" * 5000 in out and "\ufffd" not in out


def test_two_launchers_with_different_settings_in_one_process(tmp_path):
    """A launcher's settings are its own: a distrusting one confined to a folder (as a grader's
    judge makes) and the default one run side by side without affecting each other."""
    from distlab.runtime.launch import Launcher, LaunchSettings, default_launcher

    def where(rank, world_size):
        import os
        return os.getcwd(), os.environ.get("HOME")

    folder = tmp_path / "judge"
    folder.mkdir()
    judge = Launcher(LaunchSettings(distrust=True, cwd=str(folder)))
    try:
        confined = judge.run(where, 2)
        plain = distlab.run(where, 2)                 # the default launcher: untouched
        with judge.active():
            routed = distlab.run(where, 1)            # distlab.run inside active(): the judge's
        after = distlab.run(where, 1)
        assert confined == [(str(folder), str(folder))] * 2 == routed * 2
        assert plain[0][0] == os.getcwd() and plain[0][1] != str(folder)
        assert after == plain[:1]
        assert judge.zygote_pid() != default_launcher().zygote_pid()
        # The distrusting launcher reads results as plain data only: code does not come back.
        with pytest.raises(Exception):
            judge.run(lambda rank, world_size: where, 1)
        assert callable(distlab.run(lambda rank, world_size: where, 1)[0])
    finally:
        judge.close()


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t)


def test_ranks_meet_through_a_file_of_their_run_removed_after_it(tmp_path):
    # Not a TCPStore: its connections look up ::ffff:127.0.0.1 in the DNS, 5 s each time the name
    # server does not answer. A file a killed process left under the next run's name is ignored.
    from distlab.runtime.launch import Launcher, LaunchSettings
    launcher = Launcher(LaunchSettings(cwd=str(tmp_path)))
    stale = tmp_path / f".distlab-rendezvous-{os.getpid()}-{id(launcher):x}-1"
    stale.write_bytes(b"\x00\x00\x00\x07leftover" * 8)
    try:
        assert launcher.run(_sum_of_ranks, 2, backend="gloo") == [3.0, 3.0]
        assert launcher.run(_sum_of_ranks, 3, backend="gloo") == [6.0, 6.0, 6.0]
    finally:
        launcher.close()
    assert not list(tmp_path.glob(".distlab-rendezvous-*"))
