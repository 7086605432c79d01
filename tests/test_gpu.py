"""The GPU paths that one CUDA GPU can exercise for real: NCCL on one rank, the backend "auto"
picks, CUDA tensors coming back from ranks, Kineto traces with CUDA kernels, DDP and DTensor on a
GPU, the grader's "both" backends, ``distlab doctor``. Tests that need a GPU per rank for two
ranks live beside the code they test (test_launch.py, test_lab09.py) and skip with one GPU.

Every test here skips, with the reason, on a machine without CUDA.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import distlab
from distlab.runtime.devices import device as rank_device, pick_backend
from distlab.runtime.launch import DistributedError, RankError

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(GPUS < 1, reason=f"needs a CUDA GPU; this machine has {GPUS}")]


def _where(rank, world_size):
    """What a rank sees of its set-up: backend, the device distlab gives it, CUDA's current one."""
    dev = rank_device()
    return dist.get_backend(), str(dev), torch.cuda.current_device() if dev.type == "cuda" else None


# ---------------------------------------------------------------------------------------------
# The launcher on NCCL

def _all_reduce_on_gpu(rank, world_size):
    t = torch.arange(4.0, device=rank_device()) + rank
    dist.all_reduce(t)
    return t, t.device.type, _where(rank, world_size)


def test_nccl_one_rank_all_reduce_comes_back_on_the_cpu():
    out = distlab.run(_all_reduce_on_gpu, 1, backend="nccl")
    assert out.backend == "nccl"
    t, device_type, where = out[0]
    assert device_type == "cuda"                       # the rank computed on its GPU
    assert where == ("nccl", "cuda:0", 0)
    assert t.device.type == "cpu"                      # the caller may have no GPU
    torch.testing.assert_close(t, torch.arange(4.0))
    [comm] = out.comms[0]                              # the record sees NCCL calls too
    assert (comm.op, comm.shapes, comm.dtype, comm.bytes) == ("all_reduce", [(4,)], "float32", 16)
    assert comm.end is not None and comm.end >= comm.start


def test_auto_is_nccl_only_when_every_rank_has_its_own_gpu():
    assert pick_backend("auto", 1) == "nccl"
    assert pick_backend("auto", GPUS) == "nccl"
    assert pick_backend("auto", GPUS + 1) == "gloo"
    one = distlab.run(_where, 1)
    assert one.backend == "nccl" and one[0] == ("nccl", "cuda:0", 0)
    more = distlab.run(_where, GPUS + 1)                # more ranks than GPUs: all on the CPU
    assert more.backend == "gloo"
    assert list(more) == [("gloo", "cpu", None)] * (GPUS + 1)


def test_nccl_with_more_ranks_than_gpus_is_explained():
    with pytest.raises(DistributedError, match=f"{GPUS + 1} ranks, {GPUS} GPU"):
        distlab.run(_where, GPUS + 1, backend="nccl")


def test_cuda_tensors_in_containers_come_back_detached_on_the_cpu():
    def fn(rank, world_size):
        w = torch.full((2, 3), 2.0, device="cuda", requires_grad=True)
        y = w * 3
        return {"w": w, "parts": [y, (y.sum(), torch.ones(1, device="cuda", dtype=torch.int64))]}

    value = distlab.run(fn, 1)[0]
    w, (y, (total, ones)) = value["w"], value["parts"]
    for t in (w, y, total, ones):
        assert t.device.type == "cpu" and not t.requires_grad
    torch.testing.assert_close(y, torch.full((2, 3), 6.0))
    assert total.item() == 36.0 and ones.dtype == torch.int64 and ones.tolist() == [1]


def test_gloo_ranks_forked_from_the_zygote_can_use_cuda():
    """Ranks are forked from the zygote: CUDA works in them only if the zygote never touched it."""
    def fn(rank, world_size):
        x = torch.full((3,), float(rank + 1), device="cuda")
        return x @ x, torch.cuda.is_initialized()

    out = distlab.run(fn, 2, backend="gloo")
    assert out.backend == "gloo"
    assert [(v.item(), v.device.type, ok) for v, ok in out] == [(3.0, "cpu", True),
                                                                 (12.0, "cpu", True)]


def test_cpu_tensor_on_nccl_is_a_rank_error_not_a_hang():
    def fn(rank, world_size):
        dist.all_reduce(torch.ones(2))  # a CPU tensor: NCCL has no CPU path

    with pytest.raises(RankError) as info:
        distlab.run(fn, 1, backend="nccl", timeout=60)
    assert info.value.rank == 0
    assert "cpu" in str(info.value).lower()
    # The launcher is still usable afterwards, on the same GPU.
    assert distlab.run(_where, 1)[0] == ("nccl", "cuda:0", 0)


def test_torchrun_with_one_gpu_runs_on_nccl(tmp_path):
    script = tmp_path / "lab_script.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist, distlab
        from distlab.runtime.devices import device

        def fn(rank, world_size):
            t = torch.tensor([rank + 2.0], device=device())
            dist.all_reduce(t)
            return t, t.device.type

        out = distlab.run(fn, 1)
        print(f"RESULT {out.backend} {out[0][1]} {out[0][0].device.type} {out[0][0].item()}")
    """))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=1", str(script)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT nccl cuda cpu 2.0" in done.stdout, done.stdout
    assert "terminate called" not in done.stderr


# ---------------------------------------------------------------------------------------------
# The labs' GPU branches on one rank

def test_profile_on_the_gpu_records_cuda_kernels():
    from distlab.labs.timelines.profiling import profile_ranks
    from distlab.labs.timelines.runs import dp_step
    from distlab.labs.timelines.trace import load_trace

    prof = profile_ranks(dp_step, 1, steps=3, backend="nccl")
    events = load_trace(prof.traces[0])["traceEvents"]
    kernels = {e["name"] for e in events if e.get("cat") == "kernel"}
    assert kernels, "a CUDA profile has kernels"
    timeline = prof.timeline
    assert timeline.source == "torch.profiler (nccl)"
    assert len(timeline.steps(0)) == 3
    compute = timeline.of(0, "compute")
    assert compute and {s.name for s in compute} <= kernels | {
        e["name"] for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")}
    assert {"forward", "backward", "optimizer"} <= {s.name for s in timeline.of(0, "range")}
    # The steps' ranges lie on the GPU's clock and hold the kernels they launched.
    first, last = timeline.steps(0)[0][0], timeline.steps(0)[-1][1]
    inside = [s for s in compute if first <= s.start and s.end <= last]
    assert len(inside) >= 3 * 4   # at least a matrix product per layer and step (4 layers)


def test_collective_demos_on_nccl_match_gloo(capsys):
    from distlab.labs import collectives

    # A rank sending to itself teaches nothing; the *_single names are torch 2.13's (pinned).
    ops = [op for op in collectives.OPS if op != "send_recv"
           and (hasattr(dist, "all_gather_single") or not op.endswith(("gather", "scatter")))]
    assert {"broadcast", "reduce", "all_reduce", "all_to_all"} <= set(ops)
    for op in ops:
        on_gpu = collectives.demo(op, 1, show=False)          # "auto": NCCL on one rank
        assert f"{op} on 1 ranks (nccl)" in capsys.readouterr().out
        on_cpu = list(distlab.run(collectives._demo_rank, 1, op, backend="gloo"))
        assert len(on_gpu) == len(on_cpu) == 1, op
        for got, want in zip(on_gpu[0], on_cpu[0]):
            assert (got is None) == (want is None), op
            if want is not None:
                assert got.device.type == "cpu", op
                torch.testing.assert_close(got, want, msg=op)


def test_collective_sweep_times_nccl_on_the_gpu():
    from distlab.labs import collectives

    ops, sizes = ["all_reduce", "broadcast"], [1 << 10, 1 << 14]
    out = distlab.run(collectives._sweep_rank, 1, ops, sizes, 1, 3, None)
    assert out.backend == "nccl"
    rows = out[0]
    assert [(r["op"], r["nbytes"]) for r in rows] == [(op, n) for op in ops for n in sizes]
    assert all(0 < r["seconds"] < 1 for r in rows)
    # The timed calls were NCCL's: 1 + 3 calls per size and op, then the all-reduce of the time.
    assert sum(c.op == "all_reduce" for c in out.comms[0]) == 2 * (1 + 3) + len(rows)


def test_backend_features_differ_between_nccl_and_gloo():
    from distlab.labs.data_parallel.ddp import backend_features

    nccl = dict(distlab.run(backend_features, 1, backend="nccl")[0])
    gloo = dict(distlab.run(backend_features, 1, backend="gloo")[0])
    premul = "all_reduce PREMUL_SUM(1/W), float32"
    assert nccl[premul] == "ok: [1.0, 1.0]"          # NCCL scales before summing
    assert not gloo[premul].startswith("ok")          # gloo does not know the op
    assert nccl["all_reduce AVG, float32"] == "ok: [1.0, 1.0]"


def test_ddp_on_the_gpu_matches_single_process_training():
    from distlab.labs.data_parallel.ddp import ddp_training
    from distlab.labs.data_parallel.problem import Setup, reference_training

    setup, steps = Setup(), 3
    out = distlab.run(ddp_training, 1, setup, steps, 8192, timeout=120)
    assert out.backend == "nccl"
    ref = reference_training(setup, steps)
    for got, want in zip(out[0]["params"], ref["params"], strict=True):
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # Every step all-reduces each gradient once, in DDP's buckets (float64 here, like the model).
    param_bytes = sum(p.numel() * p.element_size() for p in ref["params"])
    assert sum(nbytes for nbytes, _ in out[0]["buckets"]) == steps * param_bytes


def test_fsdp2_on_the_gpu_matches_single_process_training():
    from distlab.labs.sharded.fsdp import _fsdp_variant
    from distlab.labs.sharded.problem import ShardSetup, reference_sharded_training

    setup, steps = ShardSetup(), 2
    out = distlab.run(_fsdp_variant, 1, setup, steps, True, True, timeout=120)
    assert out.backend == "nccl"
    ref = reference_sharded_training(setup, steps)["params"]
    for got, want in zip(out[0]["params"], ref, strict=True):
        assert got.device.type == "cpu"
        torch.testing.assert_close(got[:want.numel()], want, rtol=1e-4, atol=1e-5)
    assert out[0]["peak"] > 0


def test_lab12_resume_on_the_gpu_is_bit_identical(tmp_path):
    """Lab 12's run on a GPU (NCCL, FSDP2 on CUDA, dropout from the GPU's own generator): an
    asynchronous save (staged from the GPU to CPU memory, written by a thread on its own gloo
    group) resumed in a fresh trainer lands on the uninterrupted run to the last bit; without
    the GPU's generator in the state it would not."""
    from distlab.labs.checkpoint.run_state import RunSpec
    from distlab.labs.checkpoint.runs import resume_beside

    spec = RunSpec(device="cuda")
    out = distlab.run(resume_beside, 1, str(tmp_path / "saved"), 6, 3, spec, timeout=180)
    assert out.backend == "nccl"
    got = out[0]
    assert got["resumed"] == got["uninterrupted"], got
    for name, value in got["params"].items():
        assert torch.equal(got["resumed_params"][name].cpu(), value.cpu()), name


def test_tp_and_fsdp_on_a_one_gpu_mesh_match_single_process_training():
    from distlab.labs import mesh

    shape, cfg = mesh.MeshShape(1, 1, 1), mesh.TinyConfig()
    out = distlab.run(mesh.train_on_mesh, 1, shape, mesh.megatron_plan, cfg, 0, timeout=120)
    assert out.backend == "nccl"
    assert out[0]["elements"] == mesh.dense_elements(cfg)
    losses = out[0]["losses"]
    assert losses.device.type == "cpu"
    torch.testing.assert_close(losses, mesh.reference_losses(cfg, 0), rtol=mesh.LOSS_RTOL,
                               atol=mesh.LOSS_ATOL)


def test_tensor_parallel_timing_on_the_gpu():
    from distlab.labs.tensor_parallel.demos import timing_table

    rows = timing_table(world_sizes=(1,), batch=2, seq=16, hidden=64, ffn=128, steps=2)
    assert {r["backend"] for r in rows} == {"nccl"}
    assert [r["variant"] for r in rows] == ["dense", "hand-written", "DTensor"]
    assert all(float(r["ms per step"]) > 0 for r in rows)


def test_attention_scaling_on_the_gpu():
    from distlab.labs.attention.measure import scaling_table

    [row] = scaling_table(world_sizes=(1,), batch=2, seq=16, hidden=64, n_heads=4, n_kv_heads=4,
                          steps=2, warmup=1)
    assert row["backend"] == "nccl" and row["ranks"] == 1
    assert float(row["ms per step"]) > 0 and row["speedup T1/TN"] == "1.00"


# ---------------------------------------------------------------------------------------------
# The grader's backends and the doctor

def test_both_backends_are_gloo_and_nccl_where_every_rank_has_a_gpu(monkeypatch):
    from distlab.checks import ranks

    monkeypatch.setenv(ranks.ENV_BACKEND, "both")
    assert ranks.backends(1) == ["gloo", "nccl"]
    assert ranks.backends(GPUS + 1) == ["gloo"]
    results = ranks.run_each_backend(_all_reduce_on_gpu, 1)
    assert [b for b, _ in results] == ["gloo", "nccl"]
    (_, gloo), (_, nccl) = results
    assert (gloo[0][1], nccl[0][1]) == ("cpu", "cuda")
    torch.testing.assert_close(gloo[0][0], nccl[0][0])


def test_doctor_names_the_gpus(capsys):
    from distlab.course import doctor

    # On a torch older than the pin (the lent GPU machines hold 2.11: bench/reports/) the doctor
    # must fail and name the pin; the GPU lines below hold either way.
    lacking = [name for name in doctor.NEEDED if not hasattr(dist, name)]
    assert doctor.main([]) == (1 if lacking else 0)
    text = capsys.readouterr().out
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(GPUS))
    assert f"{'GPUs':<22} {GPUS} ({names})" in text
    assert "nccl" in next(line for line in text.splitlines() if "backends" in line)
    # NCCL is smoke-tested on as many ranks as there are GPUs, up to 2: with one GPU, "auto" runs
    # every 1-rank call on NCCL, so the doctor checks that much.
    assert re.search(rf"{min(GPUS, 2)}-rank NCCL collectives\s+ok", text), text
    if lacking:
        assert "torch==2.13.0" in text and all(name in text for name in lacking), text
    else:
        assert "OK: ready for the labs." in text


if __name__ == "__main__":  # pragma: no cover - a quick look on a GPU machine
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-n", "0"]))
